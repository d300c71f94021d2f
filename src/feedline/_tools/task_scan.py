"""What a spec's task rejects, by reason, over one unshuffled epoch of each source (``feedline scan --task``).

    >>> task_rejections(Spec.load("chat.yaml"))          # doctest: +SKIP
    [{'examples': 109, 'rejected': {'unrendered_content': 191}, 'rejected_samples': ['glaive.jsonl:4: ...']}]

Each record goes through the task as in a run (the chat template, the tokenizer); a rejection is
named by its file and line. Sources are read as :func:`~feedline._sources.scan.scan` reads them.
"""

from __future__ import annotations

from typing import Any

from feedline._core.record import Record, Rejection
from feedline._core.report import Rejections
from feedline._pipeline import Pipeline
from feedline._sources.source import FileSource
from feedline._spec import Spec
from feedline._tasks.base import Task

__all__ = ["task_rejections"]

_BATCH = 256


def task_rejections(spec: Spec, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Per source: examples the task made and the records it rejected (``rejected``, ``rejected_samples``)."""
    spec.check_root()
    task = Pipeline(spec).task
    out, total = [], 0
    for i, src_spec in enumerate(spec.sources):
        src = FileSource(src_spec, i, seed=spec.seed, shuffle_splits=False, epochs=1, on_error=spec.on_error)
        rejections = Rejections("skip", locate=src.locate)
        examples = 0
        batch: list[Record] = []

        it = iter(src)
        try:
            for rec in it:
                if limit is not None and total >= limit:
                    break
                batch.append(rec)
                total += 1
                if len(batch) >= _BATCH:
                    examples += _run(task, batch, rejections)
        finally:
            it.close()
        examples += _run(task, batch, rejections)
        out.append({"examples": examples, "rejected": dict(sorted(rejections.counts.items())),
                    "rejected_samples": list(rejections.samples)})
    return out


def _run(task: Task, batch: list[Record], rejections: Rejections) -> int:
    """Examples the task makes of ``batch`` (then emptied); its rejections go to ``rejections``."""
    made = 0
    for result in task.process(batch) if batch else []:
        if isinstance(result, Rejection):
            rejections.add(result)
        else:
            made += len(result)
    batch.clear()
    return made
