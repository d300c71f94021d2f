"""``feedline.load_dataset`` streams in ``torch.utils.data.DataLoader`` worker processes, as ``datasets`` shares them.

Where torch is importable, every dataset is a ``torch.utils.data.IterableDataset``
(``dataset._torch_kind``, built on the first dataset built, as ``datasets``
does), so a ``DataLoader`` iterates it instead of asking for its length. Iterated in worker ``i``
of ``W``, a dataset reads its share of the data files as ``datasets`` 5.x does:

- the files ``i, i + W, i + 2W, ...`` (``shard(W, i, contiguous=False)``); with fewer files
  than workers, workers ``n..W-1`` yield nothing and worker 0 warns, as ``datasets`` does;
- ``take(k)``/``skip(k)`` (and split slices) split ``k`` among the workers that have files:
  ``k // w`` each, one more for the first ``k % w``; functions with indices count per worker;
- an interleave shares each of its datasets' files the same way (``min`` of their counts).

So ``DataLoader(ds, batch_size=8, num_workers=W)`` yields the batches ``datasets`` yields (a
shuffle's order apart, see docs/huggingface.md): the same rows overall, none twice.
``state_dict()`` follows iteration in this process only; a worker's position is not sent back.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import warnings

__all__ = ["split_number", "too_many_workers", "torch_available", "torch_worker"]


@functools.cache
def torch_available() -> bool:
    """Whether torch can be imported (then datasets are ``torch.utils.data.IterableDataset``)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # torch blocked (sys.modules["torch"] = None) or broken
        return False


def torch_worker() -> tuple[int, int] | None:
    """``(worker id, number of workers)`` inside a ``DataLoader`` worker process, else ``None``."""
    if sys.modules.get("torch") is None:  # never imported (or blocked): not in a DataLoader worker
        return None
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    return None if info is None else (int(info.id), int(info.num_workers))


def split_number(n: int, parts: int) -> list[int]:
    """``n`` split in ``parts`` as even as can be, the first ones one larger (``datasets``' split)."""
    q, r = divmod(n, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def too_many_workers(n_shards: int, workers: int) -> None:
    """The warning ``datasets`` gives when a ``DataLoader`` has more workers than the dataset has shards."""
    warnings.warn(f"Too many dataloader workers: {workers} (max is dataset.n_shards={n_shards}): each worker reads "
                  f"its own data files, so {workers - n_shards} worker(s) yield nothing (as with datasets). Use at "
                  f"most {n_shards} workers, or split the data in more files", UserWarning, stacklevel=3)
