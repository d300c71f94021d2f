"""The NLP task library: each task turns records into model-ready examples (one module per task)."""

from feedline.tasks.base import Task, TaskContext

__all__ = ["Task", "TaskContext"]
