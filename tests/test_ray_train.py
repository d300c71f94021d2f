"""Ray Train integration: per-worker shards from feedline, state in Ray Train checkpoints."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedline._batching.planner import slice_for_rank
from feedline._loader import Loader
from feedline._ray.train import STATE_FILE, load_state, save_state, shard_for_worker
from feedline.errors import StateError
from feedline.testing import assert_batches_equal, collect, make_corpus

# one xdist worker runs every Ray test (clusters on one machine find each other)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
GPT2 = DATA / "tokenizers" / "gpt2" / "tokenizer.json"
needs_data = pytest.mark.skipif(not GPT2.exists(), reason="shared test data (../shared/data) is absent")


@dataclass
class Ctx:
    rank: int
    size: int

    def get_world_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.size


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ray-train-corpus")
    make_corpus(root, files=2, docs=60, seed=3)
    return {"seed": 5, "sources": [{"path": str(root)}], "shuffle": {"buffer": 32}, "tokenizer": str(GPT2),
            "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pad", "batch_size": 4}}


def digest(batch: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(batch):
        a = np.ascontiguousarray(batch[k])
        h.update(f"{k}{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------ the helpers, without a cluster
@needs_data
def test_shard_for_worker_gives_each_rank_its_slice_and_resumes(spec: dict[str, Any], tmp_path: Path) -> None:
    full = collect(Loader(spec, 0, 1))
    shards = [shard_for_worker(spec, context=Ctx(r, 2), state=None, checkpoint=tmp_path) for r in range(2)]
    got = [collect(s, limit=3) for s in shards]
    for r in range(2):
        assert_batches_equal([slice_for_rank(b, r, 2) for b in full[:3]], got[r], where=f"rank {r}")
    save_state(shards[1], tmp_path)
    assert load_state(tmp_path) == shards[1].state_dict()
    resumed = shard_for_worker(spec, context=Ctx(0, 1), checkpoint=str(tmp_path))  # elastic: 2 ranks -> 1
    assert_batches_equal(full[3:], collect(resumed), where="resumed on one worker")


def test_load_state_without_or_with_a_bad_file(tmp_path: Path) -> None:
    assert load_state(tmp_path) is None
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(StateError, match="not a feedline state"):
        load_state(tmp_path)
    (tmp_path / STATE_FILE).write_text("[1, 2]")
    with pytest.raises(StateError, match="must be a JSON object"):
        load_state(str(tmp_path))


# ------------------------------------------------------------------ a real TorchTrainer, 2 CPU workers
def train_loop(config: dict[str, Any]) -> None:
    """Take ``steps`` batches of this worker's shard, record their digests, checkpoint feedline's state."""
    import ray.train as rt

    loader = shard_for_worker(config["spec"])
    rank = rt.get_context().get_world_rank()
    seen = [digest(b) for b in collect(loader, limit=config["steps"])]
    Path(config["out"], f"{config['run']}-{rank}.json").write_text(json.dumps(seen))
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if rank == 0:
            save_state(loader, d)
            checkpoint = rt.Checkpoint.from_directory(d)
        rt.report({"step": loader.step}, checkpoint=checkpoint)
    loader.close()


#: Ray Train's own knobs (read from the driver's environment, passed on to its controller): the
#: controller polls its workers every 0.25 s, not 2 s (a fit ends that much sooner), and starts no
#: preemption watcher, metrics or state reconciliation, which a local cluster has no use for (an
#: actor process less per fit). The test's fits, shards and checkpoints are unchanged.
RAY_TRAIN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                 "RAY_TRAIN_METRICS_ENABLED": "0", "RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION": "0"}


@pytest.fixture(scope="module")
def ray_session(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session's local Ray cluster (conftest.py: two one-CPU nodes); this module pickles by value."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("torch")
    pytest.importorskip("ray.train.torch")
    request.getfixturevalue("ray_cluster")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with pytest.MonkeyPatch.context() as mp:
        for k, v in RAY_TRAIN_ENV.items():
            mp.setenv(k, v)
        yield ray
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def lean_torch_trainer() -> Any:
    """``TorchTrainer`` less two of Ray Train's internal callbacks that start an actor each per fit (a
    process importing ray.train, ~2.5 CPU-s) and serve nothing a fit here uses: the Ray Data shard
    manager (no ``datasets``) and the cleaner of a controller's placement groups should the controller
    die (the session's cluster is torn down). The controller, the workers, their torch process group,
    reports and checkpoints are Ray Train's own. Where Ray Train's internals differ: TorchTrainer."""
    from ray.train.torch import TorchTrainer

    try:
        from ray.train.v2._internal.callbacks import DatasetsCallback
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    except ImportError:
        return TorchTrainer
    if not hasattr(TorchTrainer, "_create_default_callbacks"):
        return TorchTrainer
    skipped = (DatasetsCallback, PlacementGroupCleanerCallback)

    class LeanTorchTrainer(TorchTrainer):  # type: ignore[misc,valid-type]
        def _create_default_callbacks(self) -> list[Any]:
            return [c for c in super()._create_default_callbacks() if not isinstance(c, skipped)]

    return LeanTorchTrainer


@needs_data
@pytest.mark.slow
def test_torch_trainer_workers_get_their_shards_and_resume(ray_session: Any, spec: dict[str, Any], tmp_path: Path) -> None:
    from ray.train import RunConfig, ScalingConfig

    TorchTrainer = lean_torch_trainer()

    def fit(run: str, workers: int, steps: int) -> Any:
        """A run named "job": a second fit restores from the first's latest checkpoint (Ray Train v2)."""
        config = {"spec": spec, "steps": steps, "out": str(tmp_path), "run": run}
        trainer = TorchTrainer(train_loop, train_loop_config=config,
                               scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
                               run_config=RunConfig(name="job", storage_path=str(tmp_path / "runs")))
        return trainer.fit()

    first = fit("first", workers=2, steps=3)
    assert first.metrics["step"] == 3
    for rank in range(2):
        want = [digest(b) for b in collect(Loader(spec, rank, 2), limit=3)]
        assert json.loads((tmp_path / f"first-{rank}.json").read_text()) == want
    # A restart from the checkpoint, with one worker instead of two, continues the global stream.
    second = fit("second", workers=1, steps=2)
    assert second.metrics["step"] == 5
    want = [digest(b) for b in collect(Loader(spec, 0, 1))[3:5]]
    assert json.loads((tmp_path / "second-0.json").read_text()) == want
