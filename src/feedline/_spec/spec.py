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
batches (fields marked ``hash: False`` in their metadata: ``parallel``, ``workers``, ``prefetch``,
``streams``), so a resume state can refuse another spec. Every section is declared by its
dataclass and parsed with :func:`~feedline._core.options.build`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from feedline._core.callables import importable
from feedline._core.options import build, close_match, to_plain
from feedline._spec.files import parse_spec_text, read_spec_text
from feedline._spec.parse import (
    _batching,
    _Context,
    _parallel,
    _shuffle,
    _sources,
    _task,
    _transforms,
    fold_engine,
    join_root,
    portable_path,
)
from feedline._spec.sections import (
    Backend,
    BatchingSpec,
    MixSpec,
    OnError,
    ParallelSpec,
    ShuffleSpec,
    SourceSpec,
    TaskSpec,
    TokenizerSpec,
    TokensSpec,
    TransformSpec,
)
from feedline.errors import SpecError

__all__ = ["BatchingSpec", "MixSpec", "ParallelSpec", "Registry", "ShuffleSpec", "SourceSpec", "Spec", "TaskSpec", "TokenizerSpec",
           "TokensSpec", "TransformSpec", "join_root", "portable_path", "use_registry"]

# ---------------------------------------------------------------------- sections
# A spec field with a ``section`` in its metadata is parsed by that function (shorthands, and the
# task's and strategy's own options dataclasses from the registry); every other field, and what a
# section returns, goes through core.options.build. ``hash: False`` leaves a field out of the hash.

NOT_HASHED: Mapping[str, Any] = {"hash": False}


@dataclass(frozen=True, kw_only=True)
class Spec:
    """A validated pipeline description. Build it with :meth:`load`.

    Attributes:
        sources: where the records come from: a path, glob, directory, URL or ``{hf: name}``, or a
            list of sources (``source:`` takes one). See the ``sources[]`` section.
        task: what an example is: ``{kind: clm | mlm | span | sop | classify | chat | infer, ...}``
            with the kind's options beside ``kind`` (a string is the kind alone).
        batching: how examples become global batches: ``{strategy: pad | bucket | pack | concat,
            batch_size, remainder, ...}`` with the strategy's options beside them.
        tokenizer: a ``tokenizer.json``, a tokenizer directory, a SentencePiece ``.model`` or a hub
            name (cached locally); or ``{path, backend}`` to choose the encoder.
        tokenizer_backend: set through ``tokenizer: {path, backend}``; not a key of its own.
        seed: the seed of every random choice (shard order, mixing, shuffling, masking); same spec
            and seed give the same batches on any machine.
        epochs: passes over the data; ``null`` for an endless stream.
        mix: how several sources interleave (``stopping`` rule); weights are set per source.
        transforms: record ``map``/``filter`` functions (import paths) run in order after mixing,
            before the shuffle buffer; see the ``transforms[]`` section.
        shuffle: ``{buffer, shards}``, a buffer size, ``true`` (the defaults) or ``null``/``false`` (off).
        on_error: a malformed record is counted and skipped (``skip``) or stops the run (``raise``).
        on_unreadable: a file, URL or dataset that cannot be opened or read (missing, permission
            denied, 404, hub unreachable) stops the run with its reason (``raise``), or is counted as
            ``unreadable`` while the other files are read (``skip``).
        reject_limit: records all rejected at a fresh start before the run stops with an error
            naming the likely fix (0 turns the early stop off; counting goes on).
        root: the folder (or URL prefix, ``s3://bucket/corpus``) that relative source and tokenizer
            paths are read from; default: the spec file's folder, or the working directory for a
            mapping. Not hashed: a state resumes with the corpus moved when ``root`` names the new place.
        partitions: independent pipelines (K) that the splits are dealt to, taking turns to
            make whole steps; changes the stream like the seed (1: one pipeline).
        parallel: where the work runs: the partitions (``{placement: auto | threads | processes | ray,
            processes, prefetch, warm_start, hang_timeout}`` or the placement alone) and the task's
            per-record map (``map: local | ray``), one Ray ``address`` and ``num_cpus``; never changes a
            batch. The old ``engine`` section is read into it (one warning line).
        workers: task threads (``0``: chosen from the cores).
        prefetch: batches prepared ahead of the consumer, on a thread (where the partitions run in
            worker processes that start at the first ask, without a warm start, they run
            ``parallel.prefetch`` ahead there, and the consumer's thread composes: no thread here).
        streams: a service's other named streams (``validation: val.yaml`` or overrides of this spec).
    """

    sources: tuple[SourceSpec, ...] = field(metadata={"section": _sources})
    task: TaskSpec = field(metadata={"section": _task})
    batching: BatchingSpec = field(metadata={"section": _batching})
    tokenizer: str | None = None
    #: The encoder backend (``tokenizer: {path, backend}``); not hashed: batches are the same.
    tokenizer_backend: Backend = field(default="auto", metadata=NOT_HASHED)
    seed: int = 0
    epochs: int | None = 1
    mix: MixSpec = MixSpec()  # noqa: RUF009 (frozen: one shared default is safe)
    #: Record ``map``/``filter`` steps after mixing, before the shuffle buffer (TransformSpec).
    transforms: tuple[TransformSpec, ...] = field(default=(), metadata={"section": _transforms})
    shuffle: ShuffleSpec | None = field(default=None, metadata={"section": _shuffle})
    on_error: OnError = "skip"
    #: A file or dataset that cannot be read stops the run (``raise``) or is counted (``skip``).
    on_unreadable: Literal["raise", "skip"] = field(default="raise", metadata=NOT_HASHED)
    #: Records all rejected at a fresh start before a SourceError (0: off); never changes batches.
    reject_limit: int = field(default=1000, metadata=NOT_HASHED)
    #: Where relative paths are read from; not hashed, so a moved corpus resumes (see hash()).
    root: str | None = field(default=None, metadata=NOT_HASHED)
    #: The sources (``-1``: the tokenizer) written relative to ``root``; set by loading, hashed as written.
    relative: tuple[int, ...] = field(default=(), repr=False, metadata=NOT_HASHED)
    #: The sources read whole (``text: null``) because the task reads whole records and they
    #: write no ``text:``; set by loading, hashed as written (the default ``text: text``).
    whole: tuple[int, ...] = field(default=(), repr=False, metadata=NOT_HASHED)
    #: Independent pipelines the splits are dealt to, composed into each global step (changes the stream).
    partitions: int = 1
    #: Where the partitions run (threads, processes, Ray actors); never changes the batches.
    parallel: ParallelSpec = field(default=ParallelSpec(), metadata={"section": _parallel, **NOT_HASHED})
    workers: int = field(default=0, metadata=NOT_HASHED)
    prefetch: int = field(default=4, metadata=NOT_HASHED)
    streams: Mapping[str, Any] | None = field(default=None, metadata=NOT_HASHED)

    def __post_init__(self) -> None:
        if self.epochs is not None and self.epochs < 1:
            raise SpecError(f"epochs: {self.epochs} must be >= 1, or null for endless")
        if self.workers < 0:
            raise SpecError(f"workers: {self.workers} must be >= 0 (0 = automatic)")
        if self.prefetch < 1:
            raise SpecError(f"prefetch: {self.prefetch} must be >= 1 (batches made ahead on a thread); to make each "
                            "batch in the caller's thread instead, pass Loader(spec, prefetch=0) in-process")
        if self.reject_limit < 0:
            raise SpecError(f"reject_limit: {self.reject_limit} must be >= 0 (0 turns the check off)")
        if not isinstance(self.partitions, int) or isinstance(self.partitions, bool) or self.partitions < 1:
            raise SpecError(f"partitions: {self.partitions!r} must be a positive integer (1 = one pipeline)")

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, spec: Spec | Mapping[str, Any] | str | os.PathLike[str], *, registry: Registry | None = None) -> Spec:
        """Load and validate a spec from a ``Spec``, a mapping, or a ``.yaml``/``.json`` file.

        Relative source (and tokenizer) paths are resolved against ``root``: the spec's own
        ``root`` key, else the file's directory for a file; a mapping without ``root`` leaves them
        relative to the working directory. ``registry`` names the task and batcher classes
        (default: feedline's, installed by the package).
        """
        if isinstance(spec, Spec):
            return spec
        if isinstance(spec, (str, os.PathLike)):
            text = read_spec_text(spec)
            data = parse_spec_text(text, str(spec))
            try:
                return cls.from_mapping(data, base=Path(spec).resolve().parent, registry=registry)
            except SpecError as e:
                if type(e) is not SpecError or str(spec) == "-":
                    raise
                from feedline._spec.locate import located

                raise SpecError(located(str(e), str(spec), text)) from e
        if isinstance(spec, Mapping):
            return cls.from_mapping(spec, registry=registry)
        raise SpecError(f"a spec must be a path, a mapping or a feedline.Spec; got {type(spec).__name__}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], base: str | os.PathLike[str] | None = None, *,
                     registry: Registry | None = None) -> Spec:
        """Validate a mapping; see the module docstring for the layout.

        ``base`` is the folder relative paths are read from when the mapping has no ``root``
        (a spec file's folder). After the spec is built, the task class's ``check_spec(spec)``
        hook may refuse settings the task cannot work with (e.g. ``infer`` refuses shuffling).
        """
        data = fold_engine(dict(data)) if "engine" in data else dict(data)
        root = data.get("root")
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise SpecError(f"root: expected a folder or URL prefix, got {type(root).__name__} {root!r:.60}")
        if root is None and base is not None:
            root = base
        if root is not None:
            root = str(root) if "://" in str(root) else os.path.abspath(os.path.expanduser(str(root)))
            data["root"] = root
        ctx = _Context(base=root, registry=registry or _default_registry())
        if "source" in data:
            if "sources" in data:
                raise SpecError("give either 'source' or 'sources', not both")
            data["sources"] = [data.pop("source")]
        fields = dataclasses.fields(cls)
        known = {f.name for f in fields} - {"tokenizer_backend", "relative", "whole"}  # set by tokenizer: {path, backend}; by loading
        for key in data:
            if key not in known:
                raise SpecError(f"{key}: unknown key{close_match(key, sorted(known))} (allowed: {', '.join(sorted(known))})")
        if isinstance(data.get("tokenizer"), Mapping):
            tok = build(TokenizerSpec, data["tokenizer"], "tokenizer")
            data["tokenizer"], data["tokenizer_backend"] = tok.path, tok.backend
        if isinstance(data.get("tokenizer"), str) and root is not None:
            resolved = join_root(root, data["tokenizer"])
            if resolved != data["tokenizer"] and ("://" in resolved or os.path.exists(resolved)):
                data["tokenizer"] = resolved  # else a hub name, or a path relative to the working directory
                ctx.relative.append(-1)
        values: dict[str, Any] = {}
        for f in fields:
            section = f.metadata.get("section")
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if section is not None and (f.name in data or required):
                values[f.name] = section(data.get(f.name), ctx)
            elif f.name in data:
                values[f.name] = data[f.name]
        values["relative"] = tuple(sorted(ctx.relative))
        spec = build(cls, values, "")
        task_cls = ctx.registry.task(spec.task.kind)
        if getattr(task_cls, "whole_records", False) and ctx.untexted:  # chat: no text: means whole records
            sources = tuple(dataclasses.replace(s, text=None) if i in ctx.untexted else s for i, s in enumerate(spec.sources))
            spec = dataclasses.replace(spec, sources=sources, whole=tuple(ctx.untexted))
        batching = data.get("batching")
        default_remainder = getattr(task_cls, "default_remainder", None)
        if default_remainder and not (isinstance(batching, Mapping) and "remainder" in batching):
            spec = dataclasses.replace(spec, batching=dataclasses.replace(spec.batching, remainder=default_remainder))
        check = getattr(task_cls, "check_spec", None)
        if getattr(ctx.registry.batcher(spec.batching.strategy), "joins_examples", False) \
                and not getattr(task_cls, "packable", True):
            fits = [s for s in ("pad", "bucket") if _accepts(check, spec, s)]
            raise SpecError(
                f"batching.strategy: {spec.batching.strategy!r} puts several examples in one row, which task "
                f"{spec.task.kind!r} does not allow (its rows carry per-example labels or keys); use strategy "
                + " or ".join(repr(s) for s in fits))
        if check is not None:
            check(spec)
        return spec

    def check_root(self) -> None:
        """Before reading: a local :attr:`root` that relative sources are read from must be a folder.

        Raises:
            SpecError: naming ``root:``, a source written relative to it, and the fix.
        """
        root = self.root
        rel = [i for i in self.relative if i >= 0]
        if root is None or "://" in root or not rel or os.path.isdir(root):
            return
        first = self.sources[rel[0]]
        written = portable_path(root, first.path) if first.path else first.label
        what = "is not a folder" if os.path.exists(root) else "does not exist"
        raise SpecError(f"root: {root} {what}; sources[{rel[0]}] ({written}) is read relative to it"
                        f"{f' (and {len(rel) - 1} more source(s))' if len(rel) > 1 else ''}: set the spec's root: "
                        "to the folder that holds the corpus, or write the source paths absolute")

    # ------------------------------------------------------------------ identity
    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data (what :meth:`hash` covers, plus parallel/workers/prefetch)."""
        d = to_plain(self)
        relative = d.pop("relative")
        for i in d.pop("whole"):  # left unwritten, so another process reads them whole as well
            d["sources"][i].pop("text", None)
        for i in relative:  # written relative to root: so they stay (another process resolves them the same)
            if 0 <= i < len(self.sources) and self.sources[i].path:
                d["sources"][i]["path"] = portable_path(self.root, self.sources[i].path)
        if -1 in relative and self.tokenizer:
            d["tokenizer"] = portable_path(self.root, self.tokenizer)
        d["task"] = {"kind": self.task.kind, **to_plain(self.task.options)}
        d["batching"] = {"strategy": self.batching.strategy, "batch_size": self.batching.batch_size,
                         "remainder": self.batching.remainder, **to_plain(self.batching.options)}
        for s in d["sources"]:
            s.pop("iterable", None)
            if s.get("tokens") is None:
                s.pop("tokens", None)  # absent unless set, so older specs keep their hash
            if s.get("cache") is None:
                s.pop("cache", None)
        # An importable function becomes its import path (so the dict can be written to a file for
        # another process); a lambda stays itself (it works in this process only).
        d["transforms"] = [{t.kind: t.fn if isinstance(t.fn, str) or not importable(t.fn) else t.name}
                           for t in self.transforms]
        if not d["transforms"]:
            d.pop("transforms")  # absent unless set, so older specs keep their hash
        backend = d.pop("tokenizer_backend")
        if backend != "auto" and self.tokenizer:
            d["tokenizer"] = {"path": d["tokenizer"], "backend": backend}
        return d

    def hash(self) -> str:
        """A stable hex digest of everything that determines the batches, as the user wrote it.

        Paths are hashed as written (normalized): one written relative to :attr:`root` stays
        relative, so a spec file and a mapping of the same content hash alike, and a corpus moved
        to another folder, mount or bucket prefix resumes once ``root`` names its new place.
        """
        return self._digest(portable=True)

    def accepted_hashes(self) -> tuple[str, ...]:
        """The hashes a resume state of this spec may carry: :meth:`hash`, then the hash that
        feedline 0.1's first releases gave (resolved absolute paths), so their states still resume."""
        legacy = self._digest(portable=False)
        current = self.hash()
        return (current,) if legacy == current else (current, legacy)

    def _digest(self, *, portable: bool) -> str:
        d = self.to_dict()  # paths as written: those written relative to root stay relative
        d["tokenizer"] = d["tokenizer"]["path"] if isinstance(d.get("tokenizer"), dict) else d.get("tokenizer")
        if self.transforms:  # import paths, or module:qualname for callables
            d["transforms"] = [{t.kind: t.name} for t in self.transforms]
        for f in dataclasses.fields(self):
            if not f.metadata.get("hash", True):
                d.pop(f.name, None)
        for i in self.whole:  # as written: no text:, the default (so states of older versions resume)
            d["sources"][i]["text"] = "text"
        for s in d["sources"]:  # options added later are hashed only when set, so old states still resume
            for k, default in _HASHED_IF_SET.items():
                if s.get(k) == default:
                    s.pop(k, None)
            s.pop("cache", None)  # where copies of remote objects live: the same batches either way
        for i, s in enumerate(d["sources"]):
            if s.get("path"):  # as written, normalized; the first releases hashed resolved paths
                s["path"] = portable_path(None, s["path"]) if portable else self.sources[i].path
        if d.get("partitions") == 1:  # one partition is the stream from before partitions existed
            d.pop("partitions")
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> Spec:
        """A copy with some top-level fields changed (new sources, root or tokenizer are taken as written)."""
        if {"sources", "root", "tokenizer"} & changes.keys():
            changes.setdefault("relative", ())
        if "sources" in changes:
            changes.setdefault("whole", ())
        return dataclasses.replace(self, **changes)


def _accepts(check: Callable[[Spec], None] | None, spec: Spec, strategy: str) -> bool:
    """Whether a task's ``check_spec`` accepts ``spec`` batched by ``strategy`` (its common keys kept)."""
    if check is None:
        return True
    try:
        check(dataclasses.replace(spec, batching=dataclasses.replace(spec.batching, strategy=strategy)))
    except SpecError:
        return False
    return True


# Source options whose default value is left out of the hash (see Spec.hash).
_HASHED_IF_SET: dict[str, Any] = {"max_record_bytes": 32 << 20, "keep_blank": False, "infer_types": False}


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
    #: The source formats known now (``auto`` aside), so a typo fails at load; ``None``: not checked.
    formats: Callable[[], Iterable[str]] | None = None


_REGISTRY: list[Registry] = []


def use_registry(registry: Registry) -> None:
    """Make ``registry`` the default of :meth:`Spec.load` (``feedline/__init__.py`` installs feedline's)."""
    _REGISTRY[:] = [registry]


def _default_registry() -> Registry:
    if not _REGISTRY:
        raise SpecError("no task/batcher registry is installed; import feedline (which installs it) or pass registry=")
    return _REGISTRY[0]
