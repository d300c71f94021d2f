"""The spec: one description of a pipeline, validated up front, with a stable hash.

A spec comes from a YAML or JSON file, a dict, or :class:`Spec` itself::

    >>> spec = Spec.load({"sources": [{"path": "corpus/*.jsonl"}], "tokenizer": "tok.json",
    ...                   "task": {"kind": "clm", "max_length": 512},
    ...                   "batching": {"strategy": "pad", "batch_size": 8}})
    >>> spec.task.kind, spec.task.options.max_length
    ('clm', 512)
    >>> Spec.load({"sources": [{"path": "x"}], "task": {"kind": "mln"}})
    Traceback (most recent call last):
    ...
    feedline.errors.SpecError: task.kind: 'mln' is not a task; did you mean 'mlm'? (tasks: ...)

Task- and batcher-specific keys sit beside ``kind``/``strategy`` and are validated against that
task's or batcher's own options dataclass. :meth:`Spec.hash` covers everything that changes the
batches (fields marked ``hash: False`` in their metadata: ``engine``, ``workers``, ``prefetch``,
``streams``), so a resume state can refuse another spec. Every section is declared by its
dataclass and parsed with :func:`~feedline._core.options.build`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from feedline._core.options import build, close_match, to_plain
from feedline.errors import SpecError

__all__ = ["BatchingSpec", "EngineSpec", "MixSpec", "Registry", "ShuffleSpec", "SourceSpec", "Spec", "TaskSpec", "TokenizerSpec",
           "TokensSpec", "use_registry"]

OnError = Literal["skip", "raise"]
Backend = Literal["auto", "hf", "fastokens"]


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
class TokenizerSpec:
    """``tokenizer: {path: ..., backend: ...}``; a plain string means ``backend: auto``.

    ``backend`` picks the encoder of plain text: ``hf`` (``tokenizers``), ``fastokens`` (required,
    verified), or ``auto`` (fastokens where it loads the tokenizer and encodes a verification corpus
    and the first data identically, else ``tokenizers``). Batches are the same for every backend,
    so it is not part of :meth:`Spec.hash`.
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
            record as it is, with no text check (chat data: ``messages``/``conversations``).
        weight: relative weight in a mixture.
        name: a label for reports; defaults to the path.
        unit: for ``text``: one record per ``line``, ``paragraph`` (blank-line separated) or ``file``.
        columns: for ``csv``/``tsv`` without a header: the column names; for ``parquet``,
            ``arrow`` and ``hf``: the columns to read (projection; all when unset).
        delimiter: for ``csv``: the field separator (``tsv`` uses a tab).
        header: for ``csv``/``tsv``: whether the first row names the columns.
        namespaces: for ``cirrus``/``wikixml``: the page namespaces to keep (0 = articles).
        split_bytes: uncompressed files larger than this are read as several byte-range splits.
        max_record_bytes: a record (line, CSV row, JSON document) larger than this is rejected
            as ``too_large`` while it is read, in bounded memory (default 32 MiB).
        tokens: for pre-tokenized formats (``tokens``, ``megatron``, ``flat``): how ids are stored.
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
    columns: tuple[str, ...] | None = None
    delimiter: str | None = None
    header: bool = True
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

    @property
    def label(self) -> str:
        return self.name or self.path or self.hf or "iterable"


@dataclass(frozen=True, kw_only=True)
class MixSpec:
    """How several sources are mixed.

    ``stopping``: ``all_exhausted`` (each source read once per epoch; weights set the
    interleaving), ``first_exhausted`` (the epoch ends when any source runs out), or ``cycle``
    (sources restart as needed so proportions follow the weights; the epoch ends when the
    largest-weight-adjusted source has been read once).
    """

    stopping: Literal["all_exhausted", "first_exhausted", "cycle"] = "all_exhausted"


@dataclass(frozen=True, kw_only=True)
class ShuffleSpec:
    """Seeded shuffling: split (shard) order per epoch, then a bounded buffer of records."""

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
    """Where the per-record work runs: ``local`` threads, or a Ray cluster."""

    kind: Literal["local", "ray"] = "local"
    address: str = "auto"
    num_cpus: int | None = None


# ---------------------------------------------------------------------- sections
# A spec field with a ``section`` in its metadata is parsed by that function (shorthands, and the
# task's and strategy's own options dataclasses from the registry); every other field, and what a
# section returns, goes through core.options.build. ``hash: False`` leaves a field out of the hash.

NOT_HASHED: Mapping[str, Any] = {"hash": False}


@dataclass(frozen=True)
class _Context:
    base: Path | None
    registry: Registry


def _default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _sources(raw: Any, ctx: _Context) -> tuple[SourceSpec, ...]:
    if not raw:
        raise SpecError("sources: at least one source is required, e.g. sources: [{path: corpus.jsonl}]")
    if isinstance(raw, (str, Mapping)):
        raw = [raw]
    out = []
    for i, s in enumerate(raw):
        src = build(SourceSpec, {"path": s} if isinstance(s, str) else s, f"sources[{i}]")
        if ctx.base is not None and src.path and "://" not in src.path and not os.path.isabs(src.path):
            src = dataclasses.replace(src, path=str(ctx.base / src.path))
        out.append(src)
    return tuple(out)


def _task(raw: Any, ctx: _Context) -> TaskSpec:
    raw = {"kind": raw} if isinstance(raw, str) else dict(raw or {})
    kind = raw.pop("kind", _default(TaskSpec, "kind"))
    return build(TaskSpec, {"kind": kind, "options": build(ctx.registry.task(kind).Options, raw, "task")}, "task")


def _batching(raw: Any, ctx: _Context) -> BatchingSpec:
    raw = dict(raw or {})
    common = {f.name: raw.pop(f.name) for f in dataclasses.fields(BatchingSpec) if f.name != "options" and f.name in raw}
    strategy = common.get("strategy", _default(BatchingSpec, "strategy"))
    options = build(ctx.registry.batcher(strategy).Options, raw, "batching")
    return build(BatchingSpec, {**common, "options": options}, "batching")


def _shuffle(raw: Any, ctx: _Context) -> ShuffleSpec | None:
    if raw is None or raw is False:
        return None
    if raw is True:
        raw = {}
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = {"buffer": raw}
    return build(ShuffleSpec, raw, "shuffle")


def _engine(raw: Any, ctx: _Context) -> EngineSpec:
    return build(EngineSpec, {"kind": raw} if isinstance(raw, str) else raw, "engine")


@dataclass(frozen=True, kw_only=True)
class Spec:
    """A validated pipeline description. Build it with :meth:`load`."""

    sources: tuple[SourceSpec, ...] = field(metadata={"section": _sources})
    task: TaskSpec = field(metadata={"section": _task})
    batching: BatchingSpec = field(metadata={"section": _batching})
    tokenizer: str | None = None
    #: The encoder backend (``tokenizer: {path, backend}``); not hashed: batches are the same.
    tokenizer_backend: Backend = field(default="auto", metadata=NOT_HASHED)
    seed: int = 0
    epochs: int | None = 1
    mix: MixSpec = MixSpec()
    shuffle: ShuffleSpec | None = field(default=None, metadata={"section": _shuffle})
    on_error: OnError = "skip"
    #: Records all rejected at a fresh start before a SourceError (0: off); never changes batches.
    reject_limit: int = field(default=1000, metadata=NOT_HASHED)
    engine: EngineSpec = field(default=EngineSpec(), metadata={"section": _engine, **NOT_HASHED})
    workers: int = field(default=0, metadata=NOT_HASHED)
    prefetch: int = field(default=4, metadata=NOT_HASHED)
    streams: Mapping[str, Any] | None = field(default=None, metadata=NOT_HASHED)

    def __post_init__(self) -> None:
        if self.epochs is not None and self.epochs < 1:
            raise SpecError(f"epochs: {self.epochs} must be >= 1, or null for endless")
        if self.workers < 0 or self.prefetch < 1:
            raise SpecError("workers must be >= 0 (0 = automatic) and prefetch >= 1")
        if self.reject_limit < 0:
            raise SpecError(f"reject_limit: {self.reject_limit} must be >= 0 (0 turns the check off)")

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, spec: Spec | Mapping[str, Any] | str | os.PathLike[str], *, registry: Registry | None = None) -> Spec:
        """Load and validate a spec from a ``Spec``, a mapping, or a ``.yaml``/``.json`` file.

        Relative source paths in a file are resolved against the file's directory. ``registry``
        names the task and batcher classes (default: feedline's, installed by the package).
        """
        if isinstance(spec, Spec):
            return spec
        if isinstance(spec, (str, os.PathLike)):
            return cls.from_mapping(read_spec_file(spec), base=Path(spec).resolve().parent, registry=registry)
        if isinstance(spec, Mapping):
            return cls.from_mapping(spec, registry=registry)
        raise SpecError(f"a spec must be a path, a mapping or a feedline.Spec; got {type(spec).__name__}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], base: Path | None = None, *, registry: Registry | None = None) -> Spec:
        """Validate a mapping; see the module docstring for the layout.

        After the spec is built, the task class's ``check_spec(spec)`` hook may refuse settings
        the task cannot work with (e.g. ``infer`` refuses shuffling).
        """
        ctx = _Context(base=base, registry=registry or _default_registry())
        data = dict(data)
        if "source" in data:
            if "sources" in data:
                raise SpecError("give either 'source' or 'sources', not both")
            data["sources"] = [data.pop("source")]
        fields = dataclasses.fields(cls)
        known = {f.name for f in fields} - {"tokenizer_backend"}  # set by tokenizer: {path, backend}
        for key in data:
            if key not in known:
                raise SpecError(f"{key}: unknown key{close_match(key, sorted(known))} (allowed: {', '.join(sorted(known))})")
        if isinstance(data.get("tokenizer"), Mapping):
            tok = build(TokenizerSpec, data["tokenizer"], "tokenizer")
            data["tokenizer"], data["tokenizer_backend"] = tok.path, tok.backend
        values: dict[str, Any] = {}
        for f in fields:
            section = f.metadata.get("section")
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if section is not None and (f.name in data or required):
                values[f.name] = section(data.get(f.name), ctx)
            elif f.name in data:
                values[f.name] = data[f.name]
        spec = build(cls, values, "spec")
        task_cls = ctx.registry.task(spec.task.kind)
        check = getattr(task_cls, "check_spec", None)
        if check is not None:
            check(spec)
        return spec

    # ------------------------------------------------------------------ identity
    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data (what :meth:`hash` covers, plus engine/workers/prefetch)."""
        d = to_plain(self)
        d["task"] = {"kind": self.task.kind, **to_plain(self.task.options)}
        d["batching"] = {"strategy": self.batching.strategy, "batch_size": self.batching.batch_size,
                         "remainder": self.batching.remainder, **to_plain(self.batching.options)}
        for s in d["sources"]:
            s.pop("iterable", None)
            if s.get("tokens") is None:
                s.pop("tokens", None)  # absent unless set, so older specs keep their hash
        backend = d.pop("tokenizer_backend")
        if backend != "auto" and self.tokenizer:
            d["tokenizer"] = {"path": self.tokenizer, "backend": backend}
        return d

    def hash(self) -> str:
        """A stable hex digest of everything that determines the batches."""
        d = self.to_dict()
        d["tokenizer"] = self.tokenizer  # the backend gives the same batches
        for f in dataclasses.fields(self):
            if not f.metadata.get("hash", True):
                d.pop(f.name, None)
        for s in d["sources"]:  # options added later are hashed only when set, so old states still resume
            for k, default in _HASHED_IF_SET.items():
                if s.get(k) == default:
                    s.pop(k, None)
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> Spec:
        """A copy with some top-level fields changed."""
        return dataclasses.replace(self, **changes)


# Source options whose default value is left out of the hash (see Spec.hash).
_HASHED_IF_SET: dict[str, Any] = {"max_record_bytes": 32 << 20}


@dataclass(frozen=True)
class Registry:
    """Where a spec finds the class behind a task kind and a batching strategy.

    The spec never imports the task or batcher packages (they sit above it); the package root
    installs feedline's registries with :func:`use_registry`, and :meth:`Spec.load` takes
    another one for a test or an embedding application::

        >>> Registry(task=lambda kind: MyTask, batcher=lambda strategy: MyBatcher)   # doctest: +SKIP

    Each callable raises :class:`~feedline.errors.SpecError` for an unknown name and returns
    a class with an ``Options`` dataclass (tasks may also have a ``check_spec(spec)`` hook).
    """

    task: Callable[[str], Any]
    batcher: Callable[[str], Any]


_REGISTRY: list[Registry] = []


def use_registry(registry: Registry) -> None:
    """Make ``registry`` the default of :meth:`Spec.load` (``feedline/__init__.py`` installs feedline's)."""
    _REGISTRY[:] = [registry]


def _default_registry() -> Registry:
    if not _REGISTRY:
        raise SpecError("no task/batcher registry is installed; import feedline (which installs it) or pass registry=")
    return _REGISTRY[0]


def read_spec_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``.yaml``/``.yml``/``.json`` spec file (``-`` reads standard input)."""
    import sys

    import yaml

    p = str(path)
    try:
        text = sys.stdin.read() if p == "-" else Path(p).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{p}: spec file not found") from None
    except OSError as e:
        raise SpecError(f"{p}: cannot read spec file ({e.strerror})") from e
    try:
        data = json.loads(text) if p.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise SpecError(f"{p}: not valid {'JSON' if p.endswith('.json') else 'YAML'}: {e}") from e
    if not isinstance(data, dict):
        raise SpecError(f"{p}: a spec must be a mapping at the top level, got {type(data).__name__}")
    return data
