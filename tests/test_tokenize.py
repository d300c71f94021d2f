"""The tokenizer layer on the real tokenizers in ../shared/data and on ones trained here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import shared
from feedline import TokenizerError, load_tokenizer
from feedline._tools.train_tokenizer import train_tokenizer


@pytest.mark.slow
def test_gpt2_matches_the_reference_encoding() -> None:
    tok = load_tokenizer(str(shared("tokenizers", "gpt2", "tokenizer.json")))
    assert tok.encode("Hello world! <|endoftext|>").tolist() == [15496, 995, 0, 220, 50256]
    assert tok.eos_id == 50256 and tok.pad_id == 50256 and tok.vocab_size == 50257


def test_t5_sentinels_and_sentencepiece_model_agree() -> None:
    tok = load_tokenizer(str(shared("tokenizers", "t5")))
    assert tok.encode("The <extra_id_0> walks in <extra_id_1> park", add_special_tokens=True).tolist() == [37, 32099, 10681, 16, 32098, 2447, 1]
    spm = load_tokenizer(str(shared("tokenizers", "t5", "spiece.model")))
    text = "The cat walks in the park, quietly."
    assert spm.encode(text).tolist() == tok.encode(text).tolist()


def test_bert_padding_and_truncation_baked_in_are_turned_off() -> None:
    path = shared("tokenizers", "bert-base-uncased")
    assert json.loads((path / "tokenizer.json").read_text())["truncation"] is not None  # the file enables it
    tok = load_tokenizer(str(path))
    long_text = "word " * 500
    ids = tok.encode_batch([long_text, "short"])
    assert len(ids[0]) == 500 and len(ids[1]) == 1  # no truncation to 128, no padding
    assert {tok.specials[r] for r in ("cls", "sep", "mask", "pad", "unk")} == {101, 102, 103, 0, 100}
    assert set(tok.all_special_ids.tolist()) >= {0, 100, 101, 102, 103}


def test_qwen_roles_follow_its_config() -> None:
    tok = load_tokenizer(str(shared("tokenizers", "qwen2.5")))
    assert tok.bos_id is None and tok.id_to_token(tok.eos_id) == "<|im_end|>"
    assert tok.hf.chat_template  # the ChatML template is carried over for the chat task


def test_batch_encoding_equals_single_encoding(small_tokenizer: str) -> None:
    tok = load_tokenizer(small_tokenizer)
    texts = [f"the river {i} under the stone bridge" for i in range(50)]
    batch = tok.encode_batch(texts)
    assert all(np.array_equal(b, tok.encode(t)) for b, t in zip(batch, texts))
    assert batch[0].dtype == np.int32


def test_trained_families_have_their_special_tokens(tmp_path, corpus: str) -> None:
    bert = train_tokenizer([corpus], str(tmp_path / "wp"), kind="wordpiece", vocab_size=300)
    t5 = train_tokenizer([corpus], str(tmp_path / "uni"), kind="unigram", vocab_size=300, sentinels=10)
    assert bert.specials["mask"] is not None and bert.specials["cls"] is not None
    assert t5.backend.token_to_id("<extra_id_0>") == t5.vocab_size - 1  # T5 convention: highest id
    reloaded = load_tokenizer(str(tmp_path / "wp"))
    assert reloaded.encode("the river").tolist() == bert.encode("the river").tolist()


def test_word_count_tsv_input(tmp_path) -> None:
    (tmp_path / "counts.tsv").write_text("river\t50\nstone\t40\nbridge\t30\n")
    tok = train_tokenizer([str(tmp_path / "counts.tsv")], str(tmp_path / "t"), kind="bpe", vocab_size=300, min_frequency=1)
    assert len(tok.encode(" river")) == 1  # a frequent word becomes one token
    (tmp_path / "bad.tsv").write_text("river fifty\n")
    with pytest.raises(Exception, match=r"bad.tsv:1: expected 'word<TAB>count'"):
        train_tokenizer([str(tmp_path / "bad.tsv")], str(tmp_path / "t2"), kind="bpe", vocab_size=300)


@pytest.mark.slow
def test_clear_errors_for_missing_or_offline_tokenizers(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TokenizerError, match="no such tokenizer file"):
        load_tokenizer(str(tmp_path / "missing" / "tokenizer.json"))
    (tmp_path / "garbage.json").write_text("{}")
    with pytest.raises(TokenizerError, match="not a readable tokenizer.json"):
        load_tokenizer(str(tmp_path / "garbage.json"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TokenizerError, match="offline, pass a local tokenizer.json"):
        load_tokenizer("some-org/surely-not-cached-model")
