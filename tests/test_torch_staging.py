"""TorchLoader stages batches on its feeder thread; pooled host buffers are reused, never handed out.

No timing here: the staging behaviour itself is asserted. The CUDA path's pool and reuse logic run
on the CPU through the stager's ``clone`` mode (the device copy a CPU clone, no events).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import feedline
from feedline.testing import collect
from heavy import lazy, needs

torch = lazy("torch")
staging = lazy("feedline._adapters.staging")
fltorch = lazy("feedline.torch")
pytestmark = needs("torch")


@pytest.fixture
def spec(corpus: str, small_tokenizer: str) -> dict[str, Any]:
    return {"sources": [{"path": corpus}], "tokenizer": small_tokenizer, "seed": 3,
            "task": {"kind": "clm", "max_length": 64}, "batching": {"strategy": "pack", "batch_size": 4}}


def _expected(spec: dict[str, Any]) -> list[dict[str, np.ndarray]]:
    """The numpy loader's batches in TorchLoader's default layout (position_ids: no 2-D mask), as int64."""
    return [{k: v.astype(np.int64) for k, v in b.items() if k != "attention_mask"} for b in collect(feedline.Loader(spec))]


def _assert_same(got: list[dict[str, Any]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want) > 6
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for k in w:
            assert np.array_equal(g[k].numpy(), w[k]), k


def test_conversion_and_layout_run_on_the_feeder_thread(spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from feedline._adapters import staging  # the module itself (patched), not this file's lazy stand-in

    converted: set[str] = set()
    real = staging.to_torch

    def recording(*a: Any, **kw: Any) -> Any:
        converted.add(threading.current_thread().name)
        return real(*a, **kw)

    monkeypatch.setattr(staging, "to_torch", recording)
    stagers: list[staging.Stager] = []
    make = fltorch.TorchLoader._stager
    monkeypatch.setattr(fltorch.TorchLoader, "_stager", lambda self: stagers.append(make(self)) or stagers[-1])
    with fltorch.TorchLoader(spec, prefetch=3) as loader:
        got = list(loader)
    _assert_same(got, _expected(spec))
    assert converted == {"feedline-torch-feeder"}  # never the caller's thread
    assert stagers[0].threads == {"feedline-torch-feeder"} and stagers[0].pool is None  # CPU: no buffer reuse
    with fltorch.TorchLoader(spec, prefetch=0) as loader:  # synchronous: staged by the caller, same batches
        _assert_same(list(loader), _expected(spec))
    assert stagers[1].threads == {threading.current_thread().name}


def test_pooled_buffers_are_reused_and_batches_kept_by_the_caller_stay_intact(
        spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The device path on the CPU: each batch is filled into pooled buffers and "copied" (cloned) on
    the feeder thread; the caller holds on to every batch while later ones reuse the buffers."""
    stagers: list[staging.Stager] = []

    def clone_stager(self: fltorch.TorchLoader) -> staging.Stager:
        stagers.append(staging.Stager(None, int64=True, pin=True, layout=self.packed, copy="clone", depth=self.prefetch))
        return stagers[-1]

    monkeypatch.setattr(fltorch.TorchLoader, "_stager", clone_stager)
    with fltorch.TorchLoader(spec, prefetch=2) as loader:
        got = list(loader)  # every batch kept until the end
    _assert_same(got, _expected(spec))
    (stager,) = stagers
    assert stager.threads == {"feedline-torch-feeder"}
    pool = stager.pool
    assert pool is not None and not pool.pin  # pinning is for CUDA only
    fields = len(pool.buffers)
    assert fields >= 3
    assert pool.allocated < len(got) * fields  # reused ...
    assert all(len(entries) <= 2 + staging.SPARE_BUFFERS for entries in pool.buffers.values())  # ... and bounded
    pooled = {b.data.data_ptr() for entries in pool.buffers.values() for b in entries}
    handed = {t.untyped_storage().data_ptr() for b in got for t in b.values()}
    assert not pooled & handed  # no pooled buffer ever reached the caller


class _Event:
    """A device event whose completion the test decides."""

    def __init__(self) -> None:
        self.done, self.waited = False, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited, self.done = True, True


def test_a_buffer_returns_to_the_pool_only_once_its_copy_is_done() -> None:
    pool = staging.HostPool(pin=False, most=2)
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    first = pool.fill("input_ids", a, np.dtype(np.int64))
    assert first.dtype == torch.int64 and first.tolist() == a.tolist()
    copying = _Event()
    pool.busy(copying)
    second = pool.fill("input_ids", a + 1, np.dtype(np.int64))  # the first is still being copied: a new buffer
    assert second.data_ptr() != first.data_ptr() and pool.allocated == 2
    assert first.tolist() == a.tolist()  # untouched
    pool.busy(_Event())
    copying.done = True
    third = pool.fill("input_ids", a + 2, np.dtype(np.int64))  # its copy is done: reused
    assert third.data_ptr() == first.data_ptr() and pool.allocated == 2
    latest = _Event()
    pool.busy(latest)
    # both busy and the pool full: the copy issued first (the second buffer's) is waited for, never a
    # buffer in use overwritten blindly
    oldest = pool.buffers["input_ids"][1].event
    fourth = pool.fill("input_ids", np.zeros((50, 40), np.int32), np.dtype(np.int64))  # larger: regrown
    assert oldest.waited and not latest.waited
    assert pool.allocated == 3 and fourth.shape == (50, 40) and not fourth.any()
    assert third.tolist() == (a + 2).tolist()  # the buffer whose copy still runs is untouched
