"""PyTorch adapter: feedline batches as dicts of torch tensors, staged ahead on the device.

    >>> from feedline.torch import TorchLoader
    >>> loader = TorchLoader("spec.yaml", device="cuda")          # doctest: +SKIP
    >>> for batch in loader:                                     # doctest: +SKIP
    ...     loss = model(**batch).loss                           # tensors already on the GPU
    >>> torch.save({"data": loader.state_dict()}, "ckpt.pt")     # doctest: +SKIP

Data path, one arrow per thread (:mod:`feedline._adapters.staging`)::

    feedline.Loader ──► Prefetch thread: numpy → torch, int64 cast into a reused pinned buffer,
                        H2D copy on a side stream, packed layout, copy waited for ──► queue[prefetch]
                    ──► caller: record_stream, the slot freed ──► step

The caller's ``next()`` only takes a staged batch from the queue and, with CUDA, marks the tensors
as used by its stream: microseconds, whatever the batch's size. It makes no call that lets go of
the GIL, and the feeder refills the slot only after ``next()`` returns (``Prefetch(hold=True)``),
so the caller never waits for the feeder's work inside ``next()``. The
feeder thread reads the state after each batch together with the batch, so
:meth:`TorchLoader.state_dict` names exactly the batches the caller has received, however far
the feeder and the device copies ran ahead. Without CUDA the batches are those of
:func:`to_torch` (zero copy where numpy allows), as always.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) or an initialised ``torch.distributed`` group,
rank and world size come from there, for in-process and remote sources alike.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from feedline._adapters.common import LoaderStage, is_loader, resolve_loader, resolve_rank
from feedline._adapters.hf import PackedLayout, PackedMode
from feedline._adapters.hf_cache import trainer_model, watch_cache
from feedline._adapters.staging import Copy, Stager, to_torch
from feedline._core.deferred import materialize
from feedline._core.prefetch import Prefetch
from feedline._loader import NO_LENGTH
from feedline.errors import FeedlineError, MissingDependency

try:
    import torch
    from torch.utils.data import IterableDataset
except ImportError as e:  # pragma: no cover - depends on the environment
    raise MissingDependency("feedline.torch needs PyTorch; install it with: pip install 'feedline[torch]'") from e

__all__ = ["TorchBatch", "TorchLoader", "passthrough_collate", "to_torch"]

log = logging.getLogger("feedline.torch")

TorchBatch = dict[str, torch.Tensor]
_END = object()


def passthrough_collate(items: Sequence[TorchBatch]) -> TorchBatch:
    """``data_collator`` for the HF ``Trainer``: the loader already yields whole batches.

    Use it with ``per_device_train_batch_size=1``::

        Trainer(model, TrainingArguments(..., per_device_train_batch_size=1, max_steps=N),
                train_dataset=TorchLoader(spec), data_collator=passthrough_collate)
    """
    if len(items) != 1:
        raise FeedlineError(f"passthrough_collate got {len(items)} batches at once; set per_device_train_batch_size=1 "
                            "(each TorchLoader item is already a full batch of the spec's batching.batch_size / world size rows)")
    return items[0]


class TorchLoader(IterableDataset):  # type: ignore[type-arg]
    """Batches of one rank as dicts of torch tensors; an ``IterableDataset`` with resumable state.

    Args:
        source: a spec (path, mapping or :class:`~feedline._spec.Spec`), a service address
            (``tcp://host:port``), or a built :class:`feedline.Loader` (its rank is used).
        device: where tensors go (``"cuda"``, ``"cuda:1"``, ``torch.device``); ``None`` keeps
            them on the CPU.
        pin_memory: stage batches in page-locked host buffers, reused once their copy is done
            (only with a CUDA device).
        prefetch: batches converted ahead on a background thread and, with CUDA, copied to the
            device ahead on a side stream from that thread; ``0`` converts synchronously.
        rank, world_size: override the environment (``RANK``/``WORLD_SIZE``) and
            ``torch.distributed``.
        state: a :meth:`state_dict` to resume from.
        stream: the service stream name (remote sources; default ``train``).
        int64: cast integer fields to ``torch.int64``.
        packed: how packed batches (``pack``/``concat``) reach the model: ``position_ids`` (default:
            no 2-D mask, so Hugging Face models keep documents apart), ``mask4d``, ``flat``, ``keep``,
            or a :class:`~feedline._adapters.hf.PackedLayout` (see :mod:`feedline._adapters.hf`).
        model: the Hugging Face model the batches feed (found on its own under the HF ``Trainer``):
            at the first packed batch, its next forward call is checked once, and one run with its
            cache on (which mixes a row's documents) is logged with the fix
            (:mod:`feedline._adapters.hf_cache`).

    Example:
        >>> loader = TorchLoader({"sources": ["c.jsonl"], "tokenizer": "tok.json"})  # doctest: +SKIP
        >>> batch = next(iter(loader)); batch["input_ids"].shape                     # doctest: +SKIP
        torch.Size([8, 117])
    """

    def __init__(self, source: Any, device: str | torch.device | None = None, pin_memory: bool = True,
                 prefetch: int = 2, *, rank: int | None = None, world_size: int | None = None,
                 state: Mapping[str, Any] | None = None, stream: str | None = None, int64: bool = True,
                 packed: PackedMode | PackedLayout = "position_ids", model: Any = None) -> None:
        super().__init__()
        if prefetch < 0:
            raise FeedlineError(f"prefetch={prefetch} must be >= 0")
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise FeedlineError(f"device={str(self.device)!r} but CUDA is not available in this process; "
                                "pass device=None for CPU tensors")
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.pin = bool(pin_memory and self.cuda)
        self.prefetch = prefetch
        self.int64 = int64
        self.packed = packed if isinstance(packed, PackedLayout) else PackedLayout(packed)
        self._model = model   # watched at the first packed batch (watch_cache), then dropped
        self._watched = False   # a model was watched (given, or the HF Trainer's found by an iteration)
        self._source = source
        self._stream_name = stream
        self._resume = state
        if is_loader(source):
            if rank is not None or world_size is not None or state is not None:
                raise FeedlineError("rank, world_size and state belong to the Loader passed in; set them there")
            self._loader: Any = source
            self.rank, self.world_size = int(getattr(source, "rank", 0)), int(getattr(source, "world_size", 1))
        else:
            self._loader = None
            self.rank, self.world_size = _distributed_rank(rank, world_size)
        self._state: dict[str, Any] | None = None
        self._feeder: Prefetch | None = None
        self._given = 0
        self._exhausted = False

    # ----------------------------------------------------------------- inner loader
    @property
    def loader(self) -> Any:
        """The wrapped numpy loader (built on first use)."""
        if self._loader is None:
            self._loader = resolve_loader(self._source, self.rank, self.world_size, state=self._resume,
                                          stream=self._stream_name)
        return self._loader

    def _stop_feeder(self) -> None:
        """Stop the feeder; rewind the inner loader if it ran ahead of what the caller received."""
        feeder, self._feeder = self._feeder, None
        if feeder is None:
            return
        feeder.close()
        if feeder.pulled != self._given and self._state is not None:
            self.loader.load_state_dict(self._state)
            self._exhausted = False

    # ----------------------------------------------------------------- iteration
    def __len__(self) -> int:
        """Not known up front: :class:`TypeError` naming :func:`feedline.epoch_steps` (a ``DataLoader``'s
        ``len()`` asks this; the Hugging Face Trainer then needs ``max_steps``, which that gives)."""
        raise TypeError(NO_LENGTH.format(type(self).__name__))

    def __bool__(self) -> bool:  # never ask __len__
        return True

    def __iter__(self) -> Iterator[TorchBatch]:
        if self.world_size > 1:
            _refuse_resharding_wrapper(self.rank, self.world_size)
        if torch.utils.data.get_worker_info() is not None:
            raise FeedlineError("TorchLoader cannot run inside DataLoader worker processes (each would read the whole "
                                "stream); use DataLoader(loader, batch_size=None, num_workers=0) or loader.dataloader(): "
                                "feedline already prepares batches in parallel")
        if self._model is None and not self._watched:   # under the HF Trainer, its model is the one fed
            self._model = trainer_model()
        self._stop_feeder()
        if self._exhausted:
            return iter(())
        if self._state is None:
            self._state = self.loader.state_dict()
        return self._iterate()

    def _stager(self) -> Stager:
        """What turns a numpy batch into the step's tensors (on the feeder thread when prefetching)."""
        copy: Copy = "cuda" if self.cuda else None
        return Stager(self.device, int64=self.int64, pin=self.pin, layout=self.packed, copy=copy,
                      depth=max(1, self.prefetch))

    def _staged_items(self, stager: Stager, feeder: Prefetch | None) -> Iterator[Any]:
        """(staged batch, state) pairs, then ``_END`` or an exception."""
        try:
            if feeder is None:   # the state after each batch as a snapshot: made whole only if it is read
                snapshot = getattr(self.loader, "_state_snapshot", None) or self.loader.state_dict
                for batch in self.loader:
                    yield stager(batch), snapshot()
            else:
                yield from feeder
            yield _END
        except GeneratorExit:  # closed by its consumer: not an error to hand on
            raise
        except BaseException as e:
            yield e

    def _iterate(self) -> Iterator[TorchBatch]:
        feeder = None
        stager = self._stager()
        if self.prefetch:
            self._feeder = feeder = Prefetch(LoaderStage(self.loader), self.prefetch, name="feedline-torch-feeder",
                                             map=stager, hold=True)
            self._given = 0
        move = self.device is not None and not self.cuda and self.device.type != "cpu"
        for item in self._staged_items(stager, feeder):
            if feeder is not None and self._feeder is not feeder:
                return  # superseded by load_state_dict() or a newer iteration
            if item is _END:
                self._exhausted = True
                self._feeder = None
                return
            if isinstance(item, BaseException):
                self._feeder = None
                raise item
            staged, state = item
            tensors = stager.take(staged)
            if move:  # another accelerator (mps, xla): copied on the caller's thread, as before
                tensors = {k: v.to(self.device) for k, v in tensors.items()}
            if self._model is not None and "seq_lens" in tensors:   # the first packed batch
                watch_cache(self._model)
                self._model, self._watched = None, True
            self._state = state
            self._given += 1
            if feeder is not None:
                feeder.release()  # only now may the feeder refill: it never competes with this thread inside next()
            yield tensors

    def dataloader(self) -> torch.utils.data.DataLoader[TorchBatch]:
        """A ``DataLoader`` that passes batches through (``batch_size=None``, no workers).

        For trainers that insist on a ``DataLoader`` (e.g. an HF ``Trainer`` subclass overriding
        ``get_train_dataloader``, which is how to run the Trainer under torchrun).
        """
        return torch.utils.data.DataLoader(self, batch_size=None, num_workers=0)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """JSON state after the last batch this loader yielded (torchdata ``Stateful`` protocol)."""
        if self._state is not None:  # the feeder's snapshot: materialized (and copied) when asked
            return materialize(self._state)  # type: ignore[no-any-return]
        return self.loader.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state``: the next batch is the one that followed it."""
        feeder, self._feeder = self._feeder, None
        if feeder is not None:
            feeder.close()
        if self._loader is None:
            self._resume = dict(state)
            self.loader.state_dict()  # validate now, not on first batch
        else:
            self._loader.load_state_dict(state)
        self._state = None
        self._exhausted = False

    @property
    def step(self) -> int:
        """Global steps received so far."""
        return int((self._state if self._state is not None else self.state_dict())["step"])

    def close(self) -> None:
        """Stop background work and close the wrapped loader. Idempotent."""
        feeder, self._feeder = self._feeder, None
        if feeder is not None:
            feeder.close()
        if self._loader is not None:
            self._loader.close()

    def __enter__(self) -> TorchLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"TorchLoader(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"prefetch={self.prefetch}, int64={self.int64})")


# accelerate's DataLoader wrappers that redistribute an IterableDataset across processes: the
# dispatcher reads every rank's batches on rank 0 (stalling a ranked service window), the shard
# keeps one batch in world_size (dropping most of each rank's slice)
_RESHARDING_WRAPPERS = {"DataLoaderDispatcher", "IterableDatasetShard"}


def _refuse_resharding_wrapper(rank: int, world_size: int) -> None:
    """Fail at once when an accelerate wrapper (the plain HF ``Trainer`` under torchrun) iterates us."""
    frame = sys._getframe(1)
    for _ in range(40):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return
        if frame.f_globals.get("__name__") == "accelerate.data_loader":
            wrapper = type(frame.f_locals.get("self")).__name__
            if wrapper in _RESHARDING_WRAPPERS:
                raise FeedlineError(
                    f"TorchLoader (rank {rank} of {world_size}) is being iterated by accelerate's {wrapper}, which "
                    "re-distributes batches across processes: each rank already receives its own slice, so this "
                    "would stall the loader service's ranked window or drop data. Hand the loader to the Trainer "
                    "unwrapped: class FeedlineTrainer(Trainer): def get_train_dataloader(self): return "
                    "self.train_dataset.dataloader()  (see docs/adapters.md, 'Hugging Face Trainer')")


def _distributed_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else the environment, else an initialised ``torch.distributed`` group, else (0, 1)."""
    if rank is None and world_size is None:
        r, w = resolve_rank(None, None)
        if (r, w) == (0, 1) and torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return r, w
    return resolve_rank(rank, world_size)
