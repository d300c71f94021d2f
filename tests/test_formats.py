"""Every format and codec, on files the tests write: records, keys, positions, fetch, splits."""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma
from pathlib import Path

import pytest
import zstandard

from feedline._core.record import Record
from feedline._records import records
from feedline._sources.source import FileSource
from feedline._spec import SourceSpec
from feedline.errors import RecordError, SourceError, SpecError


def _read(path: str | Path, **kw: object) -> tuple[list[Record], FileSource]:
    src = FileSource(SourceSpec(path=str(path), **kw), 0, seed=0, shuffle_splits=False, epochs=1)  # type: ignore[arg-type]
    return list(src), src


def _docs(n: int) -> list[dict[str, object]]:
    return [{"text": f"document {i} " + "word " * (i % 17), "id": i, "meta": {"n": i}} for i in range(n)]


def _jsonl(docs: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(d) + "\n" for d in docs).encode()


@pytest.mark.parametrize("suffix,compress", [
    ("", lambda b: b), (".gz", lambda b: gzip.compress(b, mtime=0)), (".bz2", bz2.compress), (".xz", lzma.compress),
    (".zst", lambda b: zstandard.ZstdCompressor().compress(b)), (".zstd", lambda b: zstandard.ZstdCompressor().compress(b)),
])
def test_jsonl_codecs_give_the_same_records_keys_and_fetch(tmp_path: Path, suffix: str, compress: object) -> None:
    docs = _docs(50)
    p = tmp_path / f"c.jsonl{suffix}"
    p.write_bytes(compress(_jsonl(docs)))  # type: ignore[operator]
    recs, src = _read(p)
    assert [r.data for r in recs] == docs
    plain_positions = [0]
    for d in docs[:-1]:
        plain_positions.append(plain_positions[-1] + len(json.dumps(d)) + 1)
    assert [r.key[2] for r in recs] == plain_positions  # decoded byte offsets, whatever the codec
    keys = [recs[3].key, recs[40].key]
    assert src.fetch(keys) == {keys[0]: docs[3], keys[1]: docs[40]}


def test_bom_is_stripped_and_utf16_is_decoded(tmp_path: Path) -> None:
    (tmp_path / "bom.txt").write_bytes(codecs.BOM_UTF8 + b"first\nsecond\n")
    assert [r.data["text"] for r in _read(tmp_path / "bom.txt")[0]] == ["first", "second"]
    (tmp_path / "u16.jsonl").write_bytes("\n".join(json.dumps({"text": t}) for t in ["héllo", "wörld"]).encode("utf-16"))
    recs, src = _read(tmp_path / "u16.jsonl")
    assert [r.data["text"] for r in recs] == ["héllo", "wörld"]
    assert src.fetch([recs[1].key])[recs[1].key]["text"] == "wörld"


def test_text_units_line_paragraph_file(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text("a one\na two\n\n\nb one\r\n   \nc one\nc two\n")
    assert [r.data["text"] for r in _read(p)[0]] == ["a one", "a two", "b one", "c one", "c two"]
    paras, src = _read(p, unit="paragraph")
    assert [r.data["text"] for r in paras] == ["a one\na two", "b one", "c one\nc two"]
    assert src.fetch([paras[2].key])[paras[2].key]["text"] == "c one\nc two"
    whole, _ = _read(p, unit="file")
    assert len(whole) == 1 and whole[0].data["text"].startswith("a one\na two")


def test_bert_format_keeps_sentences_and_joined_text(tmp_path: Path) -> None:
    p = tmp_path / "b.txt"
    p.write_text("First sentence.\nSecond one.\n\nOther doc.\n")
    recs, _ = _read(p, format="bert")
    assert [r.data for r in recs] == [
        {"text": "First sentence. Second one.", "sentences": ["First sentence.", "Second one."]},
        {"text": "Other doc.", "sentences": ["Other doc."]},
    ]


def test_json_array_and_dotted_text_field(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    p.write_text(json.dumps([{"body": {"text": "x one"}, "label": 1}, {"body": {"text": "x two"}, "label": 0}, {"body": {}}]))
    recs, src = _read(p, text="body.text")
    assert [(r.data["text"], r.data["label"], r.key[2]) for r in recs] == [("x one", 1, 0), ("x two", 0, 1)]
    assert src.fetch([(0, 0, 1)])[(0, 0, 1)]["label"] == 0


def test_text_null_keeps_chat_records_as_they_are(tmp_path: Path) -> None:
    msgs = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    (tmp_path / "chat.jsonl").write_bytes(_jsonl(msgs))  # type: ignore[arg-type]
    recs, _ = _read(tmp_path / "chat.jsonl", text=None)
    assert [r.data for r in recs] == msgs


def test_csv_quoted_multiline_fields_header_and_positions(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text('text,label\n"multi\nline, quoted ""x""",a\nplain,b\nbad row\n"",c\n')
    recs, src = _read(p)
    assert [(r.data["text"], r.data["label"]) for r in recs] == [('multi\nline, quoted "x"', "a"), ("plain", "b")]
    assert src.fetch([recs[1].key])[recs[1].key]["text"] == "plain"
    it = iter(FileSource(SourceSpec(path=str(p)), 0, seed=0, shuffle_splits=False, epochs=1))
    list(it)
    assert it.rejections.counts == {"bad_row": 1, "empty": 1}


def test_tsv_without_header_needs_columns(tmp_path: Path) -> None:
    p = tmp_path / "g.tsv"
    p.write_text("hello there\t1,2\tid1\nbye\t3\tid2\n")
    recs, _ = _read(p, columns=("text", "labels", "id"), header=False)
    assert [r.data for r in recs] == [{"text": "hello there", "labels": "1,2", "id": "id1"}, {"text": "bye", "labels": "3", "id": "id2"}]
    with pytest.raises(SourceError, match="columns"):
        list(records({"sources": [{"path": str(p), "header": False}], "on_error": "raise"}))


def test_parquet_row_groups_are_splits_with_projection(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"text": [f"row {i}" for i in range(25)], "label": list(range(25)), "big": ["x" * 10] * 25})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    recs, src = _read(tmp_path / "t.parquet", columns=("label",))
    assert [s.start for s in src.splits] == [0, 10, 20]
    assert [r.data for r in recs][:2] == [{"label": 0, "text": "row 0"}, {"label": 1, "text": "row 1"}]
    assert [r.key[2] for r in recs] == list(range(25))
    assert src.fetch([(0, 0, 13)])[(0, 0, 13)] == {"label": 13, "text": "row 13"}


def test_arrow_file_stream_and_save_to_disk_folder(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"text": ["a b", "c d", "e f"], "label": [0, 1, 2]})
    with pa.ipc.new_file(str(tmp_path / "f.arrow"), table.schema) as w:
        w.write_table(table)
    with pa.ipc.new_stream(str(tmp_path / "s.arrow"), table.schema) as w:
        w.write_table(table)
    for name in ("f.arrow", "s.arrow"):
        recs, src = _read(tmp_path / name)
        assert [r.data["label"] for r in recs] == [0, 1, 2]
        assert src.fetch([(0, 0, 2)])[(0, 0, 2)]["text"] == "e f"
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["x y", "z w"], "label": [5, 6]}).save_to_disk(str(tmp_path / "saved"))
    recs, src = _read(tmp_path / "saved")
    assert [(r.data["text"], r.data["label"]) for r in recs] == [("x y", 5), ("z w", 6)]
    assert src.files[0].endswith(".arrow")


def test_hf_format_streams_a_local_dataset(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    (tmp_path / "d.jsonl").write_bytes(_jsonl(_docs(30)))
    spec = {"sources": [{"hf": "json", "data_files": [str(tmp_path / "d.jsonl")], "split": "train"}]}
    recs = list(records(spec))
    assert [r["text"] for r in recs] == [d["text"] for d in _docs(30)]
    src = FileSource(SourceSpec(hf="json", data_files=(str(tmp_path / "d.jsonl"),)), 0, seed=0, shuffle_splits=False, epochs=1)
    assert src.fetch([(0, 0, 7), (0, 0, 21)])[(0, 0, 21)]["id"] == 21


def test_python_iterables(tmp_path: Path) -> None:
    assert [r["text"] for r in records({"sources": [{"iterable": ["one", "", "two"]}]})] == ["one", "two"]

    def gen() -> object:
        yield {"text": "g", "label": 3}

    assert [r["label"] for r in records({"sources": [{"iterable": gen}]})] == [3]


def test_large_file_splits_are_record_aligned_and_cover_every_record_once(tmp_path: Path) -> None:
    docs = [{"text": f"doc {i} " + "y" * (i * 37 % 500)} for i in range(3000)]
    p = tmp_path / "big.jsonl"
    p.write_bytes(_jsonl(docs))  # type: ignore[arg-type]
    recs, src = _read(p, split_bytes=1 << 16)
    assert len(src.splits) > 5
    assert sorted(r.data["text"] for r in recs) == sorted(d["text"] for d in docs)
    offsets = {r.key[2] for r in recs}
    assert all(p.read_bytes()[o - 1:o] == b"\n" for o in offsets if o)  # keys are record starts
    blocks = "\n\n".join("\n".join(f"s{d}.{k}" for k in range(d % 4 + 1)) for d in range(4000))
    (tmp_path / "b.txt").write_text(blocks + "\n")
    recs, src = _read(tmp_path / "b.txt", format="bert", split_bytes=1 << 16)
    assert len(src.splits) > 1
    assert sorted(r.data["sentences"][0] for r in recs) == sorted(f"s{d}.0" for d in range(4000))


def test_unknown_format_and_mixed_directory_say_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "a.weird").write_text("x")
    with pytest.raises(SourceError, match="format"):
        list(records({"sources": [str(tmp_path / "a.weird")]}))
    with pytest.raises(SpecError, match="did you mean 'jsonl'"):
        list(records({"sources": [{"path": str(tmp_path / "a.weird"), "format": "jsonll"}]}))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "d" / "b.csv").write_text("text\ny\n")
    with pytest.raises(SourceError, match="several formats"):
        list(records({"sources": [str(tmp_path / "d")]}))
    with pytest.raises(RecordError):
        (tmp_path / "bad.jsonl").write_text("{nope\n")
        list(records({"sources": [str(tmp_path / "bad.jsonl")], "on_error": "raise"}))
