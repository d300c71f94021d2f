"""JAX adapter: each process gets its slice of every global batch, ready for a global ``jax.Array``.

    >>> import jax, numpy as np
    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> from feedline.jax import JaxLoader
    >>> mesh = Mesh(np.array(jax.devices()), ("data",))                          # doctest: +SKIP
    >>> loader = JaxLoader("spec.yaml", sharding=NamedSharding(mesh, P("data")))  # doctest: +SKIP
    >>> for batch in loader:                     # dict of global jax.Arrays       # doctest: +SKIP
    ...     state, loss = train_step(state, batch)

Rank and world size are ``jax.process_index()`` and ``jax.process_count()``: process ``p``
receives rows ``[p]`` of the global step planner's split, which is what
``jax.make_array_from_process_local_data(sharding, local)`` expects along the batch axis.
Without ``sharding`` the loader yields the per-process numpy batches themselves. Integer fields
stay ``int32`` (JAX's default integer width).

The process reads nothing ahead of what it yields (the wrapped :class:`feedline.Loader`
prefetches on its own thread), so :meth:`JaxLoader.state_dict` is exact at every step.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from feedline._adapters.common import is_loader, resolve_loader
from feedline.errors import FeedlineError, MissingDependency

try:
    import jax
except ImportError as e:  # pragma: no cover - depends on the environment
    raise MissingDependency("feedline.jax needs JAX; install it with: pip install 'feedline[jax]'") from e

__all__ = ["JaxLoader", "global_batch"]


def global_batch(local: Mapping[str, np.ndarray], sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
    """Assemble this process's rows into global arrays sharded along the batch axis.

        >>> from jax.sharding import SingleDeviceSharding
        >>> out = global_batch({"x": np.ones((2, 3), np.int32)}, SingleDeviceSharding(jax.devices()[0]))
        >>> out["x"].shape
        (2, 3)
    """
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()}


class JaxLoader:
    """Per-process batches of a spec or a service, as numpy arrays or global ``jax.Array``.

    Args:
        source: a spec (path, mapping or :class:`~feedline._spec.Spec`), a service address, or a
            built :class:`feedline.Loader` (its rank is used).
        sharding: when given, each batch becomes global arrays with
            :func:`global_batch`; otherwise the local numpy batch is yielded.
        process_index, process_count: override ``jax.process_index()``/``jax.process_count()``.
        state: a :meth:`state_dict` to resume from.
        stream: the service stream name (remote sources; default ``train``).
    """

    def __init__(self, source: Any, *, sharding: jax.sharding.Sharding | None = None,
                 process_index: int | None = None, process_count: int | None = None,
                 state: Mapping[str, Any] | None = None, stream: str | None = None) -> None:
        self.sharding = sharding
        if is_loader(source):
            if process_index is not None or process_count is not None or state is not None:
                raise FeedlineError("process_index, process_count and state belong to the Loader passed in; set them there")
            self.loader: Any = source
            self.process_index = int(getattr(source, "rank", 0))
            self.process_count = int(getattr(source, "world_size", 1))
        else:
            self.process_index = jax.process_index() if process_index is None else process_index
            self.process_count = jax.process_count() if process_count is None else process_count
            self.loader = resolve_loader(source, self.process_index, self.process_count, state=state, stream=stream)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            local = {k: np.asarray(v) for k, v in batch.items()}
            yield local if self.sharding is None else global_batch(local, self.sharding)

    def state_dict(self) -> dict[str, Any]:
        """JSON state after the last batch yielded; any process's state resumes every process."""
        return self.loader.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state``: the next batch is the one that followed it."""
        self.loader.load_state_dict(state)

    @property
    def step(self) -> int:
        """Global steps received so far (the loader's: no state is materialized for it)."""
        return self.loader.step

    def close(self) -> None:
        """Stop the wrapped loader. Idempotent."""
        self.loader.close()

    def __enter__(self) -> JaxLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JaxLoader(process_index={self.process_index}, process_count={self.process_count}, sharding={self.sharding})"
