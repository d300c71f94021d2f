"""Chat SFT on the real Qwen2.5 tokenizer and real conversations (OASST, ShareGPT, glaive tool calls)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from conftest import shared
from feedline._core.options import build
from feedline._core.record import Record
from feedline._tasks.base import TaskContext
from feedline._tasks.chat import Chat, normalize_conversation
from feedline._tokenize.load import load_tokenizer

# On one xdist worker with the other chat-template modules (--dist loadgroup otherwise spreads the tests over
# every worker): the large tokenizers (0.4-0.8 CPU s each to parse) and transformers' references load once.
pytestmark = pytest.mark.xdist_group("chat")

# ChatML with generation blocks around what the model writes (as TRL's qwen2_5 training template)
GENERATION_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant' }}{% generation %}"
    "{{- '\\n' + message.content + '<|im_end|>\\n' }}{% endgeneration %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant' }}{%- endif %}"
)


def _task(**opts: object) -> Chat:
    tok = load_tokenizer(str(shared("tokenizers", "qwen2.5")))
    return Chat(build(Chat.Options, opts, "task"), TaskContext(tok, 0))


def _oasst() -> list[dict]:
    path = shared("chat", "oasst", "en_100_top_threads.messages.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def _records(rows: list[dict]) -> list[Record]:
    return [Record((0, 0, i), 0, r) for i, r in enumerate(rows)]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2], strict=True))


@pytest.mark.slow
def test_qwen_oasst_turn_by_turn() -> None:
    task = _task(max_length=None)
    rows = _oasst()
    outs = task.process(_records(rows))
    assert task.mode == "prefix"
    ended_on_user = 0
    for row, out in zip(rows, outs, strict=True):
        ex = out[0]
        ids, labels = ex.fields["input_ids"], ex.fields["labels"]
        msgs = row["messages"]
        if msgs[-1]["role"] == "user":
            ended_on_user += 1
            msgs = msgs[:-1]
        replies = [m["content"] for m in msgs if m["role"] == "assistant"]
        runs = _runs(labels != -100)
        assert [task.tok.decode(ids[s:e]) for s, e in runs] == [r + "<|im_end|>\n" for r in replies]
        assert np.array_equal(labels[labels != -100], ids[labels != -100])
        text = task.tok.decode(ids)
        assert text.endswith(replies[-1] + "<|im_end|>\n")  # the trailing user turn was dropped
        assert text.count("<|im_start|>assistant\n") == len(replies)
    assert ended_on_user == 39


@pytest.mark.slow
def test_generation_tags_match_apply_chat_template() -> None:
    gen = _task(max_length=None, chat_template=GENERATION_TEMPLATE)
    pre = _task(max_length=None, chat_template=GENERATION_TEMPLATE, loss_mask="prefix")
    rows = _oasst()
    out_gen, out_pre = gen.process(_records(rows)), pre.process(_records(rows))
    assert gen.mode == "generation" and pre.mode == "prefix"
    for row, g, p in zip(rows, out_gen, out_pre, strict=True):
        msgs = row["messages"][:-1] if row["messages"][-1]["role"] == "user" else row["messages"]
        ref = gen.tok.hf.apply_chat_template(msgs, chat_template=GENERATION_TEMPLATE, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
        ids = g[0].fields["input_ids"]
        assert ids.tolist() == list(ref["input_ids"])
        assert ((g[0].fields["labels"] != -100).astype(int)).tolist() == list(ref["assistant_masks"])
        assert np.array_equal(g[0].fields["labels"], p[0].fields["labels"])


def test_sharegpt_tool_calls_and_results() -> None:
    task = _task(max_length=None)
    rows = json.loads(shared("chat", "llama_factory", "glaive_toolcall_en_demo.json").read_text())[:40]
    outs = task.process(_records(rows))
    with_calls = 0
    for row, out in zip(rows, outs, strict=True):
        ex = out[0]
        ids, labels = ex.fields["input_ids"], ex.fields["labels"]
        text = task.tok.decode(ids)
        tools = json.loads(row["tools"]) if row["tools"] else []
        if tools:
            assert "<tools>" in text and tools[0]["name"] in text
        trained = [task.tok.decode(ids[s:e]) for s, e in _runs(labels != -100)]
        calls = [m for m in row["conversations"] if m["from"] == "function_call"]
        for c in calls:
            name = json.loads(c["value"])["name"]
            assert any(f'<tool_call>\n{{"name": "{name}"' in t for t in trained)
        observations = [m for m in row["conversations"] if m["from"] == "observation"]
        for o in observations:
            assert not any(o["value"][:30] in t for t in trained)
        with_calls += bool(calls)
        if observations:
            assert "<tool_response>" in text
    assert with_calls > 10
    msgs, tools = normalize_conversation(rows[0])
    assert [m["role"] for m in msgs][:2] == ["user", "assistant"] and tools is not None


def test_sharegpt_single_conversation_and_system_prompt() -> None:
    row = json.loads(shared("chat", "sharegpt", "conversation.json").read_text())
    task = _task(max_length=None, system="Be brief.")
    ex = task.process(_records([row]))[0][0]
    text = task.tok.decode(ex.fields["input_ids"])
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert len(_runs(ex.fields["labels"] != -100)) == sum(m["from"] == "gpt" for m in row["conversations"])


def test_truncation_modes(caplog: pytest.LogCaptureFixture) -> None:
    rows = [r for r in _oasst() if sum(m["role"] == "assistant" for m in r["messages"]) >= 2][:10]
    full = {i: o[0] for i, o in enumerate(_task(max_length=None).process(_records(rows)))}
    # a limit between the end of the first reply and the full length keeps whole turns only
    task = _task(max_length=400)
    truncated = 0
    for i, out in enumerate(task.process(_records(rows))):
        n = len(full[i].fields["input_ids"])
        if isinstance(out, list):
            ex = out[0]
            truncated += len(ex.fields["input_ids"]) < n
            assert len(ex.fields["input_ids"]) <= min(400, n)
            assert task.tok.decode(ex.fields["input_ids"]).endswith("<|im_end|>\n")
            assert np.array_equal(ex.fields["labels"], full[i].fields["labels"][: len(ex.fields["labels"])])
        else:
            assert out.reason == "too_long"
    assert truncated >= 2
    rejected = _task(max_length=64, truncation="reject").process(_records(rows))
    assert all(getattr(r, "reason", None) == "too_long" for r in rejected)
    with caplog.at_level(logging.WARNING):
        cut = _task(max_length=64, truncation="cut").process(_records(rows))
    assert all(len(o[0].fields["input_ids"]) == 64 for o in cut if isinstance(o, list))
    assert "partial turns" in caplog.text


def test_rejections() -> None:
    task = _task()
    res = task.process(_records([
        {"messages": [{"role": "user", "content": "hi"}]},
        {"text": "no conversation"},
        {"messages": [{"role": "wizard", "content": "hi"}]},
    ]))
    assert [r.reason for r in res] == ["no_assistant", "bad_conversation", "bad_conversation"]
