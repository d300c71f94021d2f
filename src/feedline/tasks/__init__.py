"""The NLP task library: each task turns records into model-ready examples (one module per task).

The plug-in surface lives here (and in ``feedline``)::

    from feedline.tasks import Example, Record, Rejection, Task, TaskOutput
"""

from feedline.core.record import Example, Record, Rejection
from feedline.tasks.base import Task, TaskContext, TaskOutput

__all__ = ["Example", "Record", "Rejection", "Task", "TaskContext", "TaskOutput"]
