"""The line of a spec file that a key path (``sources[0].format``) names, for error messages.

    >>> key_line("sources:\\n  - path: a.jsonl\\n    formt: jsonl\\n", "sources[0].formt")
    3
    >>> key_line("task: {kind: clm}\\n", "batching.batch_size") is None
    True
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["key_line", "located"]

_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_PATH = re.compile(r"^[A-Za-z_][\w]*(?:\[\d+\])*(?:\.[A-Za-z_][\w]*(?:\[\d+\])*)*")


def key_line(text: str, path: str) -> int | None:
    """The 1-based line of the deepest part of ``path`` found in the YAML/JSON ``text`` (``None``: not found)."""
    import yaml

    try:
        node: Any = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for name, index in _STEP.findall(path):
        if isinstance(node, yaml.MappingNode) and name:
            hit = next(((k, v) for k, v in node.value if getattr(k, "value", None) == name), None)
            if hit is None:
                if name == "sources":  # written as source: (one source)
                    hit = next(((k, v) for k, v in node.value if getattr(k, "value", None) == "source"), None)
                if hit is None:
                    break
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and index:
            if int(index) >= len(node.value):
                break
            node = node.value[int(index)]
            line = node.start_mark.line + 1
        elif index and index == "0" and not isinstance(node, yaml.SequenceNode):
            continue  # sources[0] of a single source written without a list
        else:
            break
    return line


def located(message: str, file: str, text: str) -> str:
    """``message`` prefixed with ``file:line`` of the key path it starts with (else ``file``)."""
    m = _PATH.match(message)
    line = key_line(text, m.group(0)) if m and message[m.end():m.end() + 1] in (":", "=") else None
    return f"{file}:{line}: {message}" if line is not None else f"{file}: {message}"
