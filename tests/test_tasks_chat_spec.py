"""A chat spec reads whole records without ``text: null``, on the real OASST threads; an explicit
``text:`` still applies, and when it rejects every conversation the error says what to write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import feedline
from conftest import shared
from feedline._spec import Spec
from feedline.errors import SourceError
from heavy import needs

# On one xdist worker with the other chat-template modules (--dist loadgroup otherwise spreads the tests over
# every worker): the large tokenizers (0.4-0.8 CPU s each to parse) and transformers' references load once.
pytestmark = [needs("transformers"), pytest.mark.xdist_group("chat")]


def _spec(source: Any, kind: str = "chat") -> dict[str, Any]:
    task = {"kind": "chat", "max_length": 2048} if kind == "chat" else {"kind": kind, "max_length": 128}
    return {"sources": [source], "tokenizer": str(shared("tokenizers", "qwen2.5")), "task": task,
            "batching": {"strategy": "pad", "batch_size": 4}}


def _oasst() -> str:
    return str(shared("chat", "oasst", "en_100_top_threads.messages.jsonl"))


def _batches(spec: dict[str, Any]) -> tuple[list[dict[str, np.ndarray]], dict[str, int]]:
    loader = feedline.Loader(spec)
    return list(loader), loader.stats()["rejected"]


@pytest.mark.slow
def test_a_chat_source_without_text_reads_the_conversations_as_text_null_does() -> None:
    omitted, rejected = _batches(_spec({"path": _oasst()}))
    assert rejected == {}
    assert sum(len(b["input_ids"]) for b in omitted) == 100  # every OASST thread, none rejected
    null, _ = _batches(_spec({"path": _oasst(), "text": None}))
    assert len(omitted) == len(null)
    for a, b in zip(omitted, null, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    short, _ = _batches(_spec(_oasst()))  # a source given as a bare path too
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(omitted, short, strict=True))


def test_the_hash_stays_the_one_each_form_always_had_and_travels_to_other_processes() -> None:
    omitted = Spec.load(_spec({"path": _oasst()}))
    assert omitted.sources[0].text is None
    # before, a chat source without text: read the field 'text', and its hash said so: states still resume
    assert omitted.hash() == Spec.load(_spec({"path": _oasst(), "text": "text"})).hash()
    assert Spec.load(_spec({"path": _oasst(), "text": None})).hash() != omitted.hash()
    again = Spec.load(omitted.to_dict())  # as partitions and the service ship a spec to workers
    assert again.sources[0].text is None and again.hash() == omitted.hash()
    assert Spec.load(_spec({"path": _oasst()}, kind="clm")).sources[0].text == "text"  # other tasks: unchanged


@pytest.mark.parametrize("field", ["text", "messages"])
def test_a_text_field_that_rejects_every_conversation_says_what_to_write(field: str) -> None:
    with pytest.raises(SourceError) as e:
        _batches(_spec({"path": _oasst(), "text": field}))
    message = str(e.value)
    assert "every one of the 100 records read was rejected" in message
    assert f"task 'chat' reads each record whole (the conversation, not a text field): remove text: {field!r} " \
           "from sources[0], or write text: null" in message
    assert "set the source's text: to the field holding the text" not in message  # the advice for text tasks


def test_an_explicit_text_field_still_applies_to_chat_records(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in Path(_oasst()).read_text(encoding="utf-8").splitlines()[:8]]
    path = tmp_path / "tagged.jsonl"
    path.write_text("".join(json.dumps({**r, **({"lang": "en"} if i % 2 else {})}) + "\n" for i, r in enumerate(rows)))
    batches, rejected = _batches(_spec({"path": str(path), "text": "lang"}))
    assert rejected == {"missing_field": 4}
    assert sum(len(b["input_ids"]) for b in batches) == 4  # the 4 records that have the field


@pytest.mark.slow
def test_spec_check_passes_a_chat_spec_without_text_and_says_what_to_write_for_a_wrong_one(tmp_path: Path) -> None:
    """``feedline spec --check`` in a real process: the spec that rejected 100 of 100 OASST threads."""
    import subprocess
    import sys

    def check(source: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(_spec(source)))
        return subprocess.run([sys.executable, "-m", "feedline", "spec", "--check", str(path)],
                              capture_output=True, text=True, timeout=300)

    ok = check({"path": _oasst()})
    assert ok.returncode == 0 and ": valid; task chat" in ok.stdout, ok.stderr
    wrong = check({"path": _oasst(), "text": "text"})
    assert wrong.returncode == 1 and len(wrong.stderr.strip().splitlines()) == 1
    assert wrong.stderr.strip().endswith("remove text: 'text' from sources[0], or write text: null")
