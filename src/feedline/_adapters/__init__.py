"""Framework adapters: feedline batches as PyTorch tensors or JAX-ready per-process arrays.

The adapters only convert dtype, device and layout; what the batches hold is decided by the
spec. Import them through the public shims, which fail with an install hint when the framework
is missing::

    from feedline.torch import TorchLoader      # pip install 'feedline[torch]'
    from feedline.jax import JaxLoader          # pip install 'feedline[jax]'
"""

from __future__ import annotations

from feedline._adapters.common import resolve_loader, resolve_rank

__all__ = ["resolve_loader", "resolve_rank"]
