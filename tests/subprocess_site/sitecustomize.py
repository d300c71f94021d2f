"""Run at the start of every Python process the tests start (conftest.py puts this folder on ``PYTHONPATH``).

A process that imports torch, transformers, ray or jax gets the test processes' garbage-collector
thresholds (conftest.py) from that import on: a young collection every 100,000 allocations, not 700.
Importing torch and a transformers model made ~1,000 collections (1.0-1.2 CPU s of a 7 s import),
``ray.train.torch`` ~680 (0.7 of 4.3 s); with the thresholds 0.2-0.3 s. torchrun's agent and ranks,
Ray's workers and actors and the scripts the tests run are such processes. Others (``feedline serve``,
the CLI) keep Python's defaults, so the tests that bound a server's memory see what a user's server does.
Cycles are still collected, later. A ``sitecustomize`` further along ``sys.path`` is still run.
"""

from __future__ import annotations

import gc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

HEAVY = frozenset({"torch", "transformers", "ray", "jax"})


class _OnHeavyImport:
    """A meta-path finder that finds nothing: it raises the thresholds at the first heavy import."""

    done = False

    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> None:
        if not cls.done and name in HEAVY:
            cls.done = True
            gc.set_threshold(100_000, 50, 100)
        return None


sys.meta_path.insert(0, _OnHeavyImport)  # type: ignore[arg-type]


def _run_the_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != here])
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_run_the_next_sitecustomize()
