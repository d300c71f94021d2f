"""Scale feedline out on a Ray cluster (needs ``pip install 'feedline[ray]'``).

* ``engine: {kind: ray, ...}`` in a spec runs tokenization and the task as Ray tasks over the
  cluster; the batches are bit-identical to the local engine's and resume states are
  interchangeable.
* :func:`shard_for_worker` gives each Ray Train worker its rank's share of every global batch,
  and :func:`save_state` / :func:`load_state` keep its exact resume point in Ray Train
  checkpoints::

    from feedline.ray import save_state, shard_for_worker
    loader = shard_for_worker("spec.yaml")      # this worker's rank, resumed from the checkpoint

Nothing here imports ``ray`` until it is used; without it, a
:class:`~feedline.errors.MissingDependency` says ``pip install 'feedline[ray]'``.
See ``docs/ray.md`` for a multi-node walk-through.
"""

from feedline._ray.train import STATE_FILE, WorkerContext, load_state, save_state, shard_for_worker

__all__ = ["STATE_FILE", "WorkerContext", "load_state", "save_state", "shard_for_worker"]
