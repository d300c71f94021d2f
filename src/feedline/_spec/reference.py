"""The spec reference, generated from the spec's dataclasses: ``docs/spec.md`` and a JSON Schema.

Every key's type, default and allowed values come from the dataclass fields; its meaning from
the ``Attributes:`` section of the class docstring (so the reference cannot drift from the
code, and ``tests/test_spec_reference.py`` fails on a field without a description)::

    >>> from feedline._spec.sections import ShuffleSpec
    >>> [(d.name, d.default) for d in describe(ShuffleSpec)]
    [('buffer', '10000'), ('shards', 'true')]

The task kinds and batching strategies sit above the spec, so their options classes are handed
in (``{kind: OptionsClass}``) by the caller (``feedline spec``, the test).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from feedline._spec import files
from feedline._spec.sections import BatchingSpec, EngineSpec, TaskSpec, TokenizerSpec
from feedline._spec.spec import Spec

__all__ = ["FieldDoc", "describe", "json_schema", "markdown", "undocumented"]

_HIDDEN = {"tokenizer_backend", "iterable", "options", "relative", "whole"}  # set through another key, or from Python only
_ITEM = re.compile(r"^(\s*)([A-Za-z_][\w]*(?:\s*,\s*[A-Za-z_][\w]*)*)\s*:\s*(.*)$")


@dataclass(frozen=True)
class FieldDoc:
    """One key of a section: its name, type, default (as YAML), allowed values and meaning."""

    name: str
    type: str
    default: str
    allowed: tuple[str, ...]
    doc: str


def _attribute_docs(cls: type) -> dict[str, str]:
    """``name -> text`` from the ``Attributes:`` sections of ``cls`` and its bases."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.getdoc(klass) or ""
        lines = doc.splitlines()
        try:
            start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
        except StopIteration:
            continue
        names: list[str] = []
        indent = None
        for line in lines[start + 1:]:
            if not line.strip():
                continue
            m = _ITEM.match(line)
            level = len(line) - len(line.lstrip())
            if indent is None:
                indent = level
            if level < indent:
                break
            if m and level == indent:
                names = [n.strip() for n in m.group(2).split(",")]
                for n in names:
                    out[n] = m.group(3).strip()
            elif names:
                for n in names:
                    out[n] = f"{out[n]} {line.strip()}".strip()
    return out


def _yaml(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    if dataclasses.is_dataclass(value):
        return "{}"
    return str(value)


def _type_name(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "string"
    if origin in (Union, types.UnionType):
        names = [_type_name(a) for a in get_args(hint) if a is not type(None)]
        return " | ".join(dict.fromkeys(names)) + (" | null" if type(None) in get_args(hint) else "")
    if origin in (tuple, list, Sequence):
        args = [a for a in get_args(hint) if a is not Ellipsis]
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin in (dict, Mapping) or hint is Any:
        return "mapping" if hint is not Any else "any"
    if dataclasses.is_dataclass(hint):
        return "mapping"
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(hint, getattr(hint, "__name__", str(hint)))


def _allowed(hint: Any) -> tuple[str, ...]:
    """The values a key takes where they are few: a Literal's, and ``true``/``false`` beside it."""
    for h in (hint, *get_args(hint)):
        if get_origin(h) is Literal:
            flags = ("true", "false") if bool in get_args(hint) else ()
            return (*flags, *(str(a) for a in get_args(h)))
    return ()


def describe(cls: type, *, skip: Sequence[str] = ()) -> list[FieldDoc]:
    """The documented keys of an options dataclass, in declaration order."""
    docs = _attribute_docs(cls)
    hints = get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init or f.name in _HIDDEN or f.name in skip:
            continue
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out.append(FieldDoc(f.name, _type_name(hints[f.name]), _yaml(default), _allowed(hints[f.name]),
                            docs.get(f.name, "")))
    return out


def undocumented(tasks: Mapping[str, type], batchers: Mapping[str, type]) -> list[str]:
    """Every ``Class.field`` of the spec without a description (what the reference test refuses)."""
    return [f"{cls.__name__}.{d.name}" for cls in _classes(tasks, batchers) for d in describe(cls) if not d.doc]


# ---------------------------------------------------------------------------- sections
def _sections() -> list[tuple[str, type]]:
    """(key path, dataclass) of every nested section of :class:`Spec`, in field order."""
    out: list[tuple[str, type]] = []
    hints = get_type_hints(Spec)

    def walk(path: str, hint: Any) -> None:
        if get_origin(hint) in (Union, types.UnionType):
            for h in get_args(hint):
                walk(path, h)
        elif get_origin(hint) in (tuple, list, Sequence):
            walk(f"{path}[]", get_args(hint)[0])
        elif dataclasses.is_dataclass(hint) and hint not in (TaskSpec, BatchingSpec):
            out.append((path, hint))  # type: ignore[arg-type]
            sub = get_type_hints(hint)
            for f in dataclasses.fields(hint):
                if f.name not in _HIDDEN:
                    walk(f"{path}.{f.name}", sub[f.name])

    for f in dataclasses.fields(Spec):
        walk(f.name, hints[f.name])
        if f.name == "tokenizer":
            out.append(("tokenizer", TokenizerSpec))  # ``tokenizer: {path, backend}`` (a string is the path)
    return out


def _classes(tasks: Mapping[str, type], batchers: Mapping[str, type]) -> list[type]:
    return [Spec, *(c for _, c in _sections()), BatchingSpec, *tasks.values(), *batchers.values()]


_EXAMPLES = {
    "": "seed: 1234\nsources: [{path: corpus/*.jsonl.zst, text: text}]\ntokenizer: tokenizers/gpt2\n"
        "shuffle: {buffer: 10000}\ntask: {kind: clm, max_length: 1024}\n"
        "batching: {strategy: pack, batch_size: 32}",
    "sources[]": "sources:\n  - {path: wiki/*.parquet, text: text, weight: 3}\n  - {path: s3://bucket/books/, format: jsonl}",
    "sources[].tokens": "sources: [{path: train.bin, format: flat, tokens: {dtype: uint16, eos: 50256}}]",
    "sources[].cache": "sources: [{path: s3://bucket/c4/, cache: {dir: /nvme/feedline-cache, max_bytes: 200000000000}}]",
    "tokenizer": "tokenizer: {path: tokenizers/t5/spiece.model, backend: sentencepiece}",
    "mix": "mix: {stopping: first_exhausted}",
    "transforms[]": "transforms:\n  - {filter: 'mypkg.clean:is_english'}\n  - {map: 'mypkg.clean:normalize'}",
    "parallel": "partitions: 4\nparallel: {placement: processes, processes: 2}    # or parallel: processes\n"
                "parallel: {map: ray, address: auto}    # tokenize on a Ray cluster (was engine: {kind: ray})",
    "shuffle": "shuffle: {buffer: 50000, shards: true}",
    "task": "task: {kind: mlm, max_length: 128, mlm_probability: 0.15}",
    "batching": "batching: {strategy: pad, batch_size: 32, remainder: keep}",
}


_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data):`~?(?:[\w.]*\.)?([\w]+)`")


def _md(text: str) -> str:
    """Docstring text as Markdown: Sphinx roles become the bare name, RST literals single backticks."""
    return _ROLE.sub(r"`\1`", text).replace("``", "`")


def _table(rows: list[FieldDoc]) -> list[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for d in rows:
        kind = d.type.replace("|", "\\|") if not d.allowed else " \\| ".join(f"`{a}`" for a in d.allowed)
        doc = _md(d.doc).replace("|", "\\|")
        lines.append(f"| `{d.name}` | {kind} | `{d.default}` | {doc} |")
    return lines


def markdown(tasks: Mapping[str, type], batchers: Mapping[str, type]) -> str:
    """``docs/spec.md``: every section, key, type, default, allowed values, meaning and an example."""
    out = ["# Spec reference", "",
           "Generated from the spec's dataclasses by `feedline spec --markdown`; `tests/test_spec_reference.py` "
           "fails when it is out of date. `feedline spec --schema` prints the same as a JSON Schema for "
           "editors (e.g. `# yaml-language-server: $schema=feedline.schema.json` atop a spec).", "",
           "An unknown key is refused with a did-you-mean and the section's keys, a wrong value with its key path "
           "and what is allowed (from a file, with its line: `train.yaml:3: sources[0].formt: unknown key; did you "
           "mean 'format'? (allowed: ...)`). `feedline spec --check FILE` checks a file (its `streams` too) "
           "and what is cheap to check against its data: every source path matches a file or object, the first "
           "records have the text field and suit the task (chat's messages, classify's label), the tokenizer loads, "
           "and a corpus of local files of at most 8 MiB is run to its first batch (a batch larger than the data "
           "with `remainder: drop` is found there); each problem is one line naming the source, field or key and "
           "the fix, and the exit code is 1. `--no-data` checks the spec and the tokenizer only. `feedline serve` "
           "runs the same checks before it listens. `Spec.hash()` covers every key "
           "that changes the batches (not `root`, `parallel`, `workers`, `prefetch`, `reject_limit`, `streams`, "
           "the tokenizer's `backend`).", "",
           f"A spec file is read as UTF-8, at most {files.MAX_BYTES >> 20} MB, nested at most {files.MAX_DEPTH} "
           f"levels and expanding, with its YAML aliases followed, to at most {files.MAX_VALUES:,} values "
           f"({files.MAX_CHARS >> 20} MB of text): a file beyond these (an alias bomb, 20,000 nested lists) or "
           "not UTF-8 is refused in one line naming the file and line, before anything else is read.", "",
           "A spec is code: loading it imports the modules its transforms, plug-in tasks and sources name (their "
           "top-level code runs), and transforms run on the data, so never load or serve a spec you did not write. "
           "`spec --check` checks import paths from the modules' source without running them where Python allows "
           "it, and prints a `note:` for each module it had to import (docs/sources.md, \"A spec is code\").", ""]

    def section(title: str, path: str, rows: list[FieldDoc], intro: str = "") -> None:
        out.extend([f"## {title}", ""])
        if intro:
            out.extend([_md(intro), ""])
        out.extend(_table(rows))
        example = _EXAMPLES.get(path)
        if example:
            out.extend(["", "```yaml", example, "```"])
        out.append("")

    section("Top level", "", describe(Spec))
    for path, cls in _sections():
        section(f"`{path}`", path, describe(cls), (inspect.getdoc(cls) or "").split("\n\n")[0])
    section("`task`", "task", [FieldDoc("kind", "string", "clm", tuple(sorted(tasks)), "the task kind, or "
                                        "`package.module:Class` for a plug-in task; its options sit beside it")],
            "The keys of each kind follow.")
    for kind in sorted(tasks):
        section(f"`task` with `kind: {kind}`", f"task.{kind}", describe(tasks[kind]),
                (inspect.getdoc(tasks[kind]) or "").split("\n\n")[0])
    section("`batching`", "batching", describe(BatchingSpec), (inspect.getdoc(BatchingSpec) or "").split("\n\n")[0])
    for name in sorted(batchers):
        section(f"`batching` with `strategy: {name}`", f"batching.{name}", describe(batchers[name]),
                (inspect.getdoc(batchers[name]) or "").split("\n\n")[0])
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------------------- JSON Schema
def _schema(hint: Any) -> dict[str, Any]:
    origin = get_origin(hint)
    if origin is Literal:
        return {"enum": list(get_args(hint))}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a) for a in get_args(hint)]}
    if origin in (tuple, list, Sequence):
        args = [a for a in get_args(hint) if a is not Ellipsis]
        return {"type": "array", **({"items": _schema(args[0])} if args else {})}
    if hint is type(None):
        return {"type": "null"}
    if dataclasses.is_dataclass(hint):
        return _object(hint)  # type: ignore[arg-type]
    simple = {int: "integer", float: "number", bool: "boolean", str: "string"}.get(hint)
    return {"type": simple} if simple else {}


# The bounds the sections' own checks (``__post_init__``) enforce, so the schema refuses what loading refuses.
_BOUNDS: dict[tuple[str, str], dict[str, Any]] = {
    ("Spec", "epochs"): {"minimum": 1}, ("Spec", "partitions"): {"minimum": 1}, ("Spec", "workers"): {"minimum": 0},
    ("Spec", "prefetch"): {"minimum": 1}, ("Spec", "reject_limit"): {"minimum": 0},
    ("SourceSpec", "weight"): {"exclusiveMinimum": 0}, ("SourceSpec", "split_bytes"): {"minimum": 1 << 16},
    ("SourceSpec", "max_record_bytes"): {"minimum": 1}, ("CacheSpec", "max_bytes"): {"minimum": 1},
    ("ShuffleSpec", "buffer"): {"minimum": 0}, ("BatchingSpec", "batch_size"): {"minimum": 1},
    ("ParallelSpec", "processes"): {"minimum": 0}, ("ParallelSpec", "prefetch"): {"minimum": 1},
    ("ParallelSpec", "num_cpus"): {"exclusiveMinimum": 0},
}
_IMPORT_PATH = {"type": "string", "pattern": r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"}


def _bounded(schema: dict[str, Any], bounds: dict[str, Any]) -> dict[str, Any]:
    if not bounds:
        return schema
    if "anyOf" in schema:  # Optional[int]: the bound applies to the number
        return {**schema, "anyOf": [_bounded(a, bounds) if a.get("type") in ("integer", "number") else a
                                    for a in schema["anyOf"]]}
    return {**schema, **bounds}


def _properties(cls: type, skip: Sequence[str] = ()) -> dict[str, Any]:
    hints = get_type_hints(cls)
    docs = {d.name: d for d in describe(cls, skip=skip)}
    props = {}
    for name, d in docs.items():
        props[name] = {**_bounded(_schema(hints[name]), _BOUNDS.get((cls.__name__, name), {})), "description": d.doc}
        if d.default not in ("required", "{}"):
            props[name]["default"] = json.loads(d.default) if d.default[:1] in "[{" else _parse_default(d.default)
    return props


def _parse_default(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(text, text)


def _object(cls: type) -> dict[str, Any]:
    required = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                and f.name not in _HIDDEN]
    return {"type": "object", "properties": _properties(cls), "additionalProperties": False,
            **({"required": required} if required else {})}


def _by_kind(key: str, default: str, classes: Mapping[str, type], common: dict[str, Any], *,
             plugins: bool = False) -> dict[str, Any]:
    """Objects whose ``key`` names one of ``classes`` (or, with ``plugins``, a ``module:Class``)."""
    branches = []
    for name, cls in sorted(classes.items()):
        cond: dict[str, Any] = {"properties": {key: {"const": name}}, "required": [key]}
        if name == default:
            cond = {"anyOf": [cond, {"not": {"required": [key]}}]}
        branches.append({"if": cond, "then": {"properties": _properties(cls)}})
    names: dict[str, Any] = {"enum": sorted(classes)}
    if plugins:  # a plug-in's options are its own: any key beside the kind
        names = {"anyOf": [names, _IMPORT_PATH]}
        branches.append({"if": {"properties": {key: _IMPORT_PATH}, "required": [key]},
                         "then": {"additionalProperties": True}})
    return {"type": "object", "properties": {**common, key: {"type": "string", "default": default, **names}},
            "allOf": branches, "unevaluatedProperties": False}


def json_schema(tasks: Mapping[str, type], batchers: Mapping[str, type],
                formats: Sequence[str] | None = None) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of a spec, for editors' completion and checks of YAML specs
    (``formats``: the source formats a spec may name, besides ``auto``; any string when ``None``)."""
    top = _object(Spec)
    props = top["properties"]

    def either(key: str, *alternatives: dict[str, Any]) -> None:
        props[key] = {"description": props[key]["description"], "anyOf": list(alternatives)}

    source = _object(_section_class("sources[]"))
    if formats is not None:
        source["properties"]["format"]["enum"] = ["auto", *sorted(formats)]
    either("sources", {"type": "string"}, source,
           {"type": "array", "minItems": 1, "items": {"anyOf": [{"type": "string"}, source]}})
    props["source"] = {"description": "one source (instead of `sources`)", "anyOf": [{"type": "string"}, source]}
    either("tokenizer", {"type": "string"}, {"type": "null"}, _object(_section_class("tokenizer")))
    either("shuffle", _object(_section_class("shuffle")), {"type": "null"}, {"type": "boolean"}, {"type": "integer"})
    props["engine"] = {"description": "folded into `parallel` (`map`, `address`): still read, with a warning",
                       "deprecated": True, "anyOf": [{"enum": ["local", "ray"]}, _object(EngineSpec)]}
    parallel = _object(_section_class("parallel"))
    either("parallel", parallel["properties"]["placement"], parallel, {"type": "null"})
    either("mix", _object(_section_class("mix")), {"type": "null"})
    transform = {"type": "object", "properties": {"map": _IMPORT_PATH, "filter": _IMPORT_PATH},
                 "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
                 "description": _section_class("transforms[]").__doc__.split("\n\n")[0]}  # type: ignore[union-attr]
    either("transforms", {"type": "array", "items": transform}, {"type": "null"})
    either("task", {"anyOf": [{"enum": sorted(tasks)}, _IMPORT_PATH]}, _by_kind("kind", "clm", tasks, {}, plugins=True))
    props["batching"] = {"description": props["batching"]["description"],
                         **_by_kind("strategy", "pad", batchers, _properties(BatchingSpec))}
    top.pop("required", None)
    top["anyOf"] = [{"required": ["sources"]}, {"required": ["source"]}]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "feedline spec", **top}


def _section_class(path: str) -> type:
    return next(c for p, c in _sections() if p == path)
