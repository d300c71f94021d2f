"""JAX adapter (public path): ``from feedline.jax import JaxLoader``.

    >>> from feedline.jax import JaxLoader
    >>> for batch in JaxLoader("spec.yaml", sharding=sharding):   # doctest: +SKIP
    ...     state, loss = train_step(state, batch)

See :mod:`feedline._adapters.jax` for how processes and shardings map onto the global stream.
"""

from __future__ import annotations

from feedline._adapters.jax import JaxLoader, global_batch

__all__ = ["JaxLoader", "global_batch"]
