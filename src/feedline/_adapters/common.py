"""What every adapter shares: where rank and world size come from, and how a source becomes a loader.

    >>> resolve_rank(None, None, env={"RANK": "1", "WORLD_SIZE": "4"})
    (1, 4)
    >>> resolve_rank(0, 2, env={"RANK": "1", "WORLD_SIZE": "4"})     # explicit values win
    (0, 2)

A *source* is a spec (path, mapping or :class:`~feedline._spec.Spec`), a service address
(``tcp://host:port``), or an already built loader (anything with ``__iter__``, ``state_dict``
and ``load_state_dict``, such as :class:`feedline.Loader` or the service client).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from feedline._spec import Spec
from feedline.errors import SpecError

__all__ = ["BatchLoader", "LoaderStage", "is_loader", "resolve_loader", "resolve_rank"]


@runtime_checkable
class BatchLoader(Protocol):
    """The loader interface adapters wrap: numpy batches plus resumable state."""

    rank: int
    world_size: int

    def __iter__(self) -> Iterator[Mapping[str, Any]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class LoaderStage:
    """A built loader seen as a stage (``next``/``get_state``/``set_state``), to run under a Prefetch.

    The state is the loader's :meth:`state_dict`. Closing the stage leaves the loader open: it
    belongs to whoever built it.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._it: Iterator[Mapping[str, Any]] | None = None

    def __next__(self) -> Mapping[str, Any]:
        if self._it is None:
            self._it = iter(self.loader)
        return next(self._it)

    def get_state(self) -> dict[str, Any]:
        return self.loader.state_dict()  # type: ignore[no-any-return]

    def snapshot(self) -> dict[str, Any]:
        """The state, deferred where the loader can defer it (taken after every batch)."""
        snap = getattr(self.loader, "_state_snapshot", None)
        return snap() if snap is not None else self.get_state()  # type: ignore[no-any-return]

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._it = None
        self.loader.load_state_dict(state)

    def close(self) -> None:
        self._it = None


def is_loader(obj: Any) -> bool:
    """Whether ``obj`` is a built loader rather than a spec or an address."""
    if isinstance(obj, (str, os.PathLike, Mapping, Spec)):
        return False
    return all(callable(getattr(obj, name, None)) for name in ("__iter__", "state_dict", "load_state_dict"))


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise SpecError(f"environment variable {name}={raw!r} is not an integer") from None


def resolve_rank(rank: int | None, world_size: int | None, *, env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """Rank and world size: explicit values first, then ``RANK``/``WORLD_SIZE`` (set by torchrun), else ``(0, 1)``.

    Raises:
        SpecError: only one of the pair is known, or the rank is outside ``[0, world_size)``.
    """
    env = os.environ if env is None else env
    if rank is None and world_size is None:
        rank, world_size = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
        if rank is None and world_size is None:
            return 0, 1
        if rank is None or world_size is None:
            raise SpecError("the environment sets only one of RANK and WORLD_SIZE; set both (torchrun does) or pass rank= and world_size=")
    elif rank is None or world_size is None:
        raise SpecError(f"pass both rank= and world_size= (got rank={rank}, world_size={world_size})")
    if not 0 <= rank < world_size:
        raise SpecError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size


def resolve_loader(source: Any, rank: int, world_size: int, *, state: Mapping[str, Any] | None = None,
                   stream: str | None = None, prefetch: int | None = None) -> Any:
    """A :class:`feedline.Loader` (in-process, or the service client for an address) for one rank."""
    from feedline._loader import Loader

    named = {"stream": stream} if stream is not None else {}
    return Loader(source, rank, world_size, state, prefetch=prefetch, **named)
