"""Partitions: dealing splits, the composing stage, its state and exact resume (threads placement).

Placement tests (processes, Ray) are in tests/test_placements.py; both compare against the
threads placement, which these tests check against the rule in feedline/_partitions/compose.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedline import Loader, SourceError, Spec, StateError
from feedline._pipeline import GlobalStream, Pipeline
from feedline._sources.deal import deal, partition_seed
from feedline._sources.reader import Split
from feedline.testing import assert_batches_equal, assert_resumes_exactly, assert_stage_resumes, collect, make_corpus


def spec(corpus: str, tok: str, k: int, **kw: Any) -> dict[str, Any]:
    return {"sources": [corpus], "tokenizer": tok, "task": {"kind": "clm", "max_length": 48},
            "batching": {"strategy": "pack", "batch_size": 5, "window": 16, "first_window": 4},
            "partitions": k, "parallel": "threads", **kw}


# ----------------------------------------------------------------------- dealing
def test_one_cuttable_split_feeds_every_partition_in_equal_pieces() -> None:
    parts = deal([Split(0, "a", 0, 100, 100)], [(0, 100)], 3)
    assert [[(s.start, s.end) for s in p] for p in parts] == [[(0, 33)], [(33, 66)], [(66, 100)]]
    # several splits laid end to end: only the splits under a cut point are cut
    parts = deal([Split(0, "a", 0, 60), Split(1, "b", 0, 40)], [(0, 60), (0, 40)], 2)
    assert [[(s.file, s.start, s.end) for s in p] for p in parts] == [[(0, 0, 50)], [(0, 50, 60), (1, 0, 40)]]


def test_splits_that_cannot_be_cut_are_dealt_whole_round_robin() -> None:
    splits = [Split(i, f"f{i}") for i in range(5)]
    assert [[s.file for s in p] for p in deal(splits, [None] * 5, 2)] == [[0, 2, 4], [1, 3]]
    # one split without an extent: the whole source is dealt whole, whatever the others' extents
    mixed = deal(splits, [(0, 900), None, (0, 10), (0, 10), (0, 10)], 2)
    assert [[s.file for s in p] for p in mixed] == [[0, 2, 4], [1, 3]] and all(s.end is None for p in mixed for s in p)
    assert [[s.file for s in p] for p in deal(splits, [(0, 0)] * 5, 3)] == [[0, 3], [1, 4], [2]]  # empty extents
    assert deal(splits[:1], [None], 3) == [[splits[0]], [], []]
    assert deal(splits, [None] * 5, 1) == [splits]
    assert partition_seed(7, 0, 1) == 7 and partition_seed(7, 0, 2) != partition_seed(7, 1, 2)


def _keys(pipeline: Pipeline) -> list[tuple[int, int, int]]:
    it = iter(pipeline.records())
    try:
        return [tuple(r.key) for r in it]  # type: ignore[misc]
    finally:
        it.close()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_single_file_is_shared_by_every_partition_exactly_once(tmp_path: Path, small_tokenizer: str, fmt: str) -> None:
    path = make_corpus(tmp_path, files=1, docs=90)[0]
    if fmt == "parquet":  # one row group: cut in row ranges
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        path = str(tmp_path / "one.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000)
    s = Spec.load(spec(path, small_tokenizer, 3))
    whole = _keys(Pipeline(s.replace(partitions=1)))
    shares = [_keys(Pipeline(s, partition=p)) for p in range(3)]
    assert all(25 <= len(x) <= 35 for x in shares), [len(x) for x in shares]
    assert sorted(k for x in shares for k in x) == sorted(whole) and len(whole) == 90


def _records(pipeline: Pipeline) -> list[tuple[tuple[int, int, int], str]]:
    it = iter(pipeline.records())
    try:
        return [(tuple(r.key), r.data["text"]) for r in it]  # type: ignore[misc]
    finally:
        it.close()


def test_a_partition_without_a_share_of_a_small_gzip_source_is_not_an_error(tmp_path: Path, small_tokenizer: str) -> None:
    """The gzip file (one split, not cut) goes whole to partition 0; partition 1 reads only its share
    of the plain file; together they read every record of K=1 once, key and text alike."""
    gz = make_corpus(tmp_path / "gz", files=1, docs=30, fmt="jsonl.gz")[0]
    plain = make_corpus(tmp_path / "plain", files=1, docs=30, seed=1)[0]
    s = Spec.load({**spec(plain, small_tokenizer, 2), "sources": [gz, plain]})
    whole = _records(Pipeline(s.replace(partitions=1)))
    shares = [_records(Pipeline(s, partition=p)) for p in range(2)]
    assert len(whole) == 60 and len({k for k, _ in whole}) == 60
    assert sorted(shares[0] + shares[1]) == sorted(whole)  # no record lost, none read twice, same texts
    assert {k[0] for k, _ in shares[1]} == {1} and sum(k[0] == 0 for k, _ in shares[0]) == 30
    assert all(shares)  # both partitions have records: partition 1 from the plain file alone
    batches = collect(Loader(s))
    assert len(batches) > 5


# ----------------------------------------------------------------------- the stream
def test_one_partition_is_the_stream_without_partitions(corpus: str, small_tokenizer: str) -> None:
    plain = {k: v for k, v in spec(corpus, small_tokenizer, 1).items() if k not in ("partitions", "parallel")}
    assert Spec.load(plain).hash() == Spec.load(spec(corpus, small_tokenizer, 1)).hash()
    a, sa = collect(Loader(plain), with_states=True)
    b, sb = collect(Loader(spec(corpus, small_tokenizer, 1)), with_states=True)
    assert_batches_equal(a, b, "K=1")
    assert sa == sb and "partitions" not in json.dumps(sb[0])


@pytest.mark.parametrize("k", [2, 3])
def test_partitions_take_turns_making_whole_steps_and_only_the_last_is_short(
        corpus: str, small_tokenizer: str, k: int) -> None:
    """Step s is partition (s - 1) % K's batch as it made it; after a partition's short last batch
    the rows go on in turn (steps straddle two partitions' batches), so every row of every
    partition comes once and only the stream's last step is short (dropped: remainder drop)."""
    s = Spec.load(spec(corpus, small_tokenizer, k, epochs=1, batching={"strategy": "pad", "batch_size": 5}))
    got = collect(Loader(s))
    parts = [collect(GlobalStreamRows(Pipeline(s, partition=p))) for p in range(k)]
    assert all(len(b["input_ids"]) == 5 for p in parts for b in p[:-1])  # whole batches, not 5 / K rows
    full = min(len(p) - 1 for p in parts)  # rounds in which every partition gives a full batch
    for i in range(full * k):
        assert_batches_equal([parts[i % k][i // k]], [got[i]], f"K={k}, step {i + 1}")
    # the global row stream: every partition's batches in turn, an ended partition losing its turns
    order: list[np.ndarray] = []
    for r in range(max(len(p) for p in parts)):
        order += [row for p in parts if r < len(p) for row in p[r]["input_ids"]]
    flat = [row for b in got for row in b["input_ids"]]
    assert len(got) == len(order) // 5 and all(len(b["input_ids"]) == 5 for b in got)
    assert all(np.array_equal(a[a != 0], b[b != 0]) for a, b in zip(flat, order, strict=False))


def test_a_partition_asked_first_makes_step_one_alone(corpus: str, small_tokenizer: str) -> None:
    """Partition 0 is the only one opened before step 1 (the first step waits for one pipeline,
    not K built and sharing the cores); the others start at the next ask. The composing stage
    says this once, for every placement (here threads: a Prefetch per partition)."""
    from feedline._core.prefetch import Prefetch

    s = Spec.load(spec(corpus, small_tokenizer, 3))
    it = iter(Pipeline(s).batches())
    try:
        first = next(it)
        assert it.stages[0] is not None and it.stages[1:] == [None, None]
        next(it)
        assert all(isinstance(st, Prefetch) and st._thread is not None for st in it.stages)
        want = collect(GlobalStreamRows(Pipeline(s, partition=0)))[0]
        assert_batches_equal([want], [first], "partition 0's first batch")
    finally:
        it.close()


class GlobalStreamRows:
    """A partition's batches as an iterable (for the test above)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.it = iter(pipeline.batches())

    def __iter__(self) -> Any:
        return self.it


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.slow
def test_the_composing_stage_resumes_exactly_from_every_state(corpus: str, small_tokenizer: str, k: int) -> None:
    s = Spec.load(spec(corpus, small_tokenizer, k, epochs=1))
    stage = Pipeline(s).batches()   # the composing stage, through its partitions' tails (carried rows)
    assert type(stage).__name__ == "Composed"
    assert assert_stage_resumes(stage, check=3, every=3) > 3


@pytest.mark.parametrize("k", [2, 3])
def test_a_consumer_that_lays_batches_out_gets_them_compact_with_the_same_rows_and_states(
        corpus: str, small_tokenizer: str, k: int) -> None:
    """``next_compact`` (the service's producer) has the partitions send compact ``pack`` batches:
    laid out, the same rows as ``next``, the same states, from any state (the tail's carried rows
    included, replayed compact)."""
    from feedline._batching.compact import CompactBatch
    from feedline._core.deferred import materialize

    s = Spec.load(spec(corpus, small_tokenizer, k, epochs=1))
    stage = Pipeline(s).batches()
    it = iter(stage)
    want, states = [], [json.loads(json.dumps(it.get_state()))]
    for b in it:
        want.append(b)
        states.append(json.loads(json.dumps(it.get_state())))
    it.close()
    assert k != 2 or any(st["carry"] for st in states), "no state carries rows: the replay path is not covered"
    for at in sorted({0, 1, len(want) // 2, *(i for i, st in enumerate(states[:-1]) if st["carry"])}):
        it = iter(stage)
        it.set_state(states[at])
        for i in range(at, min(at + 3, len(want))):
            got = it.next_compact()
            assert isinstance(got, CompactBatch) or len(next(iter(got.values()))) < 5
            laid = got.expand() if isinstance(got, CompactBatch) else got
            assert_batches_equal([want[i]], [laid], f"K={k}, step {i + 1} after a restore at {at}")
            assert json.loads(json.dumps(materialize(it.snapshot()))) == states[i + 1]
        it.close()


@pytest.mark.slow
def test_a_loader_resumes_exactly_with_partitions(corpus: str, small_tokenizer: str) -> None:
    assert assert_resumes_exactly(spec(corpus, small_tokenizer, 3, shuffle={"buffer": 20}), every=4) > 3


def test_elastic_resume_over_ranks_with_partitions(corpus: str, small_tokenizer: str) -> None:
    s = spec(corpus, small_tokenizer, 2, batching={"strategy": "pack", "batch_size": 4, "window": 16})
    whole = collect(Loader(s))
    ranks = [Loader(s, r, 2) for r in range(2)]
    for _ in range(3):
        for r in ranks:
            next(r)
    state = ranks[1].state_dict()
    rest = collect(Loader(s, 0, 1, state=state))
    assert_batches_equal(whole[3:], rest, "elastic 2 -> 1")
    for r in ranks:
        r.close()


def test_a_state_of_another_number_of_partitions_is_refused(corpus: str, small_tokenizer: str) -> None:
    loader = Loader(spec(corpus, small_tokenizer, 2))
    next(loader)
    state = loader.state_dict()
    loader.close()
    with pytest.raises(StateError, match="partitions: 2 but this spec has partitions: 3"):
        Loader(spec(corpus, small_tokenizer, 3), state=state)
    with pytest.raises(StateError, match="partitions: 2 but this spec has partitions: 1"):
        Loader(spec(corpus, small_tokenizer, 1), state=state)
    it = iter(Pipeline(Spec.load(spec(corpus, small_tokenizer, 3))).batches())
    with pytest.raises(StateError, match="holds 2 partition states but the spec has partitions: 3"):
        it.set_state(state["pipeline"]["pipeline"] if "pipeline" in state["pipeline"] else state["pipeline"])
    it.close()


def test_more_partitions_than_rows_a_step_is_fine_and_a_bad_placement_is_named(corpus: str, small_tokenizer: str) -> None:
    from feedline import SpecError

    got = collect(Loader(spec(corpus, small_tokenizer, 6, batching={"strategy": "pad", "batch_size": 2})))
    assert len(got) > 6 and all(len(b["input_ids"]) == 2 for b in got)
    with pytest.raises(SpecError, match="parallel.placement"):
        Spec.load(spec(corpus, small_tokenizer, 2, parallel="gpu"))


def test_a_state_from_before_partitions_took_turns_is_refused_with_what_to_do(corpus: str, small_tokenizer: str) -> None:
    loader = Loader(spec(corpus, small_tokenizer, 2))
    next(loader)
    state = loader.state_dict()
    loader.close()
    old = json.loads(json.dumps(state))
    del old["pipeline"]["turn"]   # the composed state as the row-dealing composition wrote it
    with pytest.raises(StateError, match="batch_size / K rows of each partition.*start this run from its beginning"):
        Loader(spec(corpus, small_tokenizer, 2), state=old)


def test_global_stream_state_nests_the_partitions(corpus: str, small_tokenizer: str) -> None:
    it = iter(GlobalStream(Pipeline(spec(corpus, small_tokenizer, 2))))
    next(it)
    st = it.get_state()
    it.close()
    assert sorted(st["pipeline"]) == ["carry", "ended", "partitions", "turn"] and len(st["pipeline"]["partitions"]) == 2


def test_stats_sum_the_partitions_mixtures(tmp_path: Path, small_tokenizer: str) -> None:
    a = make_corpus(tmp_path / "a", files=1, docs=30)[0]
    b = make_corpus(tmp_path / "b", files=1, docs=10, seed=1)[0]
    loader = Loader({**spec(a, small_tokenizer, 2), "sources": [a, b]})
    collect(loader)
    stats = loader.stats()
    parts = loader.state_dict()["pipeline"]["partitions"]
    counts = [0, 0]
    for p in parts:
        while "counts" not in p:   # batcher -> task map -> ... -> mixture
            p = p["parent"]
        counts = [c + d for c, d in zip(counts, p["counts"], strict=True)]
    assert counts[1] > 0 and stats["mixture"] == [round(c / sum(counts), 4) for c in counts]


@pytest.mark.parametrize("placement", ["threads", "processes"])
@pytest.mark.slow
def test_stats_count_the_rejections_of_every_partition_to_the_end(tmp_path: Path, small_tokenizer: str,
                                                                  placement: str) -> None:
    """A partition's rejections after its last batch, or in a share that gave no batch at all, are
    counted once it has ended (its state at the end replaces its last batch's): at the end of the
    stream, stats() give K = 1's counts. The states stay exact: the stream resumes from each."""
    bad = "{not json " + "x" * 90 + "}"   # the first and the last third of the bytes: bad lines only
    lines = [bad] * 10 + [json.dumps({"text": f"good line number {i} with some words"}) for i in range(9)] + [bad] * 10
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    base = {**spec(str(path), small_tokenizer, 3, epochs=1, batching={"strategy": "pad", "batch_size": 2, "remainder": "keep"}),
            "parallel": {"placement": placement, "warm_start": False}}
    plain = Loader({k: v for k, v in base.items() if k not in ("partitions", "parallel")})
    collect(plain)
    assert plain.stats()["rejected"] == {"bad_json": 20}
    loader = Loader(base)
    got, states = collect(loader, with_states=True)
    assert sum(len(b["input_ids"]) for b in got) == 9
    assert loader.stats()["rejected"] == {"bad_json": 20}   # two shares gave no batch
    for i in (0, len(states) // 2, len(states) - 1):
        assert_batches_equal(got[i + 1:], collect(Loader(base, state=states[i])), f"resumed after step {i + 1}")


@pytest.mark.parametrize("placement", ["threads", "processes"])
@pytest.mark.slow
def test_a_partition_with_nothing_to_read_ends_and_an_empty_stream_is_an_error(tmp_path: Path, small_tokenizer: str,
                                                                               placement: str) -> None:
    """Three short lines over three partitions: a share may hold no line start (or only a bad line);
    that partition just ends and the others deliver every record (it once failed the stream with
    'no record'). With nothing anywhere, the composing stage says so, naming every partition."""
    from feedline import SourceError

    small = tmp_path / "small.jsonl"
    small.write_text('{"text": "one short line of text"}\n{"text": "two"}\n{not json}\n{"text": "four words here now"}\n')
    s = {**spec(str(small), small_tokenizer, 3, epochs=1, batching={"strategy": "pad", "batch_size": 2, "remainder": "keep"}),
         "parallel": {"placement": placement, "warm_start": False}}
    got = collect(Loader(s))
    assert sum(len(b["input_ids"]) for b in got) == 3
    plain = collect(Loader({k: v for k, v in s.items() if k not in ("partitions", "parallel")}))
    assert sorted(r[r != 0].tolist() for b in got for r in b["input_ids"]) == \
        sorted(r[r != 0].tolist() for b in plain for r in b["input_ids"])
    # a share holding one bad line only (the first half of the file), the other a good line
    small.write_text("{not json " + "x" * 90 + "}\n" + '{"text": "a good line"}\n')
    assert sum(len(b["input_ids"]) for b in collect(Loader({**s, "partitions": 2}))) == 1
    for body in ("", "{not json}\n"):
        small.write_text(body)
        with pytest.raises(SourceError, match="delivered no record to any of its 3 partitions.*check the path and format"):
            collect(Loader(s))


@pytest.mark.parametrize("placement", ["threads", "processes"])
@pytest.mark.slow
def test_a_resume_after_a_file_shrank_is_refused_rather_than_repeating_records(tmp_path: Path, small_tokenizer: str,
                                                                               placement: str) -> None:
    """The files are cut into K shares by size: a shrunk file moves the cuts, and partition 1, resumed
    on its new share, would read again records partition 0 had delivered (1,400 records twice in the
    report). Each partition's state names its share, so the resume says the files changed instead."""
    files = make_corpus(tmp_path / "c", files=3, docs=60)
    parallel = {"placement": placement, "prefetch": 2, **({"warm_start": False} if placement == "processes" else {})}
    s = {**spec(str(tmp_path / "c"), small_tokenizer, 2), "parallel": parallel}
    loader = Loader(s)
    for _ in range(6):
        next(loader)
    state = loader.state_dict()
    loader.close()
    assert_batches_equal(collect(Loader(s), limit=12)[6:], collect(Loader(s, state=state), limit=6), "unchanged files")
    text = Path(files[0]).read_text().splitlines(keepends=True)
    Path(files[0]).write_text("".join(text[:len(text) // 3]))   # the first file loses two thirds of its records
    resumed = Loader(s, state=state)
    with pytest.raises(SourceError, match=r"partition [01] of 2 cannot resume: its files changed since the state"):
        next(resumed)
    resumed.close()
