"""The backend check of a tokenizer read from a file reads that file: it never serialises the
``tokenizers`` backend (``to_str`` holds the GIL for 0.05-0.3 s, and it ran just as the first
batch was handed over, stalling the consumer). A tokenizer changed since, or built in memory, is
still keyed and loaded through its JSON."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline._tokenize import backends, check
from feedline._tokenize.tokenizer import Tokenizer
from heavy import needs

pytestmark = needs("fastokens")

TEXTS = [json.loads(line)["text"] for line in shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:20]]


class _NoSerialising:
    """A ``tokenizers`` backend whose ``to_str`` fails the test; everything else is the real one."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def to_str(self) -> str:
        raise AssertionError("the backend was serialised")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _ids(encoder: Any, texts: list[str]) -> list[list[int]]:
    return [a.tolist() for a in encoder.encode_batch(texts)]


@pytest.mark.slow
def test_a_file_tokenizer_is_keyed_and_checked_from_its_file() -> None:
    path = str(shared("tokenizers", "gpt2", "tokenizer.json"))
    tok = Tokenizer.from_file(path)
    assert tok.source_file == path
    tok.backend = _NoSerialising(tok.backend)  # type: ignore[assignment]
    assert check._key(tok).startswith("file:")
    verdict = check._check_fastokens(tok)
    assert verdict.fast is not None, verdict.reason
    assert _ids(verdict.fast, TEXTS) == _ids(backends.HfEncoder(tok.backend), TEXTS)


@pytest.mark.slow
def test_a_file_with_padding_and_truncation_is_loaded_without_them(tmp_path: Any) -> None:
    """feedline turns both off on the tokenizers side; fastokens read from the file must match."""
    import tokenizers

    raw = tokenizers.Tokenizer.from_file(str(shared("tokenizers", "gpt2", "tokenizer.json")))
    raw.enable_truncation(8)
    raw.enable_padding(length=16, pad_id=50256, pad_token="<|endoftext|>")
    path = tmp_path / "tokenizer.json"
    raw.save(str(path))
    assert json.loads(path.read_text())["truncation"] is not None
    tok = Tokenizer.from_file(str(path))
    assert tok.source_file == str(path)
    verdict = check._check_fastokens(tok)
    assert verdict.fast is not None, verdict.reason
    got = _ids(verdict.fast, TEXTS)
    assert got == _ids(backends.HfEncoder(tok.backend), TEXTS)
    assert max(len(ids) for ids in got) > 16  # neither truncated nor padded


@pytest.mark.slow
def test_a_tokenizer_changed_after_loading_is_keyed_by_its_json() -> None:
    path = str(shared("tokenizers", "gpt2", "tokenizer.json"))
    tok = Tokenizer.from_file(path)
    file_key = check._key(tok)
    changed = Tokenizer.from_file(path)
    changed.backend.add_tokens(["<feedline-test-token>"])
    assert changed.source_file is None
    key = check._key(changed)
    assert not key.startswith("file:") and key != file_key
    verdict = check._check_fastokens(changed)  # loaded from its JSON: the added token is there
    assert verdict.fast is not None, verdict.reason
    text = ["a <feedline-test-token> b"]
    assert _ids(verdict.fast, text) == _ids(backends.HfEncoder(changed.backend), text)
    assert changed.backend.token_to_id("<feedline-test-token>") in np.asarray(verdict.fast.encode_batch(text)[0])
