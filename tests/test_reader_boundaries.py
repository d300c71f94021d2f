"""Readers never lose or repeat a record at a boundary: a line longer than a split, a compressed
stream that breaks after good records, a UTF-8 BOM, and resuming from every one of those places.

Every file here is written by the test and read by a real :class:`FileSource` cursor.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from feedline._sources.lines import BOM
from feedline._sources.source import FileSource
from feedline._spec import SourceSpec

MiB = 1 << 20


def _source(path: Path, **spec: Any) -> FileSource:
    return FileSource(SourceSpec(path=str(path), **spec), 0, seed=0, shuffle_splits=False, epochs=1)


def _read(path: Path, **spec: Any) -> tuple[list[Any], dict[str, int], list[str]]:
    """Every record (key, text) and the rejection counts and samples of one pass."""
    it = iter(_source(path, **spec))
    try:
        recs = [(r.key, r.data["text"]) for r in it]
    finally:
        it.close()
    return recs, dict(it.rejections.counts), list(it.rejections.samples)


def _resumes_exactly(path: Path, expected: list[Any], every: int = 1, counts: dict[str, int] | None = None,
                     **spec: Any) -> None:
    """A cursor restored from the state after record ``k`` reads exactly ``expected[k:]``, and ends with the
    rejection ``counts`` of a whole pass (none counted twice, none read again as a new bad line)."""
    src = _source(path, **spec)
    it = iter(src)
    states = [it.get_state()]
    for _ in expected:
        next(it)
        states.append(it.get_state())
    it.close()
    for k in range(0, len(states), every):
        again = iter(src)
        again.set_state(states[k])
        try:
            assert [(r.key, r.data["text"]) for r in again] == expected[k:], f"resumed after record {k}"
        finally:
            again.close()
        assert again.rejections.counts == (counts or {}), f"resumed after record {k}"


def _jsonl(texts: list[str]) -> bytes:
    return b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts)


# ------------------------------------------------------------------ a line longer than a split
@pytest.mark.parametrize("fmt", ["jsonl", "txt"])
@pytest.mark.slow
def test_a_line_longer_than_a_split_belongs_to_one_split(tmp_path: Path, fmt: str) -> None:
    """100 records, a 5 MiB line, 100 records with 1 MiB splits: 201 records, each once (was 600/601
    with 4 false ``truncated``), the same with the long line last, and exact resume everywhere."""
    before, after = [f"before {i}" for i in range(100)], [f"after {i}" for i in range(100)]
    long = "x" * (5 * MiB)
    enc = _jsonl if fmt == "jsonl" else (lambda ts: "".join(t + "\n" for t in ts).encode())
    path = tmp_path / f"long.{fmt}"
    path.write_bytes(enc([*before, long, *after]))
    recs, counts, samples = _read(path, split_bytes=MiB)
    assert [t for _k, t in recs] == [*before, long, *after]
    assert counts == {}, samples
    assert len({k for k, _t in recs}) == len(recs)
    _resumes_exactly(path, recs, every=7, split_bytes=MiB)
    # the file's last line spans the splits after it: nothing is "truncated" in an unchanged file
    last = tmp_path / f"last.{fmt}"
    last.write_bytes(enc([*before, long]))
    recs, counts, samples = _read(last, split_bytes=MiB)
    assert [t for _k, t in recs] == [*before, long] and counts == {}, samples
    # and a long line over max_record_bytes across splits is one too_large rejection, nothing more
    recs, counts, _ = _read(path, split_bytes=MiB, max_record_bytes=2 * MiB)
    assert [t for _k, t in recs] == [*before, *after] and counts == {"too_large": 1}


def test_every_split_boundary_inside_long_lines_gives_each_record_once(tmp_path: Path) -> None:
    """Lines of many sizes around the split size, with boundaries falling at every kind of place:
    the records and their keys are exactly those of the file read as one split."""
    texts = []
    for i in range(40):
        size = (i * 37_013) % (3 * (1 << 16))  # 0 .. ~196 KiB, against 64 KiB splits
        texts.append(f"r{i} " + "y" * size)
    path = tmp_path / "sizes.jsonl"
    path.write_bytes(_jsonl(texts))
    whole, counts, _ = _read(path, split_bytes=1 << 30)
    assert [t for _k, t in whole] == texts and counts == {}
    split, counts, samples = _read(path, split_bytes=1 << 16)
    assert split == whole and counts == {}, samples
    _resumes_exactly(path, split, split_bytes=1 << 16)


# ------------------------------------------------------------------ a compressed stream that breaks
def _zst_frames(texts: list[str], per_frame: int) -> list[bytes]:
    import zstandard

    c = zstandard.ZstdCompressor()
    return [c.compress(_jsonl(texts[i:i + per_frame])) for i in range(0, len(texts), per_frame)]


def test_zstd_delivers_every_record_before_a_bad_byte(tmp_path: Path) -> None:
    """A ``.jsonl.zst`` with 16 trailing zero bytes, or a corrupt later frame, delivered 0 of 10,000
    records; now all of them, then one ``truncated``."""
    pytest.importorskip("zstandard")
    texts = [f"record {i} " + "word " * (i % 7) for i in range(10_000)]
    (frame,) = _zst_frames(texts, 10_000)
    zeros = tmp_path / "zeros.jsonl.zst"
    zeros.write_bytes(frame + b"\0" * 16)
    recs, counts, samples = _read(zeros)
    assert [t for _k, t in recs] == texts
    assert counts == {"truncated": 1} and "stream broken" in samples[0]
    corrupt = tmp_path / "corrupt.jsonl.zst"
    corrupt.write_bytes(frame + frame[:30] + b"garbage" * 10 + frame[100:])
    recs, counts, _ = _read(corrupt)
    assert [t for _k, t in recs] == texts and counts == {"truncated": 1}


def test_zstd_corrupt_frame_in_the_middle_keeps_every_frame_before_it(tmp_path: Path) -> None:
    """30,000 records in frames of 1,000; frame 20 corrupted: the 20,000 records of the frames
    before it come out, exactly, and resuming after any of them reads on to the break."""
    pytest.importorskip("zstandard")
    texts = [f"document {i}: " + "lorem ipsum " * (i % 11) for i in range(30_000)]
    frames = _zst_frames(texts, 1000)
    broken = bytearray(frames[20])
    broken[len(broken) // 2:len(broken) // 2 + 64] = b"\xff" * 64
    path = tmp_path / "mid.jsonl.zst"
    path.write_bytes(b"".join(frames[:20]) + bytes(broken) + b"".join(frames[21:]))
    recs, counts, _ = _read(path)
    assert [t for _k, t in recs][:20_000] == texts[:20_000]
    assert len(recs) < 21_000 and [t for _k, t in recs] == texts[:len(recs)]
    assert counts == {"truncated": 1}
    it = iter(_source(path))
    it.take(12_345)
    state = it.get_state()
    it.close()
    again = iter(_source(path))
    again.set_state(state)
    assert [r.data["text"] for r in again] == [t for _k, t in recs][12_345:]
    assert again.rejections.counts == {"truncated": 1}


@pytest.mark.parametrize("codec", ["gz", "bz2", "xz"])
@pytest.mark.slow
def test_other_codecs_deliver_every_record_before_a_break(tmp_path: Path, codec: str) -> None:
    compress = {"gz": lambda b: gzip.compress(b, 1), "bz2": lambda b: bz2.compress(b, 1),
                "xz": lambda b: lzma.compress(b, preset=0)}[codec]
    texts = [f"record {i}" for i in range(40_000)]  # 550 kB: bz2 (level 1) decodes by blocks of 100 kB
    data = compress(_jsonl(texts))
    path = tmp_path / f"cut.jsonl.{codec}"
    second = compress(_jsonl(["q" * 100_000]))  # a second stream that breaks inside its one line
    path.write_bytes(data + second[:len(second) // 2])
    recs, counts, _ = _read(path)
    assert [t for _k, t in recs] == texts and counts == {"truncated": 1}
    path.write_bytes(data[:len(data) * 2 // 3])  # cut inside the only stream
    recs, counts, _ = _read(path)
    assert 0 < len(recs) < len(texts) and [t for _k, t in recs] == texts[:len(recs)] and counts == {"truncated": 1}
    # a second stream with a bad header (BZ2File/LZMAFile dropped it and the rest without a word)
    half = len(texts) // 2
    rest = bytearray(compress(_jsonl(texts[half:])))
    rest[0] ^= 0xFF
    path.write_bytes(compress(_jsonl(texts[:half])) + bytes(rest))
    recs, counts, _ = _read(path)
    assert [t for _k, t in recs] == texts[:half] and counts == {"truncated": 1}
    # zero padding after the last stream is no damage (gzip's and xz's rules; bz2 as gzip)
    path.write_bytes(data + b"\0" * 16)
    recs, counts, _ = _read(path)
    assert len(recs) == len(texts) and counts == {}


@pytest.mark.parametrize("codec", ["xz", "bz2"])
@pytest.mark.slow
def test_a_corrupt_block_is_a_truncated_rejection_after_the_records_before_it(tmp_path: Path, codec: str) -> None:
    """A corrupt byte run in the middle: LZMAError escaped the reader (the run stopped); now the
    records decoded before the damage come out and one ``truncated`` is counted."""
    compress = {"bz2": lambda b: bz2.compress(b, 1), "xz": lambda b: lzma.compress(b, preset=0)}[codec]
    texts = [f"record {i}" for i in range(100_000)]
    data = bytearray(compress(_jsonl(texts)))
    data[len(data) // 2:len(data) // 2 + 20] = b"\x55" * 20
    path = tmp_path / f"mid.jsonl.{codec}"
    path.write_bytes(bytes(data))
    recs, counts, _ = _read(path)
    good = [t for _k, t in recs if t.startswith("record ")]
    assert len(good) > 30_000 and good[:30_000] == texts[:30_000] and counts.get("truncated") == 1


# ------------------------------------------------------------------ byte-order marks
@pytest.mark.parametrize("codec", ["", ".gz", ".zst"])
@pytest.mark.parametrize("fmt", ["jsonl", "txt"])
def test_a_bom_file_resumes_after_every_record_and_is_not_truncated(tmp_path: Path, fmt: str, codec: str) -> None:
    """Resuming right after the first record of a BOM file re-read 3 bytes as a bad line; a
    one-line BOM file reported a false ``truncated``. Neither, on any path (plain, split, compressed)."""
    if codec == ".zst":
        pytest.importorskip("zstandard")
    texts = [f"line {i} " + "z" * (i * 997 % 5000) for i in range(60)]
    raw = _jsonl(texts) if fmt == "jsonl" else "".join(t + "\n" for t in texts).encode()

    def write(name: str, data: bytes) -> Path:
        p = tmp_path / (name + codec)
        if codec == ".gz":
            data = gzip.compress(data)
        elif codec == ".zst":
            import zstandard

            data = zstandard.ZstdCompressor().compress(data)
        p.write_bytes(data)
        return p

    path = write(f"bom.{fmt}", BOM + raw)
    recs, counts, samples = _read(path, split_bytes=1 << 16)
    assert [t for _k, t in recs] == texts and counts == {}, samples
    assert recs[0][0][2] == len(BOM)
    _resumes_exactly(path, recs, split_bytes=1 << 16)
    first = raw.split(b"\n", 1)[0]
    for one in (write(f"one.{fmt}", BOM + first), write(f"one-nl.{fmt}", BOM + first + b"\n")):
        recs, counts, samples = _read(one)
        assert [t for _k, t in recs] == texts[:1] and counts == {}, samples
        _resumes_exactly(one, recs)


# ------------------------------------------------------------------ CSV/TSV quoting (RFC 4180)
def test_tsv_quote_closed_on_a_later_line_by_text_rejects_only_its_opening_line(tmp_path: Path) -> None:
    """The issue's file: a quote opened on line 2 "closes" at ``he said "hi" twice`` ten lines down.
    It gave 1 record and no rejection (every row between swallowed into one field); now line 2 is
    rejected (file:line) and the 9 rows after it are records, each resumable."""
    rows = ["text\tlabel", '"I want my refund now\trefund', *[f"row {i}\tl{i}" for i in range(8)],
            'he said "hi" twice\tgreeting']
    path = tmp_path / "q.tsv"
    path.write_text("\n".join(rows) + "\n")
    recs, counts, samples = _read(path)
    assert [t for _k, t in recs] == [*(f"row {i}" for i in range(8)), 'he said "hi" twice']
    assert counts == {"unbalanced_quote": 1} and samples[0].startswith(f"{path}:2: unbalanced_quote")
    _resumes_exactly(path, recs, counts=counts)


def test_csv_strict_quotes_keep_legal_multiline_fields(tmp_path: Path) -> None:
    """A closing quote followed by anything but a delimiter or a line end is malformed (its line is
    rejected); doubled quotes, delimiters, CRLF and line breaks inside quoted fields are kept."""
    path = tmp_path / "q.csv"
    path.write_bytes(b'text,label\r\n'
                     b'"a legal\r\nmulti-line ""quoted"", field",1\r\n'
                     b'"closed" then text,2\r\n'
                     b'plain with "inner" quotes,3\r\n'
                     b'"a, b",4\r\n'
                     b'"opens here,5\r\n'
                     b'and closes" here,6\r\n'
                     b'last,7\r\n')
    recs, counts, samples = _read(path)
    assert [t for _k, t in recs] == ['a legal\r\nmulti-line "quoted", field', 'plain with "inner" quotes', "a, b",
                                     "and closes\" here", "last"]
    assert counts == {"bad_csv": 1, "unbalanced_quote": 1}
    assert any(s.startswith(f"{path}:4: bad_csv") for s in samples)
    assert any(s.startswith(f"{path}:7: unbalanced_quote") for s in samples)
    _resumes_exactly(path, recs, counts=counts)
