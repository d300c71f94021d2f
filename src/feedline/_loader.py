"""``feedline.Loader``: iterate a spec's batches in-process, or a service's over the network.

    >>> loader = Loader("spec.yaml", rank=0, world_size=1)           # doctest: +SKIP
    >>> for batch in loader:                                        # doctest: +SKIP
    ...     train_step(batch)          # Mapping[str, numpy.ndarray]
    >>> state = loader.state_dict()    # JSON; Loader(spec, state=state) resumes exactly

In-process, a :class:`~feedline._core.prefetch.Prefetch` stage runs the rank's stream
(``GlobalStream`` then ``RankSlice``) ``prefetch`` batches ahead on a thread; each batch travels
with the state after it, so :meth:`Loader.state_dict` always describes exactly what the caller
has received, however far prefetching ran. Iterating again continues where the last left off.
``prefetch=0`` makes each batch in the caller's thread when it is asked for
(:class:`~feedline._core.inline.Inline`: no thread, no hand-off; same batches and states). That is
the default where the partitions run in worker processes (``parallel: processes``) that all start
at the first ask (without a warm start, or with a core for each worker): the workers already make
``parallel.prefetch`` batches ahead, and the caller's ``next()`` reads their pipes itself (one
thread hand-off and one queue wake-up fewer per batch); an explicit ``prefetch`` still puts the
composing stage on a thread.
"""

from __future__ import annotations

import importlib
import os
import sys
from abc import ABC
from collections.abc import Iterator, Mapping
from typing import Any

from feedline._batching.base import Batch
from feedline._batching.planner import RankSlice
from feedline._core.inline import Inline
from feedline._core.options import check_count
from feedline._core.prefetch import Prefetch
from feedline._partitions.processes import starts_together
from feedline._pipeline import GlobalStream, Pipeline
from feedline._spec import Spec
from feedline._state import check_state, filtered_in, find_rejected, make_state, mixture_shares
from feedline.errors import SpecError

__all__ = ["NO_LENGTH", "InProcessLoader", "Loader"]


#: What ``len()`` of a stream says: a stream's length is not known before it is read.
NO_LENGTH = ("object of type {} has no len(): a feedline stream does not know its length before it is read (records "
             "are rejected, split, packed); feedline.epoch_steps(spec) counts the global steps of an epoch exactly "
             "by running the pipeline once (feedline scan --steps SPEC prints it): pass it to max_steps or an LR "
             "schedule (docs/tasks.md, 'Epoch length')")

#: The loader class of a service address, by scheme (``tcp``, ``ipc``, ``inproc``), as ``"module:Class"``
#: (imported on first use, like reader formats). The package root installs the service client's:
#: the loader never imports the service, and ``import feedline`` does not load it.
TRANSPORTS: dict[str, str] = {}
_SCHEMES = ("tcp", "ipc", "inproc")


def register_transport(scheme: str, target: str) -> None:
    """Make ``Loader("scheme://...")`` build the class ``target`` (``"module:Class"``), an instance of :class:`Loader`."""
    TRANSPORTS[scheme] = target


def is_address(source: Any) -> bool:
    return isinstance(source, str) and "://" in source and source.partition("://")[0] in (*_SCHEMES, *TRANSPORTS)


def _transport(scheme: str, source: str) -> type:
    target = TRANSPORTS.get(scheme)
    if target is None:
        raise SpecError(f"{source}: no transport for {scheme}:// addresses is installed; "
                        "import feedline (which installs the service client)")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def _workers_run_ahead(spec: Spec) -> bool:
    """Whether the spec's partitions all run in worker processes from the first ask, which make
    batches ahead themselves: the caller's thread composes (no thread here). Not where a warm start
    makes step 1 here first: the workers start at the next ask, which a thread here makes at once."""
    return spec.parallel.resolve(spec.partitions) == "processes" and starts_together(spec.parallel, spec.partitions)


class Loader(ABC):
    """Batches of one rank, from a spec (in-process) or a service address: the factory and the interface.

    ``Loader(spec, ...)`` builds an :class:`InProcessLoader`; ``Loader("tcp://host:port", ...)``
    a :class:`~feedline._service.client.RemoteLoader`. Both are instances of :class:`Loader`::

        >>> isinstance(Loader({"sources": ["c.jsonl"], "tokenizer": "t.json"}), Loader)  # doctest: +SKIP
        True

    Args:
        source: a spec (path, mapping or :class:`Spec`) or a service address ``tcp://host:port``.
        rank: this consumer's rank in ``[0, world_size)``.
        world_size: number of ranks sharing each global batch.
        state: a :meth:`state_dict` to resume from (any world size).
        stream: for a service with several streams, the stream name (refused in-process).
        prefetch: batches prepared ahead (default: the spec's ``prefetch``; 0 where the partitions run in
            worker processes, which make batches ahead themselves); in-process, ``0`` makes
            each batch in the caller's thread when it is asked for (no background thread).
    """

    rank: int
    world_size: int

    def __new__(cls, source: Any, *args: Any, **kwargs: Any) -> Any:
        if cls is Loader:
            if is_address(source):
                return _transport(source.partition("://")[0], source)(source, *args, **kwargs)
            cls = InProcessLoader
        return super().__new__(cls)

    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        # A transport's class is a Loader too; it is only known once its module is loaded (an
        # instance cannot exist before), so the interface never imports it.
        if cls is Loader:
            for target in set(TRANSPORTS.values()):
                module, _, name = target.partition(":")
                if other is getattr(sys.modules.get(module), name, None):
                    return True
        return NotImplemented

    # The interface. Not abstract methods, so that ``Loader(...)`` type-checks as the factory it is.
    def __iter__(self) -> Iterator[Batch]:
        """Batches (``Mapping[str, numpy.ndarray]``) of this rank, from the current position."""
        raise NotImplementedError

    def __next__(self) -> Batch:
        return next(iter(self))

    def __len__(self) -> int:
        """Not known up front: raises :class:`TypeError` (as before) naming :func:`feedline.epoch_steps`."""
        raise TypeError(NO_LENGTH.format(type(self).__name__))

    def __bool__(self) -> bool:  # never ask __len__
        return True

    def state_dict(self) -> dict[str, Any]:
        """The JSON state after the last batch this loader returned."""
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restart from ``state`` (the next batch is the one that followed it)."""
        raise NotImplementedError

    @property
    def step(self) -> int:
        """Global steps received so far."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop background work. Idempotent."""
        raise NotImplementedError

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessLoader(Loader):
    """A :class:`Loader` that runs the pipeline in this process (see the module docstring)."""

    def __init__(self, source: Spec | Mapping[str, Any] | str | os.PathLike[str], rank: int = 0, world_size: int = 1,
                 state: Mapping[str, Any] | str | None = None, *, stream: str | None = None, prefetch: int | None = None) -> None:
        if stream is not None:
            raise SpecError(f"stream={stream!r} names a stream of a feedline service, but this Loader runs its spec in-process; "
                            "pass the service address (tcp://host:port) to read a stream, or drop stream=")
        if not 0 <= rank < world_size:
            raise SpecError(f"rank {rank} is not in [0, world_size={world_size})")
        self.spec = Spec.load(source)  # type: ignore[arg-type]
        if self.spec.batching.batch_size % world_size:
            raise SpecError(f"batching.batch_size {self.spec.batching.batch_size} is not a multiple of world_size {world_size}")
        self.rank, self.world_size = rank, world_size
        self.pipeline = Pipeline(self.spec)
        self.spec_hash = self.spec.hash()
        if prefetch is None:
            prefetch = 0 if _workers_run_ahead(self.spec) else self.spec.prefetch
        self.prefetch = check_count(prefetch, "prefetch", low=0)
        self._stage: Prefetch | Inline = (Prefetch(self._rank_stream, self.prefetch, name="feedline-loader") if self.prefetch
                                          else Inline(self._rank_stream))
        if state is not None:
            self._stage.set_state(check_state(state, self.spec.accepted_hashes(), self.spec.partitions))

    def _rank_stream(self) -> RankSlice:
        return RankSlice(iter(GlobalStream(self.pipeline, self.world_size)), self.rank, self.world_size)

    # ----------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Batch]:
        for batch, _state in self._stage:
            yield batch

    def __next__(self) -> Batch:
        return next(self._stage)[0]  # type: ignore[no-any-return]

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The JSON state after the last batch this loader returned."""
        return make_state(self.spec_hash, self._stage.get_state(), self.world_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restart from ``state`` (the next batch is the one that followed it)."""
        self._stage.set_state(check_state(state, self.spec.accepted_hashes(), self.spec.partitions))

    def _state_snapshot(self) -> dict[str, Any]:
        """:meth:`state_dict` with its deferred parts not yet computed (for a stage that takes the
        state after every batch: :class:`~feedline._adapters.common.LoaderStage`)."""
        return make_state(self.spec_hash, self._stage.snapshot(), self.world_size)

    def stats(self) -> dict[str, Any]:
        """What this loader has read so far: steps, rejected records by reason, records dropped by
        ``filter`` transforms (not rejections), realised mixture shares.

        Everything comes from the state, so the figures survive a resume.
        """
        state = self.state_dict()
        rejected: dict[str, int] = {}
        find_rejected(state["pipeline"], rejected)
        return {"step": state["step"], "rejected": rejected, "filtered": filtered_in(state["pipeline"]),
                "mixture": mixture_shares(state["pipeline"])}

    @property
    def step(self) -> int:
        """Global steps received so far (read off the state's snapshot: nothing else of it is computed)."""
        return int(self._stage.snapshot()["step"] or 0)

    def close(self) -> None:
        """Stop the background thread and close the pipeline. Idempotent; iterating again continues."""
        self._stage.close()

    def __del__(self) -> None:
        stage = getattr(self, "_stage", None)  # absent when __init__ refused the spec
        if isinstance(stage, Prefetch):
            stage._stop.set()
