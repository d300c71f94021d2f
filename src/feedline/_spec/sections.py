"""The spec's sections: one frozen dataclass per part of a spec (sources, tokenizer, shuffle, ...).

:class:`~feedline._spec.spec.Spec` holds them; each is parsed with
:func:`~feedline._core.options.build`, so its fields and defaults are declared here only.

    >>> SourceSpec(path="corpus/*.jsonl").format
    'auto'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from feedline._core.callables import name_of
from feedline.errors import SpecError

__all__ = ["Backend", "BatchingSpec", "CacheSpec", "EngineSpec", "MixSpec", "OnError", "ParallelSpec", "Placement", "ShuffleSpec",
           "SourceSpec", "TaskSpec", "TokenizerSpec", "TokensSpec", "TransformSpec"]

OnError = Literal["skip", "raise"]
Backend = Literal["auto", "hf", "fastokens", "wordcache", "sentencepiece"]
Placement = Literal["auto", "threads", "processes", "ray"]


@dataclass(frozen=True, kw_only=True)
class TokensSpec:
    """How a pre-tokenized source stores its token ids (``format: tokens | megatron | flat``).

    Attributes:
        ids: ``tokens``: the column of token-id lists.
        labels: ``tokens``: an optional column of label lists (same lengths; ``-100`` = no loss),
            read when present; ``null`` never reads one.
        dtype: ``flat``: ``uint16`` or ``uint32``; ``auto`` reads an llm.c header, or infers it
            only when the values leave no doubt (see docs/sources.md).
        eos: ``flat``: the separator id between documents (50256 for GPT-2); required.
        eos_at: ``flat``: whether the separator ends each document (nanoGPT) or starts it
            (llm.c); ``auto``: ``start`` for llm.c files (they have a header), else ``end``.
    """

    ids: str = "input_ids"
    labels: str | None = "labels"
    dtype: Literal["auto", "uint16", "uint32"] = "auto"
    eos: int | None = None
    eos_at: Literal["auto", "end", "start"] = "auto"


@dataclass(frozen=True, kw_only=True)
class CacheSpec:
    """A bounded local copy of a remote source's objects (``cache: {dir, max_bytes}``).

    Attributes:
        dir: the folder of the copies (shared safely by the processes of one machine).
        max_bytes: at most this many bytes in all; least recently used copies go first, and an
            object larger than this is read from the store every time.
    """

    dir: str
    max_bytes: int = 20 << 30

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise SpecError(f"max_bytes: {self.max_bytes} must be >= 1")


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """``tokenizer: {path: ..., backend: ...}``; a plain string means ``backend: auto``.

    ``backend`` picks the encoder of plain text: ``hf`` (``tokenizers``), ``fastokens`` (required,
    verified), ``wordcache`` (``tokenizers``' ids per distinct word, memoized; required, verified),
    ``sentencepiece`` (a ``.model`` file encoded by sentencepiece itself), or ``auto``
    (sentencepiece for a ``.model`` file when it is installed; else fastokens where it loads the
    tokenizer and encodes a verification corpus and the first data identically, else the word
    cache where the tokenizer has its shape and it passes the same checks, else ``tokenizers``).
    Batches are the same for every backend, except that sentencepiece's ids differ from the
    converted ``.model`` pipeline (``hf``) on rare texts; it is not part of :meth:`Spec.hash`.

    Attributes:
        path: a ``tokenizer.json``, a tokenizer directory, a SentencePiece ``.model`` or a hub name.
        backend: the encoder of plain text: ``auto``, ``hf``, ``fastokens``, ``wordcache`` or
            ``sentencepiece`` (above).
    """

    path: str
    backend: Backend = "auto"


@dataclass(frozen=True, kw_only=True)
class SourceSpec:
    """Where and how to read one source.

    Attributes:
        path: file, glob, directory or URL (``http(s)://``, ``s3://``, ``gs://``, ``hf://``).
        hf: a Hugging Face dataset name, read with ``datasets.load_dataset`` (instead of path).
        format: reader name, or ``auto`` to detect it from the file name.
        text: field holding the text (dotted path allowed, ``body.text``); ``null`` keeps each
            record as it is, with no text check (chat data: ``messages``/``conversations``). With
            ``task: chat``, which reads whole records, a source without ``text:`` is read so too.
        weight: relative weight in a mixture.
        name: a label for reports; defaults to the path.
        unit: for ``text``: one record per ``line``, ``paragraph`` (blank-line separated) or ``file``.
        keep_blank: for ``text`` with ``unit: line``: every line is a record, blank and
            whitespace-only ones too, and a line ends at LF, CRLF or a lone CR: the rows
            of ``datasets``' text builder (default: blank lines are not records).
        columns: for ``csv``/``tsv`` without a header: the column names; for ``parquet``,
            ``arrow`` and ``hf``: the columns to read (projection; all when unset).
        delimiter: for ``csv``: the field separator (``tsv`` uses a tab).
        header: for ``csv``/``tsv``: whether the first row names the columns.
        infer_types: for ``csv``/``tsv``: int, float and bool columns become numbers and booleans and
            missing values (empty cells, ``NA``, ``null``...) ``None``, inferred per 10,000 rows as
            ``datasets``' csv builder (pandas) does; header names kept as written (default: strings).
        namespaces: for ``cirrus``/``wikixml``: the page namespaces to keep (0 = articles).
        split_bytes: uncompressed files larger than this are read as several byte-range splits.
        max_record_bytes: a record (line, CSV row, JSON document) larger than this is rejected
            as ``too_large`` while it is read, in bounded memory (default 32 MiB).
        tokens: for pre-tokenized formats (``tokens``, ``megatron``, ``flat``): how ids are stored.
        cache: for URLs (``s3://``, ``gs://``, ``https://``): keep whole objects in a local folder,
            bounded by size, so later epochs and resumes read them from disk (not hashed). Local
            files and Parquet objects (read by ranged requests) are never copied: a warning says so.
        config, split, streaming, data_files, data_dir, revision: ``load_dataset`` arguments for ``hf``.
        iterable: a Python iterable of records or strings (not hashed; Python specs only).
    """

    path: str | None = None
    hf: str | None = None
    format: str = "auto"
    text: str | None = "text"
    weight: float = 1.0
    name: str | None = None
    unit: Literal["line", "paragraph", "file"] = "line"
    keep_blank: bool = False
    columns: tuple[str, ...] | None = None
    delimiter: str | None = None
    header: bool = True
    infer_types: bool = False
    namespaces: tuple[int, ...] = (0,)
    split_bytes: int = 64 << 20
    max_record_bytes: int = 32 << 20
    config: str | None = None
    split: str = "train"
    streaming: bool = True
    data_files: Any = None
    data_dir: str | None = None
    revision: str | None = None
    tokens: TokensSpec | None = None
    cache: CacheSpec | None = None
    iterable: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        given = [k for k in ("path", "hf", "iterable") if getattr(self, k) is not None]
        if len(given) != 1:
            raise SpecError("a source needs exactly one of 'path', 'hf' or 'iterable'" + (f"; got {given}" if given else ""))
        if self.weight <= 0:
            raise SpecError(f"weight: {self.weight} must be > 0")
        if self.split_bytes < 1 << 16:
            raise SpecError(f"split_bytes: {self.split_bytes} must be at least 65536")
        if self.max_record_bytes < 1:
            raise SpecError(f"max_record_bytes: {self.max_record_bytes} must be >= 1")
        if self.cache is not None and self.path is None:
            raise SpecError(f"cache: is for files at URLs (s3://, gs://, https://); a source of {'hf' if self.hf else 'iterable'}: "
                            "has no objects to copy (datasets keeps its own cache of hub downloads): remove cache: from it")
        if self.keep_blank and self.unit != "line":
            raise SpecError(f"keep_blank: true keeps blank lines as records of unit: line, not unit: {self.unit}")

    @property
    def label(self) -> str:
        return self.name or self.path or self.hf or "iterable"


@dataclass(frozen=True, kw_only=True)
class MixSpec:
    """How several sources are mixed.

    ``stopping``: ``all_exhausted`` (each source read once per epoch; weights set the
    interleaving), ``first_exhausted`` (the epoch ends when any source runs out), or ``cycle``
    (sources restart as needed so proportions follow the weights; the epoch ends when the
    largest-weight-adjusted source has been read once), or ``concat`` (the sources one after
    another in spec order, weights ignored).

    Attributes:
        stopping: when an epoch of the mixture ends: ``all_exhausted``, ``first_exhausted``, ``cycle``
            or ``concat``.
    """

    stopping: Literal["all_exhausted", "first_exhausted", "cycle", "concat"] = "all_exhausted"


@dataclass(frozen=True, kw_only=True)
class TransformSpec:
    """One record transform, run after reading and mixing and before the shuffle buffer.

    ``{map: "pkg.mod:func"}`` replaces each record by ``func(record)`` (a dict);
    ``{filter: "pkg.mod:func"}`` keeps the records for which ``func(record)`` is true (the
    others are counted as ``filtered`` in ``stats()``; they are not rejections). From Python, a
    callable may stand in for the import path; a module-level function travels to other
    processes by its import path, a lambda or local function works in this process only.

    Both must be pure functions of the record: a resume re-reads records by key and runs the
    transforms again, so the same record must give the same result. The spec hashes the import
    path (a callable: ``module:qualname``), not the code: change a function's name, or bump a
    source option, to make older states refuse to resume.

    Attributes:
        map: ``record -> record``: an import path ``"package.module:function"`` or a callable.
        filter: ``record -> bool``: an import path or a callable.
    """

    map: Any = None
    filter: Any = None

    def __post_init__(self) -> None:
        given = [k for k in ("map", "filter") if getattr(self, k) is not None]
        if len(given) != 1:
            raise SpecError("a transform is one of {map: 'pkg.mod:func'} or {filter: 'pkg.mod:func'}"
                            + (f"; got {given}" if given else ""))
        fn = getattr(self, given[0])
        if not isinstance(fn, str) and not callable(fn):
            raise SpecError(f"{given[0]}: expected an import path 'package.module:function' or a callable, got {fn!r:.60}")

    @property
    def kind(self) -> Literal["map", "filter"]:
        return "map" if self.map is not None else "filter"

    @property
    def fn(self) -> Any:
        """The import path or callable."""
        return self.map if self.map is not None else self.filter

    @property
    def name(self) -> str:
        """The import path, or ``module:qualname`` of a callable (what the spec hashes)."""
        return name_of(self.fn)


@dataclass(frozen=True, kw_only=True)
class ShuffleSpec:
    """Seeded shuffling: split (shard) order per epoch, then a bounded buffer of records.

    Attributes:
        buffer: records held and drawn from at random (0: only the split order is shuffled);
            memory grows with it, and a state holds the buffered records' keys.
        shards: shuffle the order of splits (files, byte ranges, row groups) each epoch.
    """

    buffer: int = 10_000
    shards: bool = True

    def __post_init__(self) -> None:
        if self.buffer < 0:
            raise SpecError(f"shuffle.buffer: {self.buffer} must be >= 0")


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """A task kind (or ``module:Class`` plug-in) and its validated options dataclass.

    In a spec, the options sit beside ``kind``: ``task: {kind: mlm, max_length: 128}``.
    """

    kind: str = "clm"
    options: Any


@dataclass(frozen=True, kw_only=True)
class BatchingSpec:
    """How examples become global batches; ``options`` is the strategy's own dataclass.

    In a spec, the options sit beside the common keys: ``batching: {strategy: pack, batch_size: 64}``.

    Attributes:
        strategy: ``pad`` (one example per row), ``bucket`` (rows of similar length), ``pack``
            (several documents per row, best fit) or ``concat`` (documents end to end, cut into rows).
        batch_size: global rows per step, over all ranks (each rank gets ``batch_size / world_size``).
        remainder: the last short batch: ``drop`` it, ``pad`` it with empty rows to ``batch_size``,
            or ``keep`` it (padded only to a multiple of the world size); ``infer`` keeps it unless
            told otherwise. A stream whose only batch would be dropped raises instead of ending empty.
    """

    strategy: str = "pad"
    batch_size: int = 8
    remainder: Literal["drop", "pad", "keep"] = "drop"
    options: Any

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise SpecError(f"batching.batch_size: {self.batch_size!r} must be a positive integer (global rows per step)")


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """The old ``engine`` section, read only to be folded into ``parallel`` (``map``, ``address``):
    see :func:`feedline._spec.parse.fold_engine`.

    Attributes:
        kind: ``local`` (threads in this process) or ``ray`` (tasks on a Ray cluster): ``parallel.map``.
        address: the Ray cluster to join: ``parallel.address``.
        num_cpus: CPUs of a local Ray cluster started for the run (no longer read: start Ray yourself).
    """

    kind: Literal["local", "ray"] = "local"
    address: str = "auto"
    num_cpus: int | None = None


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """Where a spec's work runs: its ``partitions`` and its task's per-record map (never what they deliver: not hashed).

    Attributes:
        placement: ``threads`` (one thread per partition, in this process), ``processes`` (spawned
            worker processes, each owning some partitions), ``ray`` (one Ray actor per partition),
            or ``auto`` (``processes`` when ``partitions > 1``, else ``threads``). With
            ``partitions: 1``, ``processes`` or ``ray`` runs the one pipeline there (the same
            batches and states as in this process; its Python off this process's GIL). A worker
            process tunes its own garbage collector (what lives once it made a batch frozen, the
            young generation collected every 10,000 allocations: on short records the collector
            took ~12 % of a pipeline's thread with CPython's defaults, ~4 % so); this process is
            left as you set it (``gc.freeze()`` after the first batch and
            ``gc.set_threshold(10_000)`` do the same here).
        processes: worker processes for ``processes`` (0: one per partition, at most the cores).
        map: where the task's per-record work (tokenizing) runs: ``local`` (threads of the pipeline
            that reads the records, wherever it runs) or ``ray`` (chunks of records as Ray tasks on
            the cluster at ``address``, while the pipeline reads, mixes, shuffles and batches); the
            same batches and states either way. Formerly ``engine: {kind: ray}``.
        address: the one Ray cluster of ``placement: ray`` and ``map: ray``: ``auto`` (the one
            this machine belongs to, else a new local instance with all the cores), ``local``
            (always a new local instance), or ``ray://host:10001`` / ``host:6379``. A process that
            called ``ray.init`` itself keeps its session (size a local instance there).
        num_cpus: CPUs each Ray actor (``placement: ray``) or map task (``map: ray``) reserves.
        prefetch: batches each partition runs ahead of the composing stage.
        warm_start: with ``processes``, run a partition on a thread here when it is asked for
            before its worker process is ready, so the first steps never wait for processes to
            start; the moment the worker is ready it takes over, after the batches the thread
            made (the one the thread was making is dropped: the worker makes it). ``auto`` (the
            default) does so when the machine has a core for each worker beside two for this
            process: with fewer, the workers' start takes the cores the threads serve from, and
            waiting for the workers (``false``) reaches the full rate sooner.
        hang_timeout: with ``processes``, seconds a worker process may stay silent (stopped, hung
            with the interpreter held; a live worker says so every second even while its
            pipeline works) before it is killed and restarted from its partitions' states like
            a crashed one; it is named in a warning (partitions and pid) after a quarter of that,
            at most 30 s.
    """

    placement: Placement = "auto"
    processes: int = 0
    map: Literal["local", "ray"] = "local"
    address: str = "auto"
    num_cpus: float = 1.0
    prefetch: int = 4
    warm_start: bool | Literal["auto"] = "auto"
    hang_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.processes < 0:
            raise SpecError(f"parallel.processes: {self.processes} must be >= 0 (0 = one per partition)")
        if self.prefetch < 1:
            raise SpecError(f"parallel.prefetch: {self.prefetch} must be >= 1")
        if self.num_cpus <= 0:
            raise SpecError(f"parallel.num_cpus: {self.num_cpus} must be > 0")
        if not self.hang_timeout > 0:
            raise SpecError(f"parallel.hang_timeout: {self.hang_timeout} must be > 0 (seconds)")

    def resolve(self, partitions: int) -> str:
        """The placement that runs ``partitions`` partitions (``auto``: processes when more than one)."""
        if self.placement != "auto":
            return self.placement
        return "processes" if partitions > 1 else "threads"
