"""Where a ``feedline.load_dataset`` stream starts: files read by feedline, or other datasets interleaved.

A root is a frozen recipe: :meth:`FileRoot.stage` builds the record stage for an epoch (nothing is
read until it is iterated), :meth:`describe` is what the dataset's fingerprint hashes, and
:meth:`shard` keeps a part of the files (``datasets``' ``shard`` splits data files, not rows).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from feedline._core.dataset import Dataset
from feedline._core.record import Key, Record
from feedline._hf_datasets.stages import RowFix
from feedline._spec import Spec
from feedline.errors import SpecError

__all__ = ["FileRoot", "shard_indices"]

_BOM = b"\xef\xbb\xbf"


def shard_indices(n: int, num_shards: int, index: int, contiguous: bool) -> list[int]:
    """The data files shard ``index`` of ``num_shards`` keeps, as ``datasets`` splits them."""
    if not 0 <= index < num_shards:
        raise SpecError(f"shard: index {index} is not in [0, {num_shards})")
    if not contiguous:
        return list(range(index, n, num_shards))
    div, mod = divmod(n, num_shards)
    start = div * index + min(index, mod)
    return list(range(start, start + div + (1 if index < mod else 0)))


@dataclass(frozen=True)
class FileRoot:
    """Files of one split read by feedline's readers, one source per file, in order.

    ``shuffle_buffer`` set: the spec's shuffle (a seeded order of the files' splits, a mixture
    drawing the files at random, and a buffer of rows), seeded with ``seed + epoch``.
    """

    sources: tuple[Mapping[str, Any], ...]
    builder: str
    split: str
    seed: int = 0
    shuffle_buffer: int | None = None
    schema_file: str | None = None  # json: the file datasets infers the split's types from (the first split's first)

    def spec(self, epoch: int = 0) -> dict[str, Any]:
        spec: dict[str, Any] = {"sources": [dict(copy.deepcopy(s)) for s in self.sources], "seed": self.seed + epoch,
                                "task": {"kind": "clm"}}
        if self.shuffle_buffer:
            spec["shuffle"] = {"buffer": self.shuffle_buffer}
        elif len(self.sources) > 1:
            spec["mix"] = {"stopping": "concat"}  # the files one after another, as datasets reads data_files
        return spec

    def describe(self) -> str:
        return f"files({Spec.load(self.spec()).hash()})"

    def stage(self, epoch: int) -> Dataset[Record]:
        from feedline._pipeline import Pipeline

        pipeline = Pipeline(self.spec(epoch))
        records = pipeline.records()
        if self.builder == "text":
            return _TextBom(records, pipeline.sources)
        if self.builder == "json" and self.schema_file and "://" not in self.schema_file:
            from feedline._hf_datasets.features import JsonTypes

            return JsonTypes(records, self.schema_file)
        return records

    @property
    def files(self) -> list[str]:
        """The data files (a hub dataset's name for ``hf`` sources)."""
        return [str(s.get("path") or s.get("hf")) for s in self.sources]

    def shard(self, num_shards: int, index: int, contiguous: bool) -> FileRoot:
        keep = shard_indices(len(self.sources), num_shards, index, contiguous)
        if not keep:
            raise SpecError(f"shard({num_shards}, {index}): this split has {len(self.sources)} data file(s), so shard "
                            f"{index} would be empty (datasets shards files, not rows); use at most "
                            f"{len(self.sources)} shards, or split by rank with to_loader(rank=, world_size=)")
        return dataclasses.replace(self, sources=tuple(self.sources[i] for i in keep))

    def keyed(self) -> bool:
        return True


class _TextBom(RowFix):
    """``datasets`` keeps a text file's byte-order mark on its first row; feedline's reader skips it."""

    def __init__(self, parent: Dataset[Record], sources: Sequence[Any]) -> None:
        super().__init__(parent)
        self.sources = sources  # FileSource: their files are listed when first needed
        self._boms: dict[tuple[int, int], bool] = {}

    def fix(self, key: Key, data: dict[str, Any]) -> dict[str, Any]:
        if key[2] != len(_BOM) or "text" not in data:
            return data
        found = self._boms.get((key[0], key[1]))
        if found is None:
            from feedline._sources.files import open_binary

            with open_binary(self.sources[key[0]].files[key[1]]) as f:
                found = self._boms[(key[0], key[1])] = f.read(3) == _BOM
        return {**data, "text": "\ufeff" + data["text"]} if found else data
