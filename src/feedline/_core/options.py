"""Turn plain mappings (from YAML, JSON or Python) into frozen option dataclasses.

Every configurable part of feedline (a source, a task, a batcher) declares its options as a
frozen, keyword-only dataclass. :func:`build` fills one from a mapping, checking every key
and value up front, and raises :class:`~feedline.errors.SpecError` with the key path, the
value seen, what is allowed, and a close match for typos::

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, kw_only=True)
    ... class Opts:
    ...     max_length: int = 128
    >>> build(Opts, {"max_lenght": 5}, "task")
    Traceback (most recent call last):
    ...
    feedline.errors.SpecError: task.max_lenght: unknown key; did you mean 'max_length'? (allowed: max_length)
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from feedline.errors import SpecError

__all__ = ["build", "check_count", "close_match", "join", "to_plain"]

T = TypeVar("T")


def close_match(word: str, choices: Sequence[str]) -> str:
    """Return ``"; did you mean 'x'?"`` for the closest choice, or ``""`` when none is close."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {found[0]!r}?" if found else ""


def check_count(value: Any, name: str, *, low: int = 1, high: int | None = None) -> int:
    """``value`` if it is an integer in ``[low, high]``, else a :class:`SpecError` naming ``name``.

        >>> check_count(0, "prefetch")
        Traceback (most recent call last):
        ...
        feedline.errors.SpecError: prefetch=0 must be an integer >= 1
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise SpecError(f"{name}={value!r:.40} must be an integer {bound}")
    return value


def build(cls: type[T], data: Any, path: str) -> T:
    """Build the dataclass ``cls`` from ``data`` (a mapping, or already a ``cls``).

    Raises:
        SpecError: naming ``path.key`` for unknown keys, missing required keys and bad values.
    """
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    klass: Any = cls  # a class is hashable: the key of the two caches below
    fields = _init_fields(klass)
    if not isinstance(data, Mapping):
        keys = ", ".join(k for k in fields if k not in ("options", "iterable"))
        raise SpecError(f"{path or 'spec'}: expected a mapping of options ({keys}), got {type(data).__name__} {data!r:.60}")
    hints = _type_hints(klass)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            allowed = ", ".join(sorted(fields))
            raise SpecError(f"{join(path, key)}: unknown key{close_match(str(key), list(fields))} (allowed: {allowed})")
        kwargs[key] = _convert(hints[key], value, join(path, key))
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SpecError(f"{join(path, name)}: required key is missing")
    try:
        return cls(**kwargs)
    except SpecError as e:
        raise _located(e, path, fields) from e.__cause__
    except (TypeError, ValueError) as e:
        raise SpecError(f"{path or 'spec'}: {e}") from e


@functools.lru_cache(maxsize=256)
def _init_fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]


@functools.lru_cache(maxsize=256)
def _type_hints(cls: type) -> dict[str, Any]:
    """``get_type_hints(cls)``, once per class: with string annotations it compiles and evaluates
    every field's annotation again on each call (~0.5 ms a spec section), and a class's hints do not
    change once they resolve. Callers only read the dict."""
    return get_type_hints(cls)


def join(path: str, key: str) -> str:
    """``path.key``, or ``key`` at the top level (``path`` empty).

        >>> join("sources[0]", "weight"), join("", "seed")
        ('sources[0].weight', 'seed')
    """
    return f"{path}.{key}" if path else key


def _located(err: SpecError, path: str, fields: Mapping[str, Any]) -> SpecError:
    """``err`` (raised by a dataclass's own checks) with ``path`` in front, unless it names it already:
    ``weight: ...`` becomes ``sources[0].weight: ...``, any other message ``sources[0]: ...``."""
    msg = str(err)
    if not path or msg.startswith(path):
        return err
    head = msg.split(":", 1)[0]
    if head.partition(".")[0].partition("=")[0].strip() in fields:
        return SpecError(f"{path}.{msg}")
    return SpecError(f"{path}: {msg}")


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if tp is bool:
        return "true | false"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        allowed = get_args(tp)
        if value in allowed:
            return value
        hint = close_match(str(value), [str(a) for a in allowed])
        raise SpecError(f"{path}: {value!r} is not allowed{hint} (allowed: {_type_name(tp)})")
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(get_args(tp)):
            return None
        if len(args) == 1:  # Optional[X]: X's own message is the clearest
            return _convert(args[0], value, path)
        errors: list[SpecError] = []
        for arg in get_args(tp):
            try:
                return _convert(arg, value, path)
            except SpecError as err:
                errors.append(err)
        # Prefer the message of a Literal mismatch: it carries the suggestion.
        hinted = [x for x in errors if "did you mean" in str(x)]
        if hinted:
            raise hinted[0]
        raise SpecError(f"{path}: {value!r} is not one of: {_type_name(tp)}")
    if tp is type(None):
        if value is None:
            return None
        raise SpecError(f"{path}: expected null, got {value!r}")
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)  # type: ignore[arg-type]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise SpecError(f"{path}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise SpecError(f"{path}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise SpecError(f"{path}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise SpecError(f"{path}: expected a string, got {value!r}")
    if origin in (tuple, Sequence, list, typing.Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise SpecError(f"{path}: expected a list, got {value!r}")
        item_tp = get_args(tp)[0] if get_args(tp) else Any
        return tuple(_convert(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping, typing.Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise SpecError(f"{path}: expected a mapping, got {value!r}")
        kv = get_args(tp)
        val_tp = kv[1] if len(kv) == 2 else Any
        return {str(k): _convert(val_tp, v, f"{path}.{k}") for k, v in value.items()}
    return value


def to_plain(obj: Any) -> Any:
    """Turn nested option dataclasses into plain JSON-ready data (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj
