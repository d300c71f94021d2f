"""feedline: a streaming data loader for NLP training that runs independently of the model.

    >>> import feedline
    >>> loader = feedline.Loader("spec.yaml")                 # doctest: +SKIP
    >>> for batch in loader: ...                              # doctest: +SKIP
    >>> state = loader.state_dict()                           # doctest: +SKIP
"""

from feedline import _spec
from feedline._batching.registry import batcher_class as _batcher_class
from feedline._core.record import Example, Record, Rejection
from feedline._hf_datasets import interleave_datasets, load_dataset
from feedline._loader import Loader
from feedline._loader import register_transport as _register_transport
from feedline._partitions.placement import register_placement as _register_placement
from feedline._partitions.processes import ProcessPlacement as _ProcessPlacement
from feedline._pipeline import Pipeline
from feedline._pipeline import register_engine as _register_engine
from feedline._ray.map import ray_engine as _ray_engine
from feedline._ray.placement import RayPlacement as _RayPlacement
from feedline._records import records
from feedline._sources.reader import FORMATS as _FORMATS
from feedline._spec import Spec
from feedline._tasks.base import Task, TaskContext, TaskOutput
from feedline._tasks.registry import task_class as _task_class
from feedline._tokenize import Tokenizer, load_tokenizer
from feedline._tools.steps import epoch_steps
from feedline.errors import (
    AuthError,
    FeedlineError,
    MissingDependency,
    ProtocolError,
    RecordError,
    SourceError,
    SpecError,
    StateError,
    TaskError,
    TokenizerError,
    TransformError,
    TransportError,
    TransportTimeout,
)

# The composition root: the spec finds tasks and batchers through registries handed to it here.
_spec.use_registry(_spec.Registry(task=_task_class, batcher=_batcher_class, formats=lambda: _FORMATS))
# ... and the composing stage finds where partitions run by name (threads is the stage's own).
_register_placement("processes", _ProcessPlacement)
_register_placement("ray", _RayPlacement)
_register_engine("ray", _ray_engine)
# A service address gives the service's client (a Loader by registration; loaded on first use).
for _scheme in ("tcp", "ipc", "inproc"):
    _register_transport(_scheme, "feedline._service.client:RemoteLoader")

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "Example",
    "FeedlineError",
    "Loader",
    "MissingDependency",
    "Pipeline",
    "ProtocolError",
    "Record",
    "RecordError",
    "Rejection",
    "SourceError",
    "Spec",
    "SpecError",
    "StateError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskOutput",
    "Tokenizer",
    "TokenizerError",
    "TransformError",
    "TransportError",
    "TransportTimeout",
    "epoch_steps",
    "interleave_datasets",
    "load_dataset",
    "load_tokenizer",
    "records",
]
