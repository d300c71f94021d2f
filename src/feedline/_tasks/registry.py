"""Task lookup by kind, including ``"package.module:Class"`` plug-ins.

    >>> task_class("clm").__name__
    'CausalLM'
"""

from __future__ import annotations

import importlib

from feedline._core.options import close_match
from feedline._core.static_imports import note_import
from feedline._tasks.base import Task
from feedline.errors import SpecError

__all__ = ["TASKS", "task_class", "task_options"]

TASKS: dict[str, str] = {
    "chat": "feedline._tasks.chat:Chat",
    "classify": "feedline._tasks.classify:Classify",
    "clm": "feedline._tasks.clm:CausalLM",
    "infer": "feedline._tasks.infer:Infer",
    "mlm": "feedline._tasks.mlm:MaskedLM",
    "sop": "feedline._tasks.sop:SentenceOrder",
    "span": "feedline._tasks.span:SpanCorruption",
}


def task_class(kind: str) -> type[Task]:
    """The task class for ``kind`` (a built-in name or ``module:Class``)."""
    target = TASKS.get(kind)
    if target is None and ":" not in kind:
        raise SpecError(f"task.kind: {kind!r} is not a task{close_match(kind, sorted(TASKS))} (tasks: {', '.join(sorted(TASKS))}, or 'package.module:Class')")
    module, _, name = (target or kind).partition(":")
    if target is None:
        note_import("task.kind", module, "a plug-in task's options are read from its class")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise SpecError(f"task.kind: cannot import {kind!r} ({e}); is the package installed and on sys.path?") from e
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise SpecError(f"task.kind: {kind!r} is not a feedline.Task subclass")
    return cls


def task_options(kind: str) -> type:
    """The options dataclass of a task kind."""
    return task_class(kind).Options
