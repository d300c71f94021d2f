"""Heavy optional libraries, imported by the tests that use them rather than at collection.

Every pytest-xdist worker collects every test module. Module-level imports of torch, transformers, accelerate,
datasets (with pandas and jax), ray, moto, s3fs, aiohttp, sentencepiece and fastokens cost about 6 of the 7 CPU s a
worker spent collecting, yet each library serves the tests of one or two xdist groups, run by one worker.

``torch = lazy("torch")`` stands for the module and imports it at the first public attribute access (names that start
with ``_``, which pytest probes while collecting, raise ``AttributeError`` until then). ``needs("torch")`` is the mark
that skips a module's tests where the extra is not installed, with the reason ``pytest.importorskip`` gave.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from typing import Any

import pytest


class _Lazy(types.ModuleType):
    """A stand-in for a module, imported at the first public attribute read."""

    def _load(self) -> types.ModuleType:
        module = self.__dict__.get("_module")
        if module is None:
            module = self.__dict__["_module"] = importlib.import_module(self.__name__)
        return module

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_") and "_module" not in self.__dict__:
            raise AttributeError(f"{self.__name__!r} is not imported yet (lazy); {attr!r} does not import it")
        return getattr(self._load(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        # monkeypatch.setattr(proxy, ...) would read the old value from the proxy's __dict__ and so delete
        # the module's attribute when it undoes: patch the module itself
        raise TypeError(f"{self.__name__!r} is a lazy stand-in: import the module in the test to patch it")

    def __delattr__(self, attr: str) -> None:
        raise TypeError(f"{self.__name__!r} is a lazy stand-in: import the module in the test to patch it")

    def __dir__(self) -> list[str]:
        module = self.__dict__.get("_module")
        return dir(module) if module is not None else []


def lazy(name: str) -> Any:
    """The module ``name``, imported when a test first reads one of its attributes (``torch.tensor``)."""
    return _Lazy(name)


def installed(name: str) -> bool:
    """Whether ``name`` (a top-level module or a dotted one) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:   # a dotted name whose parent is absent or hidden (sys.modules[parent] = None)
        return False


def needs(*names: str, reason: str | None = None) -> pytest.MarkDecorator:
    """Skip where any of ``names`` is not installed, as a module-level ``pytest.importorskip`` did."""
    missing = [n for n in names if not installed(n)]
    why = reason or (f"could not import {missing[0]!r}: No module named {missing[0]!r}" if missing else "")
    return pytest.mark.skipif(bool(missing), reason=why)
