"""``feedline.IterableDataset`` as a ``torch.utils.data.IterableDataset`` (imported only where torch is).

``IterableDataset(...)`` builds this subclass when torch is importable (see
:mod:`~feedline._hf_datasets.workers`), so ``DataLoader(ds, batch_size=8)`` iterates the rows
rather than asking for a length; it pickles by reference, like any module-level class.
"""

from __future__ import annotations

import torch.utils.data

from feedline._hf_datasets.dataset import IterableDataset

__all__ = ["TorchIterableDataset"]


class TorchIterableDataset(IterableDataset, torch.utils.data.IterableDataset):  # type: ignore[misc]
    """A :class:`feedline.IterableDataset` that torch's ``DataLoader`` reads as an iterable dataset."""
