"""``feedline.load_dataset`` gives ``datasets.load_dataset(..., streaming=True)``'s rows, value for
value and type for type, on files written here with every irregularity its builders handle
(text: blank lines, BOM, CRLF, lone CR; csv/tsv: inferred int/float/bool columns, missing values,
quoted newlines, short rows, per-chunk types), and resumes exactly from any row.

The reader options behind it (text ``keep_blank``, csv ``infer_types``) are tested at the reader
level too: splits, resume inside a line, and the defaults left as they were.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

import feedline
from conftest import shared
from feedline._sources.source import FileSource
from feedline._spec import SourceSpec, Spec
from heavy import lazy, needs

datasets = lazy("datasets")

# On one xdist worker with the other load_dataset modules (--dist loadgroup otherwise spreads the tests over
# every worker): datasets' builders and their imports (pandas for CSV) and the module data are set up once.
pytestmark = [needs("datasets"), pytest.mark.xdist_group("load_dataset")]


def hf_rows(builder: str, path: Path, **kw: Any) -> list[dict[str, Any]]:
    return list(datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True, **kw))


def typed(rows: list[dict[str, Any]]) -> list[list[tuple[str, type, Any]]]:
    """Rows with each value's type beside it (``1 == 1.0 == True`` would hide a wrong type)."""
    return [[(k, type(v), v) for k, v in r.items()] for r in rows]


def assert_same_rows_and_resume(builder: str, path: Path, cuts: int | list[int] = 5, **kw: Any) -> list[dict[str, Any]]:
    """Rows equal datasets', types included; a dataset restored after the first, middle, last and
    ``cuts`` random rows (or exactly the rows ``cuts`` lists) reads the rest."""
    expected = hf_rows(builder, path, **kw)
    ds = feedline.load_dataset(builder, data_files=str(path), split="train", **kw)
    got = list(ds)
    assert typed(got) == typed(expected)
    n = len(expected)
    chosen = cuts if isinstance(cuts, list) else [0, 1, n // 2, n - 1, *random.Random(n).sample(range(n), min(cuts, n))]
    for cut in sorted({c for c in chosen if 0 <= c < n}):
        ds = feedline.load_dataset(builder, data_files=str(path), split="train", **kw)
        rows = iter(ds)
        head = [next(rows) for _ in range(cut)]
        state = json.loads(json.dumps(ds.state_dict()))
        resumed = feedline.load_dataset(builder, data_files=str(path), split="train", **kw)
        resumed.load_state_dict(state)
        assert typed(head + list(resumed)) == typed(expected), f"resumed after row {cut}"
    return expected


# ------------------------------------------------------------------ text
TEXTS = {
    "blank.txt": b"a\n\nb\n\n\n   \n\t\nlast",                      # 'a\n\nb' gives ['a', '', 'b']
    "bom.txt": b"\xef\xbb\xbffirst\n\nsecond\n",                       # datasets keeps the BOM in row 1
    "crlf.txt": b"one\r\n\r\n  two  \r\nthree\r\n",
    "cr.txt": b"mac\rold\r\rstyle\r\nmixed\n\x0cform feed\xe2\x80\xa8stays one line\n\n",
    "empty.txt": b"",
    "newline.txt": b"\n",
    "bom-only.txt": b"\xef\xbb\xbf\n\n",
}


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_text_rows_equal_datasets(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(TEXTS[name])
    assert_same_rows_and_resume("text", path)


@pytest.mark.slow
def test_text_rows_equal_datasets_on_real_and_compressed_files(tmp_path: Path) -> None:
    with gzip.open(shared("prose", "kjv_bible_verses.txt.gz"), "rb") as fh:
        verses = fh.read().splitlines(keepends=True)[:3000]
    # real lines with blank and whitespace-only lines, CRLF and a BOM mixed in
    mixed = [b"\xef\xbb\xbf"] + [v if i % 7 else (b"\n" if i % 3 else b"  \r\n") + v for i, v in enumerate(verses)]
    plain = tmp_path / "verses.txt"
    plain.write_bytes(b"".join(mixed))
    rows = assert_same_rows_and_resume("text", plain)
    assert sum(r["text"] == "" for r in rows) > 200 and len(rows) > 3000
    packed = tmp_path / "verses.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert_same_rows_and_resume("text", packed, cuts=2)
    assert_same_rows_and_resume("text", shared("prose", "wiki_demo.txt"), cuts=2)


@pytest.mark.slow
def test_keep_blank_is_exact_across_splits_and_inside_lines(tmp_path: Path) -> None:
    """Lines with lone CRs (several records in one line) across 64 KiB splits: each record once, at
    its own byte offset, and a cursor restored after any of them reads exactly the rest."""
    rng = random.Random(7)
    parts = []
    for i in range(3000):
        parts.append(rng.choice([b"", b"  ", f"line {i} ".encode() * rng.randint(1, 40)]))
        parts.append(rng.choice([b"\n", b"\n", b"\r\n", b"\r"]))
    path = tmp_path / "cr.txt"
    path.write_bytes(b"".join(parts))
    expected = [r["text"] for r in hf_rows("text", path)]

    def source(split_bytes: int) -> FileSource:
        return FileSource(SourceSpec(path=str(path), keep_blank=True, split_bytes=split_bytes), 0, seed=0,
                          shuffle_splits=False, epochs=1)

    for split_bytes in (1 << 30, 1 << 16):
        it = iter(source(split_bytes))
        recs, states = [], [it.get_state()]
        for r in it:
            recs.append((r.key, r.data["text"]))
            states.append(it.get_state())
        assert [t for _k, t in recs] == expected and it.rejections.counts == {}
        assert len({k for k, _t in recs}) == len(recs)
        for k in range(0, len(states), 97):
            again = iter(source(split_bytes))
            again.set_state(states[k])
            assert [(r.key, r.data["text"]) for r in again] == recs[k:], f"split_bytes {split_bytes}, after {k}"
        fetched = source(split_bytes).fetch([k for k, _t in recs[::50]])
        assert [r["text"] for r in fetched.values()] == [t for _k, t in recs[::50]]


def test_defaults_are_unchanged(tmp_path: Path) -> None:
    """Without the options, text drops blank lines and csv keeps strings, and old specs keep their hash."""
    path = tmp_path / "a.txt"
    path.write_bytes(b"a\n\n  \nb\n")
    it = iter(FileSource(SourceSpec(path=str(path)), 0, seed=0, shuffle_splits=False, epochs=1))
    assert [r.data["text"] for r in it] == ["a", "b"]
    csv_path = tmp_path / "a.csv"
    csv_path.write_text("text,n\nx,1\n")
    it = iter(FileSource(SourceSpec(path=str(csv_path)), 0, seed=0, shuffle_splits=False, epochs=1))
    assert [r.data for r in it] == [{"text": "x", "n": "1"}]
    base = {"sources": [{"path": str(path)}], "task": {"kind": "clm"}}
    assert Spec.load(base).hash() == Spec.load({**base, "sources": [{"path": str(path), "keep_blank": False,
                                                                     "infer_types": False}]}).hash()
    assert Spec.load(base).hash() != Spec.load({**base, "sources": [{"path": str(path), "keep_blank": True}]}).hash()


# ------------------------------------------------------------------ csv / tsv
CSVS = {
    "types.csv": ('i,f,b,s,e,m,n,na,bs,sp\n1,1.5,True,x,,1,NA,null,true, 2\n2,2,False,"multi\nline",,,3,,false,3 \n'
                  '-3,1e3,true,NA,,2.5,nan,N/A,TRUE,x\n'),
    "blank-lines.csv": "a,b\n1,True\n\n2,\n   \n3,False\n",
    "names.csv": " a ,a,,a\n1,2,3,4\n",
    "short-row.csv": "a,b\n1\n2,3\n",
    "crlf.csv": 'a,b\r\n1,"x\r\ny"\r\n2,""\r\n+7,"inf"\r\n',
    "numbers.csv": "x,y,z\n 1,.5,-Infinity\n01,1.,1E-2\n-0,1e400,nan\n",
}


@pytest.mark.parametrize("name", sorted(CSVS))
def test_csv_rows_equal_datasets(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(CSVS[name].encode())
    assert_same_rows_and_resume("csv", path)


@pytest.mark.slow
def test_tsv_rows_equal_datasets(tmp_path: Path) -> None:
    path = tmp_path / "a.tsv"
    path.write_text('text\tlabel\tscore\nhello world\t1\t0.5\n"tab\tinside"\t2\t\nNA\t3\t1e-3\n')
    assert_same_rows_and_resume("csv", path, sep="\t")
    assert_same_rows_and_resume("csv", shared("classification", "goemotions", "dev.tsv"), cuts=[2_000], sep="\t",
                                column_names=["text", "labels", "id"])


@pytest.mark.slow
def test_csv_types_are_inferred_per_chunk_of_10000_rows(tmp_path: Path) -> None:
    """datasets types each 10,000-row chunk on its own: a column of ints that turns float (or gets an
    empty cell) in a later chunk is int before and float after; the same with random real numbers."""
    rng = random.Random(1)
    rows = ["n,x,flag,word,mixed"]
    for i in range(20_200):
        x = rng.choice([repr(rng.uniform(-1e6, 1e6)), f"{rng.random():.17g}", str(rng.randint(-10**9, 10**9)),
                        f"{rng.random() * 10 ** rng.randint(-300, 300):.12e}"])
        flag = rng.choice(["true", "False"]) if i < 10_000 else rng.choice(["true", "", "FALSE"])
        mixed = str(i) if i < 10_000 else (f"{i}.5" if i < 20_000 else rng.choice(["w", "NA", "7"]))
        rows.append(f"{i},{x},{flag},{rng.choice(['a', 'b c', 'NA', 'null'])},{mixed}")
    path = tmp_path / "big.csv"
    path.write_text("\n".join(rows) + "\n")
    expected = assert_same_rows_and_resume("csv", path, cuts=[9_999, 10_000, 20_100])  # around chunk starts
    assert type(expected[9_999]["mixed"]) is int and type(expected[10_000]["mixed"]) is float
    assert {type(r["mixed"]) for r in expected[20_000:]} <= {str, type(None)}
    packed = tmp_path / "big.csv.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert typed(list(feedline.load_dataset("csv", data_files=str(packed), split="train"))) == typed(expected)


# ------------------------------------------------------------------ json, parquet, arrow
ROWS = [{"text": "a", "n": 1, "f": 1.5, "b": True, "l": [1, 2], "d": {"x": 1, "y": "s"}},
        {"text": "b", "n": 2, "f": 2.25, "b": False, "l": [], "d": {"x": None, "y": "t"}},
        {"text": "c", "n": None, "f": None, "b": None, "l": None, "d": None},
        {"text": "\u00e9\u65e5 \U0001f600", "n": -3, "f": -0.5, "b": True, "l": [7], "d": {"x": 3, "y": ""}}]


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.jsonl.gz", "rows.json"])
def test_json_rows_equal_datasets(tmp_path: Path, name: str) -> None:
    """JSON Lines (plain and gzip) and a JSON array file (it was read as JSON Lines: one
    ``not_object`` rejection and no row): int, float, bool, None, list and dict values."""
    path = tmp_path / name
    data = json.dumps(ROWS).encode() if name.endswith(".json") else b"".join(json.dumps(r).encode() + b"\n" for r in ROWS)
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    rows = assert_same_rows_and_resume("json", path)
    assert typed(rows)[0] == typed(ROWS[:1])[0]


@pytest.mark.parametrize("kind", ["parquet", "arrow-stream", "arrow-file"])
def test_parquet_and_arrow_rows_equal_datasets(tmp_path: Path, kind: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(ROWS * 50)
    if kind == "parquet":
        path = tmp_path / "rows.parquet"
        pq.write_table(table, path, row_group_size=30)
    else:
        path = tmp_path / "rows.arrow"
        with pa.OSFile(str(path), "wb") as sink:
            new = pa.ipc.new_stream if kind == "arrow-stream" else pa.ipc.new_file
            with new(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=30)
    assert_same_rows_and_resume(kind.split("-")[0], path)


@pytest.mark.parametrize("builder", ["text", "json"])
def test_row_fix_stages_give_the_same_rows_by_next_take_and_fetch(tmp_path: Path, builder: str) -> None:
    """The root's row fix (the text BOM, the JSON types: one shared stage) gives the same rows read
    one by one, in takes, and re-read by key (what a buffer above it restores from), and resumes."""
    from feedline._hf_datasets.stages import RowFix

    path = tmp_path / f"rows.{'txt' if builder == 'text' else 'jsonl'}"
    if builder == "text":
        path.write_bytes(b"\xef\xbb\xbffirst\nsecond\n\nthird\nfourth\n")
    else:
        path.write_text('{"a": 1, "b": 2.5}\n{"a": 2}\n{"b": 3}\n{"a": 4, "b": 1, "c": "x"}\n{"a": 5, "b": 6}\n')
    ds = feedline.load_dataset(builder, data_files=str(path), split="train")
    stage = ds.stage()
    assert isinstance(stage, RowFix)
    one = list(iter(stage))
    assert [r.data for r in one] == hf_rows(builder, path)
    it = iter(stage)
    taken = it.take(2) + it.take(10)
    assert [(r.key, r.data) for r in taken] == [(r.key, r.data) for r in one]
    assert stage.fetch([r.key for r in one[::-1]]) == {r.key: r.data for r in one}
    it = iter(stage)
    it.take(2)
    again = iter(stage)
    again.set_state(json.loads(json.dumps(it.get_state())))
    assert [r.data for r in again] == [r.data for r in one[2:]]
