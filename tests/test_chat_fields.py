"""Chat templates that leave a field out, or write no end-of-turn text: rejected by reason or told
once; every kept reply trains a stop (``task.stop``); counts in ``stats()`` and ``feedline scan --task``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import feedline
from conftest import shared
from feedline._core.options import build
from feedline._core.record import Record
from feedline._tasks.base import TaskContext
from feedline._tasks.chat import Chat
from feedline._tokenize.load import load_tokenizer
from feedline.errors import TaskError
from heavy import needs
from test_tasks_chat_templates import glm4_tokenizer

# On one xdist worker with the other chat-template modules (--dist loadgroup otherwise spreads the tests over
# every worker): the large tokenizers (0.4-0.8 CPU s each to parse) and transformers' references load once.
pytestmark = [needs("transformers"), pytest.mark.xdist_group("chat")]

# ChatML pieces; each template below leaves one thing out
_OPEN = "{%- for m in messages %}"
_CLOSE = "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
_CALLS = "{%- for c in m.tool_calls or [] %}{{ '<tool_call>' + (c.function | tojson) + '</tool_call>' }}{%- endfor %}"
_TOOLS = "{%- if tools %}{{ '<|im_start|>system\\n' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
_THINK = "{%- if m.reasoning_content %}{{ '<think>' + m.reasoning_content + '</think>' }}{%- endif %}"


def _chatml(*, calls: bool = True, tools: bool = True, think: bool = True, skip: str = "") -> str:
    body = "{{ '<|im_start|>' + m.role + '\\n' }}" + (_THINK if think else "") + "{{ m.content or '' }}" + (_CALLS if calls else "")
    body += "{{ '<|im_end|>\\n' }}"
    if skip:
        body = f"{{%- if m.role != '{skip}' %}}{body}{{%- endif %}}"
    return (_TOOLS if tools else "") + _OPEN + body + _CLOSE


_CALL = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}
_TOOL_SCHEMA = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
_CONV = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}, _CALL,
                      {"role": "tool", "content": "{\"temp\": 3}"},
                      {"role": "assistant", "reasoning_content": "3 degrees is cold.", "content": "It is 3 degrees."}],
         "tools": _TOOL_SCHEMA}

DROPS = {  # template -> what the rejection names
    "no tool calls": (_chatml(calls=False), "message 3 (assistant): tool_calls, tool_calls arguments"),
    "no tool schemas": (_chatml(tools=False), "tools: names, descriptions, parameters"),
    "no reasoning": (_chatml(think=False), "message 5 (assistant): reasoning_content"),
    "no tool results": (_chatml(skip="tool"), "message 4 (tool): content"),
    "no system prompt": (_chatml(skip="system"), "message 1 (system): content"),
}


@pytest.fixture(scope="module")
def glm4_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return glm4_tokenizer(tmp_path_factory.mktemp("glm4"))


def _task(template: str | None = None, tokenizer: str | None = None, **opts: object) -> Chat:
    tok = load_tokenizer(tokenizer or str(shared("tokenizers", "qwen2.5")))
    return Chat(build(Chat.Options, {"max_length": None, "chat_template": template, **opts}, "task"), TaskContext(tok, 0))


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2], strict=True))


def _trained(task: Chat, out: Any) -> list[str]:
    ids, labels = out[0].fields["input_ids"], out[0].fields["labels"]
    return [task.tok.decode(ids[s:e]) for s, e in _runs(labels != -100)]


@pytest.mark.parametrize("drop", list(DROPS))
@pytest.mark.slow
def test_a_template_that_drops_a_field_rejects_the_conversation_naming_it(drop: str) -> None:
    template, named = DROPS[drop]
    task = _task(template)
    out = task.process([Record((0, 0, 0), 0, _CONV)])[0]
    assert not isinstance(out, list) and out.reason == "unrendered_content"
    assert named in out.detail and "task.unrendered: warn" in out.detail
    assert isinstance(_task(_chatml()).process([Record((0, 0, 0), 0, _CONV)])[0], list)  # the full template keeps it


def test_real_tool_call_conversations_on_a_template_without_tool_calls() -> None:
    rows = json.loads(shared("chat", "llama_factory", "glaive_toolcall_en_demo.json").read_text())[:80]
    with_calls = [any(m["from"] == "function_call" for m in r["conversations"]) for r in rows]
    outs = _task(_chatml(calls=False, tools=False)).process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])
    assert [not isinstance(o, list) for o in outs] == [c or bool(json.loads(r["tools"] or "[]")) for c, r in zip(with_calls, rows, strict=True)]
    assert sum(with_calls) > 20


@pytest.mark.slow
def test_the_template_is_probed_once_per_conversation_shape() -> None:
    rows = json.loads(shared("chat", "llama_factory", "glaive_toolcall_en_demo.json").read_text())[:120]
    task = _task()
    task.process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])
    probes = task._fields.probes
    assert 0 < probes < 40  # 120 conversations, few shapes
    task.process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])
    assert task._fields.probes == probes  # the steady state renders no probe


# A template that validates values (a tool call must name a given tool), so it refuses the probe's
# sentinels and the conversation's own values are looked up in its render; {% generation %} blocks.
_KNOWN_TOOLS = ("{%- set names = (tools or []) | map(attribute='function') | map(attribute='name') | list %}"
                "{%- for m in messages %}{%- for c in m.tool_calls or [] %}{%- if c.function.name not in names %}"
                "{{ raise_exception('unknown tool: ' + c.function.name) }}{%- endif %}{%- endfor %}{%- endfor %}")


def _validating(*, think: bool = True) -> str:
    reply = ("{{ '<|im_start|>assistant\\n' }}{% generation %}" + (_THINK if think else "") + "{{ m.content or '' }}"
             + _CALLS + "{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}")
    other = "{{ '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    return _KNOWN_TOOLS + _TOOLS + _OPEN + "{%- if m.role == 'assistant' %}" + reply + "{%- else %}" + other + "{%- endif %}" + _CLOSE


def test_a_template_that_refuses_the_probe_is_checked_on_its_one_render(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the probe fails, the conversation's values are looked up in the render the task already
    made: one render per conversation (it rendered twice), the same examples and rejections."""
    task = _task(_validating())
    renders: list[int] = []
    real = task._render

    def counting(msgs: Any, tools: Any, **kw: Any) -> Any:
        renders.append(len(msgs))
        return real(msgs, tools, **kw)

    monkeypatch.setattr(task, "_render", counting)
    first = task.process([Record((0, 0, 0), 0, _CONV)])[0]
    assert task.mode == "generation" and isinstance(first, list) and task._fields.probes == 1
    renders.clear()
    again = task.process([Record((0, 0, 0), 0, _CONV)])[0]
    assert renders == [len(_CONV["messages"])]  # the probe's answer (it failed) is cached: no second render
    assert isinstance(again, list) and again[0].fields["input_ids"].tolist() == first[0].fields["input_ids"].tolist()
    assert again[0].fields["labels"].tolist() == first[0].fields["labels"].tolist()
    out = _task(_validating(think=False)).process([Record((0, 0, 0), 0, _CONV)])[0]
    assert not isinstance(out, list) and out.reason == "unrendered_content"
    assert "message 5 (assistant): reasoning_content" in out.detail


# a template with no end-of-turn text (as GLM-4's): "<|im_start|>" opens each turn, nothing closes it
NO_EOT = _OPEN + "{{ '<|im_start|>' + m.role + '\\n' + m.content }}" + _CLOSE
_TWO_TURNS = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."},
                           {"role": "user", "content": "bye"}, {"role": "assistant", "content": "See you."}]}


def test_stop_auto_inserts_the_eos_where_the_template_writes_no_end_of_turn() -> None:
    task = _task(NO_EOT)
    out = task.process([Record((0, 0, 0), 0, _TWO_TURNS)])[0]
    assert _trained(task, out) == ["Hello.<|im_end|>", "See you.<|im_end|>"]  # Qwen2.5's EOS
    assert task.tok.decode(out[0].fields["input_ids"]).startswith("<|im_start|>user\nhi<|im_start|>assistant\nHello.<|im_end|><|im_start|>user")
    plain = _task(NO_EOT, stop="template").process([Record((0, 0, 0), 0, _TWO_TURNS)])[0]
    assert _trained(task, plain) == ["Hello.", "See you."]  # what the template writes, nothing more


def test_stop_auto_keeps_the_template_end_of_turn_and_eos_adds_nothing_more() -> None:
    for stop in ("auto", "eos", "template"):
        task = _task(stop=stop)
        assert _trained(task, task.process([Record((0, 0, 0), 0, _TWO_TURNS)])[0]) == ["Hello.<|im_end|>\n", "See you.<|im_end|>\n"]


def test_stop_eos_adds_the_eos_after_an_end_of_turn_text_that_is_no_stop_token() -> None:
    """ChatML on the GPT-2 vocabulary: ``<|im_end|>`` is ordinary text there, not a stop token. ``auto``
    accepts it as the reply's end; ``eos`` trains the tokenizer's EOS after it (docs/tasks.md, **Stop**)."""
    gpt2 = str(shared("tokenizers", "gpt2"))
    auto = _task(_chatml(), tokenizer=gpt2)
    assert _trained(auto, auto.process([Record((0, 0, 0), 0, _TWO_TURNS)])[0]) == ["Hello.<|im_end|>\n", "See you.<|im_end|>\n"]
    eos = _task(_chatml(), tokenizer=gpt2, stop="eos")
    out = eos.process([Record((0, 0, 0), 0, _TWO_TURNS)])[0]
    assert _trained(eos, out) == ["Hello.<|im_end|>\n<|endoftext|>", "See you.<|im_end|>\n<|endoftext|>"]
    assert int((out[0].fields["labels"] == eos.tok.eos_id).sum()) == 2   # the EOS id itself is trained, once a reply


@pytest.mark.slow
def test_glm4_trains_the_next_role_header_and_ends_the_last_reply_with_eos(glm4_dir: str) -> None:
    task = _task(tokenizer=glm4_dir)
    out = task.process([Record((0, 0, 0), 0, _TWO_TURNS)])[0]
    assert _trained(task, out) == ["\nHello.<|user|>", "\nSee you.<|endoftext|>"]
    assert _trained(task, _task(tokenizer=glm4_dir, stop="template").process(
        [Record((0, 0, 0), 0, _TWO_TURNS)])[0]) == ["\nHello.", "\nSee you."]


def test_truncation_to_whole_turns_keeps_each_reply_with_its_stop(glm4_dir: str) -> None:
    task = _task(tokenizer=glm4_dir)
    full = task.process([Record((0, 0, 0), 0, _TWO_TURNS)])[0][0]
    ids = full.fields["input_ids"]
    first_stop = int(np.flatnonzero(ids == task.tok.backend.token_to_id("<|user|>"))[1])  # the header after the first reply
    cut = _task(tokenizer=glm4_dir, max_length=len(ids) - 1).process([Record((0, 0, 0), 0, _TWO_TURNS)])[0][0]
    assert cut.fields["input_ids"].tolist() == ids[:first_stop + 1].tolist()
    assert _trained(task, [cut]) == ["\nHello.<|user|>"]


@pytest.mark.slow
def test_no_stop_token_to_train_is_an_error_naming_the_fix(tmp_path: Path) -> None:
    d = tmp_path / "no-eos"
    d.mkdir()
    (d / "tokenizer.json").write_bytes(shared("tokenizers", "qwen2.5", "tokenizer.json").read_bytes())
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": None}))
    with pytest.raises(TaskError, match="task.stop: template"):
        _task(NO_EOT, tokenizer=str(d)).process([Record((0, 0, 0), 0, _TWO_TURNS)])
    assert isinstance(_task(NO_EOT, tokenizer=str(d), stop="template").process([Record((0, 0, 0), 0, _TWO_TURNS)])[0], list)


@pytest.mark.slow
def test_rejections_by_reason_in_stats_and_scan(tmp_path: Path, glm4_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    from feedline._cli.__main__ import main

    rows = json.loads(shared("chat", "llama_factory", "glaive_toolcall_en_demo.json").read_text())[:40]
    data = tmp_path / "glaive.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dropped = [i + 1 for i, r in enumerate(rows)
               if json.loads(r["tools"] or "[]") or any(m["from"] == "function_call" for m in r["conversations"])]
    spec = {"sources": [{"path": str(data), "text": None}], "tokenizer": glm4_dir,
            "task": {"kind": "chat", "max_length": 2048}, "batching": {"strategy": "pad", "batch_size": 4}}
    loader = feedline.Loader(spec)
    batches = list(loader)
    assert sum(len(b["input_ids"]) for b in batches) == len(rows) - len(dropped)
    assert loader.stats()["rejected"] == {"unrendered_content": len(dropped)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    capsys.readouterr()
    code = main(["scan", str(tmp_path / "spec.json"), "--task", "--json"])  # in this process: the report is the point
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["rejected"] == {"unrendered_content": len(dropped)} and report["examples"] == len(rows) - len(dropped)
    assert report["rejected_samples"][0].startswith(f"{data}:{dropped[0]}: unrendered_content (the chat template does not render")


# {% generation %} blocks around the reply only: the template's <|im_end|> falls outside the mask
GENERATION_OUTSIDE = (_OPEN + "{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% generation %}{{ m.content }}"
                      "{% endgeneration %}{{ '<|im_end|>\\n' }}{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                      "{%- endif %}" + _CLOSE)


def test_generation_blocks_that_leave_the_end_of_turn_out_train_the_stop_token_after_them() -> None:
    task = _task(GENERATION_OUTSIDE)
    out = task.process([Record((0, 0, 0), 0, _TWO_TURNS)])[0]
    assert task.mode == "generation"
    assert _trained(task, out) == ["Hello.<|im_end|>", "See you.<|im_end|>"]
    ref = task.tok.hf.apply_chat_template(_TWO_TURNS["messages"], chat_template=GENERATION_OUTSIDE, tokenize=True, return_dict=True)
    assert out[0].fields["input_ids"].tolist() == list(ref["input_ids"])  # nothing inserted: the stop was there
    plain = _task(GENERATION_OUTSIDE, stop="template")
    assert _trained(plain, plain.process([Record((0, 0, 0), 0, _TWO_TURNS)])[0]) == ["Hello.", "See you."]


@pytest.mark.slow
def test_a_used_task_pickles_and_gives_the_same_examples() -> None:
    import pickle

    task = _task(_chatml(calls=False))
    first = task.process([Record((0, 0, 0), 0, _TWO_TURNS), Record((0, 0, 1), 0, _CONV)])
    again = pickle.loads(pickle.dumps(task)).process([Record((0, 0, 0), 0, _TWO_TURNS), Record((0, 0, 1), 0, _CONV)])
    assert first[0][0].fields["input_ids"].tolist() == again[0][0].fields["input_ids"].tolist()
    assert first[1].reason == again[1].reason == "unrendered_content"
