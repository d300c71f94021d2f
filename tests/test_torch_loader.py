"""TorchLoader: same batches as the numpy Loader, exact resume, rank from the environment."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import feedline
from feedline.errors import FeedlineError, SourceError, SpecError, StateError
from feedline.testing import assert_batches_equal, collect
from heavy import lazy, needs

torch = lazy("torch")
fltorch = lazy("feedline.torch")
pytestmark = needs("torch")


@pytest.fixture
def spec(corpus: str, small_tokenizer: str) -> dict[str, Any]:
    return {"sources": [{"path": corpus}], "tokenizer": small_tokenizer, "seed": 3,
            "shuffle": {"buffer": 30}, "task": {"kind": "clm", "max_length": 48},
            "batching": {"strategy": "pad", "batch_size": 8}}


def as_numpy(batches: list[dict[str, Any]], dtype: Any = None) -> list[dict[str, np.ndarray]]:
    return [{k: (v.numpy().astype(dtype) if dtype is not None and v.dtype == torch.int64 else v.numpy())
             for k, v in b.items()} for b in batches]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_batches_equal_the_numpy_loaders(spec: dict[str, Any], prefetch: int) -> None:
    ref = collect(feedline.Loader(spec))
    got = list(fltorch.TorchLoader(spec, prefetch=prefetch, int64=False))
    assert len(ref) > 5
    assert all(isinstance(v, torch.Tensor) for b in got for v in b.values())
    assert_batches_equal(ref, as_numpy(got))


def test_without_a_feeder_no_state_is_made_whole_until_it_is_read(spec: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # with partitions in workers, a whole state is asked of every worker: once per batch was once per step
    loader = feedline.Loader(spec)
    made = []
    whole = loader.state_dict
    monkeypatch.setattr(loader, "state_dict", lambda: made.append(1) or whole())
    torch_loader = fltorch.TorchLoader(loader, prefetch=0, int64=False)
    it = iter(torch_loader)
    for _ in range(5):
        next(it)
    assert len(made) <= 1   # the start state only
    assert torch_loader.step == 5 and len(made) <= 1
    state = torch_loader.state_dict()
    assert state["step"] == 5
    rest = as_numpy(list(fltorch.TorchLoader(spec, prefetch=0, state=json.loads(json.dumps(state)), int64=False)))
    assert_batches_equal(collect(feedline.Loader(spec))[5:], rest)


def test_integer_fields_become_int64_by_default(spec: dict[str, Any]) -> None:
    ref = collect(feedline.Loader(spec), limit=3)
    got = []
    for b in fltorch.TorchLoader(spec):
        assert {v.dtype for v in b.values()} == {torch.int64}
        got.append(b)
        if len(got) == 3:
            break
    assert_batches_equal(ref, as_numpy(got, np.int32))


def test_rank_slices_equal_the_numpy_loaders(spec: dict[str, Any]) -> None:
    for rank in range(2):
        ref = collect(feedline.Loader(spec, rank=rank, world_size=2))
        got = as_numpy(list(fltorch.TorchLoader(spec, rank=rank, world_size=2, int64=False)))
        assert_batches_equal(ref, got, where=f"rank {rank}")


def test_rank_and_world_size_come_from_torchrun_environment(spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = fltorch.TorchLoader(spec, int64=False)
    assert (loader.rank, loader.world_size) == (1, 2)
    ref = collect(feedline.Loader(spec, rank=1, world_size=2), limit=4)
    got = []
    for b in loader:
        got.append(b)
        if len(got) == 4:
            break
    assert_batches_equal(ref, as_numpy(got))
    monkeypatch.delenv("RANK")
    with pytest.raises(SpecError, match="only one of RANK and WORLD_SIZE"):
        fltorch.TorchLoader(spec)


def test_wraps_a_built_loader_and_uses_its_rank(spec: dict[str, Any]) -> None:
    inner = feedline.Loader(spec, rank=1, world_size=2)
    loader = fltorch.TorchLoader(inner, int64=False)
    assert (loader.rank, loader.world_size) == (1, 2)
    assert_batches_equal(collect(feedline.Loader(spec, rank=1, world_size=2)), as_numpy(list(loader)))
    with pytest.raises(FeedlineError, match="belong to the Loader"):
        fltorch.TorchLoader(inner, rank=0, world_size=1)


@pytest.mark.parametrize("prefetch", [0, 3])
@pytest.mark.slow
def test_resume_through_torchloader_is_exact(spec: dict[str, Any], prefetch: int) -> None:
    ref = collect(feedline.Loader(spec))
    n = len(ref)
    for stop in (0, 1, n // 2, n - 1, n):
        loader = fltorch.TorchLoader(spec, prefetch=prefetch, int64=False)
        it = iter(loader)
        for _ in range(stop):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))  # what a checkpoint stores
        assert state["step"] == stop
        loader.close()
        resumed = as_numpy(list(fltorch.TorchLoader(spec, prefetch=prefetch, state=state, int64=False)))
        assert_batches_equal(ref[stop:], resumed, where=f"resume after {stop}")


def test_packed_states_through_the_feeder_are_json_and_resume(spec: dict[str, Any]) -> None:
    """The feeder hands on the loader's deferred (pack) states; state_dict() gives plain JSON."""
    packed = {**spec, "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pack", "batch_size": 4}}
    ref = as_numpy(list(fltorch.TorchLoader(packed, int64=False)))
    loader = fltorch.TorchLoader(packed, prefetch=2, int64=False)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert loader.step == 3 and state["step"] == 3
    loader.close()
    assert_batches_equal(ref[3:], as_numpy(list(fltorch.TorchLoader(packed, state=state, int64=False))), where="resume after 3")


def test_iterating_again_continues_after_the_last_batch_received(spec: dict[str, Any]) -> None:
    """The feeder thread runs ahead; a new iteration must not skip what it had prefetched."""
    ref = collect(feedline.Loader(spec))
    loader = fltorch.TorchLoader(spec, prefetch=4, int64=False)
    got = []
    for _ in range(3):
        for b in loader:
            got.append(b)
            break
    got += list(loader)
    assert_batches_equal(ref, as_numpy(got))
    assert list(loader) == []  # exhausted
    assert loader.step == len(ref)


def test_load_state_dict_rewinds_a_running_loader(spec: dict[str, Any]) -> None:
    ref = collect(feedline.Loader(spec))
    loader = fltorch.TorchLoader(spec, int64=False)
    it = iter(loader)
    next(it)
    next(it)
    saved = loader.state_dict()
    for _ in range(3):
        next(it)
    loader.load_state_dict(saved)
    assert_batches_equal(ref[2:], as_numpy(list(loader)))
    fresh = fltorch.TorchLoader(spec, int64=False)
    fresh.load_state_dict(saved)  # before any iteration
    assert_batches_equal(ref[2:], as_numpy(list(fresh)))


def test_state_from_another_spec_is_refused(spec: dict[str, Any]) -> None:
    state = fltorch.TorchLoader(spec).state_dict()
    other = {**spec, "seed": 4}
    with pytest.raises(StateError, match="saved under spec"):
        fltorch.TorchLoader(other).load_state_dict(state)


def test_pipeline_errors_reach_the_caller(spec: dict[str, Any], tmp_path: Any) -> None:
    bad = {**spec, "sources": [{"path": str(tmp_path / "missing-*.jsonl")}]}
    with pytest.raises(SourceError):
        list(fltorch.TorchLoader(bad))


def test_dataloader_passthrough_and_worker_refusal(spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    loader = fltorch.TorchLoader(spec, int64=False)
    ref = collect(feedline.Loader(spec), limit=2)
    dl = loader.dataloader()
    got = []
    for b in dl:
        got.append(b)
        if len(got) == 2:
            break
    assert_batches_equal(ref, as_numpy(got))
    # inside a DataLoader worker process (simulated: a real worker takes seconds to shut down)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    with pytest.raises(FeedlineError, match="worker processes"):
        iter(fltorch.TorchLoader(spec))


def test_to_torch_and_passthrough_collate() -> None:
    ro = np.arange(6, dtype=np.int32).reshape(2, 3)
    ro.flags.writeable = False  # as batches decoded from the network are
    multi_hot = np.array([[0.0, 1.0]], dtype=np.float32)
    out = fltorch.to_torch({"input_ids": ro, "labels": multi_hot}, int64=False)
    assert out["input_ids"].dtype == torch.int32 and out["labels"].dtype == torch.float32
    assert out["input_ids"].tolist() == ro.tolist()
    assert fltorch.to_torch({"input_ids": ro})["input_ids"].dtype == torch.int64
    assert fltorch.passthrough_collate([out]) is out
    with pytest.raises(FeedlineError, match="per_device_train_batch_size=1"):
        fltorch.passthrough_collate([out, out])


def test_bad_arguments_are_refused(spec: dict[str, Any]) -> None:
    with pytest.raises(FeedlineError, match="prefetch"):
        fltorch.TorchLoader(spec, prefetch=-1)
    with pytest.raises(SpecError, match="both rank= and world_size="):
        fltorch.TorchLoader(spec, rank=1)
    if not torch.cuda.is_available():
        with pytest.raises(FeedlineError, match="CUDA is not available"):
            fltorch.TorchLoader(spec, device="cuda")


def test_feedline_torch_does_not_shadow_torch_inside_the_package() -> None:
    import torch  # the module itself, not this file's lazy stand-in

    import feedline._adapters.torch as adapter
    import feedline.torch

    assert adapter.torch is torch
    assert feedline.torch.TorchLoader is adapter.TorchLoader  # the public shim


@pytest.mark.slow
def test_remote_ranks_from_the_environment_equal_in_process(spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two torchrun-style ranks reading one ``feedline serve``: same slices as in-process, exact state."""
    import importlib.util

    if importlib.util.find_spec("feedline._service.launch") is None:
        pytest.skip("the loader service is not available")
    from feedline.service import serve_process

    with serve_process(spec) as address:
        loaders = []
        for rank in range(2):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
            loaders.append(fltorch.TorchLoader(address, int64=False))
        assert [(x.rank, x.world_size) for x in loaders] == [(0, 2), (1, 2)]
        its = [iter(x) for x in loaders]
        got: list[list[dict[str, Any]]] = [[], []]
        for _ in range(4):  # ranked mode is lockstep: take a step on each rank in turn
            for rank in range(2):
                got[rank].append(next(its[rank]))
        states = [x.state_dict() for x in loaders]
        for x in loaders:
            x.close()
    for rank in range(2):
        ref = collect(feedline.Loader(spec, rank=rank, world_size=2), limit=4)
        assert_batches_equal(ref, as_numpy(got[rank]), where=f"remote rank {rank}")
    assert states[0]["step"] == states[1]["step"] == 4
    assert states[0]["pipeline"] == states[1]["pipeline"]
    rest = as_numpy(list(fltorch.TorchLoader(spec, rank=1, world_size=2, state=states[0], int64=False)))
    assert_batches_equal(collect(feedline.Loader(spec, rank=1, world_size=2))[4:], rest, where="resume from remote state")
