"""Run a pipeline offline and write its examples (or global batches) as shards with a manifest.

    >>> manifest = export("spec.yaml", "out/", "parquet")                 # doctest: +SKIP
    >>> manifest["rows"], [s["path"] for s in manifest["shards"]]        # doctest: +SKIP
    (12840, ['examples-00000.parquet'])

``what="examples"`` writes one row per task example: its key (``source``, ``file``,
``position``, ``epoch``, ``sub``) and its fields; ``what="batches"`` writes one row per row of
each global batch with its ``step``. A new shard starts every ``shard_rows`` rows; writers flush
every ``flush_rows`` rows, so memory stays bounded whatever the corpus size. ``manifest.json``
records the format, the spec and its hash, each shard's path and row count, the columns, the
real tokens written and the records rejected by reason.

Output is atomic (:class:`~feedline._tools.output.AtomicOutput`): shards are written under
temporary names and renamed into place when the run is complete, the manifest last; a
non-empty ``out_dir`` needs ``overwrite=True``, which removes the previous run's shards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np

from feedline._core.report import rejected_along
from feedline._pipeline import GlobalStream, Pipeline
from feedline._spec import Spec
from feedline._tools.output import AtomicOutput
from feedline._tools.progress import track
from feedline._tools.writers import FORMATS, Format, RowWriter
from feedline.errors import SpecError

__all__ = ["export"]

What = Literal["examples", "batches"]
MANIFEST = "manifest.json"


def _example_rows(pipeline: Pipeline, limit: int | None, report: dict[str, Any]) -> Iterator[dict[str, Any]]:
    it = iter(pipeline.examples())
    try:
        for n, ex in enumerate(it):
            if limit is not None and n >= limit:
                break
            s, f, p = ex.key
            yield {"source": s, "file": f, "position": p, "epoch": ex.epoch, "sub": ex.sub, **ex.fields}
    finally:
        report["rejected"] = rejected_along(it)  # the task's and its sources'
        it.close()


def _batch_rows(pipeline: Pipeline, limit: int | None, report: dict[str, Any]) -> Iterator[dict[str, Any]]:
    it = iter(GlobalStream(pipeline))
    try:
        for step, batch, _state in it:
            if limit is not None and step > limit:
                break
            for i in range(len(batch["input_ids"])):
                yield {"step": step, **{k: v[i] for k, v in batch.items()}}
    finally:
        report["rejected"] = rejected_along(getattr(it.it, "parent", None))
        report["batcher_stats"] = stats.as_dict() if (stats := getattr(it.it, "stats", None)) is not None else None
        it.close()


def _real_tokens(row: Mapping[str, Any]) -> int:
    mask = row.get("attention_mask")
    if isinstance(mask, np.ndarray) and mask.ndim == 1:
        return int(mask.astype(bool).sum())
    if isinstance(mask, np.ndarray) and mask.ndim == 2:
        return int(mask.any(axis=1).sum())
    ids = row.get("input_ids")
    return len(ids) if isinstance(ids, np.ndarray) else 0


def export(spec: Spec | Mapping[str, Any] | str, out_dir: str, fmt: Format = "arrow", *, what: What = "examples",
           shard_rows: int = 100_000, flush_rows: int = 1000, limit: int | None = None,
           overwrite: bool = False) -> dict[str, Any]:
    """Write ``spec``'s examples or batches under ``out_dir``; returns the manifest (also written).

    Args:
        spec: the pipeline.
        out_dir: created if needed; must be empty unless ``overwrite``.
        fmt: ``arrow``, ``parquet``, ``jsonl`` or ``msgpack``.
        what: ``examples`` or ``batches``.
        shard_rows: rows per shard.
        flush_rows: rows buffered before a write.
        limit: stop after this many examples (or global steps).
        overwrite: replace a previous output in ``out_dir`` (its stale shards are removed).

    Raises:
        SpecError: for an unknown format or ``what``, a non-positive size, an ``out_dir`` that
            is a file, or one that is not empty without ``overwrite``.
    """
    if fmt not in FORMATS:
        raise SpecError(f"export format {fmt!r} is not supported; choose one of {', '.join(FORMATS)}")
    if what not in ("examples", "batches"):
        raise SpecError(f"export: what={what!r}; choose 'examples' or 'batches'")
    if shard_rows < 1 or flush_rows < 1:
        raise SpecError(f"export: shard_rows ({shard_rows}) and flush_rows ({flush_rows}) must be >= 1")
    pipeline = Pipeline(spec)
    with AtomicOutput(out_dir, overwrite=overwrite, patterns=("examples-*", "batches-*", MANIFEST), what="export") as out:
        report: dict[str, Any] = {}
        rows = (_example_rows if what == "examples" else _batch_rows)(pipeline, limit, report)
        shards: list[dict[str, Any]] = []
        columns: list[str] = []
        tokens = 0
        writer: RowWriter | None = None
        try:
            for row in track(rows, "export", unit="rows"):
                if writer is None or writer.rows >= shard_rows:
                    if writer is not None:
                        writer.close()
                        shards[-1]["rows"] = writer.rows
                    name = f"{what}-{len(shards):05d}{FORMATS[fmt]}"
                    writer = RowWriter(out.temp(name), fmt, flush_rows=flush_rows)
                    shards.append({"path": name, "rows": 0})
                    columns = columns or list(row)
                writer.write(row)
                tokens += _real_tokens(row)
        finally:
            if writer is not None:
                writer.close()
                shards[-1]["rows"] = writer.rows
        manifest = {
            "format": fmt, "what": what, "spec_hash": pipeline.spec.hash(), "spec": pipeline.spec.to_dict(),
            "rows": sum(s["rows"] for s in shards), "tokens": tokens, "columns": columns, "shards": shards, **report,
        }
        with open(out.temp(MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, default=str)
            f.write("\n")
        out.publish([s["path"] for s in shards] + [MANIFEST], manifest=MANIFEST)
    return manifest
