"""Errors that cross from a worker process (or a Ray actor) to the caller, with their tracebacks.

Pickling an exception keeps its type and arguments but drops its traceback and its cause, so a
transform's ``1/0`` in a worker used to arrive showing only the parent's frames. The worker sends
the error with its formatted traceback (:func:`portable`, the whole chain: the user's function and
line, and the error it was raised from), and the caller raises it with a :class:`RemoteTraceback`
as its ``__cause__`` (:func:`with_remote`), as :mod:`concurrent.futures` does::

    feedline._partitions.remote.RemoteTraceback:
    Traceback (most recent call last):
      File "/home/me/clean.py", line 12, in strip_html
        return {**rec, "text": html(rec["body"])}
    KeyError: 'body'
    ...
    The above exception was the direct cause of the following exception:
    feedline.errors.TransformError: data/a.jsonl:7: transforms[0] (map clean:strip_html, /home/me/clean.py:11) raised KeyError at /home/me/clean.py:12: 'body'; ...

``SystemExit`` and ``KeyboardInterrupt`` raised by user code in a worker (which ignores Ctrl-C:
its parent stops it) would end the worker, which would be restarted and fail again; they travel
as a :class:`~feedline.errors.FeedlineError` naming them instead, so the stream fails once, at once.

    >>> e, tb = portable(_raised(ZeroDivisionError("division by zero")))
    >>> type(with_remote(e, tb).__cause__).__name__, "in _raised" in tb
    ('RemoteTraceback', True)
"""

from __future__ import annotations

import pickle
import traceback

from feedline.errors import FeedlineError

__all__ = ["RemoteTraceback", "portable", "with_remote"]


class RemoteTraceback(Exception):
    """The formatted traceback of an error raised in another process (its ``str``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def portable(error: BaseException) -> tuple[BaseException, str]:
    """``error`` ready to be pickled to the caller, and its formatted traceback (with its chain).

    The error itself when it survives pickling, else a :class:`FeedlineError` with its text; a
    ``SystemExit``/``KeyboardInterrupt`` (user code's, see the module docstring) a FeedlineError naming it.
    """
    tb = "".join(traceback.format_exception(error))
    if not isinstance(error, Exception):
        what = f"{type(error).__name__}({error})" if str(error) else type(error).__name__
        return FeedlineError(f"a partition's pipeline raised {what} in its worker process (a transform, a plug-in "
                             "source or task called sys.exit or raised it; it must raise an exception instead): the "
                             "stream stops, without restarting the worker (its traceback is the cause)"), tb
    try:
        pickle.loads(pickle.dumps(error))
        return error, tb
    except Exception:
        return FeedlineError(f"{type(error).__name__}: {error}"), tb


def with_remote(error: BaseException, tb: str) -> BaseException:
    """``error`` with the remote traceback ``tb`` as its cause (set once: raising it again keeps it)."""
    if tb and not isinstance(error.__cause__, RemoteTraceback):
        error.__cause__ = RemoteTraceback(tb)
    return error


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as e:
        return e
