"""The plug-in surface for writing a task (also importable from ``feedline``).

A task turns a chunk of :class:`Record` objects into :class:`Example` objects (or a
:class:`Rejection` per record it cannot use); ``docs/tasks.md`` shows how to register one::

    from feedline.tasks import Task

    class Upper(Task):
        kind = "upper"

        def process(self, records):
            ids = self.tok.encode_batch([r.data["text"].upper() for r in records])
            return [[self.example(r, 0, input_ids=i, labels=i)] for r, i in zip(records, ids)]
"""

from feedline._core.record import Example, Record, Rejection
from feedline._tasks.base import Task, TaskContext, TaskOutput

__all__ = ["Example", "Record", "Rejection", "Task", "TaskContext", "TaskOutput"]
