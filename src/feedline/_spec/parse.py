"""Parsing a spec's sections: shorthands, paths against ``root``, and each kind's own options.

A spec field with a ``section`` in its metadata (:class:`~feedline._spec.spec.Spec`) is parsed by
one of these functions; every other field, and what a section returns, goes through
:func:`~feedline._core.options.build`. Also here: the two path rules
(:func:`join_root` resolves a path written relative to ``root``; :func:`portable_path` is how the
hash sees a path). Reading a spec file is :mod:`feedline._spec.files`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedline._core.options import build, close_match
from feedline._spec.sections import (
    BatchingSpec,
    EngineSpec,
    ParallelSpec,
    ShuffleSpec,
    SourceSpec,
    TaskSpec,
    TransformSpec,
)
from feedline.errors import SpecError

__all__ = ["fold_engine", "join_root", "portable_path"]

log = logging.getLogger("feedline")


@dataclass(frozen=True)
class _Context:
    base: str | None
    registry: Any  # the spec's Registry (task, batcher and format lookups)
    relative: list[int] = field(default_factory=list)  # sources (and -1: the tokenizer) written relative
    untexted: list[int] = field(default_factory=list)  # sources written without a text: key


def join_root(root: str | os.PathLike[str] | None, path: str) -> str:
    """``path`` resolved against ``root`` (a folder or a URL prefix); absolute paths and URLs unchanged.

        >>> join_root("s3://bucket/corpus", "en/*.jsonl")
        's3://bucket/corpus/en/*.jsonl'
        >>> join_root(None, "corpus.jsonl")
        'corpus.jsonl'
    """
    if root is None or not path or "://" in path or os.path.isabs(path):
        return path
    root = str(root)
    if "://" in root:
        return root.rstrip("/") + "/" + path
    return str(Path(root) / path)


def portable_path(root: str | None, path: str) -> str:
    """``path`` as the hash sees it: relative to ``root`` where it lies under it, normalized.

        >>> portable_path("/data/run", "/data/run/./corpus/a.jsonl")
        'corpus/a.jsonl'
        >>> portable_path(None, "./corpus/../corpus/a.jsonl")
        'corpus/a.jsonl'
    """
    if "://" in path:
        if root and "://" in root and path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) + 1:]
        return path
    norm = os.path.normpath(path)
    if root is not None and "://" not in root:
        r = os.path.normpath(root)
        if norm == r:
            return "."
        if norm.startswith(r.rstrip(os.sep) + os.sep):
            norm = norm[len(r.rstrip(os.sep)) + 1:]
    return norm.replace(os.sep, "/")


def _default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _sources(raw: Any, ctx: _Context) -> tuple[SourceSpec, ...]:
    if not raw:
        raise SpecError("sources: at least one source is required, e.g. sources: [{path: corpus.jsonl}]")
    if isinstance(raw, (str, os.PathLike, Mapping)):
        raw = [raw]
    out = []
    if not isinstance(raw, (list, tuple)):
        raise SpecError(f"sources: expected a list of sources, a path or a mapping, got {type(raw).__name__} {raw!r:.60}")
    for i, s in enumerate(raw):
        if isinstance(s, os.PathLike):  # a pathlib.Path from Python
            s = os.fspath(s)
        if not isinstance(s, (str, Mapping, SourceSpec)):
            raise SpecError(f"sources[{i}]: expected a path or a mapping such as {{path: corpus.jsonl, text: text}}, "
                            f"got {type(s).__name__} {s!r:.60}")
        src = build(SourceSpec, {"path": s} if isinstance(s, str) else s, f"sources[{i}]")
        if isinstance(s, str) or (isinstance(s, Mapping) and "text" not in s):
            ctx.untexted.append(i)
        _check_format(src.format, f"sources[{i}].format", ctx.registry)
        if ctx.base is not None and src.path:
            resolved = join_root(ctx.base, src.path)
            if resolved != src.path:
                ctx.relative.append(i)
                src = dataclasses.replace(src, path=resolved)
        out.append(src)
    return tuple(out)


def _check_format(fmt: str, path: str, registry: Any) -> None:
    known = sorted(registry.formats()) if registry.formats is not None else None
    if known is not None and fmt != "auto" and fmt not in known:
        raise SpecError(f"{path}: {fmt!r} is not a format{close_match(fmt, ['auto', *known])} "
                        f"(formats: auto, {', '.join(known)})")


def _check_keys(raw: Mapping[str, Any], known: list[str], path: str, owner: str) -> None:
    """Refuse an unknown key of a section that holds common keys beside a kind's options,
    with a close match and every key the section takes (``owner`` says whose options they are)."""
    for key in raw:
        if key not in known:
            raise SpecError(f"{path}.{key}: unknown key{close_match(str(key), known)} "
                            f"(allowed with {owner}: {', '.join(known)})")


def _task(raw: Any, ctx: _Context) -> TaskSpec:
    if raw is not None and not isinstance(raw, (str, Mapping)):
        raise SpecError(f"task: expected a kind (task: clm) or a mapping (task: {{kind: clm, max_length: 1024}}), "
                        f"got {type(raw).__name__} {raw!r:.60}")
    raw = {"kind": raw} if isinstance(raw, str) else dict(raw or {})
    kind = raw.pop("kind", _default(TaskSpec, "kind"))
    options_cls = ctx.registry.task(kind).Options
    _check_keys(raw, ["kind", *(f.name for f in dataclasses.fields(options_cls))], "task", f"kind {kind!r}")
    return build(TaskSpec, {"kind": kind, "options": build(options_cls, raw, "task")}, "task")


def _batching(raw: Any, ctx: _Context) -> BatchingSpec:
    if raw is not None and not isinstance(raw, Mapping):
        raise SpecError(f"batching: expected a mapping such as {{strategy: pad, batch_size: 32}}, "
                        f"got {type(raw).__name__} {raw!r:.60}")
    raw = dict(raw or {})
    names = [f.name for f in dataclasses.fields(BatchingSpec) if f.name != "options"]
    common = {name: raw.pop(name) for name in names if name in raw}
    strategy = common.get("strategy", _default(BatchingSpec, "strategy"))
    options_cls = ctx.registry.batcher(strategy).Options
    _check_keys(raw, [*names, *(f.name for f in dataclasses.fields(options_cls))], "batching",
                f"strategy {strategy!r}")
    options = build(options_cls, raw, "batching")
    return build(BatchingSpec, {**common, "options": options}, "batching")


def _shuffle(raw: Any, ctx: _Context) -> ShuffleSpec | None:
    if raw is None or raw is False:
        return None
    if raw is True:
        raw = {}
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = {"buffer": raw}
    if not isinstance(raw, Mapping):
        raise SpecError(f"shuffle: expected a buffer size (shuffle: 10000), {{buffer: 10000, shards: true}}, true "
                        f"(the defaults) or false/null (off), got {type(raw).__name__} {raw!r:.60}")
    return build(ShuffleSpec, raw, "shuffle")


def _transforms(raw: Any, ctx: _Context) -> tuple[TransformSpec, ...]:
    from feedline._core.callables import resolve
    from feedline._core.static_imports import locate, without_imports_active

    if raw is None:
        return ()
    if isinstance(raw, Mapping) or not isinstance(raw, (list, tuple)):
        raise SpecError(f"transforms: expected a list such as [{{map: 'pkg.mod:func'}}, {{filter: 'pkg.mod:func'}}], "
                        f"got {raw!r:.60}")
    out = []
    for i, t in enumerate(raw):
        spec = build(TransformSpec, t, f"transforms[{i}]")
        if isinstance(spec.fn, str) and without_imports_active():   # spec --check: runs no module it can avoid
            locate(spec.fn, f"transforms[{i}].{spec.kind}")
        elif isinstance(spec.fn, str):
            resolve(spec.fn, f"transforms[{i}].{spec.kind}")  # a typo fails here, not at the first record
        out.append(spec)
    return tuple(out)


_told_engine: set[str] = set()   # the engine sections already told of in this process


def fold_engine(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its old ``engine`` section folded into ``parallel``, told in one warning line.

    ``engine: {kind: ray, address: A}`` reads as ``parallel: {map: ray, address: A}``: the same
    batches, spec hash and states (neither section is hashed). A key written in both that
    disagrees is refused, naming both; ``engine.num_cpus`` (the CPUs of a local Ray instance) is
    no longer read: parallel's ``num_cpus`` is what each Ray task or actor reserves.

        >>> fold_engine({"engine": "ray", "parallel": "processes"})["parallel"]   # doctest: +SKIP
        {'placement': 'processes', 'map': 'ray'}

    Raises:
        SpecError: ``engine`` and ``parallel`` disagree (``kind``/``map``, ``address``).
    """
    out = dict(data)
    raw = out.pop("engine")
    if raw is None:
        return out
    written = {"kind": raw} if isinstance(raw, str) else dict(raw) if isinstance(raw, Mapping) else raw
    old = build(EngineSpec, written, "engine")
    par = out.get("parallel")
    parallel = {"placement": par} if isinstance(par, str) else dict(par) if isinstance(par, Mapping) else {}
    if par is not None and not isinstance(par, (str, Mapping)):
        return out   # parallel's own parse names what is wrong with it
    moved = {new: getattr(old, was) for was, new in (("kind", "map"), ("address", "address")) if was in written}
    for key, value in moved.items():
        if key in parallel and parallel[key] != value:
            was = "kind" if key == "map" else key
            raise SpecError(f"engine.{was}: {value!r} and parallel.{key}: {parallel[key]!r} disagree; engine is folded "
                            f"into parallel: remove engine and keep parallel.{key}")
        parallel[key] = value
    out["parallel"] = parallel
    shown = ", ".join(f"{k}: {v}" for k, v in moved.items())
    dropped = "; engine.num_cpus is no longer read (a local Ray instance gets every core: start Ray with " \
              "`ray start --head --num-cpus N` or ray.init(num_cpus=N) to size it)" if old.num_cpus is not None else ""
    said = f"{_plain(written)}{dropped}"
    if said not in _told_engine:   # once per process: a spec is often read twice (a check, then the loader)
        _told_engine.add(said)
        log.warning("spec key engine is folded into parallel: engine: %s reads as parallel: {%s} (the same "
                    "batches, hash and states); write that instead%s", _plain(written), shown, dropped)
    return out


def _plain(written: Any) -> str:
    if not isinstance(written, Mapping):
        return str(written)
    return "{" + ", ".join(f"{k}: {v}" for k, v in written.items()) + "}"


def _parallel(raw: Any, ctx: _Context) -> ParallelSpec:
    return build(ParallelSpec, {"placement": raw} if isinstance(raw, str) else (raw or {}), "parallel")
