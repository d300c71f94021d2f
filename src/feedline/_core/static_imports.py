"""Checking an import path (``package.module:function``) without running the module, for ``spec --check``.

A spec is code: loading it imports the modules its transforms, plug-in tasks and sources name,
which runs their top-level code. ``feedline spec --check`` validates without that where Python
allows it: inside :func:`without_imports`, :func:`locate` finds the module with the import
system's finders (never executing it, nor its parent packages) and parses its source with
:mod:`ast` to see that the name is defined at its top level. Where that cannot tell (a built-in or
extension module, no source, ``from x import *``, a module ``__getattr__``) or where the spec
needs the object itself (a plug-in task's options), the module is imported and a note says so.

    >>> with without_imports() as notes:
    ...     locate("json.decoder:JSONDecoder", "transforms[0].map")
    >>> notes
    []
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from typing import Any

from feedline._core.options import close_match
from feedline.errors import SpecError

__all__ = ["locate", "note_import", "without_imports", "without_imports_active"]

_NOTES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("feedline_static_notes", default=None)


@contextlib.contextmanager
def without_imports() -> Iterator[list[str]]:
    """Within: spec loading checks import paths with :func:`locate`; yields the notes of what it had to import."""
    notes: list[str] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def without_imports_active() -> bool:
    return _NOTES.get() is not None


def note_import(where: str, module: str, why: str) -> None:
    """Record, inside :func:`without_imports`, that ``module`` was imported (its top-level code ran) and why."""
    notes = _NOTES.get()
    if notes is not None and module not in sys.modules:
        notes.append(f"{where}: imported {module!r} to check it ({why}); its top-level code ran")


def locate(path: str, where: str) -> None:
    """Check ``package.module:attr`` without executing the module where its source can tell.

    Raises:
        SpecError: naming ``where``: the path is malformed, the module is not found, or its source
            does not define the name at top level.
    """
    from feedline._core.callables import resolve

    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        resolve(path, where)   # raises its message for a malformed path
    name = attr.split(".")[0]
    if module in sys.modules:   # imported already: looking costs nothing
        resolve(path, where)
        return
    spec = _find(module, where)
    source = _source(spec)
    if source is None:
        kind = "a built-in module" if spec.origin in ("built-in", "frozen") else \
            "an extension module" if isinstance(spec.loader, importlib.machinery.ExtensionFileLoader) else \
            "a module without Python source"
        note_import(where, module, kind)
        resolve(path, where)
        return
    try:
        tree = ast.parse(source, filename=spec.origin or module)
    except (SyntaxError, ValueError) as e:
        raise SpecError(f"{where}: {module!r} ({spec.origin}) does not parse: {e}") from None
    names, opaque = _top_level_names(tree)
    if name in names:
        return
    if opaque:
        note_import(where, module, "its names come from 'import *' or a module __getattr__")
        resolve(path, where)
        return
    public = sorted(n for n in names if not n.startswith("_"))
    raise SpecError(f"{where}: {module!r} ({spec.origin}) defines no {name!r} at its top level"
                    f"{close_match(name, public)}")


def _find(module: str, where: str) -> Any:
    """The module's spec, found part by part so that no parent package is executed."""
    parts = module.split(".")
    spec: Any = None
    for i in range(len(parts)):
        full = ".".join(parts[:i + 1])
        try:
            if full in sys.modules:
                spec = getattr(sys.modules[full], "__spec__", None) or importlib.util.find_spec(full)
            elif i == 0:
                spec = importlib.util.find_spec(full)
            else:
                locations = spec.submodule_search_locations if spec is not None else None
                spec = importlib.machinery.PathFinder.find_spec(full, locations) if locations is not None else None
        except (ImportError, ValueError) as e:
            raise SpecError(f"{where}: cannot find module {module!r} ({e}); is its package installed "
                            "or on PYTHONPATH?") from None
        if spec is None:
            raise SpecError(f"{where}: cannot find module {module!r}"
                            + (f" ({'.'.join(parts[:i])!r} is not a package)" if i else "")
                            + "; is its package installed or on PYTHONPATH?")
    return spec


def _source(spec: Any) -> str | None:
    loader = spec.loader
    if not isinstance(loader, importlib.machinery.SourceFileLoader) or not spec.origin:
        return None
    try:
        return loader.get_source(spec.name)  # type: ignore[no-any-return]
    except (ImportError, OSError):
        return None


def _top_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Names bound at a module's top level (in ``if``/``try``/``with`` blocks too), and whether some
    are unknowable from the source (``from x import *``, a module ``__getattr__``)."""
    names: set[str] = set()
    opaque = False
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            opaque |= node.name == "__getattr__"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    opaque = True
                else:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody"):
                stack.extend(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                stack.extend(handler.body)
    return names, opaque
