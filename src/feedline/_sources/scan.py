"""Count what a spec's sources hold: records, text bytes, tokens, rejections by reason.

    >>> report = scan(Spec.load("spec.yaml"), tokens=True)        # doctest: +SKIP
    >>> report["records"], report["rejected"]                    # doctest: +SKIP
    (120034, {'bad_json': 2})

Each source is read once, in file order (no mixing, no shuffling, one epoch), so the counts are
the ones a one-epoch run delivers. ``bytes`` is the UTF-8 size of the delivered text: the text
field, or for a record kept whole (``text: null``: chat data) every string it holds, nested.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from feedline._sources.source import FileSource, source_format
from feedline._spec import Spec

__all__ = ["scan"]

_TOKEN_BATCH = 512


def scan(spec: Spec, *, tokens: bool = False, limit: int | None = None,
         progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Scan every source of ``spec``; ``progress(n)`` is called with records read so far.

    Returns:
        ``{"records", "bytes", "tokens" (with ``tokens``), "rejected": {reason: n},
        "rejected_samples": [...], "seconds", "sources": [per-source dicts of the same counts
        plus "name", "format", "files"]}``.
    """
    tok = None
    if tokens:
        from feedline._tokenize.load import load_spec_tokenizer

        if not spec.tokenizer:
            from feedline.errors import SpecError

            raise SpecError("scan --tokens needs a tokenizer: set tokenizer: in the spec or pass --tokenizer")
        tok = load_spec_tokenizer(spec.tokenizer, spec.root)
    spec.check_root()
    started = time.perf_counter()
    total = 0
    per_source = []
    for i, src_spec in enumerate(spec.sources):
        src = FileSource(src_spec, i, seed=spec.seed, shuffle_splits=False, epochs=1, on_error=spec.on_error)
        it = iter(src)
        n = nbytes = ntok = 0
        batch: list[str] = []
        try:
            for rec in it:
                if limit is not None and total >= limit:
                    break
                text = rec.data.get("text")
                if not isinstance(text, str):  # a record kept whole (chat)
                    nbytes += _string_bytes(rec.data)
                else:
                    nbytes += len(text.encode("utf-8"))
                    if tok is not None:
                        batch.append(text)
                        if len(batch) >= _TOKEN_BATCH:
                            ntok += sum(len(x) for x in tok.encode_batch(batch))
                            batch = []
                n += 1
                total += 1
                if progress is not None and total % 1000 == 0:
                    progress(total)
        finally:
            it.close()
        if tok is not None and batch:
            ntok += sum(len(x) for x in tok.encode_batch(batch))
        entry: dict[str, Any] = {
            "name": src_spec.label, "format": source_format(src_spec, src.files), "files": len(src.files),
            "records": n, "bytes": nbytes, "rejected": dict(sorted(it.rejections.counts.items())),
            "rejected_samples": list(it.rejections.samples),
        }
        if tok is not None:
            entry["tokens"] = ntok
        per_source.append(entry)
    rejected: dict[str, int] = {}
    for e in per_source:
        for k, v in e["rejected"].items():
            rejected[k] = rejected.get(k, 0) + v
    report: dict[str, Any] = {
        "records": sum(e["records"] for e in per_source), "bytes": sum(e["bytes"] for e in per_source),
        "rejected": dict(sorted(rejected.items())),
        "rejected_samples": [s for e in per_source for s in e["rejected_samples"]],
    }
    if tok is not None:
        report["tokens"] = sum(e["tokens"] for e in per_source)
    report["seconds"] = round(time.perf_counter() - started, 3)
    report["sources"] = per_source
    return report


def _string_bytes(value: Any) -> int:
    """The UTF-8 size of every string in ``value`` (mappings' values and lists, nested; keys not counted).

        >>> _string_bytes({"messages": [{"role": "user", "content": "héllo"}], "id": 3})
        10
    """
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, dict):
        return sum(_string_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_string_bytes(v) for v in value)
    return 0
