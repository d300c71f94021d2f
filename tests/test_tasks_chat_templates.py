"""Chat on templates that are not prefix-stable (Qwen3.5, DeepSeek-R1 distill) and on Qwen2.5, with real data.

Every conversation with an assistant turn is kept, and each turn's labelled tokens are checked
against the messages: the reply and the template's end-of-turn text, never another role's text
or a role header.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline._core.options import build
from feedline._core.record import Record
from feedline._tasks.base import TaskContext
from feedline._tasks.chat import Chat, normalize_conversation
from feedline._tokenize.load import load_tokenizer

pytest.importorskip("transformers")

# per family: end-of-turn text after a reply, and role markers never trained
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen2.5": {"eot": "<|im_end|>\n", "headers": ("<|im_start|>",), "opener": ("<|im_start|>assistant\n",)},
    "qwen3.5": {"eot": "<|im_end|>\n", "headers": ("<|im_start|>", "<think>"),
                "opener": ("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>")},
    # R1's template writes no header after tool outputs, nor before a second tool call (is_first is never reset)
    "llama3-r1-distill": {"eot": "<｜end▁of▁sentence｜>", "headers": ("<｜User｜>", "<｜Assistant｜>"),
                          "opener": ("<｜Assistant｜>", "<｜tool▁outputs▁end｜>"), "bare_tool_calls": True},
}


def _task(family: str, **opts: object) -> Chat:
    tok = load_tokenizer(str(shared("tokenizers", family)))
    return Chat(build(Chat.Options, {"max_length": None, **opts}, "task"), TaskContext(tok, 0))


def _rows(dataset: str) -> list[dict[str, Any]]:
    if dataset == "oasst":
        path = shared("chat", "oasst", "en_100_top_threads.messages.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines()]
    if dataset == "glaive":
        return json.loads(shared("chat", "llama_factory", "glaive_toolcall_en_demo.json").read_text())
    return [json.loads(shared("chat", "sharegpt", "conversation.json").read_text())]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2], strict=True))


def _check_turns(task: Chat, family: str, msgs: list[dict[str, Any]], ids: np.ndarray, labels: np.ndarray) -> None:
    fam = FAMILIES[family]
    while msgs[-1]["role"] != "assistant":
        msgs = msgs[:-1]
    replies = [m for m in msgs if m["role"] == "assistant"]
    others = [str(m.get("content") or "").strip() for m in msgs if m["role"] != "assistant"]
    runs = _runs(labels != -100)
    assert len(runs) == len(replies)
    assert np.array_equal(labels[labels != -100], ids[labels != -100])
    for (s, e), m in zip(runs, replies, strict=True):
        trained = task.tok.decode(ids[s:e])
        answer = str(m.get("content") or "").split("</think>")[-1].strip()
        assert answer in trained
        calls = m.get("tool_calls") or []
        for call in calls:
            assert call["function"]["name"] in trained
        if not calls:
            assert trained.endswith(fam["eot"]) and trained[:-len(fam["eot"])].rstrip().endswith(answer)
        for h in fam["headers"]:
            assert h not in trained, (h, trained[:80])
        # the run starts right after the assistant header (or in the token that finishes it)
        before, first = task.tok.decode(ids[:s]), task.tok.decode(ids[s:s + 1])
        if not (calls and fam.get("bare_tool_calls")):
            assert any((before + first[:k]).endswith(fam["opener"]) for k in range(len(first) + 1)), before[-40:]
        own = answer + json.dumps([c["function"] for c in calls], ensure_ascii=False)
        for other in others:  # another role's text is never trained (unless the reply quotes it)
            if len(other) >= 40 and other[:40] not in own:
                assert other[:40] not in trained


@pytest.mark.parametrize("dataset", ["oasst", "glaive", "sharegpt"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_conversation_kept_and_masked_turn_by_turn(family: str, dataset: str) -> None:
    rows = _rows(dataset)
    if family == "qwen2.5" and dataset == "glaive":
        rows = rows[:100]  # prefix-stable, already kept 300/300 before; keeps the suite short
    task = _task(family)
    outs = task.process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])
    rejected = [(i, o.reason, o.detail) for i, o in enumerate(outs) if not isinstance(o, list)]
    assert rejected == []  # 100% of conversations with an assistant turn kept
    assert task.mode == "prefix"
    for row, out in zip(rows, outs, strict=True):
        msgs, _ = normalize_conversation(row)
        _check_turns(task, family, msgs, out[0].fields["input_ids"], out[0].fields["labels"])


def test_qwen35_trains_reasoning_where_the_template_renders_it() -> None:
    """Qwen3.5 renders reasoning only for turns after the last user query; it is trained exactly there."""
    task = _task("qwen3.5")
    conv = {"messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "reasoning_content": "Earlier thought about sums.", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nLatest thought: add three.\n</think>\n\n6."},
    ]}
    ex = task.process([Record((0, 0, 0), 0, conv)])[0][0]
    ids, labels = ex.fields["input_ids"], ex.fields["labels"]
    text = task.tok.decode(ids)
    assert "Earlier thought" not in text  # the template drops reasoning before the last query
    first, last = (task.tok.decode(ids[s:e]) for s, e in _runs(labels != -100))
    assert first == "4.<|im_end|>\n"
    assert last.endswith("Latest thought: add three.\n</think>\n\n6.<|im_end|>\n")
    assert "<think>" not in last  # the opening tag is the generation prompt, not generated


def test_r1_distill_drops_earlier_reasoning_and_never_trains_it() -> None:
    task = _task("llama3-r1-distill")
    conv = {"messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nadding\n</think>\n\nFour."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nadding again\n</think>\n\nSix."},
    ]}
    ex = task.process([Record((0, 0, 0), 0, conv)])[0][0]
    ids, labels = ex.fields["input_ids"], ex.fields["labels"]
    assert "adding" not in task.tok.decode(ids)
    trained = [task.tok.decode(ids[s:e]) for s, e in _runs(labels != -100)]
    assert trained == ["\n\nFour.<｜end▁of▁sentence｜>", "\n\nSix.<｜end▁of▁sentence｜>"]


@pytest.mark.parametrize("family", ["qwen2.5", "llama3-r1-distill"])
def test_a_conversation_opening_with_the_assistant_trains_no_system_prompt(family: str) -> None:
    """Qwen2.5 writes a default system prompt before a first assistant turn: it is not trained."""
    task = _task(family)
    conv = {"messages": [{"role": "assistant", "content": "Welcome! Ask me."}, {"role": "user", "content": "Hi there"},
                         {"role": "assistant", "content": "Hello."}]}
    ex = task.process([Record((0, 0, 0), 0, conv)])[0][0]
    ids, labels = ex.fields["input_ids"], ex.fields["labels"]
    eot = FAMILIES[family]["eot"]
    assert [task.tok.decode(ids[s:e]) for s, e in _runs(labels != -100)] == [f"Welcome! Ask me.{eot}", f"Hello.{eot}"]


def test_truncation_keeps_whole_turns_on_non_prefix_templates() -> None:
    rows = [r for r in _rows("oasst") if sum(m["role"] == "assistant" for m in r["messages"]) >= 2][:8]
    full = [o[0] for o in _task("qwen3.5").process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])]
    cut = _task("qwen3.5", max_length=400).process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])
    shortened = 0
    for f, c in zip(full, cut, strict=True):
        if not isinstance(c, list):
            assert c.reason == "too_long"
            continue
        n = len(c[0].fields["input_ids"])
        shortened += n < len(f.fields["input_ids"])
        assert n <= 400 and c[0].fields["input_ids"].tolist() == f.fields["input_ids"][:n].tolist()
        assert _task("qwen3.5").tok.decode(c[0].fields["input_ids"]).endswith("<|im_end|>\n")
    assert shortened >= 1


def test_a_turn_the_template_rewrites_is_rejected_and_counted() -> None:
    """A template that writes earlier replies differently from the latest one (here: upper case)."""
    upper = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
             "{%- if m.role == 'assistant' and not loop.last %}{{ m.content | upper }}{% else %}{{ m.content }}{% endif %}"
             "{{ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
    task = _task("qwen2.5", chat_template=upper)
    conv = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                         {"role": "user", "content": "bye"}, {"role": "assistant", "content": "see you"}]}
    out = task.process([Record((0, 0, 0), 0, conv)])[0]
    assert not isinstance(out, list) and out.reason == "turn_not_located"
    assert "assistant turn 1" in out.detail
    same = _task("qwen2.5", chat_template=upper.replace(" and not loop.last", ""))  # consistent rewriting is fine
    ex = same.process([Record((0, 0, 0), 0, conv)])[0][0]
    trained = [same.tok.decode(ex.fields["input_ids"][s:e]) for s, e in _runs(ex.fields["labels"] != -100)]
    assert trained == ["HELLO<|im_end|>\n", "SEE YOU<|im_end|>\n"]
