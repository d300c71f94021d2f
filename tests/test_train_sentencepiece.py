"""SentencePiece training: real text in, a .model that sentencepiece loads and encodes real text with."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shared
from feedline._tools.count_tokens import count_tokens, write_counts
from feedline._tools.train_sentencepiece import train_sentencepiece
from feedline.errors import SourceError, SpecError
from heavy import lazy, needs

spm = lazy("sentencepiece")
pytestmark = needs("sentencepiece")

SENTENCE = "I have been a mischievous boy since my childhood, and have had many losses."


@pytest.fixture(scope="module")
def botchan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first ~2,000 lines of Botchan (real English prose)."""
    text = shared("prose", "botchan.txt").read_text(encoding="utf-8").splitlines()[:2000]
    path = tmp_path_factory.mktemp("spm") / "botchan.txt"
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_unigram_from_text_has_the_t5_layout_and_encodes(botchan: Path, tmp_path: Path) -> None:
    model = train_sentencepiece([str(botchan)], str(tmp_path / "u"), kind="unigram", vocab_size=1200, sentinels=10,
                                tokenizer_json=True)
    assert model.name == "spiece.model" and model.with_suffix(".vocab").is_file()
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert sp.get_piece_size() == 1200
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
    assert sp.id_to_piece(1199) == "<extra_id_0>" and sp.id_to_piece(1190) == "<extra_id_9>"
    ids = sp.encode(SENTENCE)
    assert sp.decode(ids) == SENTENCE and 2 not in ids and len(ids) < len(SENTENCE.split()) * 3
    assert 1199 in sp.encode("a <extra_id_0> b")
    vocab_lines = model.with_suffix(".vocab").read_text(encoding="utf-8").splitlines()
    assert len(vocab_lines) == 1200 and vocab_lines[-1].startswith("<extra_id_0>\t")
    # the converted tokenizer.json encodes exactly as sentencepiece does
    from tokenizers import Tokenizer

    tj = Tokenizer.from_file(str(tmp_path / "u" / "tokenizer.json"))
    for line in botchan.read_text(encoding="utf-8").splitlines()[:300]:
        assert tj.encode(line, add_special_tokens=False).ids == sp.encode(line), line


def test_bpe_from_word_counts_has_the_llama_layout(botchan: Path, tmp_path: Path) -> None:
    counts = tmp_path / "counts.tsv"
    write_counts(count_tokens([str(botchan)], format="text"), str(counts))
    model = train_sentencepiece([str(counts)], str(tmp_path / "b"), kind="bpe", vocab_size=800)
    assert model.name == "tokenizer.model"
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2)
    ids = sp.encode(SENTENCE)
    assert sp.decode(ids) == SENTENCE and 0 not in ids


@pytest.mark.slow
def test_bad_inputs_are_refused(botchan: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("word\t3\nno count here\n")
    with pytest.raises(SourceError, match=r"bad.tsv:2: expected 'word<TAB>count'"):
        train_sentencepiece([str(bad)], str(tmp_path / "x"), kind="unigram", vocab_size=500)
    with pytest.raises(SpecError, match="mix of word-count TSV and text"):
        train_sentencepiece([str(bad), str(botchan)], str(tmp_path / "x"), vocab_size=500)
    with pytest.raises(SpecError, match="unigram or bpe"):
        train_sentencepiece([str(botchan)], str(tmp_path / "x"), kind="wordpiece", vocab_size=500)
    r = subprocess.run([sys.executable, "-m", "feedline", "train-tokenizer", str(botchan), "-o",
                        str(tmp_path / "x"), "--format", "sentencepiece", "--kind", "wordpiece"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "use --format tokenizers" in r.stderr


@pytest.mark.slow
def test_cli_trains_a_sentencepiece_model(botchan: Path, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "feedline", "train-tokenizer", str(botchan), "-o", str(tmp_path / "c"),
                        "--format", "sentencepiece", "--kind", "bpe", "--vocab-size", "600"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "c" / "tokenizer.model"))
    assert sp.decode(sp.encode(SENTENCE)) == SENTENCE


@pytest.mark.slow
def test_a_vocabulary_the_corpus_cannot_fill_is_reported(botchan: Path, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "feedline", "train-tokenizer", str(botchan), "-o", str(tmp_path / "s"),
                        "--format", "sentencepiece", "--kind", "bpe", "--vocab-size", "32000"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = spm.SentencePieceProcessor(model_file=str(tmp_path / "s" / "tokenizer.model")).get_piece_size()
    assert got < 32000
    assert f"{got} pieces; only {got} of the 32000 asked" in r.stdout  # not a silent 25,415 for 32,000
    assert "not the 32000 asked" in r.stderr  # the library's warning, for callers of train_sentencepiece
