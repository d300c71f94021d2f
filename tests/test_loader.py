"""The in-process loader: determinism, exact resume, conservation of tokens, rank slices."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import feedline
from conftest import shared
from feedline import Loader, SpecError, StateError
from feedline.testing import assert_batches_equal, assert_resumes_exactly, collect, make_corpus


def spec_for(corpus: str, tokenizer: str, **over: object) -> dict:
    spec = {"sources": [corpus], "tokenizer": tokenizer, "seed": 7, "shuffle": {"buffer": 32},
            "task": {"kind": "clm", "max_length": 48}, "batching": {"strategy": "pad", "batch_size": 4}}
    spec.update(over)
    return spec


def test_same_spec_and_seed_give_identical_batches(corpus: str, small_tokenizer: str) -> None:
    spec = spec_for(corpus, small_tokenizer)
    a, b = collect(Loader(spec)), collect(Loader({**spec, "workers": 1, "prefetch": 1}))
    assert len(a) > 10
    assert_batches_equal(a, b)
    c = collect(Loader({**spec, "seed": 8}))
    assert any(not np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, c))


@pytest.mark.slow
def test_resume_is_exact_across_epochs_with_shuffle(corpus: str, small_tokenizer: str) -> None:
    spec = spec_for(corpus, small_tokenizer, epochs=2)
    assert assert_resumes_exactly(spec, every=3) >= 8


@pytest.mark.slow
def test_resume_of_another_rank_and_world_size(corpus: str, small_tokenizer: str) -> None:
    spec = spec_for(corpus, small_tokenizer, batching={"strategy": "pad", "batch_size": 4})
    assert_resumes_exactly(spec, rank=1, world_size=2, every=4)
    # Elastic: a state saved under W=2 resumes the same global stream under W=4.
    full = collect(Loader(spec))
    half = Loader(spec, rank=0, world_size=2)
    for _ in range(3):
        next(iter(half))
    state = half.state_dict()
    half.close()
    slices = [collect(Loader(spec, rank=r, world_size=4, state=state)) for r in range(4)]
    for step, global_batch in enumerate(full[3:]):
        got = np.concatenate([s[step]["input_ids"] for s in slices])
        assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, global_batch["input_ids"].tolist()))


def test_ranks_reassemble_the_global_batch_with_balanced_tokens(corpus: str, small_tokenizer: str) -> None:
    spec = spec_for(corpus, small_tokenizer, batching={"strategy": "pad", "batch_size": 8})
    full = collect(Loader(spec))
    ranks = [collect(Loader(spec, rank=r, world_size=4)) for r in range(4)]
    assert all(len(r) == len(full) for r in ranks)  # equal steps per rank
    for step, g in enumerate(full):
        rows = [rank[step] for rank in ranks]
        assert all(r["input_ids"].shape[0] == 2 for r in rows)
        got = sorted(tuple(x) for r in rows for x in r["input_ids"].tolist())
        assert got == sorted(tuple(x) for x in g["input_ids"].tolist())
        loads = [int(r["attention_mask"].sum()) for r in rows]
        assert max(loads) - min(loads) <= int(g["attention_mask"].sum(axis=1).max())


def test_tokens_delivered_equal_the_tokenizers_output(tmp_path: Path) -> None:
    """Nothing lost, nothing invented: an epoch's real tokens are each document's encoding plus EOS."""
    tok_dir = shared("tokenizers", "gpt2")
    tok = feedline.load_tokenizer(str(tok_dir))
    make_corpus(tmp_path / "c", files=2, docs=30, fmt="jsonl.gz", max_words=200)
    spec = spec_for(str(tmp_path / "c"), str(tok_dir), shuffle=None,
                    batching={"strategy": "pad", "batch_size": 3, "remainder": "pad"})
    got = []
    for b in Loader(spec):
        for ids, mask in zip(b["input_ids"], b["attention_mask"]):
            got.extend(ids[mask.astype(bool)].tolist())
    texts = [r["text"] for r in feedline.records({"sources": [str(tmp_path / "c")]})]
    want = [t for text in texts for t in [*tok.encode(text).tolist(), tok.eos_id]]
    assert got == want


def test_real_prose_streams_and_resumes() -> None:
    c4 = shared("prose", "c4_demo.jsonl")
    spec = spec_for(str(c4), str(shared("tokenizers", "bert-base-uncased")), batching={"strategy": "pad", "batch_size": 8},
                    task={"kind": "clm", "max_length": 128})
    batches = collect(Loader(spec), limit=5)
    assert batches[0]["input_ids"].shape[0] == 8 and batches[0]["input_ids"].dtype == np.int32
    assert assert_resumes_exactly(spec, limit=12, every=4) >= 3


def test_state_is_json_versioned_and_checked(corpus: str, small_tokenizer: str) -> None:
    spec = spec_for(corpus, small_tokenizer)
    loader = Loader(spec)
    next(iter(loader))
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    assert state["version"] == 1 and state["step"] == 1
    with pytest.raises(StateError, match="saved under spec"):
        Loader({**spec, "seed": 99}, state=state)
    with pytest.raises(StateError, match="version 99"):
        Loader(spec, state={**state, "version": 99})
    with pytest.raises(StateError, match="not valid JSON"):
        Loader(spec, state="{oops")


def test_remainder_rules(corpus: str, small_tokenizer: str) -> None:
    n_docs = 120
    spec = spec_for(corpus, small_tokenizer, shuffle=None, task={"kind": "clm", "max_length": 1000})
    dropped = collect(Loader({**spec, "batching": {"strategy": "pad", "batch_size": 7, "remainder": "drop"}}))
    padded = collect(Loader({**spec, "batching": {"strategy": "pad", "batch_size": 7, "remainder": "pad"}}))
    assert len(dropped) == n_docs // 7 and len(padded) == -(-n_docs // 7)
    last = padded[-1]
    assert last["input_ids"].shape[0] == 7
    assert (last["attention_mask"][n_docs % 7:] == 0).all() and (last["labels"][n_docs % 7:] == -100).all()


def test_bad_lines_are_skipped_counted_and_good_ones_kept(tmp_path: Path, small_tokenizer: str) -> None:
    f = tmp_path / "mixed.jsonl"
    f.write_text('{"text": "good one"}\nnot json\n{"body": "no text"}\n{"text": "good two"}\n')
    texts = [r["text"] for r in feedline.records({"sources": [str(f)]})]
    assert texts == ["good one", "good two"]
    with pytest.raises(feedline.RecordError, match=r"mixed.jsonl:2: bad_json"):
        list(feedline.records({"sources": [str(f)], "on_error": "raise"}))


def test_missing_source_is_a_clear_error(tmp_path: Path, small_tokenizer: str) -> None:
    with pytest.raises(feedline.SourceError, match="no such file or directory"):
        collect(Loader(spec_for(str(tmp_path / "nope"), small_tokenizer)))


def test_stats_report_rejections_and_realised_mixture(tmp_path: Path, small_tokenizer: str) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("broken\n" + "".join(f'{{"text": "alpha {i}"}}\n' for i in range(300)))
    b.write_text("".join(f'{{"text": "beta {i}"}}\n' for i in range(300)))
    spec = {"sources": [{"path": str(a), "weight": 3}, {"path": str(b), "weight": 1}], "tokenizer": small_tokenizer,
            "mix": {"stopping": "first_exhausted"}, "task": {"kind": "clm", "max_length": 16},
            "batching": {"strategy": "pad", "batch_size": 10}}
    loader = Loader(spec)
    collect(loader)
    stats = loader.stats()
    # Counts are those of the state: reading runs a chunk (256 records) ahead of it.
    assert stats["rejected"] == {"bad_json": 1}
    assert abs(stats["mixture"][0] - 0.75) < 0.06
    resumed = Loader(spec, state=loader.state_dict())
    assert resumed.stats()["rejected"] == {"bad_json": 1}  # counts live in the state


def test_endless_reading_of_a_source_with_no_good_record_fails_clearly(tmp_path: Path, small_tokenizer: str) -> None:
    f = tmp_path / "chat.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n' * 3)  # no "text" field
    spec = spec_for(str(f), small_tokenizer, epochs=None, shuffle=None)
    with pytest.raises(feedline.SourceError, match=r"delivered no record in a whole epoch \(rejected so far: missing_field: 3\)"):
        collect(Loader(spec), limit=1)


@pytest.mark.parametrize("prefetch", [0, -2, 1.5, True])
def test_a_prefetch_that_is_not_a_positive_integer_is_refused(corpus: str, small_tokenizer: str, prefetch: object) -> None:
    """``prefetch=0`` used to mean the default silently; now every loader names the argument (in-process,
    0 is the synchronous loader: see the next test)."""
    if prefetch != 0:
        with pytest.raises(SpecError, match=r"prefetch=.* must be an integer >= 0"):
            feedline.Loader(spec_for(corpus, small_tokenizer), prefetch=prefetch)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"prefetch=.* must be an integer in \[1, 1024\]"):
        feedline.Loader("tcp://127.0.0.1:9", prefetch=prefetch)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"prefetch=2000 must be an integer in \[1, 1024\]"):
        feedline.Loader("tcp://127.0.0.1:9", prefetch=2000)


def test_prefetch_0_makes_each_batch_in_the_callers_thread_with_the_same_batches_and_states(
        corpus: str, small_tokenizer: str) -> None:
    """``Loader(spec, prefetch=0)``: no thread; the threaded loader's batches and states, and each resumes the other."""
    import threading

    spec = spec_for(corpus, small_tokenizer)
    ref, ref_states = collect(Loader(spec), with_states=True)
    before = set(threading.enumerate())
    with Loader(spec, prefetch=0) as loader:
        got, states = collect(loader, with_states=True)
        assert not [t.name for t in set(threading.enumerate()) - before if t.name.startswith("feedline-loader")]
        assert loader.step == len(ref)
    assert_batches_equal(ref, got)
    assert states == ref_states
    k = len(ref) // 2
    with Loader(spec, state=ref_states[k - 1], prefetch=0) as loader:  # a threaded state, resumed inline ...
        assert_batches_equal(ref[k:], collect(loader))
    with Loader(spec, prefetch=0) as loader:  # ... and an inline state after a close, then threaded
        assert_batches_equal(ref[:2], collect(loader, limit=2))
        loader.close()
        assert_batches_equal(ref[2:4], collect(loader, limit=2))
        mid = loader.state_dict()
    assert_batches_equal(ref[4:], collect(Loader(spec, state=mid)))


def test_a_spec_prefetch_of_0_names_the_value_and_the_in_process_way(tmp_path: Path) -> None:
    """``prefetch: 0`` in a spec is refused, naming the value and pointing to ``Loader(spec, prefetch=0)``
    (which the constructor accepts): the message used to say only "prefetch >= 1" beside workers."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello there"}\n')
    spec = {"sources": [{"path": str(corpus)}], "tokenizer": "gpt2", "task": {"kind": "clm", "max_length": 8},
            "batching": {"batch_size": 1}, "prefetch": 0}
    with pytest.raises(SpecError, match=r"prefetch: 0 must be >= 1 .*Loader\(spec, prefetch=0\)"):
        Loader(spec)
