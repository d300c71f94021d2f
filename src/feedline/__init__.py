"""feedline: a streaming data loader for NLP training that runs independently of the model.

    >>> import feedline
    >>> loader = feedline.Loader("spec.yaml")                 # doctest: +SKIP
    >>> for batch in loader: ...                              # doctest: +SKIP
    >>> state = loader.state_dict()                           # doctest: +SKIP
"""

from feedline.core.record import Example, Record, Rejection
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
    TransportError,
    TransportTimeout,
)
from feedline.loader import Loader
from feedline.pipeline import Pipeline
from feedline.records import records
from feedline.spec import Spec
from feedline.tasks.base import Task, TaskContext, TaskOutput
from feedline.tokenize import Tokenizer, load_tokenizer

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
    "TransportError",
    "TransportTimeout",
    "load_tokenizer",
    "records",
]
