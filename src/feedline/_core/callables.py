"""Python callables named by import path (``"package.module:function"``), and the name a callable hashes by.

Specs name user code by import path so that a spec file can hold it and every process (a
service, a Ray worker, a spawned pool) can import it again::

    >>> resolve("os.path:basename", "transforms[0].map")("/a/b.txt")
    'b.txt'
    >>> name_of(resolve("os.path:basename", "x"))
    'posixpath:basename'
"""

from __future__ import annotations

import importlib
import inspect
import os
import traceback
from collections.abc import Callable
from typing import Any

from feedline._core.options import close_match
from feedline.errors import SpecError, TransformError

__all__ = ["defined_at", "importable", "name_of", "raised_at", "resolve"]


def resolve(path: str, where: str) -> Callable[..., Any]:
    """Import ``package.module:attr`` (``attr`` may be dotted: ``Class.method``).

    Raises:
        SpecError: naming ``where``, when the path is malformed, the module cannot be imported,
            the attribute is missing or not callable.
        TransformError: the module raised something else than ``ImportError`` while imported
            (naming its file:line).
    """
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise SpecError(f"{where}: {path!r} is not an import path; write 'package.module:function' "
                        "(a function importable by every process that runs the pipeline)")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise SpecError(f"{where}: cannot import {module!r} ({e}); is its package installed or on PYTHONPATH?") from e
    except Exception as e:  # the module's own code failed: the user's to fix, named where it failed
        at = raised_at(e)
        raise TransformError(f"{where}: importing {module!r} raised {type(e).__name__}{f' at {at}' if at else ''}: {e}; "
                             "the module runs when the spec is loaded: make it import cleanly") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise SpecError(f"{where}: {module!r} has no {attr!r}{close_match(part, names)}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SpecError(f"{where}: {path!r} is a {type(obj).__name__}, not a callable")
    return obj  # type: ignore[no-any-return]


def name_of(fn: Any) -> str:
    """``module:qualname`` of a callable (or the import path a string already is).

    This is what a spec hashes for a callable: two lambdas of one module share a name, and a
    function whose body changes keeps its name (the same holds for an import path).
    """
    if isinstance(fn, str):
        return fn
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qual = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{qual}"


def importable(fn: Any) -> bool:
    """Whether ``fn`` is found again by its :func:`name_of` (so another process can import it)."""
    name = name_of(fn)
    if "<" in name:  # <lambda>, <locals>
        return False
    try:
        return resolve(name, "") is fn
    except SpecError:
        return False


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def defined_at(fn: Any) -> str:
    """``file:line`` where a callable's code starts (``""`` for a builtin or unknown).

        >>> defined_at(defined_at).endswith("callables.py:" + str(defined_at.__code__.co_firstlineno))
        True
    """
    target = inspect.unwrap(fn) if callable(fn) else fn
    call = next((c.__dict__["__call__"] for c in type(target).__mro__ if "__call__" in c.__dict__), None)
    code = getattr(target, "__code__", None) or getattr(call, "__code__", None)  # a function, or an object's __call__
    return f"{_shown(code.co_filename)}:{code.co_firstlineno}" if code is not None else ""


def raised_at(error: BaseException, fn: Any = None) -> str:
    """``file:line`` where ``error`` was raised: the innermost frame in ``fn``'s file when it has
    one (the user's line, not a library's below it), else the innermost frame; ``""`` if unknown."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    home = defined_at(fn).rpartition(":")[0] if fn is not None else ""
    own = [f for f in frames if home and _shown(f.filename) == home]
    frame = (own or frames)[-1]
    return f"{_shown(frame.filename)}:{frame.lineno}"
