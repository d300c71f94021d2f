"""Run at the start of every Python process the tests start (conftest.py puts this folder on ``PYTHONPATH``).

Such a process collects cyclic garbage with the test processes' thresholds (conftest.py): a young
collection every 100,000 allocations, not 700. Importing torch and a transformers model made ~1,000
collections (1.0-1.2 CPU s of a 7 s import), ``ray.train.torch`` ~680 (0.7 of 4.3 s), ``import
feedline`` ~70; with the thresholds 0.2-0.3 s, 0.2 s and none. torchrun's agent and ranks, Ray's
workers and actors, the CLI and the scripts the tests run are such processes. ``feedline serve``
keeps Python's defaults, so the tests that bound a server's memory see what a user's server does.
Cycles are still collected, later. A ``sitecustomize`` further along ``sys.path`` is still run.
"""

from __future__ import annotations

import gc
import importlib.machinery
import importlib.util
import os
import sys


def _a_server() -> bool:
    """``feedline serve`` (``python -m feedline serve``, the ``feedline`` script): the command line
    as given (``sys.argv`` is not set yet)."""
    return "serve" in getattr(sys, "orig_argv", ())


def _run_the_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != here])
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if not _a_server():
    gc.set_threshold(100_000, 50, 100)
_run_the_next_sitecustomize()
