"""``feedline.Loader``: iterate a spec's batches in-process, or a service's over the network.

    >>> loader = Loader("spec.yaml", rank=0, world_size=1)           # doctest: +SKIP
    >>> for batch in loader:                                        # doctest: +SKIP
    ...     train_step(batch)          # Mapping[str, numpy.ndarray]
    >>> state = loader.state_dict()    # JSON; Loader(spec, state=state) resumes exactly

In-process, a background thread runs the pipeline ``prefetch`` batches ahead; each batch travels
with the state after it, so :meth:`Loader.state_dict` always describes exactly what the caller
has received, however far prefetching ran. Iterating again continues where the last left off.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from feedline.batching.base import Batch
from feedline.batching.planner import slice_for_rank
from feedline.errors import SpecError
from feedline.pipeline import GlobalStream, Pipeline
from feedline.spec import Spec
from feedline.state import check_state, make_state

__all__ = ["Loader"]

_END = object()


def is_address(source: Any) -> bool:
    return isinstance(source, str) and source.startswith(("tcp://", "ipc://", "inproc://"))


class Loader:
    """Batches of one rank, from a spec (in-process) or a service address.

    Args:
        source: a spec (path, mapping or :class:`Spec`) or a service address ``tcp://host:port``.
        rank: this consumer's rank in ``[0, world_size)``.
        world_size: number of ranks sharing each global batch.
        state: a :meth:`state_dict` to resume from (any world size).
        stream: for a service with several streams, the stream name.
        prefetch: batches prepared ahead (default: the spec's ``prefetch``).
    """

    def __new__(cls, source: Any, *args: Any, **kwargs: Any) -> Any:
        if cls is Loader and is_address(source):
            from feedline.service.client import RemoteLoader

            return RemoteLoader(source, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, source: Spec | Mapping[str, Any] | str | os.PathLike[str], rank: int = 0, world_size: int = 1,
                 state: Mapping[str, Any] | str | None = None, *, stream: str = "train", prefetch: int | None = None) -> None:
        if not 0 <= rank < world_size:
            raise SpecError(f"rank {rank} is not in [0, world_size={world_size})")
        self.spec = Spec.load(source)  # type: ignore[arg-type]
        if self.spec.batching.batch_size % world_size:
            raise SpecError(f"batching.batch_size {self.spec.batching.batch_size} is not a multiple of world_size {world_size}")
        self.rank, self.world_size = rank, world_size
        self.pipeline = Pipeline(self.spec)
        self.spec_hash = self.spec.hash()
        self._global = check_state(state, self.spec_hash) if state is not None else {"step": 0, "pipeline": None}
        self.prefetch = prefetch or self.spec.prefetch
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue[Any] | None = None
        self._stop = threading.Event()
        self._finished = False

    # ----------------------------------------------------------------- iteration
    def _produce(self, q: queue.Queue[Any], stop: threading.Event, start: Mapping[str, Any]) -> None:
        try:
            it = iter(GlobalStream(self.pipeline, self.world_size))
            try:
                if start["pipeline"] is not None:
                    it.set_state(start)
                for _step, batch, st in it:
                    item = (slice_for_rank(batch, self.rank, self.world_size), st)
                    while not stop.is_set():
                        try:
                            q.put(item, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
            finally:
                it.close()
            q.put(_END)
        except BaseException as e:  # forwarded to the consumer
            q.put(e)

    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(target=self._produce, args=(self._queue, self._stop, dict(self._global)),
                                        name="feedline-loader", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[Batch]:
        if self._finished:
            return
        if self._thread is None:
            self._start()
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if item is _END:
                self._finished = True
                self._thread = None
                return
            if isinstance(item, BaseException):
                self._thread = None
                raise item
            batch, st = item
            self._global = st
            yield batch

    def __next__(self) -> Batch:
        return next(iter(self))

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The JSON state after the last batch this loader returned."""
        if self._global["pipeline"] is None:
            it = iter(GlobalStream(self.pipeline, self.world_size))
            try:
                self._global = it.get_state()
            finally:
                it.close()
        return make_state(self.spec_hash, self._global, self.world_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restart from ``state`` (the next batch is the one that followed it)."""
        self.close()
        self._global = check_state(state, self.spec_hash)
        self._finished = False

    def stats(self) -> dict[str, Any]:
        """What this loader has read so far: steps, rejected records by reason, realised mixture shares.

        Everything comes from the state, so the figures survive a resume.
        """
        from feedline.service.metrics import find_rejected, mixture_shares

        state = self.state_dict()
        rejected: dict[str, int] = {}
        find_rejected(state["pipeline"], rejected)
        return {"step": state["step"], "rejected": rejected, "mixture": mixture_shares(state["pipeline"])}

    @property
    def step(self) -> int:
        """Global steps received so far."""
        return int(self._global["step"] or 0)

    def close(self) -> None:
        """Stop the background thread. Idempotent."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=5)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)  # absent when __init__ refused the spec
        if stop is not None:
            stop.set()
