"""Scale feedline out on a Ray cluster.

* ``engine: {kind: ray, ...}`` in a spec runs tokenization and the task as Ray tasks over the
  cluster (:class:`feedline.ray.map.RayTaskMap`); the batches are bit-identical to the local
  engine's and resume states are interchangeable.
* :mod:`feedline.ray.train` gives each Ray Train worker its rank's shard with exact resume.

Nothing here imports ``ray`` until it is used; without it, a
:class:`~feedline.errors.MissingDependency` says ``pip install 'feedline[ray]'``.
See ``docs/ray.md`` for a multi-node walk-through.
"""

from __future__ import annotations
