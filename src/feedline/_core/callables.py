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
from collections.abc import Callable
from typing import Any

from feedline._core.options import close_match
from feedline.errors import SpecError

__all__ = ["importable", "name_of", "resolve"]


def resolve(path: str, where: str) -> Callable[..., Any]:
    """Import ``package.module:attr`` (``attr`` may be dotted: ``Class.method``).

    Raises:
        SpecError: naming ``where``, when the path is malformed, the module cannot be imported,
            the attribute is missing or not callable.
    """
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise SpecError(f"{where}: {path!r} is not an import path; write 'package.module:function' "
                        "(a function importable by every process that runs the pipeline)")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise SpecError(f"{where}: cannot import {module!r} ({e}); is its package installed or on PYTHONPATH?") from e
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
