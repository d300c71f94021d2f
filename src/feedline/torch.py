"""PyTorch adapter (public path): ``from feedline.torch import TorchLoader``.

    >>> from feedline.torch import TorchLoader
    >>> for batch in TorchLoader("spec.yaml", device="cuda"):   # doctest: +SKIP
    ...     model(**batch).loss.backward()

See :mod:`feedline._adapters.torch` for the data path and the resume guarantees.
"""

from __future__ import annotations

from feedline._adapters.hf import PackedLayout
from feedline._adapters.torch import TorchBatch, TorchLoader, passthrough_collate, to_torch

__all__ = ["PackedLayout", "TorchBatch", "TorchLoader", "passthrough_collate", "to_torch"]
