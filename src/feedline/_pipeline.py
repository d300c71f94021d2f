"""Build the iterator tree a spec describes, and the global stream of steps.

    sources ─► Mixture ─► Transform (map/filter) ─► ShuffleBuffer ─► TaskMap (tokenize + task) ─► Batcher ─► GlobalStream

:class:`Pipeline` holds the recipes (no I/O until iterated). :class:`GlobalStream` numbers the
global batches, applies the remainder rule, and yields each with the state after it::

    >>> for step, batch, state in GlobalStream(Pipeline(spec)):   # doctest: +SKIP
    ...     ...

The global state (``{"step": s, "pipeline": ...}``) is the same for every rank; a rank's slice
is derived from the global batch, which is what makes elastic resume possible.

With ``partitions: K`` > 1, ``Pipeline(spec, partition=p)`` is partition ``p``'s pipeline (its
share of the splits, its seed; it makes whole steps in its turn) and the whole pipeline's :meth:`Pipeline.batches`
is the composing stage over the K of them (:mod:`feedline._partitions.compose`), run where
``parallel.placement`` says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from feedline._batching.base import Batch, BatchContext, Batcher
from feedline._batching.compact import CompactBatch
from feedline._batching.planner import complete_batch
from feedline._batching.registry import batcher_class
from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.deferred import materialize
from feedline._core.record import Example, Key, Record
from feedline._partitions.compose import CompactBatches, Composed
from feedline._partitions.rows import row_count
from feedline._sources.deal import partition_seed
from feedline._sources.mix import Mixture
from feedline._sources.shuffle import ShuffleBuffer
from feedline._sources.source import FileSource
from feedline._sources.transform import Transform, steps_of
from feedline._spec import MixSpec, Spec
from feedline._tasks.base import Task, TaskContext
from feedline._tasks.map import TaskMap, useful_threads
from feedline._tasks.registry import task_class
from feedline._tokenize.tokenizer import Tokenizer
from feedline.errors import SpecError

__all__ = ["ENGINES", "GlobalStream", "OnePass", "PartitionStreams", "Pipeline", "engine", "register_engine"]

#: Builds the task map of a pipeline from it (its records, task, spec and workers).
Engine = Callable[["Pipeline"], TaskMap]


def _local(p: Pipeline) -> TaskMap:
    return TaskMap(p.records(), p.task, workers=p.workers, on_error=p.spec.on_error, reject_limit=p.spec.reject_limit)


#: The task-map engines by ``parallel.map``: ``local`` (threads) is the pipeline's own; the package root
#: installs ``ray`` (:mod:`feedline._ray.map`, above this layer), as it installs tasks and batchers.
ENGINES: dict[str, Engine] = {"local": _local}


def register_engine(kind: str, build: Engine) -> None:
    """Make ``parallel: {map: kind}`` map a pipeline's task with ``build(pipeline)``."""
    ENGINES[kind] = build


def engine(kind: str) -> Engine:
    """The engine registered as ``kind``."""
    found = ENGINES.get(kind)
    if found is None:
        raise SpecError(f"parallel.map: {kind!r} has no engine installed (engines: {', '.join(sorted(ENGINES))}); "
                        "import feedline, which installs ray")
    return found


def _whole_record_fixes(kind: str, index: int, text: str) -> dict[str, str]:
    """What to write when a source's ``text:`` rejects every record of a task that reads whole records."""
    fix = (f"task {kind!r} reads each record whole (the conversation, not a text field): remove text: {text!r} "
           f"from sources[{index}], or write text: null")
    return dict.fromkeys(("missing_field", "not_string", "empty"), fix)


class Pipeline:
    """The recipes of one spec (or of its partition ``partition``). Cheap to build; nothing is opened until iteration."""

    def __init__(self, spec: Spec | Mapping[str, Any] | str, *, tokenizer: Tokenizer | None = None,
                 partition: int | None = None) -> None:
        self.spec = Spec.load(spec)  # type: ignore[arg-type]
        self._tokenizer = tokenizer
        k = self.spec.partitions
        if partition is not None and not 0 <= partition < k:
            raise SpecError(f"partition {partition} is not in [0, partitions={k})")
        self.partition = partition
        #: The seed of this pipeline: the spec's, or its partition's (seed, partition).
        self.seed = self.spec.seed if partition is None else partition_seed(self.spec.seed, partition, k)

    @property
    def composed(self) -> bool:
        """Whether :meth:`batches` composes partitions (``partitions`` > 1 and no partition chosen)."""
        return self.partition is None and (self.spec.partitions > 1 or self.spec.parallel.resolve(1) != "threads")

    @cached_property
    def sources(self) -> list[FileSource]:
        s = self.spec
        s.check_root()
        endless = s.mix.stopping == "cycle" or s.epochs is None
        part, k = (0, 1) if self.partition is None else (self.partition, s.partitions)
        whole = task_class(s.task.kind).whole_records
        return [
            FileSource(src, i, seed=self.seed, shuffle_splits=bool(s.shuffle and s.shuffle.shards),
                       epochs=None if endless else s.epochs, on_error=s.on_error, reject_limit=s.reject_limit,
                       on_unreadable=s.on_unreadable, partition=part, partitions=k,
                       fixes=_whole_record_fixes(s.task.kind, i, src.text) if whole and src.text is not None else None)
            for i, src in enumerate(s.sources)
        ]

    @cached_property
    def mixture(self) -> Mixture:
        s = self.spec
        return Mixture(self.sources, [x.weight for x in s.sources], seed=self.seed, stopping=s.mix.stopping, epochs=s.epochs)

    def fetch(self, keys: Sequence[Key]) -> Mapping[Key, dict[str, Any]]:
        """Re-read records by key, after the spec's transforms: the records the task saw (what a
        corpus tool joining outputs to inputs needs)."""
        return self.transformed().fetch(keys)

    def transformed(self) -> Dataset[Record]:
        """Records after reading, mixing and the spec's ``transforms`` (unshuffled)."""
        if not self.spec.transforms:
            return self.mixture
        s = self.spec
        return Transform(self.mixture, steps_of(s.transforms), locate=self.mixture.locate, on_error=s.on_error,
                         limits=[src.max_record_bytes if src.text is not None else None for src in s.sources])

    def records(self) -> Dataset[Record]:
        """Records after reading, mixing, transforms and shuffling."""
        s = self.spec
        if s.shuffle and s.shuffle.buffer > 1:
            return ShuffleBuffer(self.transformed(), s.shuffle.buffer, seed=self.seed)
        return self.transformed()

    @cached_property
    def tokenizer(self) -> Tokenizer | None:
        """The spec's tokenizer, encoding plain ids with its ``backend`` (verified per pipeline)."""
        if self._tokenizer is None and self.spec.tokenizer:
            from feedline._tokenize.load import load_spec_tokenizer

            self._tokenizer = load_spec_tokenizer(self.spec.tokenizer, self.spec.root)
        if self._tokenizer is None:
            return None
        from feedline._tokenize.backends import with_backend

        return with_backend(self._tokenizer, self.spec.tokenizer_backend)

    @cached_property
    def task(self) -> Task:
        cls = task_class(self.spec.task.kind)
        return cls(self.spec.task.options, TaskContext(self.tokenizer, self.seed, records=OnePass(self.spec)))

    @property
    def workers(self) -> int:
        """Threads calling the task (``spec.workers``; 0 = automatic: ``useful_threads``)."""
        return self.spec.workers or useful_threads(self.task)

    def examples(self) -> Dataset[Example]:
        """Task examples, in order (through the task's own stream stage, if it has one)."""
        if not self.task.accepts_tokens:
            for src in self.sources:
                if src.reader.pretokenized:
                    raise SpecError(f"sources[{src.index}] ({src.spec.label}) holds token ids ({src.reader.name}); "
                                    f"task {self.spec.task.kind!r} needs text: use task: clm, or a text source")
        mapped = engine(self.spec.parallel.map)(self)
        mapped.locate = self.mixture.locate
        mapped.share = self.partition is not None and self.spec.partitions > 1
        return self.task.stream(mapped)

    def batches(self) -> Batcher | Composed:
        """Global batches (the last may be short); a partition's batches when ``partition`` is set."""
        b = self.spec.batching
        if self.composed:
            return Composed(PartitionStreams(self.spec, self._tokenizer), self.spec.partitions, b.batch_size,
                            self.spec.parallel, lambda: self.task.pad_values)
        ctx = BatchContext(batch_size=b.batch_size, task=self.task, seed=self.seed)  # a partition's too: whole steps
        return batcher_class(b.strategy)(self.examples(), b.options, ctx)


@dataclass(frozen=True)
class PartitionStreams:
    """Partition ``p``'s batches of a spec, as a picklable factory (what a placement runs, anywhere);
    ``compact``: ``pack`` batches stay compact (:meth:`compacted`, for a consumer that lays them out)."""

    spec: Spec
    tokenizer: Tokenizer | None = None
    compact: bool = False

    def __call__(self, p: int) -> Batcher | Composed | CompactBatches:
        batches = Pipeline(self.spec, tokenizer=self.tokenizer, partition=p).batches()
        return CompactBatches(batches) if self.compact else batches

    def compacted(self) -> PartitionStreams:
        return dataclasses.replace(self, compact=True)

    def warm(self) -> None:
        """Load what every partition shares (the tokenizer, cached per process) before the first starts."""
        _ = Pipeline(self.spec, tokenizer=self.tokenizer, partition=0).tokenizer


@dataclass(frozen=True)
class OnePass:
    """One unshuffled epoch of a spec's records, as a picklable factory (``TaskContext.records``).

    For tasks that need a first pass over the corpus (classify collecting label names).
    """

    spec: Spec

    def __call__(self) -> Iterator[Record]:
        one = Pipeline(self.spec.replace(epochs=1, shuffle=None, mix=MixSpec(), partitions=1))
        it = iter(one.transformed())
        try:
            yield from it
        finally:
            it.close()


class GlobalStream(Dataset[tuple[int, Batch, State]]):
    """Numbered, complete global batches with the state after each: ``(step, batch, state)``.

    A stage like any other: its iterator has ``get_state``/``set_state``/``close``, and its state
    is ``{"step": s, "pipeline": <batcher state>}``. :class:`~feedline._batching.planner.RankSlice`
    cuts each global batch into a rank's slice.
    """

    def __init__(self, pipeline: Pipeline, world_size: int = 1) -> None:
        self.pipeline = pipeline
        self.world_size = world_size

    def __iter__(self) -> GlobalStreamIterator:
        return GlobalStreamIterator(self)

    def initial_state(self) -> State:
        """The state at the start of the stream (built without producing anything)."""
        it = iter(self)
        try:
            return it.get_state()
        finally:
            it.close()


class GlobalStreamIterator(DatasetIterator[tuple[int, Batch, State]]):
    """Cursor over a :class:`GlobalStream`; ``state`` is ``{"step": s, "pipeline": ...}``."""

    NAME = "global stream"
    PARENT = "pipeline"
    STATE_KEYS = ("step",)

    def __init__(self, gs: GlobalStream) -> None:
        self.gs = gs
        self.parent: DatasetIterator[Batch] = iter(gs.pipeline.batches())
        self._next_compact: Callable[[], CompactBatch] | None = getattr(self.parent, "next_compact", None)
        self.step = 0
        self.done = False
        # The tokenizer's background backend check (``auto``) waits until this stream's first batch
        # is out, so it never takes the cores the first batch waits for.
        # (Partitions hold their own, where they run: the composing process never encodes.)
        encoder = getattr(gs.pipeline.tokenizer, "encoder", None) if not gs.pipeline.composed else None
        self._held: Any = encoder if hasattr(encoder, "hold") else None
        self._out = False
        self._state: State | None = None  # the state after the last step, built once per step
        self._snapshot: State | None = None  # the same, with deferred parts (see snapshot)
        if self._held is not None:
            self._held.hold()

    @property
    def it(self) -> DatasetIterator[Batch]:
        """The batcher's iterator (this stage's parent)."""
        return self.parent

    def __next__(self) -> tuple[int, Batch, State]:
        step, batch, _ = self._next_step(compact=False)
        assert not isinstance(batch, CompactBatch)
        return step, batch, self.get_state()

    def _next_step(self, compact: bool) -> tuple[int, Batch | CompactBatch, None]:
        p = self.gs.pipeline
        b = p.spec.batching
        if self._out:  # the first batch is out (starting the check may digest the tokenizer's JSON)
            self.release()
        self._state = self._snapshot = None
        while not self.done:
            batch = self._next_batch(compact)
            if batch is None:
                self.done = True
                break
            if isinstance(batch, CompactBatch):
                if len(batch) == b.batch_size:
                    self.step += 1
                    self._out = True
                    return self.step, batch, None
                batch = batch.expand()
            # a full batch needs no pad values: reading them builds the task (loads the tokenizer), which a
            # composing process with partitions in workers never needs otherwise
            full = batch if row_count(batch) == b.batch_size else complete_batch(
                batch, b.batch_size, self.gs.world_size, b.remainder, p.task.pad_values)
            if full is None:
                if self.step == 0:  # the only batch: dropping it would end the stream empty, silently
                    rows = row_count(batch)
                    raise SpecError(
                        f"the stream holds {rows} rows, fewer than batching.batch_size={b.batch_size}, and "
                        "batching.remainder: drop dropped them all (0 batches); lower batch_size, or set "
                        "remainder: keep (a short batch) or pad (empty rows up to batch_size)")
                continue
            self.step += 1
            self._out = True
            return self.step, full, None
        raise StopIteration

    def _next_batch(self, compact: bool) -> Batch | CompactBatch | None:
        if not compact or self._next_compact is None:
            return next(self.parent, None)
        try:
            return self._next_compact()
        except StopIteration:
            return None

    def next_deferred(self) -> tuple[int, Batch, State]:
        """:meth:`__next__` with the :meth:`snapshot` instead of the state (what a prefetching
        consumer takes after every step; it materializes only the states it is asked for)."""
        step, batch, _ = self._next_step(compact=False)
        assert not isinstance(batch, CompactBatch)
        return step, batch, self.snapshot()

    def next_compact(self) -> tuple[int, Batch | CompactBatch, State]:
        """:meth:`next_deferred`, with a full batch of a batcher that can (``pack``) as a
        :class:`~feedline._batching.compact.CompactBatch`, laid out by whoever receives it (the
        service's clients); a short last batch is laid out here, where the remainder rule completes it."""
        step, batch, _ = self._next_step(compact=True)
        return step, batch, self.snapshot()

    def release(self) -> None:
        """Let the backend check start (after the first batch, or when the stream closes)."""
        if self._held is not None:
            held, self._held = self._held, None
            held.release_hold()

    def get_state(self) -> State:
        """The state after the last step; built once per step (the loader and the service's producer
        both ask for it after every step, and a packer's state costs a pass over its buffered rows)."""
        if self._state is None:
            self._state = materialize(self.snapshot())
        return self._state

    def snapshot(self) -> State:
        """The state after the last step with the batcher's deferred parts (taken once per step)."""
        if self._snapshot is None:
            self._snapshot = {self.PARENT: self.parent.snapshot(), **self.own_state()}
        return self._snapshot

    def own_state(self) -> State:
        return {"step": self.step}

    def restore(self, own: Mapping[str, Any]) -> None:
        self.step = int(own["step"])
        self.done = False
        self._state = self._snapshot = None
