"""Build the iterator tree a spec describes, and the global stream of steps.

    sources ─► Mixture ─► ShuffleBuffer ─► TaskMap (tokenize + task) ─► Batcher ─► GlobalStream

:class:`Pipeline` holds the recipes (no I/O until iterated). :class:`GlobalStream` numbers the
global batches, applies the remainder rule, and yields each with the state after it::

    >>> for step, batch, state in GlobalStream(Pipeline(spec)):   # doctest: +SKIP
    ...     ...

The global state (``{"step": s, "pipeline": ...}``) is the same for every rank; a rank's slice
is derived from the global batch, which is what makes elastic resume possible.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any

from feedline.batching.base import Batch, BatchContext, Batcher
from feedline.batching.planner import complete_batch
from feedline.batching.registry import batcher_class
from feedline.core.dataset import Dataset, DatasetIterator, State
from feedline.core.record import Example, ExampleRef, Key, Record
from feedline.errors import SpecError, StateError
from feedline.sources.mix import Mixture
from feedline.sources.shuffle import ShuffleBuffer
from feedline.sources.source import FileSource
from feedline.spec import Spec
from feedline.tasks.base import Task, TaskContext
from feedline.tasks.map import TaskMap
from feedline.tasks.registry import task_class
from feedline.tokenize.tokenizer import Tokenizer

__all__ = ["GlobalStream", "Pipeline"]


class Pipeline:
    """The recipes of one spec. Cheap to build; nothing is opened until iteration."""

    def __init__(self, spec: Spec | Mapping[str, Any] | str, *, tokenizer: Tokenizer | None = None) -> None:
        self.spec = Spec.load(spec)  # type: ignore[arg-type]
        self._tokenizer = tokenizer

    @cached_property
    def sources(self) -> list[FileSource]:
        s = self.spec
        endless = s.mix.stopping == "cycle" or s.epochs is None
        return [
            FileSource(src, i, seed=s.seed, shuffle_splits=bool(s.shuffle and s.shuffle.shards),
                       epochs=None if endless else s.epochs, on_error=s.on_error, reject_limit=s.reject_limit)
            for i, src in enumerate(s.sources)
        ]

    @cached_property
    def mixture(self) -> Mixture:
        s = self.spec
        return Mixture(self.sources, [x.weight for x in s.sources], seed=s.seed, stopping=s.mix.stopping, epochs=s.epochs)

    def fetch(self, keys: Sequence[Key]) -> Mapping[Key, dict[str, Any]]:
        return self.mixture.fetch(keys)

    def records(self) -> Dataset[Record]:
        """Records after reading, mixing and shuffling."""
        s = self.spec
        if s.shuffle and s.shuffle.buffer > 1:
            return ShuffleBuffer(self.mixture, s.shuffle.buffer, seed=s.seed, fetch=self.fetch)
        return self.mixture

    @cached_property
    def tokenizer(self) -> Tokenizer | None:
        """The spec's tokenizer, encoding plain ids with its ``backend`` (verified per pipeline)."""
        if self._tokenizer is None and self.spec.tokenizer:
            from feedline.tokenize.load import load_tokenizer

            self._tokenizer = load_tokenizer(self.spec.tokenizer)
        if self._tokenizer is None:
            return None
        from feedline.tokenize.backends import with_backend

        return with_backend(self._tokenizer, self.spec.tokenizer_backend)

    @cached_property
    def task(self) -> Task:
        cls = task_class(self.spec.task.kind)
        return cls(self.spec.task.options, TaskContext(self.tokenizer, self.spec.seed, spec=self.spec))

    @property
    def workers(self) -> int:
        """Threads calling the task (``spec.workers``; 0 = automatic: one, see ThreadRunner)."""
        return self.spec.workers or 1

    def examples(self) -> Dataset[Example]:
        """Task examples, in order (through the task's own stream stage, if it has one)."""
        if not self.task.accepts_tokens:
            for src in self.sources:
                if src.reader.pretokenized:
                    raise SpecError(f"sources[{src.index}] ({src.spec.label}) holds token ids ({src.reader.name}); "
                                    f"task {self.spec.task.kind!r} needs text: use task: clm, or a text source")
        mapped: TaskMap
        if self.spec.engine.kind == "ray":
            from feedline.ray.map import RayTaskMap

            mapped = RayTaskMap(self.records(), self.task, self.spec.engine, on_error=self.spec.on_error,
                                reject_limit=self.spec.reject_limit)
        else:
            mapped = TaskMap(self.records(), self.task, workers=self.workers, on_error=self.spec.on_error,
                             reject_limit=self.spec.reject_limit)
        mapped.locate = self.mixture.locate
        return self.task.stream(mapped, self.materialize)

    def materialize(self, refs: Sequence[ExampleRef]) -> list[Example]:
        """Rebuild examples from refs by re-reading their records (used to restore buffers)."""
        ints = [(int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in refs]
        found = self.fetch([(s, f, p) for s, f, p, _e, _sub in ints])
        cache: dict[tuple[int, int, int, int], list[Example]] = {}
        out = []
        for s, f, p, e, sub in ints:
            k = (s, f, p, e)
            if k not in cache:
                res = self.task.process([Record((s, f, p), e, found[(s, f, p)])])[0]
                if not isinstance(res, list):
                    raise StateError(f"record {(s, f, p)} was rejected on re-read; the data changed since the state was saved")
                cache[k] = res
            out.append(cache[k][sub])
        return out

    def batches(self) -> Batcher:
        """Global batches (the last may be short)."""
        b = self.spec.batching
        ctx = BatchContext(batch_size=b.batch_size, task=self.task, materialize=self.materialize, seed=self.spec.seed)
        return batcher_class(b.strategy)(self.examples(), b.options, ctx)


class GlobalStream:
    """Numbered, complete global batches with the state after each: ``(step, batch, state)``."""

    def __init__(self, pipeline: Pipeline, world_size: int = 1) -> None:
        self.pipeline = pipeline
        self.world_size = world_size

    def __iter__(self) -> GlobalStreamIterator:
        return GlobalStreamIterator(self)


class GlobalStreamIterator(Iterator[tuple[int, Batch, State]]):
    """Cursor over a :class:`GlobalStream`; ``state`` is ``{"step": s, "pipeline": ...}``."""

    def __init__(self, gs: GlobalStream) -> None:
        self.gs = gs
        self.it: DatasetIterator[Batch] = iter(gs.pipeline.batches())
        self.step = 0
        self.done = False

    def __next__(self) -> tuple[int, Batch, State]:
        p = self.gs.pipeline
        b = p.spec.batching
        while not self.done:
            batch = next(self.it, None)
            if batch is None:
                self.done = True
                break
            full = complete_batch(batch, b.batch_size, self.gs.world_size, b.remainder, p.task.pad_values)
            if full is None:
                continue
            self.step += 1
            return self.step, full, self.get_state()
        raise StopIteration

    def get_state(self) -> State:
        return {"step": self.step, "pipeline": self.it.get_state()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        try:
            self.step = int(state["step"])
            self.it.set_state(state["pipeline"])
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"malformed pipeline state ({e})") from e

    def close(self) -> None:
        self.it.close()
