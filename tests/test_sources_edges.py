"""Edges of reading real files: unbalanced CSV quotes, files shrinking mid-read, huge records,
compressed JSON Lines without ``.jsonl`` in the name, single-object ``.json`` files."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from feedline._core.record import Rejection
from feedline._records import records
from feedline._sources.source import FileSource, source_format
from feedline._spec import SourceSpec


def read_all(path: str, **spec: Any) -> tuple[list[dict[str, Any]], list[Rejection], dict[str, int]]:
    """Every record and rejection of one source, read by a real FileSource cursor."""
    src = FileSource(SourceSpec(path=path, **spec), 0, seed=0, shuffle_splits=False, epochs=1)
    it = iter(src)
    recs = [r.data for r in it]
    it.close()
    return recs, it.rejections.samples, dict(it.rejections.counts)


# ------------------------------------------------------------------ item 10: CSV quotes
def test_csv_unbalanced_quote_keeps_the_rows_after_it(tmp_path: Path) -> None:
    rows = ["text,label"] + [f"row {i},{i % 2}" for i in range(11)]
    rows[4] = '"row 3 opens a quote and never closes it,1'
    p = tmp_path / "t.csv"
    p.write_text("\n".join(rows) + "\n")
    recs, samples, counts = read_all(str(p))
    assert [r["text"] for r in recs] == [f"row {i}" for i in range(11) if i != 3]
    assert counts == {"unbalanced_quote": 1}
    assert f"{p}:5" in samples[0]  # the header is line 1


def test_tsv_quote_closed_far_below_rejects_only_its_first_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from feedline._sources import tabular

    monkeypatch.setattr(tabular, "MAX_ROW_LINES", 5)  # 10,000 by default
    lines = ["text\tlabel"] + [f"line {i}\t{i}" for i in range(20)]
    lines[3] = '"broken quote\t2'      # opens a quoted field at line 4 ...
    lines[11] = 'closing" here\t10'    # ... that a stray quote eight lines down closes
    p = tmp_path / "t.tsv"
    p.write_text("\n".join(lines) + "\n")
    recs, samples, counts = read_all(str(p))
    texts = [r["text"] for r in recs]
    assert texts[:2] == ["line 0", "line 1"] and [f"line {i}" for i in range(3, 10)] == texts[2:9]
    assert texts[-1] == "line 19"
    assert counts.get("unbalanced_quote") == 1 and f"{p}:4" in samples[0]
    # A multi-line row whose field count is wrong is cut the same way (only its first line rejected).
    monkeypatch.setattr(tabular, "MAX_ROW_LINES", 10_000)
    lines[11] = 'closing" here\t10\textra'
    p.write_text("\n".join(lines) + "\n")
    recs, samples, counts = read_all(str(p))
    assert [f"line {i}" for i in range(3, 10)] == [r["text"] for r in recs][2:9]
    assert counts.get("bad_row", 0) >= 1 and f"{p}:4" in samples[0]


def test_csv_quoted_field_over_the_size_limit_is_too_large(tmp_path: Path) -> None:
    p = tmp_path / "big.csv"
    body = "\n".join("x" * 100 for _ in range(200))  # a legal multi-line field of ~20 KB
    p.write_text(f'text,label\nsmall,0\n"{body}",1\nafter,0\n')
    recs, _samples, counts = read_all(str(p), max_record_bytes=1 << 16)
    assert [r["text"] for r in recs] == ["small", body, "after"]
    recs, _samples, counts = read_all(str(p), max_record_bytes=4096)
    assert recs[0]["text"] == "small" and recs[-1]["text"] == "after" and counts.get("too_large") == 1


# ------------------------------------------------------------------ item 11: shrinking file
@pytest.mark.slow
def test_a_file_truncated_while_read_is_reported(tmp_path: Path) -> None:
    p = tmp_path / "big.jsonl"
    lines = [json.dumps({"text": f"record {i} " + "word " * 10}) + "\n" for i in range(40_000)]
    p.write_text("".join(lines))
    cut = sum(len(x) for x in lines[:20_000])
    src = FileSource(SourceSpec(path=str(p)), 0, seed=0, shuffle_splits=False, epochs=1)
    it = iter(src)
    got = [next(it) for _ in range(100)]
    os.truncate(p, cut)  # another process truncates the file at a line boundary
    got += list(it)
    it.close()
    assert len(got) == 20_000
    assert it.rejections.counts == {"truncated": 1}
    assert "shrank" in it.rejections.samples[0] and str(cut) in it.rejections.samples[0]


# ------------------------------------------------------------------ item 12: huge records
@pytest.mark.parametrize("name", ["h.jsonl", "h.txt"])
def test_a_line_over_max_record_bytes_is_too_large_and_the_rest_is_kept(tmp_path: Path, name: str) -> None:
    p = tmp_path / name
    huge = "y" * 300_000  # no newline for 300 KB; the limit below is 64 KiB
    rec = (lambda t: json.dumps({"text": t})) if name.endswith("jsonl") else (lambda t: t)
    p.write_text(f"{rec('before')}\n{rec(huge)}\n{rec('after')}\n")
    recs, samples, counts = read_all(str(p), max_record_bytes=1 << 16)
    assert [r["text"] for r in recs] == ["before", "after"]
    assert counts == {"too_large": 1} and ":2" in samples[0] and "max_record_bytes" in samples[0]
    # Resume right after the huge record: positions skip it exactly.
    src = FileSource(SourceSpec(path=str(p), max_record_bytes=1 << 16), 0, seed=0, shuffle_splits=False, epochs=1)
    it = iter(src)
    next(it)
    next(it)
    state = it.get_state()
    it.close()
    it2 = iter(src)
    it2.set_state(state)
    assert [r.data for r in it2] == [] and it2.rejections.counts == {"too_large": 1}


def test_unit_file_over_the_limit_is_too_large(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("z" * 5000)
    (tmp_path / "b.txt").write_text("small file")
    recs, _s, counts = read_all(str(tmp_path), unit="file", max_record_bytes=1024)
    assert [r["text"] for r in recs] == ["small file"] and counts == {"too_large": 1}


# ------------------------------------------------------------------ item 13: sniffing
@pytest.mark.parametrize("name", ["pile-00.zst", "pile-00.gz", "part-00000"])
def test_compressed_jsonl_without_jsonl_in_the_name_is_sniffed(tmp_path: Path, name: str) -> None:
    data = "".join(json.dumps({"text": f"doc {i}", "meta": {"pile_set_name": "x"}}) + "\n" for i in range(5)).encode()
    p = tmp_path / name
    if name.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    elif name.endswith(".gz"):
        data = gzip.compress(data)
    p.write_bytes(data)
    assert source_format(SourceSpec(path=str(p)), [str(p)]) == "jsonl"
    assert [r["text"] for r in records({"sources": [str(p)]})] == [f"doc {i}" for i in range(5)]


def test_plain_text_without_extension_stays_text(tmp_path: Path) -> None:
    p = tmp_path / "notes.gz"
    p.write_bytes(gzip.compress(b"{ not json, just a brace\nsecond line\n"))
    assert source_format(SourceSpec(path=str(p)), [str(p)]) == "text"


def test_pretty_printed_json_object_is_one_record(tmp_path: Path) -> None:
    p = tmp_path / "doc.json"
    p.write_text(json.dumps({"title": "T", "text": "one document\nover lines"}, indent=2))
    recs, _s, counts = read_all(str(p))
    assert [r["text"] for r in recs] == ["one document\nover lines"] and counts == {}


def test_json_object_with_a_list_of_records(tmp_path: Path) -> None:
    p = tmp_path / "data.json"
    p.write_text(json.dumps({"version": 1, "data": [{"text": f"item {i}"} for i in range(4)]}, indent=1))
    recs, _s, counts = read_all(str(p))
    assert [r["text"] for r in recs] == [f"item {i}" for i in range(4)] and counts == {}
    # Compact on one line, the same.
    p.write_text(json.dumps({"version": 1, "data": [{"text": f"item {i}"} for i in range(4)]}))
    assert [r["text"] for r in read_all(str(p))[0]] == [f"item {i}" for i in range(4)]
