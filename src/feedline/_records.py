"""``feedline.records(spec)``: the raw records the loader reads, after mixing and shuffling.

    >>> for rec in records({"sources": ["corpus.jsonl"]}):     # doctest: +SKIP
    ...     print(rec["text"][:40], rec["__key__"])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from feedline._pipeline import Pipeline
from feedline._spec import Spec

__all__ = ["records"]


def records(spec: Spec | Mapping[str, Any] | str, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield record dicts (text under ``"text"``; ``"__key__"`` is ``[source, file, position]``)."""
    if isinstance(spec, Mapping) and "task" not in spec:
        spec = {**spec, "task": {"kind": "clm"}}
    it = iter(Pipeline(spec).records())
    try:
        for n, rec in enumerate(it):
            if limit is not None and n >= limit:
                return
            yield {**rec.data, "__key__": list(rec.key), "__epoch__": rec.epoch}
    finally:
        it.close()
