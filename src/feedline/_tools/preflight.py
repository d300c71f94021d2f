"""Cheap checks of a spec against its data before a run (``feedline spec --check``, ``feedline serve``).

    >>> preflight(Spec.load("train.yaml"))                     # doctest: +SKIP
    ["sources[0] (corpus/*.jsonl): no record among the first 200 read (missing_field: 200); e.g. ..."]

Each problem is one line naming the source, field, path or key and what to do. In order:

* ``root:`` is a folder where relative paths are read from it;
* the tokenizer loads;
* each source's path matches at least one file or object (``hf:`` and Python iterables are not
  listed), and among its first records (at most :data:`READ_LIMIT` read) one is delivered, that
  is has the text field (else the reasons of the rejections, with a sample and the fix);
* the task accepts at least one of each source's first :data:`SAMPLE` records (chat: the
  messages fields; classify: the label), without ``transforms`` (they run between);
* where the data's size is known and small (local files of at most ``small_bytes`` in all), the
  stream is run to its first batch: a batch larger than the data with ``remainder: drop``, an
  empty stream, or any other error of a real run, is found here exactly as the run finds it.

``data=False`` checks only ``root:`` and the tokenizer (no listing, no reading).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from feedline._core.record import TEXT_FIELD_ADVICE, Record, Rejection
from feedline._core.report import Rejections, likely_fix
from feedline._pipeline import GlobalStream, Pipeline
from feedline._pipeline import _whole_record_fixes as whole_record_fixes
from feedline._sources.files import size_of
from feedline._sources.source import FileSource, list_files
from feedline._spec import Spec
from feedline._tasks.base import TaskContext
from feedline._tasks.registry import task_class
from feedline._tokenize.tokenizer import Tokenizer
from feedline.errors import FeedlineError, SpecError

__all__ = ["READ_LIMIT", "SAMPLE", "SMALL_BYTES", "preflight"]

#: Records (delivered or rejected) read at most per source looking for its first good ones.
READ_LIMIT = 200
#: Delivered records per source the task is tried on.
SAMPLE = 8
#: Sources of at most this many bytes (local files, in all) are run to their first batch.
SMALL_BYTES = 8 << 20


def preflight(spec: Spec, *, data: bool = True, small_bytes: int = SMALL_BYTES) -> list[str]:
    """The problems found in ``spec`` and its data, one line each (none: the checks passed)."""
    with _quiet():
        try:
            spec.check_root()
        except SpecError as e:
            return [_line(e)]
        problems: list[str] = []
        tok = _tokenizer(spec, problems)
        if not data:
            return problems
        sizes: list[int | None] = []
        for i in range(len(spec.sources)):
            sizes += _check_source(spec, i, tok, problems)
        if problems or (spec.tokenizer and tok is None):
            return problems
        if sizes and None not in sizes and sum(s or 0 for s in sizes) <= small_bytes:
            _first_batch(spec, tok, problems)
        return problems


def _tokenizer(spec: Spec, problems: list[str]) -> Tokenizer | None:
    if not spec.tokenizer:
        return None
    from feedline._tokenize.load import load_spec_tokenizer

    try:
        return load_spec_tokenizer(spec.tokenizer, spec.root)
    except FeedlineError as e:
        text = _line(e)
        problems.append(text if text.startswith("tokenizer:") else f"tokenizer: {text}")
        return None


def _check_source(spec: Spec, i: int, tok: Tokenizer | None, problems: list[str]) -> list[int | None]:
    """Check source ``i``: its files, its first records, the task on them; returns its files' sizes."""
    src = spec.sources[i]
    where = f"sources[{i}] ({src.label})"
    if src.path is None:  # hf: or a Python iterable: nothing cheap to check
        return [None]
    try:
        files = list_files(src)
    except FeedlineError as e:
        problems.append(f"{where}: {_line(e).removeprefix(f'{src.path}: ')}")
        return [None]
    # the run's own advice where a task reads records whole (chat) and a text: field rejects them
    fixes = whole_record_fixes(spec.task.kind, i, src.text) \
        if task_class(spec.task.kind).whole_records and src.text is not None else {}
    source = FileSource(src, i, seed=spec.seed, shuffle_splits=False, epochs=1, on_unreadable=spec.on_unreadable)
    try:
        records, rejections = _first_records(source)
    except FeedlineError as e:
        problems.append(f"{where}: {_line(e).removeprefix(f'{src.path}: ')}")
        return [None]
    if not records and rejections.total:
        problems.append(f"{where}: no record among the first {rejections.total} read{_summary(rejections, fixes)}")
    elif records and not spec.transforms and (tok is not None or not spec.tokenizer):
        _check_task(spec, where, source, records, tok, problems)
    return [size_of(f) for f in files]


def _first_records(source: FileSource) -> tuple[list[Record], Rejections]:
    """Up to :data:`SAMPLE` delivered records of ``source``, reading at most :data:`READ_LIMIT`."""
    it = iter(source)
    records: list[Record] = []
    try:
        while len(records) < SAMPLE and len(records) + it.rejections.total < READ_LIMIT:
            got = it.take(1)
            if not got:
                break
            records += got
    finally:
        it.close()
    return records, it.rejections


def _check_task(spec: Spec, where: str, source: FileSource, records: list[Record], tok: Tokenizer | None,
                problems: list[str]) -> None:
    """The task must make an example of at least one of ``records`` (its fields: chat's messages, a label...)."""
    try:
        # A task that reads the corpus first (classify's label names) reads these records only.
        task = task_class(spec.task.kind)(spec.task.options, TaskContext(tok, spec.seed, records=lambda: iter(records)))
        if source.reader.pretokenized and not task.accepts_tokens:
            problems.append(f"{where}: holds token ids ({source.reader.name}); task {spec.task.kind!r} needs text: "
                            "use task: clm, or a text source")
            return
        outputs = task.process(records)
    except FeedlineError as e:
        problems.append(f"{where}: task {spec.task.kind}: {_line(e)}")
        return
    except Exception as e:  # a plug-in task's own failure: one line here too (the run would raise it)
        problems.append(f"{where}: task {spec.task.kind} failed on the first records: {type(e).__name__}: {_line(e)}")
        return
    if all(isinstance(o, Rejection) for o in outputs):
        rejections = Rejections(locate=source.locate)
        for o in outputs:
            rejections.add(o)  # type: ignore[arg-type]
        problems.append(f"{where}: task {spec.task.kind} rejected each of the first {len(records)} records"
                        f"{_summary(rejections, {})}")


def _first_batch(spec: Spec, tok: Tokenizer | None, problems: list[str]) -> None:
    """Run the stream (in this process, threads only: never another batch) to its first batch.

    ``backend: auto`` encodes with ``tokenizers`` here (what would stop the run stops it the same
    way), so no fast-encoder check starts for a check that ends with this batch (``serve`` runs
    its own before it listens)."""
    backend = "hf" if spec.tokenizer_backend == "auto" else spec.tokenizer_backend
    here = spec.replace(parallel=dataclasses.replace(spec.parallel, placement="threads", map="local"),
                        tokenizer_backend=backend)
    it = iter(GlobalStream(Pipeline(here, tokenizer=tok)))
    try:
        next(it, None)
    except FeedlineError as e:
        problems.append(_line(e))
    finally:
        it.close()


def _summary(rejections: Rejections, fixes: Mapping[str, str]) -> str:
    """`` (reason: n, ...); e.g. FILE:LINE: reason (detail); the fix`` (``fixes``: the caller's, by reason)."""
    counts = rejections.counts
    top = max(counts, key=lambda k: counts[k])
    sample = next((s for s in rejections.samples if f": {top}" in s), rejections.samples[0] if rejections.samples else "")
    fix = likely_fix(top)
    if top in fixes:
        fix, sample = fixes[top], sample.replace(TEXT_FIELD_ADVICE, "")
    elif TEXT_FIELD_ADVICE in sample:
        fix = ""  # the sample says it
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f" ({reasons})" + (f"; e.g. {sample}" if sample else "") + (f"; {fix}" if fix else "")


def _line(error: BaseException) -> str:
    """An error's message on one line."""
    return " ".join(str(error).split())


@contextmanager
def _quiet() -> Iterator[None]:
    """Keep the rejections the checks provoke out of the log (the problems say them once)."""
    log = logging.getLogger("feedline")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
