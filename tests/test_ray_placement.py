"""The ray placement on a real multi-node local cluster: the batches and states of threads and
processes, exact resume, and exact recovery when a node dies."""

from __future__ import annotations

from typing import Any

import pytest

from feedline import Loader
from feedline.testing import assert_batches_equal, collect, make_corpus
from heavy import lazy, needs

ray = lazy("ray")

# one xdist worker runs every Ray test (clusters on one machine find each other), after the others
pytestmark = [needs("ray"), pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any) -> Any:
    """The session's local cluster (conftest.py): a head node and a worker node, one CPU each."""
    return ray_cluster


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("ray-placement")
    make_corpus(root / "c", files=2, docs=40)
    return str(root / "c")


def spec(corpus: str, tok: str, placement: str, **kw: Any) -> dict[str, Any]:
    return {"sources": [corpus], "tokenizer": tok, "task": {"kind": "clm", "max_length": 48}, "shuffle": {"buffer": 16},
            "batching": {"strategy": "pack", "batch_size": 6, "window": 16, "first_window": 4}, "partitions": 3,
            "parallel": {"placement": placement, "num_cpus": 0.25, "prefetch": 2, "processes": 2}, **kw}


def placement_of(loader: Any) -> Any:
    stage = loader._stage
    return stage._parent.parent.parent.runner


def test_ray_actors_give_the_batches_and_states_of_threads_and_processes(cluster: Any, corpus: str,
                                                                        small_tokenizer: str) -> None:
    runs = {p: collect(Loader(spec(corpus, small_tokenizer, p)), with_states=True)
            for p in ("threads", "processes", "ray")}
    assert len(runs["threads"][0]) > 8
    for p in ("processes", "ray"):
        assert_batches_equal(runs["threads"][0], runs[p][0], f"threads vs {p}")
        assert runs["threads"][1] == runs[p][1]


def test_ray_placement_resumes_exactly(cluster: Any, corpus: str, small_tokenizer: str) -> None:
    """Ray resumes the threads placement's states (the test above shows they are ray's own states):
    mid-stream, and in the tail with rows carried from an ended round, rebuilt by a short-lived actor."""
    want, states = collect(Loader(spec(corpus, small_tokenizer, "threads")), with_states=True)
    carried = next(i for i, st in enumerate(states) if st["pipeline"]["carry"]) + 1
    assert len(want) > 10
    for at in (8, carried):
        loader = Loader(spec(corpus, small_tokenizer, "ray"), state=states[at - 1])
        got = collect(loader, limit=2)
        loader.close()
        assert_batches_equal(want[at:at + 2], got, f"ray resumed at step {at}" + (", with carried rows" if at == carried else ""))


def test_a_lost_node_is_recovered_exactly(cluster: Any, corpus: str, small_tokenizer: str) -> None:
    c = cluster
    want = collect(Loader(spec(corpus, small_tokenizer, "threads")))
    loader = Loader(spec(corpus, small_tokenizer, "ray"))
    got = [dict(next(loader)) for _ in range(3)]
    placement = placement_of(loader)
    on = placement.nodes()
    assert len(set(on)) >= 2   # spread over the cluster; the driver only composes
    victim = next(n for n in c.worker_nodes if n.node_id in on)   # a worker node holding a partition's actor
    c.remove_node(victim)
    try:
        got += collect(loader)
        loader.close()
    finally:
        c.add_node(num_cpus=1)   # the session's cluster keeps its two nodes for the tests after this one
        c.wait_for_nodes()
    assert sum(placement.restarts) >= 1
    assert_batches_equal(want, got, "after a lost node")



def test_one_partition_on_ray_is_the_plain_loader_bit_for_bit(cluster: Any, corpus: str, small_tokenizer: str) -> None:
    """``partitions: 1`` with ``placement: ray`` runs the one pipeline in an actor: the plain
    loader's batches and states, and either resumes the other's state."""
    on_ray = spec(corpus, small_tokenizer, "ray", partitions=1)
    plain = {k: v for k, v in on_ray.items() if k not in ("partitions", "parallel")}
    want, states = collect(Loader(plain), with_states=True)
    loader = Loader(on_ray)
    got, got_states = collect(loader, with_states=True)
    assert len(want) > 8 and type(placement_of(loader)).__name__ == "RayPlacement"
    assert_batches_equal(want, got, "K = 1: plain vs ray")
    assert states == got_states
    assert_batches_equal(want[4:], collect(Loader(on_ray, state=states[3])), "ray resumed from a plain state")
    assert_batches_equal(want[4:], collect(Loader(plain, state=got_states[3])), "plain resumed from a ray state")


def test_an_error_in_an_actor_shows_the_users_frame(cluster: Any, corpus: str, small_tokenizer: str, tmp_path: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The actor's exception is raised in the driver as it was (not Ray's wrapper), with the actor's
    traceback, the user's file, line and function in it, as its cause."""
    import importlib

    from ray import cloudpickle

    from feedline import TransformError

    (tmp_path / "ray_user_maps.py").write_text(
        "def explode(rec):\n    if rec['text'].startswith('Document 1-5:'):\n        return 1 / 0\n    return rec\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("ray_user_maps")
    cloudpickle.register_pickle_by_value(module)   # the actors' workers cannot import it from tmp_path
    try:
        loader = Loader(spec(corpus, small_tokenizer, "ray", transforms=[{"map": module.explode}]))
        with pytest.raises(TransformError, match="raised ZeroDivisionError") as got:
            collect(loader)
        loader.close()
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    cause = got.value.__cause__
    assert type(cause).__name__ == "RemoteTraceback", repr(cause)
    assert f'File "{tmp_path / "ray_user_maps.py"}", line 3, in explode' in str(cause), str(cause)


def test_an_actor_stream_resumes_alone_like_a_thread_stage(cluster: Any, corpus: str, small_tokenizer: str) -> None:
    """Partition 1 as an actor stream (issue 34 item 1): resumed from any of its states, the
    batches and states of the same partition on a thread here."""
    from feedline import Spec
    from feedline._partitions.placement import ThreadPlacement
    from feedline._pipeline import PartitionStreams
    from feedline._ray.placement import ActorStream, RayPlacement
    from feedline.testing import assert_stage_resumes

    s = Spec.load(spec(corpus, small_tokenizer, "ray"))
    ray_placement = RayPlacement(PartitionStreams(s), 3, s.parallel)
    try:
        assert isinstance(ray_placement.open(1, None), ActorStream)
        assert assert_stage_resumes(lambda: ray_placement.open(1, None), check=2, every=4) >= 2
        here = ThreadPlacement(PartitionStreams(s), 3, s.parallel).open(1, None)
        want = [(b, dict(st)) for b, st in here]
        got = list(ray_placement.open(1, None))
        assert_batches_equal([b for b, _ in want], [b for b, _ in got], "partition 1: thread vs actor")
        assert [st for _, st in want] == [st for _, st in got]
    finally:
        ray_placement.close()
