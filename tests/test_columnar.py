"""The columnar path gives exactly what the per-example path gives.

``clm`` builds a chunk as one :class:`ExampleBlock`, the task map hands blocks on
(``peek_block``/``consume``) and the ``pack`` batcher places pieces as arrays
(:class:`PiecePool`). Each is checked here against a plain reference written with one object per
example or piece (the way these stages worked before), on real text and real tokens.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline._batching.bestfit import BestFitPacker
from feedline._batching.rows import Piece, collate_rows
from feedline._core.block import ExampleBlock
from feedline._core.record import Example, Record
from feedline._pipeline import Pipeline
from feedline._spec import Spec
from feedline._tasks.base import TaskContext
from feedline._tasks.clm import CausalLM, CausalLMOptions
from feedline._tokenize.load import load_tokenizer

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("columnar")


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(str(shared("tokenizers", "gpt2", "tokenizer.json")))


@pytest.fixture(scope="module")
def records() -> list[Record]:
    """Real records: C4 documents (long) and KJV-length prefixes (short), one empty-ish text."""
    lines = shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:60]
    texts = [json.loads(line)["text"] for line in lines]
    texts = [t if i % 3 else t[:120] for i, t in enumerate(texts)] + [" ."]
    return [Record((0, i % 2, 100 * i), i % 3, {"text": t}) for i, t in enumerate(texts)]


def reference_clm(opts: CausalLMOptions, tok: Any, rec: Record) -> list[tuple[tuple[int, ...], list[int]]]:
    """One record's examples, one at a time: framed, cut at max_length (what clm did per record)."""
    ids = tok.encode(rec.data["text"]).tolist()
    b = [tok.special("bos")] if opts.bos else []
    e = [tok.special("eos")] if opts.eos else []
    if opts.frame == "document":
        doc = b + ids + e
        n = opts.max_length or max(len(doc), 1)
        pieces = [doc[i:i + n] for i in range(0, max(len(doc), 1), n)]
    else:
        n = (opts.max_length or len(ids) + len(b) + len(e)) - len(b) - len(e)
        pieces = [b + ids[i:i + n] + e for i in range(0, max(len(ids), 1), max(n, 1))]
    if opts.overflow == "truncate":
        pieces = pieces[:1]
    return [((*rec.key, rec.epoch, j), p) for j, p in enumerate(pieces)]


@pytest.mark.parametrize("kw", [
    {}, {"max_length": 64}, {"max_length": 64, "bos": True, "frame": "piece"}, {"max_length": 5, "eos": False},
    {"max_length": 64, "overflow": "truncate", "bos": True}, {"max_length": None}, {"max_length": 9, "frame": "piece", "bos": True},
])
@pytest.mark.slow
def test_clm_block_equals_per_record_examples(tok: Any, records: list[Record], kw: dict[str, Any]) -> None:
    opts = CausalLMOptions(**kw)
    task = CausalLM(opts, TaskContext(tok, 0))
    block = task.process_block(records)
    assert isinstance(block, ExampleBlock)
    got = [(tuple(int(x) for x in block.refs[i]), block[i].fields["input_ids"].tolist()) for i in range(len(block))]
    want = [ex for rec in records for ex in reference_clm(opts, tok, rec)]
    assert got == want
    outputs = task.process(records)  # the per-record interface, from the block
    assert [len(o) for o in outputs] == [len(reference_clm(opts, tok, r)) for r in records]  # type: ignore[arg-type]
    assert all(np.array_equal(ex.fields["labels"], ex.fields["input_ids"]) for o in outputs for ex in o)  # type: ignore[union-attr]


def test_clm_stored_tokens_checked_as_arrays(tok: Any) -> None:
    ids = [np.arange(5, dtype=np.int32), np.zeros(0, np.int32), np.array([1, 60000], np.int32), np.arange(7, dtype=np.int32)]
    recs = [Record((2, 0, i), 0, {"input_ids": a}) for i, a in enumerate(ids)]
    recs[3].data["labels"] = np.arange(6, dtype=np.int32)  # one label short
    recs.insert(1, Record((0, 0, 9), 1, {"text": "Some text between token records."}))
    task = CausalLM(CausalLMOptions(max_length=3), TaskContext(tok, 0))
    out = task.process(recs)
    assert [o.reason if not isinstance(o, list) else [e.fields["input_ids"].tolist() for e in o] for o in out] == [
        [[0, 1, 2], [3, 4]], [e.fields["input_ids"].tolist() for e in out[1]],  # type: ignore[union-attr]
        "empty_document", "token_out_of_range", "labels_length"]
    block = task.process_block(recs)
    assert [r for r, _rej in block.rejected] == [2, 3, 4] and block.examples_before(2) == len(out[0]) + len(out[1])  # type: ignore[arg-type]
    assert out[3].detail.startswith("ids 1..60000, vocabulary 50257")  # type: ignore[union-attr]


def reference_pack(examples: list[Example], opts: dict[str, Any], pad_values: dict[str, Any], batch_size: int) -> list[dict[str, np.ndarray]]:
    """The pack strategy with a Piece object per piece and collate_rows (the per-piece algorithm)."""
    cap, window, first = opts["max_length"], opts.get("window", 1000), opts.get("first_window", 32)
    packer: BestFitPacker[Piece] = BestFitPacker(cap, window=window, open_bins=opts.get("open_bins", 64), max_items=64)
    it, documents, out, done = iter(examples), 0, [], False
    while not done or packer.ready:
        while len(packer.ready) < batch_size and not done:
            size = min(window, max(first, documents))
            while packer.pending < size:
                ex = next(it, None)
                if ex is None:
                    done = True
                    packer.flush()
                    break
                documents += 1
                starts = range(0, ex.length, cap)[:1 if opts.get("overflow") == "truncate" else None]
                for s in starts:
                    piece = Piece(ex.ref, s, {k: v[s:s + cap] for k, v in ex.fields.items()})
                    packer.add(piece.length, piece)
            else:
                packer.pack()
        if not packer.ready:
            break
        rows = [packer.ready.popleft() for _ in range(min(batch_size, len(packer.ready)))]
        out.append(collate_rows(rows, cap, 64, pad_values, mask_first=True, attention=opts.get("attention", "padding")))
    return out


@pytest.mark.parametrize("opts", [
    {"max_length": 256},
    {"max_length": 64, "window": 50, "first_window": 8, "open_bins": 4},
    {"max_length": 100, "overflow": "truncate", "attention": "block_causal", "window": 30},
])
def test_array_pack_equals_piece_objects(tmp_path: Any, opts: dict[str, Any]) -> None:
    src = tmp_path / "c4.jsonl"
    src.write_text("\n".join(shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:150]) + "\n")
    spec = Spec.load({"sources": [{"path": str(src)}], "tokenizer": str(shared("tokenizers", "gpt2")),
                      "task": {"kind": "clm", "max_length": 300}, "batching": {"strategy": "pack", "batch_size": 4, **opts}})
    pipe = Pipeline(spec)
    ex_it = iter(pipe.examples())
    examples = list(ex_it)
    ex_it.close()
    want = reference_pack(examples, opts, pipe.task.pad_values, 4)
    it = iter(Pipeline(spec).batches())
    got = list(it)
    it.close()
    assert len(got) == len(want) > 5
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in g:
            assert g[k].dtype == w[k].dtype and np.array_equal(g[k], w[k]), k


def test_task_map_blocks_leave_the_state_of_next(tmp_path: Any) -> None:
    """consume(k) after peek_block() leaves the state next() would after k examples, across chunks."""
    src = tmp_path / "c4.jsonl"
    src.write_text("\n".join(shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:40]) + "\n")
    spec = Spec.load({"sources": [{"path": str(src)}], "tokenizer": str(shared("tokenizers", "gpt2")),
                      "task": {"kind": "clm", "max_length": 64}, "batching": {"strategy": "pack", "batch_size": 4}})
    a, b = iter(Pipeline(spec).examples()), iter(Pipeline(spec).examples())
    try:
        for k in (1, 3, 7, 50, 2, 500):
            block = a.peek_block()  # type: ignore[attr-defined]
            if block is None:
                break
            take = min(k, len(block))
            a.consume(take)  # type: ignore[attr-defined]
            refs = [next(b).ref for _ in range(take)]
            assert [tuple(int(x) for x in r) for r in block.refs[:take]] == refs
            assert a.get_state() == b.get_state()
        with pytest.raises(ValueError, match="examples are left"):
            a.consume(10_000)
    finally:
        a.close()
        b.close()


def test_a_subclass_that_overrides_process_is_used_by_the_task_map(tmp_path: Any) -> None:
    """A plug-in deriving from clm and changing process() keeps working: its lists, not clm's block."""
    from feedline._core.record import Rejection
    from feedline._tasks.map import TaskMap

    class NoRiver(CausalLM):
        def process(self, records: Any) -> Any:
            out = super().process(records)
            return [Rejection("x", None, "river") if "river" in r.data["text"] else o for r, o in zip(records, out, strict=True)]

    src = tmp_path / "c4.jsonl"
    src.write_text("\n".join(shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:80]) + "\n")
    spec = Spec.load({"sources": [{"path": str(src)}], "tokenizer": str(shared("tokenizers", "gpt2")),
                      "task": {"kind": "clm", "max_length": 64}, "batching": {"strategy": "pack", "batch_size": 4}})
    pipe = Pipeline(spec)
    it = iter(TaskMap(pipe.records(), NoRiver(pipe.task.options, pipe.task.ctx)))
    keys = {ex.key for ex in it}
    assert it.rejected.get("river", 0) > 0  # type: ignore[attr-defined]
    it.close()
    rec_it = iter(Pipeline(spec).records())
    river = {r.key for r in rec_it if "river" in r.data["text"]}
    rec_it.close()
    assert river and not river & keys and len(keys) > 10


def test_piece_pool_shares_aliased_fields_until_a_block_does_not() -> None:
    """labels stored once while they are input_ids' array; a block with its own labels splits them."""
    from feedline._batching.pieces import PiecePool

    pool = PiecePool()
    a = np.arange(10, dtype=np.int32)
    ids_a = pool.add(np.zeros((2, 6), np.int64), np.array([4, 6]), np.array([0, 4]), {"input_ids": a, "labels": a})
    assert pool.alias == {"labels": "input_ids"}
    b, lb = np.arange(100, 105, dtype=np.int32), np.full(5, 7, np.int32)
    ids_b = pool.add(np.ones((1, 6), np.int64), np.array([5]), np.array([0]), {"input_ids": b, "labels": lb})
    assert pool.alias == {}
    pool.keep(np.array([*ids_a, *ids_b]))
    batch, tokens = pool.collate([[ids_a[1], ids_b[0]], [ids_a[0]]], 12, 4, {"labels": -100}, mask_first=False,
                                 attention="padding")
    assert tokens == 15 and list(batch) == ["input_ids", "labels", "position_ids", "seq_lens", "cu_seqlens", "attention_mask"]
    assert batch["input_ids"][0, :11].tolist() == [4, 5, 6, 7, 8, 9, 100, 101, 102, 103, 104]
    assert batch["labels"][0].tolist() == [4, 5, 6, 7, 8, 9, 7, 7, 7, 7, 7, -100]
    assert batch["labels"][1, :5].tolist() == [0, 1, 2, 3, -100]
