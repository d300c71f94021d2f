"""The process's one fork server: what it imports before it forks, and the context that starts it.

Worker processes (partition workers, the Wikipedia parse pool) start from ``forkserver`` where
the platform has it, ``spawn`` elsewhere; neither forks the parent, which holds threads and Rayon
pools. A fork of a server that already imported numpy, pyarrow and the tokenizers saves most of a
fresh interpreter's imports, and one that also imported feedline saves the rest (``import
feedline`` alone is about 0.6 CPU s a worker).

A process has one fork server, and it heeds its preloads only when it starts, so every part of
feedline that starts processes takes its context from :func:`context`: whichever starts first,
the server preloads the same modules.

feedline itself is preloaded only where the server would import *this* copy. The server imports
with the interpreter's default ``sys.path`` (the working directory, ``PYTHONPATH``, the installed
packages), not the parent's (CPython 3.10-3.13): a script that put a checkout on ``sys.path``
beside an installed feedline would otherwise get workers running the installed one. One
interpreter started once per process (``find_spec``, no import: ~30 ms) tells which copy that is.

Example::

    >>> from feedline._core import forkserver
    >>> forkserver.context().get_start_method() in ("forkserver", "spawn")
    True
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import subprocess
import sys
from multiprocessing import spawn, util
from multiprocessing.context import BaseContext
from pathlib import Path

__all__ = ["PRELOAD", "context", "preload_own", "preloads", "same_feedline"]

#: Third-party modules the fork server imports before it forks, those of them this process has imported.
PRELOAD = ("numpy", "pyarrow", "pyarrow.parquet", "tokenizers", "fastokens", "zstandard", "orjson", "msgpack",
           "yaml", "sentencepiece")
#: feedline's modules a worker needs (filled by the layers that start processes), preloaded where the server's
#: feedline is this one.
_OWN: list[str] = []
_FEEDLINE = Path(__file__).resolve().parents[1] / "__init__.py"
_FIND = "import importlib.util as u; s = u.find_spec('feedline'); print(s.origin if s and s.origin else '')"


def preload_own(*modules: str) -> None:
    """Register feedline modules that workers import (a layer that starts processes calls this at import)."""
    _OWN.extend(m for m in modules if m not in _OWN)


@functools.lru_cache(maxsize=1)
def same_feedline() -> bool:
    """Whether the fork server, on the interpreter's default path, would import this copy of feedline."""
    try:
        out = subprocess.run([spawn.get_executable(), *util._args_from_interpreter_flags(),  # type: ignore[attr-defined]
                              "-c", _FIND],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        return bool(out) and os.path.samefile(out, _FEEDLINE)
    except (OSError, subprocess.SubprocessError):  # cannot tell: leave feedline to each worker
        return False


def preloads() -> list[str]:
    """The modules the fork server imports: the third-party ones this process has imported, and
    feedline's own where :func:`same_feedline`."""
    third = [m for m in PRELOAD if m in sys.modules]
    return third + (list(_OWN) if _OWN and same_feedline() else [])


def context() -> BaseContext:
    """``forkserver`` (preloading :func:`preloads`) where the platform has it, else ``spawn``."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(preloads())  # heeded when the server starts (the first process started)
        return ctx
    return multiprocessing.get_context("spawn")
