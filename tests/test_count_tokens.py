"""``feedline count-tokens``: whitespace word counts to TSV, count files merged."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from feedline._cli.__main__ import main
from feedline._tools.count_tokens import count_tokens, is_count_file


def _read_tsv(p: Path) -> list[tuple[str, int]]:
    return [(w, int(c)) for w, c in (ln.split("\t") for ln in p.read_text().splitlines())]


def test_counts_match_an_independent_count_and_shards_merge(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "the cat the hat"}\n{"text": "A cat"}\n')
    (tmp_path / "b.txt.gz").write_bytes(__import__("gzip").compress(b"the end\nthe\tTHE\n"))
    expected = collections.Counter("the cat the hat A cat the end the THE".split())
    assert main(["count-tokens", str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt.gz"), "-o", str(tmp_path / "all.tsv")]) == 0
    rows = _read_tsv(tmp_path / "all.tsv")
    assert dict(rows) == expected and rows[0] == ("the", 4)
    assert [c for _, c in rows] == sorted((c for _, c in rows), reverse=True)
    main(["count-tokens", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "1.tsv")])
    main(["count-tokens", str(tmp_path / "b.txt.gz"), "-o", str(tmp_path / "2.tsv")])
    assert is_count_file(str(tmp_path / "1.tsv"))
    assert main(["count-tokens", str(tmp_path / "1.tsv"), str(tmp_path / "2.tsv"), "-o", str(tmp_path / "m.tsv")]) == 0
    assert _read_tsv(tmp_path / "m.tsv") == rows
    assert count_tokens([str(tmp_path / "a.jsonl")], lowercase=True)["a"] == 1


def test_a_tsv_that_is_not_counts_is_read_as_a_source(tmp_path: Path) -> None:
    (tmp_path / "d.tsv").write_text("text\tlabel\nhello world\tx\nhello\ty\n")
    assert not is_count_file(str(tmp_path / "d.tsv"))
    assert count_tokens([str(tmp_path / "d.tsv")]) == collections.Counter({"hello": 2, "world": 1})


@pytest.mark.slow
def test_with_a_tokenizer_it_counts_that_tokenizers_tokens(tmp_path: Path, gpt2_path: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from tokenizers import Tokenizer

    texts = ["The cat sat on the mat.", "Naïve café — the end.\nThe second line", "tokenization, tokenizers"]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    raw = Tokenizer.from_file(str(Path(gpt2_path) / "tokenizer.json"))
    expected = collections.Counter(tok for t in texts for tok in raw.encode(t, add_special_tokens=False).tokens)
    assert count_tokens([str(tmp_path / "a.jsonl")], tokenizer=gpt2_path) == expected
    assert main(["count-tokens", str(tmp_path / "a.jsonl"), "--tokenizer", gpt2_path, "-o", str(tmp_path / "t.tsv")]) == 0
    assert dict(_read_tsv(tmp_path / "t.tsv")) == expected and "Ġthe" in expected  # not whitespace words
    err = capsys.readouterr().err
    assert f"counted tokens of {gpt2_path}: {sum(expected.values())} in all, {len(expected)} distinct" in err
    assert main(["count-tokens", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "w.tsv")]) == 0
    assert "counted whitespace-separated words: 16 in all" in capsys.readouterr().err


def test_a_token_with_a_tab_or_line_break_stays_on_one_line(tmp_path: Path) -> None:
    from feedline._tools.count_tokens import write_counts

    write_counts(collections.Counter({"a\tb": 2, "\n": 1}), str(tmp_path / "c.tsv"))
    assert (tmp_path / "c.tsv").read_text() == "a\\tb\t2\n\\n\t1\n"
