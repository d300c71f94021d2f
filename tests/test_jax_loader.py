"""feedline.jax: per-process numpy batches, global jax.Arrays, exact resume."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import feedline
from feedline.errors import FeedlineError
from feedline.testing import assert_batches_equal, collect

# jax imported by the tests, not at collection, and every JAX test (these, the example's, the recipe's) on one
# xdist worker: the others never import it (~1 CPU-s each)
pytestmark = pytest.mark.xdist_group("jax")


@pytest.fixture(scope="module")
def jax() -> Any:
    return pytest.importorskip("jax")


@pytest.fixture
def spec(jax: Any, corpus: str, small_tokenizer: str) -> dict[str, Any]:
    return {"sources": [{"path": corpus}], "tokenizer": small_tokenizer, "seed": 5,
            "shuffle": {"buffer": 20}, "task": {"kind": "clm", "max_length": 32},
            "batching": {"strategy": "pad", "batch_size": 4}}


def test_single_process_batches_equal_the_numpy_loaders(jax: Any, spec: dict[str, Any]) -> None:
    from feedline.jax import JaxLoader

    loader = JaxLoader(spec)
    assert (loader.process_index, loader.process_count) == (jax.process_index(), jax.process_count()) == (0, 1)
    assert_batches_equal(collect(feedline.Loader(spec)), list(loader))


def test_each_process_gets_its_slice(spec: dict[str, Any]) -> None:
    from feedline.jax import JaxLoader

    for p in range(2):
        got = list(JaxLoader(spec, process_index=p, process_count=2))
        assert_batches_equal(collect(feedline.Loader(spec, rank=p, world_size=2)), got, where=f"process {p}")
        assert all(len(b["input_ids"]) == 2 for b in got)


def test_sharding_yields_global_arrays(jax: Any, spec: dict[str, Any]) -> None:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from feedline.jax import JaxLoader, global_batch

    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    ref = collect(feedline.Loader(spec), limit=3)
    got = []
    for b in JaxLoader(spec, sharding=NamedSharding(mesh, PartitionSpec("data"))):
        assert all(isinstance(v, jax.Array) for v in b.values())
        got.append({k: np.asarray(v) for k, v in b.items()})
        if len(got) == 3:
            break
    assert_batches_equal(ref, got)
    assert global_batch({"x": np.zeros((2, 5), np.int32)}, NamedSharding(mesh, PartitionSpec("data")))["x"].shape == (2, 5)


def test_resume_is_exact(spec: dict[str, Any]) -> None:
    from feedline.jax import JaxLoader

    ref = collect(feedline.Loader(spec))
    loader = JaxLoader(spec)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert loader.step == 4
    assert_batches_equal(ref[4:], list(JaxLoader(spec, state=state)))
    loader.load_state_dict(state)
    assert_batches_equal(ref[4:], list(loader))


def test_wraps_a_built_loader(spec: dict[str, Any]) -> None:
    from feedline.jax import JaxLoader

    inner = feedline.Loader(spec, rank=1, world_size=2)
    loader = JaxLoader(inner)
    assert (loader.process_index, loader.process_count) == (1, 2)
    with pytest.raises(FeedlineError, match="belong to the Loader"):
        JaxLoader(inner, process_index=0)
