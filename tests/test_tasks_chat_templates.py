"""Chat conformance per template family, on real conversations (OASST, glaive tool calls, ShareGPT).

Families: Qwen2.5, Qwen3.5 (not prefix-stable), DeepSeek-R1 distill (drops earlier reasoning and
tool schemas), and GLM-4's format (built here: the GLM-4 template, its role tokens added to the
Qwen2.5 vocabulary, its ``generation_config.json`` stop ids; it writes no end-of-turn text and
ignores ``tool_calls`` and tools). For each: no kept conversation has content that the render
lacks, every kept reply trains a stop, the rejections are those expected by reason; each turn's
labelled tokens are the reply and its stop, never another role's text or a role header.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline._core.options import build
from feedline._core.record import Record
from feedline._tasks.base import TaskContext
from feedline._tasks.chat import Chat, normalize_conversation
from feedline._tokenize.load import load_tokenizer
from heavy import needs

# On one xdist worker with the other chat-template modules (--dist loadgroup otherwise spreads the tests over
# every worker): the large tokenizers (0.4-0.8 CPU s each to parse) and transformers' references load once.
pytestmark = [needs("transformers"), pytest.mark.xdist_group("chat")]

# GLM-4's chat template format (glm-4-9b-chat): tools only from a message's own "tools", a message without
# content (a tool call) not written at all, no end-of-turn text; every role written as <|role|>, so a
# tool result keeps its native role "observation" (the task keeps it: the template has a token for it)
GLM4_TEMPLATE = (
    "[gMASK]<sop>{% for item in messages %}"
    "{% if item['tools'] is defined %}<|system|>\n# Tools{% for tool in item['tools'] %}\n\n## {{ tool['function']['name'] }}"
    "\n\n{{ tool['function'] | tojson(indent=4) }}{% endfor %}{% endif %}"
    "{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}"
    "\n{{ item['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
GLM4_STOPS = ("<|endoftext|>", "<|user|>", "<|observation|>")
# Mistral's instruct template (v3, without tools): the system prompt only goes into the last user
# turn, so a conversation that ends with a reply loses it; tool calls and results are not written
MISTRAL_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set loop_messages = messages %}{%- endif %}{{- bos_token }}{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}{%- endif %}{%- endfor %}")
# a plain template with no end-of-turn text and no tool support, on GPT-2 (its EOS ends each reply)
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.role | capitalize }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"


def glm4_tokenizer(directory: Path, generation_config: bool = True) -> str:
    """A GLM-4-format tokenizer directory: Qwen2.5's vocabulary (GLM-4's is not in the shared data)
    with GLM-4's role tokens, its template, and ``generation_config.json`` listing its stop ids
    (unless ``generation_config`` is false)."""
    import tokenizers

    if not (directory / "tokenizer.json").exists():
        directory.mkdir(parents=True, exist_ok=True)
        tok = tokenizers.Tokenizer.from_file(str(shared("tokenizers", "qwen2.5", "tokenizer.json")))
        tok.add_special_tokens(["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"])
        tok.save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": GLM4_TEMPLATE, "eos_token": "<|endoftext|>"}))
        if generation_config:
            (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.token_to_id(t) for t in GLM4_STOPS]}))
    return str(directory)


# per family: end-of-turn text after a reply, stop tokens, role markers never trained (but as a reply's stop)
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen2.5": {"eot": "<|im_end|>\n", "stops": ("<|im_end|>",), "headers": ("<|im_start|>",), "opener": ("<|im_start|>assistant\n",)},
    "qwen3.5": {"eot": "<|im_end|>\n", "stops": ("<|im_end|>",), "headers": ("<|im_start|>", "<think>"),
                "opener": ("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>")},
    # R1's template writes no header after tool outputs, nor before a second tool call (is_first is never reset)
    "llama3-r1-distill": {"eot": "<｜end▁of▁sentence｜>", "stops": ("<｜end▁of▁sentence｜>",), "headers": ("<｜User｜>", "<｜Assistant｜>"),
                          "opener": ("<｜Assistant｜>", "<｜tool▁outputs▁end｜>"), "bare_tool_calls": True},
    "glm4": {"eot": "", "stops": GLM4_STOPS, "headers": ("<|user|>", "<|assistant|>", "<|observation|>", "<|system|>"),
             "opener": ("<|assistant|>",)},
    "mistral-v3": {"eot": "</s>", "stops": ("</s>",), "headers": ("[INST]", "[/INST]"), "opener": ("[/INST]",),
                   "template": MISTRAL_TEMPLATE},
    "gpt2": {"eot": "", "stops": ("<|endoftext|>",), "headers": ("User:", "Assistant:"), "opener": ("Assistant:",),
             "template": PLAIN_TEMPLATE},
}
# rejected by reason on the glaive conversations (all 300, or the first 100): R1's template writes
# no tool schemas; GLM-4's neither tool calls (153 conversations) nor tool schemas (38 more);
# Mistral's refuses a tool call's null content (53) and writes no tool schemas (6 more); the plain
# template writes neither tool calls nor schemas
GLAIVE_REJECTED = {"llama3-r1-distill": {"unrendered_content": 191}, "glm4": {"unrendered_content": 191},
                   "mistral-v3": {"template_error": 53, "unrendered_content": 6}, "gpt2": {"unrendered_content": 59}}
GLAIVE_FIRST_100 = ("qwen2.5", "mistral-v3", "gpt2")

@pytest.fixture(scope="module")
def glm4_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return glm4_tokenizer(tmp_path_factory.mktemp("glm4"))


def _task(family: str, glm4: str | None = None, **opts: object) -> Chat:
    tok = load_tokenizer(glm4 if family == "glm4" and glm4 else str(shared("tokenizers", family)))
    template = FAMILIES.get(family, {}).get("template")
    return Chat(build(Chat.Options, {"max_length": None, "chat_template": template, **opts}, "task"), TaskContext(tok, 0))


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


def _unrendered(text: str, msgs: list[dict[str, Any]], tools: Any) -> list[str]:
    """Values of the conversation that the decoded input lacks (checked on the data, not by the task's probe)."""
    missing = []
    for i, m in enumerate(msgs):
        content = str(m.get("content") or "")
        pieces = [p.strip() for p in content.replace("<think>", "").split("</think>")]
        pieces.append(str(m.get("reasoning_content") or "").strip())
        for call in m.get("tool_calls") or []:
            pieces.append(call["function"]["name"])
            args = call["function"].get("arguments")
            args = json.loads(args) if isinstance(args, str) else args
            pieces += [v for v in args.values() if isinstance(v, str) and v.isprintable() and '"' not in v and "\\" not in v]
        missing += [f"message {i}: {p[:30]!r}" for p in pieces if p and p not in text]
    for t in tools or []:
        fn = t.get("function", t)
        missing += [f"tool {fn['name']}: {k}" for k in ("name", "description") if fn.get(k) and fn[k] not in text]
    return missing


def _body(trained: str, fam: dict[str, Any]) -> str | None:
    """The trained run without its stop (the template's end-of-turn text or a stop token); ``None`` without one."""
    end = trained.rstrip()
    for stop in (fam["eot"].rstrip(), *fam["stops"]):
        if stop and end.endswith(stop):
            return end[:-len(stop)]
    return None


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
        body = _body(trained, fam)
        assert body is not None, f"reply trains no stop: {trained[-60:]!r}"  # every kept reply trains a stop
        answer = str(m.get("content") or "").split("</think>")[-1].strip()
        assert answer in body
        calls = m.get("tool_calls") or []
        for call in calls:
            assert call["function"]["name"] in body
        if not calls:
            assert body.rstrip().endswith(answer)
        for h in fam["headers"]:
            assert h not in body, (h, trained[:80])
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
@pytest.mark.slow
def test_conformance_per_family(family: str, dataset: str, glm4_dir: str) -> None:
    """0 conversations kept with content the render lacks, every kept reply trains a stop, rejections by reason."""
    rows = _rows(dataset)
    if family in GLAIVE_FIRST_100 and dataset == "glaive":
        rows = rows[:100]  # keeps the suite short
    task = _task(family, glm4_dir)
    outs = task.process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])
    rejected = collections.Counter(o.reason for o in outs if not isinstance(o, list))
    assert rejected == collections.Counter(GLAIVE_REJECTED.get(family, {}) if dataset == "glaive" else {})
    assert task.mode == "prefix"
    for row, out in zip(rows, outs, strict=True):
        msgs, tools = normalize_conversation(row)
        if not isinstance(out, list):
            if out.reason == "unrendered_content":  # the render does lack some of the conversation
                assert _unrendered(_plain_render(task, msgs, tools), msgs, tools)
            continue
        ids = out[0].fields["input_ids"]
        while msgs[-1]["role"] != "assistant":
            msgs = msgs[:-1]
        assert _unrendered(task.tok.decode(ids), msgs, tools) == []
        _check_turns(task, family, msgs, ids, out[0].fields["labels"])


def _plain_render(task: Chat, msgs: list[dict[str, Any]], tools: Any) -> str:
    while msgs[-1]["role"] != "assistant":
        msgs = msgs[:-1]
    try:
        return task._render(msgs, tools)[0]
    except Exception:  # R1 wants tool-call arguments as strings
        from feedline._tasks.chat_messages import string_arguments

        return task._render(string_arguments(msgs), tools)[0]


@pytest.mark.slow
def test_mistral_drops_the_system_prompt_of_a_conversation_ending_with_a_reply() -> None:
    rows = _rows("oasst")[:5]
    outs = _task("mistral-v3", system="Answer in French.").process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])
    assert all(not isinstance(o, list) and "message 1 (system): content" in o.detail for o in outs)


@pytest.mark.parametrize("family", ["llama3-r1-distill", "glm4"])
@pytest.mark.slow
def test_unrendered_warn_keeps_conversations_and_says_once_which_field(family: str, glm4_dir: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    rows = _rows("glaive")[:60]
    task = _task(family, glm4_dir, unrendered="warn")
    with caplog.at_level("WARNING", logger="feedline"):
        outs = task.process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])
    assert all(isinstance(o, list) for o in outs)
    said = [r.getMessage() for r in caplog.records if "does not render" in r.getMessage()]
    assert any("tools: names" in x for x in said)
    assert len(said) <= 2  # once per field (listed together), not once per conversation
    if family == "glm4":
        assert any("(assistant): tool_calls" in x for x in said)
    fam = FAMILIES[family]
    for out in outs:  # every reply the template writes still trains a stop
        ids, labels = out[0].fields["input_ids"], out[0].fields["labels"]
        for s, e in _runs(labels != -100):
            assert _body(task.tok.decode(ids[s:e]), fam) is not None


@pytest.mark.slow
def test_qwen35_trains_reasoning_where_the_template_renders_it() -> None:
    """Qwen3.5 renders reasoning only for turns after the last user query: a conversation with
    reasoning before it is rejected, or kept with ``unrendered: warn``, reasoning trained exactly where rendered."""
    conv = {"messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "reasoning_content": "Earlier thought about sums.", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nLatest thought: add three.\n</think>\n\n6."},
    ]}
    out = _task("qwen3.5").process([Record((0, 0, 0), 0, conv)])[0]
    assert not isinstance(out, list) and out.reason == "unrendered_content"
    assert "message 2 (assistant): reasoning_content" in out.detail
    latest_only = {"messages": conv["messages"][:1] + conv["messages"][2:]}
    assert isinstance(_task("qwen3.5").process([Record((0, 0, 0), 0, latest_only)])[0], list)
    task = _task("qwen3.5", unrendered="warn")
    ex = task.process([Record((0, 0, 0), 0, conv)])[0][0]
    ids, labels = ex.fields["input_ids"], ex.fields["labels"]
    text = task.tok.decode(ids)
    assert "Earlier thought" not in text  # the template drops reasoning before the last query
    first, last = (task.tok.decode(ids[s:e]) for s, e in _runs(labels != -100))
    assert first == "4.<|im_end|>\n"
    assert last.endswith("Latest thought: add three.\n</think>\n\n6.<|im_end|>\n")
    assert "<think>" not in last  # the opening tag is the generation prompt, not generated


def test_r1_distill_drops_reasoning_rejected_or_never_trained() -> None:
    """R1's template cuts ``<think>`` reasoning out of every reply: rejected, or trained without it with ``unrendered: warn``."""
    conv = {"messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nadding\n</think>\n\nFour."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nadding again\n</think>\n\nSix."},
    ]}
    out = _task("llama3-r1-distill").process([Record((0, 0, 0), 0, conv)])[0]
    assert not isinstance(out, list) and out.reason == "unrendered_content"
    assert "message 2 (assistant): <think> reasoning in content" in out.detail
    task = _task("llama3-r1-distill", unrendered="warn")
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


@pytest.mark.parametrize("family", ["bert-base-uncased", "t5", "qwen2.5"])
def test_the_special_tokens_given_to_a_template_are_those_of_the_transformers_tokenizer(family: str) -> None:
    """Templates get ``bos_token``, ``eos_token``, ... from :attr:`Tokenizer.special_tokens_map`, which must
    equal the ``special_tokens_map`` of the ``transformers`` tokenizer that used to be built for them."""
    tok = load_tokenizer(str(shared("tokenizers", family)))
    assert tok.special_tokens_map and tok.special_tokens_map == dict(tok.hf.special_tokens_map)


def test_a_chat_task_renders_without_building_a_transformers_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building one took 0.2-1.6 s a tokenizer (Qwen3.5's vocabulary: 1.6 s), in every process that renders."""
    from feedline._tokenize.tokenizer import Tokenizer

    def no_hf(self: Tokenizer) -> None:
        raise AssertionError("the chat task built a transformers tokenizer")

    monkeypatch.setattr(Tokenizer, "hf", property(no_hf))
    outs = _task("qwen2.5").process([Record((0, 0, i), 0, r) for i, r in enumerate(_rows("oasst")[:3])])
    assert all(isinstance(o, list) for o in outs)
