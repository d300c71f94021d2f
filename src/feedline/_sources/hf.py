"""Any Hugging Face dataset, through ``datasets.load_dataset`` (streaming by default).

    sources:
      - hf: wikimedia/wikipedia          # load_dataset(path=...)
        config: 20231101.en              # load_dataset(name=...)
        split: train
      - hf: json                         # a packaged builder over local or remote files
        data_files: ["chat/*.jsonl"]
        text: null

The arguments keep ``load_dataset``'s names (``split``, ``data_files``, ``data_dir``,
``revision``, ``streaming``); ``config`` is its ``name``. Positions are row indices in the
split. A streaming dataset resumes by skipping rows (``IterableDataset.skip``: it reads and
drops them, which costs time proportional to the position), and re-reads buffered rows in one
forward pass; with ``streaming: false`` rows are read directly by index from the Arrow cache.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from feedline._core.record import Rejection
from feedline._sources.jsonl import text_record
from feedline._sources.reader import Item, Reader, Split
from feedline.errors import MissingDependency, SourceError

__all__ = ["HfReader"]


class HfReader(Reader):
    """Reads a ``datasets`` dataset split row by row."""

    name = "hf"

    def load(self) -> Any:
        """The dataset split (an ``IterableDataset`` when streaming), projected to ``columns``."""
        cached = self.__dict__.get("_dataset")
        if cached is not None:
            return cached
        try:
            import datasets
        except ImportError as e:
            raise MissingDependency("the hf format needs datasets: pip install 'feedline[hf]'") from e
        s = self.spec
        kwargs = {k: v for k, v in {"name": s.config, "data_files": _plain(s.data_files), "data_dir": s.data_dir,
                                    "revision": s.revision}.items() if v is not None}
        try:
            ds = datasets.load_dataset(s.hf, split=s.split, streaming=s.streaming, **kwargs)
        except Exception as e:  # datasets raises many types (FileNotFoundError, ValueError, HTTP errors)
            raise SourceError(f"{s.hf}: load_dataset failed ({type(e).__name__}: {e})") from e
        if s.columns:
            keep = list(s.columns)
            if s.text and s.text.split(".")[0] not in keep:
                keep.append(s.text.split(".")[0])
            ds = ds.select_columns(keep)
        self.__dict__["_dataset"] = ds
        return ds

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        ds = self.load()
        label = self.spec.hf or split.path
        if self.spec.streaming:
            rows: Any = ds.skip(position) if position else ds
            for i, row in enumerate(rows, start=position):
                yield i, i + 1, i + 1, text_record(row, self.spec.text, label, i + 1)
        else:
            for i in range(position, len(ds)):
                yield i, i + 1, i + 1, text_record(ds[i], self.spec.text, label, i + 1)

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        if self.spec.streaming:
            return super().fetch(path, positions)
        ds = self.load()
        found: dict[int, dict[str, Any]] = {}
        for p in set(positions):
            rec = text_record(ds[p], self.spec.text, path, p + 1) if 0 <= p < len(ds) else None
            if rec is None or isinstance(rec, Rejection):
                raise SourceError(f"{path}: cannot re-read row {p}; the dataset changed since the state was saved")
            found[p] = rec
        return found


def _plain(value: Any) -> Any:
    """Spec values arrive as tuples/mappings; ``load_dataset`` wants lists and dicts."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
