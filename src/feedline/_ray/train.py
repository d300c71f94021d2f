"""Ray Train integration: each training worker gets its rank's shard, with exact resume.

Inside ``train_loop_per_worker``, :func:`shard_for_worker` returns a :class:`feedline.Loader`
for this worker's world rank and size, resumed from the feedline state kept in the latest Ray
Train checkpoint; :func:`save_state` writes the loader's state next to the model's, so a run
restarted by Ray Train (after a failure, or with another number of workers) continues the
same global stream::

    from ray.train import Checkpoint, ScalingConfig, get_checkpoint, report
    from ray.train.torch import TorchTrainer
    from feedline._ray.train import save_state, shard_for_worker

    def train_loop(config):
        loader = shard_for_worker(config["data"])   # a spec, or "tcp://head:5555" (the service)
        for step, batch in enumerate(loader, 1):
            ...                                                 # forward, backward, step
            if step % 100 == 0:
                with tempfile.TemporaryDirectory() as d:
                    save_state(loader, d)                       # + torch.save(model, ...) in d
                    report({"step": loader.step}, checkpoint=Checkpoint.from_directory(d))

    TorchTrainer(train_loop, train_loop_config={"data": "spec.yaml"},
                 scaling_config=ScalingConfig(num_workers=8, use_gpu=True)).fit()

The state is the global stream's, the same on every rank, so any rank's copy resumes every
rank at any world size. With a spec, each worker runs the pipeline itself (planning is
replicated; with ``engine: ray`` the tokenization of all of them runs on the cluster); with a
service address, one ``feedline serve`` feeds all workers and nothing is computed twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from feedline._loader import Loader
from feedline._ray.runtime import import_ray
from feedline._spec import Spec
from feedline.errors import StateError

__all__ = ["STATE_FILE", "WorkerContext", "load_state", "save_state", "shard_for_worker"]

#: The file, inside a Ray Train checkpoint directory, that holds feedline's resume state.
STATE_FILE = "feedline_state.json"


class WorkerContext(Protocol):
    """What :func:`shard_for_worker` needs from ``ray.train.get_context()``."""

    def get_world_rank(self) -> int: ...

    def get_world_size(self) -> int: ...


def shard_for_worker(source: Spec | Mapping[str, Any] | str | os.PathLike[str], *,
                     state: Mapping[str, Any] | None = None, checkpoint: Any = None,
                     context: WorkerContext | None = None, **loader_kwargs: Any) -> Any:
    """This Ray Train worker's :class:`~feedline.Loader`, resumed from the last checkpoint.

    Args:
        source: a spec (path, mapping or :class:`~feedline.Spec`) or a service address
            (``tcp://host:port``).
        state: an explicit resume state; by default the one in ``checkpoint``.
        checkpoint: a ``ray.train.Checkpoint`` (default: ``ray.train.get_checkpoint()``, the
            checkpoint the run is being restored from, if any).
        context: rank and world size (default: ``ray.train.get_context()``).
        **loader_kwargs: passed to :class:`~feedline.Loader` (``prefetch``, ``stream``...).

    Example:
        >>> loader = shard_for_worker("spec.yaml")        # doctest: +SKIP
        >>> batch = next(iter(loader))                     # this rank's rows of global step 1
    """
    if context is None or (state is None and checkpoint is None):
        train = import_ray().train
        context = context or train.get_context()
        if state is None and checkpoint is None:
            checkpoint = train.get_checkpoint()
    if state is None and checkpoint is not None:
        state = load_state(checkpoint)
    rank, world_size = int(context.get_world_rank()), int(context.get_world_size())
    return Loader(source, rank=rank, world_size=world_size, state=state, **loader_kwargs)  # service or spec


def save_state(loader: Any, directory: str | os.PathLike[str]) -> Path:
    """Write ``loader.state_dict()`` into a checkpoint directory; returns the file written."""
    path = Path(directory) / STATE_FILE
    path.write_text(json.dumps(loader.state_dict(), separators=(",", ":")), encoding="utf-8")
    return path


def load_state(checkpoint: Any) -> dict[str, Any] | None:
    """The feedline state in a ``ray.train.Checkpoint`` (or a directory), or ``None`` if it has none.

    Raises:
        StateError: the file is there but is not valid JSON.
    """
    if hasattr(checkpoint, "as_directory"):  # a ray.train.Checkpoint (which refuses os.fspath)
        with checkpoint.as_directory() as d:
            return _read_state(Path(d) / STATE_FILE)
    return _read_state(Path(checkpoint) / STATE_FILE)


def _read_state(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise StateError(f"{path}: not a feedline state ({e}); was it written by feedline._ray.train.save_state?") from e
    if not isinstance(state, dict):
        raise StateError(f"{path}: a feedline state must be a JSON object, got {type(state).__name__}")
    return state
