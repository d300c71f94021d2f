"""The Ray engine on a local Ray instance: same batches as the local engine, exact resume, retries."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from feedline._core.record import Example, Record, Rejection
from feedline._loader import Loader
from feedline._pipeline import Pipeline
from feedline._ray.map import RayTaskMap
from feedline._spec import ParallelSpec
from feedline._tasks.base import TaskOutput
from feedline._tasks.clm import CausalLM
from feedline._tasks.map import TaskMap
from feedline.errors import MissingDependency, RecordError, TaskError
from feedline.testing import assert_batches_equal, assert_resumes_exactly, collect, make_corpus
from heavy import lazy, needs

ray = lazy("ray")
# one xdist worker runs every Ray test (clusters on one machine find each other)
pytestmark = [needs("ray"), pytest.mark.slow, pytest.mark.xdist_group("ray")]

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TOKENIZERS = DATA / "tokenizers"
needs_data = pytest.mark.skipif(not TOKENIZERS.is_dir(), reason="shared test data (../shared/data) is absent")

RAY = "ray"   # parallel.map (was engine: {kind: ray, address: auto})


@pytest.fixture(scope="module")
def ray_session(ray_cluster: Any) -> Iterator[Any]:
    """The session's local Ray cluster (conftest.py); test-module classes pickle by value."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("ray-corpus")
    return {
        "a": make_corpus(root / "a", files=3, docs=150, seed=1),
        "b": make_corpus(root / "b", files=2, docs=100, seed=2, max_words=40),
    }


def spec_for(corpus: dict[str, list[str]], engine: Any = "local", **over: Any) -> dict[str, Any]:
    """A mixture of two sources, shuffled, clm on GPT-2, padded batches of 16."""
    spec: dict[str, Any] = {
        "seed": 7,
        "sources": [{"path": corpus["a"][0].rsplit("/", 1)[0], "weight": 2.0},
                    {"path": corpus["b"][0].rsplit("/", 1)[0], "weight": 1.0}],
        "shuffle": {"buffer": 64},
        "tokenizer": str(TOKENIZERS / "gpt2" / "tokenizer.json"),
        "task": {"kind": "clm", "max_length": 64},
        "batching": {"strategy": "pad", "batch_size": 16},
        "parallel": {"map": engine},
    }
    spec.update(over)
    return spec


def both_engines(spec: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    local, remote = Loader({**spec, "parallel": {"map": "local"}}), Loader({**spec, "parallel": {"map": RAY}})
    try:
        return collect(local), collect(remote)
    finally:
        local.close()
        remote.close()


# ------------------------------------------------------------------ identical output
@needs_data
def test_clm_mixture_with_shuffle_is_identical_to_local(ray_session: Any, corpus: dict[str, list[str]]) -> None:
    spec = spec_for(corpus)
    assert isinstance(Pipeline({**spec, "parallel": {"map": RAY}}).examples(), RayTaskMap)
    want, got = both_engines(spec)
    assert len(want) > 40  # long enough to span several chunks
    assert_batches_equal(want, got, where="clm ray vs local")


@needs_data
def test_mlm_is_identical_to_local(ray_session: Any, corpus: dict[str, list[str]]) -> None:
    from feedline._tasks.registry import TASKS

    if "mlm" not in TASKS:
        pytest.skip("the mlm task is not in this checkout yet")
    spec = spec_for(corpus, tokenizer=str(TOKENIZERS / "bert-base-uncased"), task={"kind": "mlm", "max_length": 64})
    want, got = both_engines(spec)
    assert want and "labels" in want[0]
    assert_batches_equal(want, got, where="mlm ray vs local")


@needs_data
def test_pack_is_identical_to_local(ray_session: Any, corpus: dict[str, list[str]]) -> None:
    from feedline._batching.registry import STRATEGIES

    if "pack" not in STRATEGIES:
        pytest.skip("the pack strategy is not in this checkout yet")
    spec = spec_for(corpus, batching={"strategy": "pack", "batch_size": 8})
    want, got = both_engines(spec)
    assert want
    assert_batches_equal(want, got, where="pack ray vs local")


TASK_KINDS = {
    "clm": ("gpt2", {"kind": "clm", "max_length": 32}),
    "mlm": ("bert-base-uncased", {"kind": "mlm", "max_length": 32}),
    "sop": ("bert-base-uncased", {"kind": "sop", "max_length": 48, "segmenter": "lines"}),
    "span": ("t5", {"kind": "span", "max_length": 32}),
    "classify": ("bert-base-uncased", {"kind": "classify", "label": "label", "max_length": 16}),
    "chat": ("qwen2.5", {"kind": "chat", "max_length": 256}),
    "infer": ("bert-base-uncased", {"kind": "infer", "max_length": 16}),
}


@needs_data
@pytest.mark.parametrize("kind", list(TASK_KINDS))
def test_every_task_kind_runs_on_ray_like_local(kind: str, ray_session: Any, tmp_path: Path) -> None:
    """Every task pickles to the Ray workers (classify used to hold a lock and fail at ray.put)."""
    import json

    tok, task = TASK_KINDS[kind]
    if kind == "chat":
        rows = (DATA / "chat" / "oasst" / "en_100_top_threads.messages.jsonl").read_text().splitlines()[:6]
        (tmp_path / "d.jsonl").write_text("\n".join(rows) + "\n")
        source: dict[str, Any] = {"path": str(tmp_path / "d.jsonl"), "text": None}
    else:
        docs = [{"text": f"Sentence {i} about the river.\nAnother line {i} on stone.", "label": ["x", "y"][i % 2]}
                for i in range(12)]
        (tmp_path / "d.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        source = {"path": str(tmp_path / "d.jsonl")}
    spec = {"sources": [source], "tokenizer": str(TOKENIZERS / tok), "task": task, "seed": 3,
            "batching": {"strategy": "pad", "batch_size": 4, "remainder": "keep"}}
    want, got = both_engines(spec)
    assert want
    assert_batches_equal(want, got, where=f"{kind} ray vs local")


# ------------------------------------------------------------------ resume
@needs_data
def test_resume_is_exact(ray_session: Any, corpus: dict[str, list[str]]) -> None:
    assert assert_resumes_exactly(spec_for(corpus, engine=RAY), every=9, check=2) >= 3


@needs_data
def test_states_carry_across_engines(ray_session: Any, corpus: dict[str, list[str]]) -> None:
    """The engine is not part of the spec hash: a local state resumes on Ray and vice versa."""
    spec = spec_for(corpus)
    ref = Loader(spec)
    batches, states = collect(ref, with_states=True)
    ref.close()
    for at, src, dst in ((11, "local", RAY), (23, RAY, "local")):
        saver = Loader({**spec, "parallel": {"map": src}})
        collect(saver, limit=at)
        state = saver.state_dict()
        saver.close()
        assert state["pipeline"] == states[at - 1]["pipeline"]
        resumed = Loader({**spec, "parallel": {"map": dst}}, state=state)
        assert_batches_equal(batches[at:], collect(resumed), where=f"{src} -> {dst} at step {at}")
        resumed.close()


# ------------------------------------------------------------------ the service with a Ray engine
@needs_data
def test_service_with_a_ray_engine_serves_the_local_batches(ray_session: Any, corpus: dict[str, list[str]]) -> None:
    """A server whose pipeline runs on Ray: two ranks over ZeroMQ reassemble the local stream."""
    pytest.importorskip("zmq")
    from feedline._batching.planner import slice_for_rank
    from feedline._service.server import Server, ServerOptions

    spec = spec_for(corpus, epochs=1)
    want = collect(Loader(spec))
    server = Server({"train": Pipeline({**spec, "parallel": {"map": RAY}})},
                    ServerOptions(bind="tcp://127.0.0.1:0", heartbeat=0.2, timeout=5.0, drain_timeout=1.0))
    address = server.bind()
    thread = threading.Thread(target=server.serve, name="ray-test-server", daemon=True)
    thread.start()
    try:
        clients = [Loader(address, rank=r, world_size=2) for r in range(2)]
        its = [iter(c) for c in clients]
        got: list[list[Any]] = [[], []]
        for _ in want:
            for r in range(2):
                got[r].append(next(its[r]))
        for r in range(2):
            assert_batches_equal([slice_for_rank(b, r, 2) for b in want], got[r], where=f"rank {r} via the service")
            clients[r].close()
    finally:
        server.stop()
        thread.join(timeout=10)


# ------------------------------------------------------------------ failures
class DieOnce(CausalLM):
    """clm that SIGKILLs its own worker process the first time it sees ``victim``'s record.

    With ``marker`` empty it dies every time.
    """

    victim: tuple[int, int, int]
    marker: str = ""

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        if any(r.key == self.victim for r in records) and not (self.marker and os.path.exists(self.marker)):
            if self.marker:
                Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().process(records)


class RejectSome(CausalLM):
    """clm that rejects records whose text mentions 'river' (to check the accounting)."""

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        out = super().process(records)
        return [Rejection("x", None, "river") if "river" in r.data["text"] else o for r, o in zip(records, out)]


class Broken(CausalLM):
    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        raise TaskError("broken task: refuses every chunk")


def task_of(cls: type[CausalLM], pipeline: Pipeline) -> CausalLM:
    return cls(pipeline.task.options, pipeline.task.ctx)


def examples_of(it: Iterator[Example]) -> list[tuple[Any, ...]]:
    return [(e.key, e.epoch, e.sub, e.fields["input_ids"].tobytes()) for e in it]


@needs_data
def test_killed_worker_is_retried_without_loss_or_duplicates(ray_session: Any, corpus: dict[str, list[str]],
                                                             tmp_path: Path) -> None:
    p = Pipeline(spec_for(corpus))
    want = examples_of(iter(TaskMap(p.records(), p.task, chunk=32)))
    task = task_of(DieOnce, p)
    task.victim = want[len(want) // 2][0]   # a record in the middle of the stream
    task.marker = str(tmp_path / "killed")
    got = examples_of(iter(RayTaskMap(p.records(), task, ParallelSpec(map="ray"), chunk=32)))
    assert Path(task.marker).exists(), "the worker was never killed; the test did not test anything"
    assert int(Path(task.marker).read_text()) != os.getpid()
    assert got == want


@needs_data
def test_worker_lost_too_often_fails_clearly(ray_session: Any, corpus: dict[str, list[str]]) -> None:
    p = Pipeline(spec_for(corpus))
    task = task_of(DieOnce, p)
    task.victim = next(iter(p.records())).key   # no marker: every attempt dies
    with pytest.raises(TaskError, match="lost 2 times"):
        list(RayTaskMap(p.records(), task, ParallelSpec(map="ray"), retries=1))


@needs_data
def test_rejections_and_states_match_the_local_engine(ray_session: Any, corpus: dict[str, list[str]]) -> None:
    p = Pipeline(spec_for(corpus))
    task = task_of(RejectSome, p)
    local, remote = iter(TaskMap(p.records(), task, chunk=40)), iter(RayTaskMap(p.records(), task, chunk=40))
    n = 0
    for a, b in zip(local, remote, strict=True):
        assert (a.key, a.sub) == (b.key, b.sub)
        assert local.get_state() == remote.get_state()
        n += 1
    assert n > 100 and local.rejected == remote.rejected and remote.rejected["river"] > 10
    strict = RayTaskMap(p.records(), task, on_error="raise")
    with pytest.raises(RecordError, match="river"):
        list(strict)


@needs_data
def test_task_errors_reach_the_driver_as_themselves(ray_session: Any, corpus: dict[str, list[str]]) -> None:
    p = Pipeline(spec_for(corpus))
    with pytest.raises(TaskError, match="refuses every chunk"):
        next(iter(RayTaskMap(p.records(), task_of(Broken, p))))


def test_without_ray_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch, corpus: dict[str, list[str]]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    loader = Loader(spec_for(corpus, engine=RAY, tokenizer=None, task={"kind": "clm"}))
    with pytest.raises(MissingDependency, match=r"pip install 'feedline\[ray\]'"):
        collect(loader)
    loader.close()

