"""Conformance matrix: every tokenizer in ../shared/data/tokenizers through clm, pack and chat,
against the family's own reference encoder (transformers from the same files, or sentencepiece).

The next family is one row in ``ROWS``.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline._core.options import build
from feedline._core.record import Record
from feedline._pipeline import GlobalStream, Pipeline
from feedline._tasks.base import TaskContext
from feedline._tasks.chat import Chat
from feedline._tasks.clm import CausalLM
from feedline._tokenize.load import load_tokenizer
from heavy import lazy, needs

transformers = lazy("transformers")

# On one xdist worker with the other chat-template modules (--dist loadgroup otherwise spreads the tests over
# every worker): the large tokenizers (0.4-0.8 CPU s each to parse) and transformers' references load once.
pytestmark = [needs("transformers"), pytest.mark.xdist_group("chat")]


@dataclass(frozen=True)
class Reference:
    """The family's own encoder: ids of a text (no specials), its bos/eos ids, and a chat renderer."""

    encode: Callable[[list[str]], list[list[int]]]
    framed: Callable[[list[str]], list[list[int]]]  # with the family's own BOS/EOS
    bos: int | None
    eos: int | None
    chat: Callable[[list[dict[str, Any]]], list[int]] | None = None


def _hf(path: Path, **roles: str) -> Reference:
    """``AutoTokenizer`` on the directory; a bare ``tokenizer.json`` with the family's documented ``roles``."""
    if (path / "tokenizer_config.json").is_file():
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
    else:
        tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), **roles)
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    chat = None
    if getattr(tok, "chat_template", None):
        def chat(msgs: list[dict[str, Any]]) -> list[int]:
            out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True)
            return list(out["input_ids"])
    return Reference(lambda texts: tok(texts, add_special_tokens=False)["input_ids"],
                     lambda texts: tok(texts)["input_ids"], tok.bos_token_id, eos, chat)


def _sentencepiece(path: Path) -> Reference:
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(path))
    bos = sp.bos_id() >= 0  # documented convention: BOS in front when the model has one, else EOS at the end
    return Reference(lambda texts: sp.encode(texts), lambda texts: sp.encode(texts, add_bos=bos, add_eos=not bos),
                     sp.bos_id() if bos else None, sp.eos_id() if sp.eos_id() >= 0 else None)


@dataclass(frozen=True)
class Row:
    family: str
    path: str  # under ../shared/data/tokenizers
    reference: Callable[[Path], Reference]
    chat: bool = False  # the family ships a chat template


ROWS = [
    Row("gpt2", "gpt2", lambda p: _hf(p, bos_token="<|endoftext|>", eos_token="<|endoftext|>")),
    Row("bert-base-uncased", "bert-base-uncased", _hf),
    Row("t5", "t5", _hf),
    Row("t5 spiece.model", "t5/spiece.model", _sentencepiece),
    Row("qwen2.5", "qwen2.5", _hf, chat=True),
    Row("qwen3.5", "qwen3.5", _hf, chat=True),
    Row("llama3-r1-distill", "llama3-r1-distill", _hf, chat=True),
    Row("mistral-v3", "mistral-v3/tokenizer.model", _sentencepiece),
]
IDS = [r.family for r in ROWS]


@cache
def _texts() -> tuple[str, ...]:
    prose = shared("prose")
    c4 = [json.loads(x)["text"] for x in (prose / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:25]]
    botchan = [x for x in (prose / "botchan.txt").read_text(encoding="utf-8").split("\n") if x.strip()][:40]
    return tuple(c4 + botchan)


@cache
def _reference(row: Row) -> Reference:
    return row.reference(shared("tokenizers", *row.path.split("/")))


def _tokenizer(row: Row) -> Any:
    return load_tokenizer(str(shared("tokenizers", *row.path.split("/"))))


@pytest.mark.parametrize("row", ROWS, ids=IDS)
@pytest.mark.slow
def test_clm_ids_equal_the_reference(row: Row) -> None:
    ref, tok, texts = _reference(row), _tokenizer(row), list(_texts())
    expected = ref.encode(texts)
    assert tok.eos_id == ref.eos
    assert tok.bos_id == ref.bos or ref.bos is None
    bos = ref.bos is not None
    task = CausalLM(build(CausalLM.Options, {"max_length": None, "bos": bos}, "task"), TaskContext(tok, 0))
    outs = task.process([Record((0, 0, i), 0, {"text": t}) for i, t in enumerate(texts)])
    for out, ids in zip(outs, expected, strict=True):
        assert out[0].fields["input_ids"].tolist() == [ref.bos] * bos + list(ids) + [ref.eos]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
@pytest.mark.slow
def test_framing_with_special_tokens_equals_the_reference(row: Row) -> None:
    """``add_special_tokens=True`` (classify, infer) frames as the family's reference does."""
    texts = list(_texts())[:20]
    got = [x.tolist() for x in _tokenizer(row).encode_batch(texts, add_special_tokens=True)]
    assert got == [list(x) for x in _reference(row).framed(texts)]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
@pytest.mark.slow
def test_packed_rows_hold_the_reference_ids(row: Row, tmp_path: Path) -> None:
    ref, texts = _reference(row), list(_texts())
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    spec = {"sources": [{"path": str(tmp_path / "docs.jsonl")}],
            "tokenizer": str(shared("tokenizers", *row.path.split("/"))),
            "task": {"kind": "clm", "max_length": 128},
            "batching": {"strategy": "pack", "batch_size": 8, "remainder": "keep", "max_length": 128, "window": 16}}
    it = iter(GlobalStream(Pipeline(spec)))
    try:
        batches = [b for _step, b, _st in it]
    finally:
        it.close()
    pieces = collections.Counter()
    for b in batches:
        for r in range(len(b["input_ids"])):
            cu = b["cu_seqlens"][r]
            pieces.update(b["input_ids"][r, cu[d]:cu[d + 1]].tobytes() for d in range(len(cu) - 1) if cu[d + 1] > cu[d])
    expected = collections.Counter()
    for ids in ref.encode(texts):
        doc = np.asarray([*ids, ref.eos], dtype=np.int32)
        expected.update(doc[i:i + 128].tobytes() for i in range(0, len(doc), 128))
    assert pieces == expected


@pytest.mark.parametrize("row", [r for r in ROWS if r.chat], ids=[r.family for r in ROWS if r.chat])
def test_chat_ids_equal_apply_chat_template(row: Row) -> None:
    ref, tok = _reference(row), _tokenizer(row)
    assert ref.chat is not None
    lines = shared("chat", "oasst", "en_100_top_threads.messages.jsonl").read_text().splitlines()[:12]
    convs = [json.loads(x)["messages"] for x in lines]
    convs = [c[:-1] if c[-1]["role"] == "user" else c for c in convs]
    task = Chat(build(Chat.Options, {"max_length": None}, "task"), TaskContext(tok, 0))
    outs = task.process([Record((0, 0, i), 0, {"messages": c}) for i, c in enumerate(convs)])
    for conv, out in zip(convs, outs, strict=True):
        assert out[0].fields["input_ids"].tolist() == ref.chat(conv)


@pytest.mark.parametrize("row", [r for r in ROWS if r.path.endswith(".model")],
                         ids=[r.family for r in ROWS if r.path.endswith(".model")])
def test_sentencepiece_backend_equals_sentencepiece(row: Row) -> None:
    """``.model`` rows under ``backend: sentencepiece`` (``auto``'s choice): exact, framed or not,
    also where the converted pipeline differs (combining marks, ties, spelled control pieces)."""
    from feedline._tokenize.backends import with_backend

    ref, tok = _reference(row), with_backend(_tokenizer(row), "sentencepiece")
    texts = [*_texts(), "a\u0301\u0301b", "Hotta.......", "<s>[INST] Hi [/INST]</s>", "", "\x00\x07 x"]
    assert [x.tolist() for x in tok.encode_batch(texts)] == [list(x) for x in ref.encode(texts)]
    assert [x.tolist() for x in tok.encode_batch(texts, add_special_tokens=True)] == [list(x) for x in ref.framed(texts)]
