"""Importing and connecting to Ray, with feedline's errors.

``ray`` is an optional extra: :func:`import_ray` raises
:class:`~feedline.errors.MissingDependency` naming ``pip install 'feedline[ray]'`` when it is
absent. :func:`connect` joins (or starts) the one cluster ``parallel.address`` names, for the
``ray`` placement and the ``ray`` map alike, unless the process already called ``ray.init``
itself, in which case that session is used as it is (so ``runtime_env``, ``num_cpus`` and other
``ray.init`` options stay the caller's)::

    parallel: {map: ray, address: auto}          # a running cluster, else a new local instance
    parallel: {placement: ray, address: local}   # always a new local instance (every core)
    parallel: {map: ray, address: "ray://head:10001"}   # Ray Client to a remote cluster
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from feedline._spec import ParallelSpec
from feedline.errors import FeedlineError, MissingDependency

__all__ = ["cluster_cpus", "connect", "import_ray"]

log = logging.getLogger("feedline")


def import_ray() -> ModuleType:
    """The ``ray`` module, or :class:`MissingDependency` saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise MissingDependency(
            "parallel: ray (placement or map) needs Ray, which is not installed; install it with: "
            "pip install 'feedline[ray]' (or set parallel.placement and parallel.map to run here)"
        ) from e
    return ray


def connect(options: ParallelSpec) -> ModuleType:
    """Make sure this process is connected to the Ray cluster ``options.address`` names; return ``ray``.

    ``address``: ``auto`` connects to a running cluster (``RAY_ADDRESS`` or the one ``ray start``
    left on this machine) and starts a local instance (every core) when there is none; ``local``
    always starts a local instance; anything else (``ray://host:10001``, ``host:6379``) is passed
    to ``ray.init(address=...)``.

    Raises:
        MissingDependency: ray is not installed.
        FeedlineError: the cluster at ``address`` cannot be reached.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"include_dashboard": False, "ignore_reinit_error": True}
    address = options.address
    try:
        if address == "auto":
            try:
                ray.init(address="auto", **kwargs)
            except ConnectionError:
                log.info("no running Ray cluster found; starting a local instance")
                ray.init(address="local", **kwargs)
        else:
            ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise FeedlineError(
            f"parallel.address: cannot connect to the Ray cluster at {address!r} ({e}); start it with "
            "'ray start --head' on the head node, or use address: local"
        ) from e
    return ray


def cluster_cpus() -> int:
    """The connected cluster's CPUs (at least 1)."""
    ray = import_ray()
    return max(1, int(ray.cluster_resources().get("CPU", 1)))
