"""``feedline count-tokens``: whitespace word counts to TSV, count files merged."""

from __future__ import annotations

import collections
from pathlib import Path

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
