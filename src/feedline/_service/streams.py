"""Named streams of one server: ``train`` from the main spec, others from its ``streams`` key.

A spec may name more streams, each with its own cursor::

    streams:
      validation: val.yaml                      # a whole spec file (relative to this spec)
      heldout: {sources: [heldout.jsonl], epochs: 1}   # top-level keys overriding this spec

A mapping overrides the main spec's top-level keys (tokenizer, task and batching are inherited),
which is usually what a validation stream wants. On the command line,
``feedline serve train.yaml --stream validation=val.yaml`` adds or replaces one.

    >>> streams = load_streams({"sources": ["a.txt"], "streams": {"val": {"sources": ["b.txt"]}}})
    >>> sorted(streams), streams["val"].spec.sources[0].path
    (['train', 'val'], 'b.txt')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from feedline._pipeline import Pipeline
from feedline._spec import Spec
from feedline.errors import SpecError

__all__ = ["DEFAULT_STREAM", "load_streams", "parse_stream_option"]

DEFAULT_STREAM = "train"


def load_streams(spec: Spec | Mapping[str, Any] | str | os.PathLike[str],
                 extra: Mapping[str, str | Mapping[str, Any]] | None = None) -> dict[str, Pipeline]:
    """The pipelines of every stream a spec names (``train`` first), plus ``extra`` ones."""
    base: Path | None = None
    if isinstance(spec, (str, os.PathLike)):
        base = Path(spec).resolve().parent
    main = Spec.load(spec)  # a file's errors name its file:line
    named: dict[str, Any] = dict(main.streams or {})
    named.update(extra or {})
    if DEFAULT_STREAM in named:
        raise SpecError(f"streams.{DEFAULT_STREAM}: the main spec is the '{DEFAULT_STREAM}' stream; name the others differently")
    out = {DEFAULT_STREAM: Pipeline(main.replace(streams=None))}
    for name, value in named.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise SpecError(f"streams: {name!r} is not a valid stream name (letters, digits and _)")
        out[name] = Pipeline(_stream_spec(main, name, value, base))
    return out


def _stream_spec(main: Spec, name: str, value: Any, base: Path | None) -> Spec:
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if base is not None and not path.is_absolute():
            path = base / path
        sub = Spec.load(str(path))
    elif isinstance(value, Mapping):
        merged = {k: v for k, v in main.to_dict().items() if k != "streams"}
        merged.update(value)
        try:
            sub = Spec.from_mapping(merged, base=base)
        except SpecError as e:
            raise SpecError(f"streams.{name}: {e}") from e
    else:
        raise SpecError(f"streams.{name}: expected a spec file path or a mapping of overrides, got {type(value).__name__}")
    if sub.streams:
        raise SpecError(f"streams.{name}: a stream cannot name streams of its own")
    return sub


def parse_stream_option(text: str) -> tuple[str, str]:
    """``"validation=val.yaml"`` → ``("validation", "val.yaml")`` (the ``--stream`` option)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise SpecError(f"--stream {text!r}: expected NAME=SPEC, e.g. --stream validation=val.yaml")
    return name.strip(), path.strip()
