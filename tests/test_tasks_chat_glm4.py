"""GLM-4 conformance: ids equal ``apply_chat_template`` plus only the documented stop, with and without
``generation_config.json``, on the real OASST threads and glaive tool-call conversations.

The tokenizer is built by the tests (``test_tasks_chat_templates.glm4_tokenizer``): Qwen2.5's vocabulary
with GLM-4's special tokens ([gMASK], <sop>, the role tokens; <|endoftext|> is Qwen2.5's own), and a
template in GLM-4's format, which writes every message as ``<|{role}|>{metadata}\\n{content}``, no
end-of-turn text, and skips a message without content. So a tool result must keep the native role
``observation`` (the special ``<|observation|>``, not ``<|tool|>`` in ordinary tokens); a reply is
ended by the next role token (the stop the model writes), the last one by ``<|endoftext|>``; and no
header is trained, also the ``<|assistant|>`` of a conversation that opens with a reply.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline._core.options import build
from feedline._core.record import Record
from feedline._tasks.base import TaskContext
from feedline._tasks.chat import Chat
from feedline._tokenize.load import load_tokenizer
from heavy import needs
from test_tasks_chat_templates import GLM4_STOPS, glm4_tokenizer

# On one xdist worker with the other chat-template modules (--dist loadgroup otherwise spreads the tests over
# every worker): the large tokenizers (0.4-0.8 CPU s each to parse) and transformers' references load once.
pytestmark = [needs("transformers"), pytest.mark.xdist_group("chat")]

STOPS = GLM4_STOPS  # GLM-4's generation_config.json eos_token_id: <|endoftext|>, <|user|>, <|observation|>
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "observation": "observation", "system": "system"}


@pytest.fixture(scope="module", params=[False, True], ids=["no-generation-config", "generation-config"])
def glm4(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return glm4_tokenizer(tmp_path_factory.mktemp("glm4") / "tok", generation_config=request.param)


def _task(path: str, **opts: Any) -> Chat:
    return Chat(build(Chat.Options, {"max_length": None, **opts}, "task"), TaskContext(load_tokenizer(path), 0))


def _reference_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation as GLM-4's template is given it by hand: native roles, trailing turns after the last
    reply dropped (a ShareGPT function_call is a reply), tool-call turns left out (the template skips them)."""
    if "messages" in row:
        msgs = [(m["role"], m["content"]) for m in row["messages"]]
    else:
        msgs = [("call" if t["from"] == "function_call" else SHAREGPT_ROLES[t["from"]], t["value"]) for t in row["conversations"]]
    while msgs[-1][0] not in ("assistant", "call"):
        msgs.pop()
    return [{"role": role, "content": content} for role, content in msgs if role != "call"]


def _runs(labels: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], (labels != -100).astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2], strict=True))


def _rows() -> list[dict[str, Any]]:
    oasst = shared("chat", "oasst", "en_100_top_threads.messages.jsonl").read_text().splitlines()
    glaive = json.loads(shared("chat", "llama_factory", "glaive_toolcall_en_demo.json").read_text())
    return [json.loads(line) for line in oasst] + glaive


@pytest.mark.slow
def test_ids_equal_apply_chat_template_plus_the_documented_stop(glm4: str) -> None:
    """OASST 100 + glaive 300 (``unrendered: warn``: GLM-4 writes no tool calls nor schemas)."""
    task = _task(glm4, unrendered="warn")
    tok = task.tok
    eos, observation = tok.backend.token_to_id("<|endoftext|>"), tok.backend.token_to_id("<|observation|>")
    rows = _rows()
    outs = task.process([Record((0, 0, i), 0, r) for i, r in enumerate(rows)])
    kept, observations = 0, 0
    rejected = collections.Counter(o.reason for o in outs if not isinstance(o, list))
    assert rejected == {}
    for row, out in zip(rows, outs, strict=True):
        if not isinstance(out, list):
            continue
        msgs = _reference_messages(row)
        ids, labels = out[0].fields["input_ids"].tolist(), out[0].fields["labels"]
        ref = list(tok.hf.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"])
        assert ids == [*ref, eos]  # one stop, after the last reply: each earlier one ends with the next role token
        n_obs = sum(m["role"] == "observation" for m in msgs)
        assert ids.count(observation) == n_obs and "<|tool|>" not in tok.decode(ids)
        observations += n_obs
        replies = [m["content"] for m in msgs if m["role"] == "assistant"]
        trained = [tok.decode(ids[s:e]) for s, e in _runs(labels)]
        assert len(trained) == len(replies)
        for text, reply in zip(trained, replies, strict=True):
            assert text.startswith("\n" + reply) and text.removeprefix("\n" + reply) in STOPS  # the reply and its stop
        kept += 1
    assert kept == 400 and observations == 211


def test_a_conversation_opening_with_a_reply_trains_no_header(glm4: str) -> None:
    task = _task(glm4)
    conv = [{"role": "assistant", "content": "Welcome! Ask me."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello."}]
    ex = task.process([Record((0, 0, 0), 0, {"messages": conv})])[0][0]
    ids, labels = ex.fields["input_ids"].tolist(), ex.fields["labels"]
    assert [task.tok.decode(ids[s:e]) for s, e in _runs(labels)] == ["\nWelcome! Ask me.<|user|>", "\nHello.<|endoftext|>"]
    ref = list(task.tok.hf.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])
    assert ids == [*ref, task.tok.backend.token_to_id("<|endoftext|>")]


def test_an_observation_in_openai_form_keeps_its_role_and_a_tool_result_stays_tool(glm4: str) -> None:
    """A message whose role is ``observation`` passes through; a ``tool`` message is written as the template writes it."""
    task = _task(glm4)
    conv = [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": "Checking."},
            {"role": "observation", "content": "{\"temp\": 3}"}, {"role": "assistant", "content": "It is 3 degrees."}]
    ex = task.process([Record((0, 0, 0), 0, {"messages": conv})])[0][0]
    ids = ex.fields["input_ids"].tolist()
    assert [task.tok.decode(ids[s:e]) for s, e in _runs(ex.fields["labels"])] == \
        ["\nChecking.<|observation|>", "\nIt is 3 degrees.<|endoftext|>"]
    as_tool = [*conv[:2], {**conv[2], "role": "tool"}, conv[3]]
    ex = task.process([Record((0, 0, 0), 0, {"messages": as_tool})])[0][0]
    ids = ex.fields["input_ids"].tolist()
    ref = list(task.tok.hf.apply_chat_template(as_tool, tokenize=True, return_dict=True)["input_ids"])
    # '<|tool|>' is written as the template writes it: ordinary text, no stop, so the EOS ends the reply before it
    assert task.tok.decode(ids) == task.tok.decode(ref).replace("Checking.<|tool|>", "Checking.<|endoftext|><|tool|>") + "<|endoftext|>"
