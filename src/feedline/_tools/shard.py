"""Shuffle any inputs into N ``.jsonl.zst`` shards with bounded memory, deterministically.

    >>> report = shard(["wiki/*.xml.bz2", "books.txt"], "shards/", num_shards=64, seed=1)  # doctest: +SKIP

Like the ``create_pretraining_data`` step of BERT-style recipes, but streaming:

1. *Scatter*: every record goes to shard ``mix64(seed, *key) % num_shards`` (its key is
   ``(input, file, position)``), appended to a temporary zstd file in the output directory.
2. *Shuffle*: each temporary file is loaded on its own, its lines permuted with a permutation
   keyed by ``(seed, shard)``, and written as ``{prefix}-{i:05d}-of-{n:05d}.jsonl.zst``.

Memory holds one shard (about corpus / N) plus N zstd writers, whatever the corpus size. The
output is a pure function of the inputs, ``seed`` and ``num_shards``. Output is atomic
(:class:`~feedline._tools.output.AtomicOutput`): every shard is renamed into place only once all
are written; a non-empty ``output_dir`` needs ``overwrite=True``, which removes the shards of the
previous run (another ``num_shards`` would otherwise leave old shards beside the new ones). Records keep every field
(``text``, and e.g. ``sentences`` for the ``bert`` format).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from feedline._core.report import Rejections
from feedline._core.rng import mix64, permutation
from feedline._sources.files import open_binary
from feedline._sources.inputs import read_inputs
from feedline._tools.output import AtomicOutput
from feedline._tools.progress import track
from feedline.errors import SourceError, SpecError

__all__ = ["ShardReport", "shard"]


@dataclass
class ShardReport:
    """What :func:`shard` wrote."""

    files: list[str]
    records: list[int]
    rejected: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "records": self.records, "total": sum(self.records), "rejected": self.rejected}


def shard(inputs: Sequence[str], output_dir: str, *, num_shards: int, seed: int = 0, format: str = "auto",
          text: str | None = "text", prefix: str = "shard", on_error: str = "skip", level: int = 3,
          overwrite: bool = False) -> ShardReport:
    """Write ``num_shards`` shuffled ``.jsonl.zst`` shards of ``inputs`` into ``output_dir``.

    Raises:
        SpecError: for a bad count, no inputs, an output that is (or holds) an input, or a
            non-empty ``output_dir`` without ``overwrite``.
    """
    import zstandard

    if num_shards < 1:
        raise SpecError(f"num_shards: {num_shards} must be >= 1")
    if not inputs:
        raise SpecError("shard: give at least one input path")
    local = [p for p in inputs if "://" not in p and not any(c in p for c in "*?[")]
    with AtomicOutput(output_dir, overwrite=overwrite, inputs=local, what="shard",
                      patterns=(f"{prefix}-?????-of-?????.jsonl.zst",)) as out:
        tmp = [out.temp(f"{prefix}-{i:05d}.scatter.zst") for i in range(num_shards)]
        rejections = Rejections(on_error)
        writers: list[IO[bytes]] = []
        try:
            for p in tmp:
                # One compressor per writer: a compression context serves one stream at a time.
                cctx = zstandard.ZstdCompressor(level=1)
                writers.append(cctx.stream_writer(open(p, "wb"), closefd=True))  # noqa: SIM115 - closed below
            for rec in track(read_inputs(inputs, format=format, text=text, on_error=on_error, rejections=rejections),
                             "shard: scatter"):
                line = json.dumps(rec.data, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
                writers[mix64(seed, *rec.key) % num_shards].write(line)
        finally:
            for w in writers:
                w.close()
        names, counts = [], []
        out_ctx = zstandard.ZstdCompressor(level=level)
        try:
            for i, p in track(list(enumerate(tmp)), "shard: write", unit="shards"):
                with open_binary(p) as f:
                    lines = f.read().splitlines(keepends=True)
                order = permutation(len(lines), seed, 0x5A4D, i)
                name = f"{prefix}-{i:05d}-of-{num_shards:05d}.jsonl.zst"
                with open(out.temp(name), "wb") as fo, out_ctx.stream_writer(fo, closefd=False) as w:
                    for j in order:
                        w.write(lines[j])
                names.append(name)
                counts.append(len(lines))
                os.remove(p)
            out.publish(names)
        except OSError as e:
            raise SourceError(f"{output_dir}: cannot write shards ({e})") from e
    files = [os.path.join(output_dir, n) for n in names]
    return ShardReport(files, counts, dict(sorted(rejections.counts.items())))
