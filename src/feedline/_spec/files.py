"""Reading a spec file: bounded in bytes, nesting and alias expansion, as UTF-8, in one line on error.

A spec file is read whole (at most :data:`MAX_BYTES`), decoded as UTF-8 and parsed as JSON
(``.json``) or YAML (anything else). YAML is parsed by :class:`_BoundedLoader`, a ``SafeLoader``
that counts, while it composes the document, what the document expands to once every alias
is followed: at most :data:`MAX_VALUES` values and :data:`MAX_CHARS` characters of scalars,
nested at most :data:`MAX_DEPTH` levels. So a 661-byte "billion laughs" file (nine anchors, each
a list of nine aliases of the previous one) is refused after a few hundred events instead of
being walked as a tree of 10^9 values, and 20,000 nested lists are refused at level 65 instead
of overflowing the parser's recursion. Real specs nest about 6 levels and hold a few hundred
values.

    >>> parse_spec_text("task: clm\\nsources: [a.jsonl]\\n", "train.yaml")
    {'task': 'clm', 'sources': ['a.jsonl']}
    >>> parse_spec_text("a: &x [1, 1]\\nb: [*x, *x, *x]\\n", "t.yaml")["b"]
    [[1, 1], [1, 1], [1, 1]]
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import yaml

from feedline._core.bounded import NotRegularFile, read_bounded, utf8_error
from feedline.errors import SpecError

__all__ = ["MAX_BYTES", "MAX_CHARS", "MAX_DEPTH", "MAX_VALUES", "parse_spec_text", "read_spec_file",
           "read_spec_text"]

MAX_BYTES = 16 << 20        # a spec file's size
MAX_DEPTH = 64              # levels of nesting (real specs: about 6)
MAX_VALUES = 1_000_000      # values once every alias is expanded
MAX_CHARS = 64 << 20        # characters of scalars once every alias is expanded


def read_spec_text(path: str | os.PathLike[str]) -> str:
    """The text of a spec file (``-``: standard input), as UTF-8, at most :data:`MAX_BYTES`.

    Raises:
        SpecError: missing, unreadable, too large, or not UTF-8 (naming the line and byte).
    """
    p = str(path)
    try:
        if p == "-":
            raw = getattr(sys.stdin, "buffer", None)   # a text stream without bytes (a test's): read as text
            data = raw.read(MAX_BYTES + 1) if raw is not None else \
                sys.stdin.read(MAX_BYTES + 1).encode("utf-8", "surrogateescape")
        else:
            data = read_bounded(p, MAX_BYTES)
    except FileNotFoundError:
        raise SpecError(f"{p}: spec file not found") from None
    except NotRegularFile as e:
        if e.what == "a folder":
            raise SpecError(f"{p}: is a directory, not a spec file") from None
        raise SpecError(f"{p}: not a regular file (a pipe or device); give a spec file, or - for "
                        "standard input") from None
    except OSError as e:
        raise SpecError(f"{p}: cannot read spec file ({e.strerror})") from None
    if len(data) > MAX_BYTES:
        raise SpecError(f"{p}: larger than {MAX_BYTES >> 20} MB; a spec file is a few KB "
                        "(list many sources with a glob, e.g. path: 'corpus/*.jsonl')")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, byte = utf8_error(data, e)
        raise SpecError(f"{p}:{line}: not UTF-8 text ({byte}); save the spec as UTF-8") from None


def parse_spec_text(text: str, name: str) -> dict[str, Any]:
    """Parse a spec's text (JSON when ``name`` ends in ``.json``, else YAML) into its top-level mapping.

    Raises:
        SpecError: not valid JSON/YAML, nested deeper than :data:`MAX_DEPTH`, expanding beyond
            :data:`MAX_VALUES` values or :data:`MAX_CHARS` characters, or not a mapping.
    """
    if name.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"{name}:{e.lineno}: not valid JSON: {e.msg} (column {e.colno})") from None
        except RecursionError:
            raise SpecError(f"{name}: nested deeper than {MAX_DEPTH} levels; a spec nests about 6") from None
        _check_depth(data, name)
    else:
        loader = _BoundedLoader(text, name)
        try:
            data = loader.get_single_data()
        except yaml.YAMLError as e:
            raise SpecError(f"{name}: not valid YAML: {_one_line(e)}") from None
        finally:
            loader.dispose()
    if not isinstance(data, dict):
        raise SpecError(f"{name}: a spec must be a mapping at the top level, got {type(data).__name__}")
    return data


def read_spec_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``.yaml``/``.yml``/``.json`` spec file (``-`` reads standard input) into its mapping."""
    return parse_spec_text(read_spec_text(path), str(path))


def _one_line(e: yaml.YAMLError) -> str:
    return " ".join(str(e).split())


def _check_depth(data: Any, name: str) -> None:
    """Refuse JSON nested deeper than :data:`MAX_DEPTH` (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SpecError(f"{name}: nested deeper than {MAX_DEPTH} levels; a spec nests about 6")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


class _BoundedLoader(yaml.SafeLoader):
    """A ``SafeLoader`` that refuses, while composing, a document nested or expanding beyond the bounds.

    Composition is depth first, so the values composed between a node's start and its end are
    exactly its subtree: a node's expanded size is the difference of the running totals, kept
    per node so that an alias adds its target's whole size (an alias of an unfinished node is a
    recursive structure, refused too).
    """

    def __init__(self, text: str, name: str) -> None:
        super().__init__(text)
        self._name = name
        self._depth = 0
        self._values = 0
        self._chars = 0
        self._sizes: dict[int, tuple[int, int]] = {}   # id(node) -> (values, chars) it expands to

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:
                raise self._refuse(mark, f"alias *{self._anchor_of(node)} refers to a value that contains it "
                                         "(a recursive structure); a spec is a tree")
            self._add(size[0], size[1], mark)
            return node
        mark = self.peek_event().start_mark
        if self._depth >= MAX_DEPTH:
            raise self._refuse(mark, f"nested deeper than {MAX_DEPTH} levels; a spec nests about 6")
        values, chars = self._values, self._chars
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._add(1, len(node.value) if isinstance(node, yaml.ScalarNode) else 0, mark)
        self._sizes[id(node)] = (self._values - values, self._chars - chars)
        return node

    def _add(self, values: int, chars: int, mark: Any) -> None:
        self._values += values
        self._chars += chars
        if self._values > MAX_VALUES or self._chars > MAX_CHARS:
            raise self._refuse(mark, f"expands, with its aliases (*name) followed, to more than {MAX_VALUES:,} "
                                     f"values or {MAX_CHARS >> 20} MB of text; write the values out, "
                                     "or use fewer aliases")

    def _anchor_of(self, node: Any) -> str:
        return next((a for a, n in self.anchors.items() if n is node), "?")

    def _refuse(self, mark: Any, why: str) -> SpecError:
        return SpecError(f"{self._name}:{mark.line + 1}: {why}")
