"""Command-line flags generated from a frozen options dataclass, so the CLI never repeats its defaults.

    >>> import argparse
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, kw_only=True)
    ... class Opts:
    ...     '''Attributes:
    ...         max_retries: how often to retry.
    ...         verbose: say more.
    ...     '''
    ...     max_retries: int = 3
    ...     verbose: bool = False
    >>> parser = argparse.ArgumentParser()
    >>> add_option_arguments(parser, Opts)
    >>> options_from_args(Opts, parser.parse_args(["--max-retries", "5"]))
    Opts(max_retries=5, verbose=False)

Each field becomes ``--field-name``: ``int``/``float``/``str`` (and ``X | None``) take a value
of that type, ``bool`` fields defaulting to false become switches, ``Literal`` fields get their
choices. Help text comes from the ``Attributes:`` section of the class docstring, and the
default shown is the dataclass's. Fields of other types (a key object, a nested dataclass) are
left to the command (name them in ``skip``); a new simple field appears as a flag by itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

__all__ = ["add_option_arguments", "option_fields", "options_from_args"]

T = TypeVar("T")

_SIMPLE = (int, float, str)


def _attribute_docs(cls: type) -> dict[str, str]:
    """``name: description`` pairs from a Google-style ``Attributes:`` section."""
    doc = inspect.getdoc(cls) or ""
    out: dict[str, str] = {}
    section = False
    current = None
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            section = True
            continue
        if not section:
            continue
        if line and not line.startswith(" "):
            break
        m = re.match(r"^\s{2,8}(\w+)(?: \([^)]*\))?: (.*)$", line)
        if m:
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current and line.strip():
            out[current] += " " + line.strip()
    return {k: v.replace("``", "") for k, v in out.items()}


def _flag_type(tp: Any) -> tuple[Any, bool] | None:
    """``(argparse type or Literal, optional)`` for a field type, or ``None`` when it is not a flag."""
    optional = False
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) != 1:
            return None
        optional, tp = True, args[0]
    if tp in _SIMPLE or tp is bool or get_origin(tp) is Literal:
        return tp, optional
    return None


def option_fields(cls: type, skip: frozenset[str] | set[str] = frozenset()) -> list[dataclasses.Field[Any]]:
    """The fields of ``cls`` that :func:`add_option_arguments` turns into flags."""
    hints = get_type_hints(cls)
    return [f for f in dataclasses.fields(cls) if f.init and f.name not in skip and _flag_type(hints[f.name]) is not None]


def add_option_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Add one ``--flag`` per simple field of the options dataclass ``cls`` (see the module docstring)."""
    hints = get_type_hints(cls)
    docs = _attribute_docs(cls)
    for f in option_fields(cls, skip):
        tp, _optional = _flag_type(hints[f.name])  # type: ignore[misc]
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        text = docs.get(f.name, f.name.replace("_", " "))
        if tp is bool and default is False:
            parser.add_argument(flag, action="store_true", dest=f.name, help=text)
        elif tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, dest=f.name, default=default, help=text)
        elif get_origin(tp) is Literal:
            parser.add_argument(flag, choices=get_args(tp), dest=f.name, default=default,
                                help=f"{text} (default: {default})")
        else:
            shown = "" if default is None else f" (default: {default})"
            parser.add_argument(flag, type=tp, dest=f.name, default=default, help=text + shown)


def options_from_args(cls: type[T], args: argparse.Namespace, *, skip: frozenset[str] | set[str] = frozenset(),
                      **given: Any) -> T:
    """Build ``cls`` from the parsed flags of :func:`add_option_arguments`, plus ``given`` values."""
    values = {f.name: getattr(args, f.name) for f in option_fields(cls, skip) if hasattr(args, f.name)}
    return cls(**{**values, **given})
