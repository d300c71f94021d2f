"""The one exception tree of feedline.

Every error that feedline raises on purpose derives from :class:`FeedlineError`, so
``except feedline.FeedlineError`` catches them all. Messages name what was seen, where
(file, line, key path) and what to do about it::

    FeedlineError
    ├── SpecError              a spec key is unknown, missing, or has a bad value
    ├── SourceError            a file, URL or dataset cannot be opened or listed
    │   └── RecordError        one record is malformed (raised only with on_error: raise)
    ├── TokenizerError         a tokenizer cannot be loaded or lacks a needed token
    │   └── TokenizerDivergence  a faster encoder gave other ids than tokenizers on the data
    ├── TaskError              a task cannot build an example from a record
    ├── TransformError         a map/filter transform raised on a record (names its file:line)
    ├── StateError             a resume state is malformed, of another version or spec
    ├── TransportError         the loader service or its connection failed
    │   ├── ProtocolError      a peer spoke a different protocol version or sent garbage
    │   ├── AuthError          credentials were missing or refused
    │   └── TransportTimeout   no answer within the configured time
    └── MissingDependency      an optional extra (torch, jax, ray, datasets) is not installed

The command line maps ``SpecError``/``MissingDependency`` to exit code 2 (bad usage) and
every other ``FeedlineError`` to exit code 1, with the message as a one-line reason.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "FeedlineError",
    "MissingDependency",
    "ProtocolError",
    "RecordError",
    "SourceError",
    "SpecError",
    "StateError",
    "TaskError",
    "TokenizerDivergence",
    "TokenizerError",
    "TransformError",
    "TransportError",
    "TransportTimeout",
]


class FeedlineError(Exception):
    """Base class of every error feedline raises on purpose."""


class SpecError(FeedlineError, ValueError):
    """A spec is invalid: the message names the key path, the value seen and what is allowed."""


class SourceError(FeedlineError):
    """A source cannot be opened, listed or read as a whole."""


class RecordError(SourceError):
    """One record is malformed; raised only when ``on_error: raise``.

    Attributes:
        path: the file (or URL) holding the record.
        line: 1-based line number where known, else ``None``.
        reason: a short machine-readable reason such as ``"bad_json"``.
    """

    def __init__(self, message: str, *, path: str = "", line: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.reason = reason


class TokenizerError(FeedlineError):
    """A tokenizer cannot be loaded, or lacks a token the task needs."""


class TokenizerDivergence(TokenizerError):
    """A fast encoder (fastokens, the word cache) gave other ids than ``tokenizers`` for a text of the data.

    Raised with ``backend: fastokens`` or ``wordcache`` at any difference, and with ``backend: auto`` when a spot
    check after the verified start of the data finds one; the message quotes the text.
    """


class TaskError(FeedlineError):
    """A task is misconfigured or cannot build an example."""


class TransformError(FeedlineError):
    """A ``map`` or ``filter`` transform raised, or returned something else than it must, on a record.

    Attributes:
        path: the file (or URL) holding the record.
        line: its 1-based line or row, when known.
    """

    def __init__(self, message: str, *, path: str = "", line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class StateError(FeedlineError):
    """A resume state is malformed, of an unsupported version, or from another spec."""


class TransportError(FeedlineError):
    """The loader service or the connection to it failed."""


class ProtocolError(TransportError):
    """A peer sent a message of another protocol version, or one that cannot be parsed."""


class AuthError(TransportError):
    """Credentials were missing, wrong, or refused by the server."""


class TransportTimeout(TransportError, TimeoutError):
    """No answer arrived within the configured time."""


class MissingDependency(FeedlineError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

