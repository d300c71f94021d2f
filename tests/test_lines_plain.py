"""The block-reading path of plain local line files gives exactly the items of the line-by-line path.

``LineReader.read`` reads a plain local file in blocks (``_read_plain``); compressed, remote and
UTF-16 files (and readers that override ``records``) go line by line (``_read_lines``). Both must
yield the same ``(position, next position, line, record or rejection)`` items from every split and
every resume position, on real text and on every irregular line the line path handles.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pytest

from conftest import shared
from feedline._sources import jsonl
from feedline._sources.jsonl import JsonlReader
from feedline._sources.lines import BOM, LineReader
from feedline._sources.reader import Split
from feedline._sources.source import FileSource
from feedline._spec import SourceSpec
from feedline.errors import SourceError


def _lines(tmp_path: Path) -> list[bytes]:
    """Real text records and every irregular kind of line, as JSON Lines."""
    with gzip.open(shared("prose", "kjv_bible_verses.txt.gz"), "rt", encoding="utf-8") as fh:
        verses = fh.read().splitlines()
    out = [json.dumps({"text": v.strip(), "id": i}).encode() + b"\n" for i, v in enumerate(verses[:4000]) if v.strip()]
    odd = [b"\n", b"   \n", b"{not json}\n", b'{"text": ""}\n', b'{"text": "  "}\n', b'{"other": 1}\n',
           b'{"text": 5}\n', b"[1, 2]\n", b'{"text": "crlf line"}\r\n', b'{"text": "\xff bad utf8"}\n',
           json.dumps({"text": "x" * 70_000}).encode() + b"\n", b'{"text": "caf\xc3\xa9 \xe2\x98\x83"}\n']
    for i, line in enumerate(odd):
        out.insert(97 * (i + 1), line)
    return out


def _items(reader: LineReader, split: Split, position: int, line: int, plain: bool,
           limit: int | None = None) -> list[tuple]:
    it = reader._read_plain(split, position, line) if plain else reader._read_lines(split, position, line)
    return [(p, n, ln, rec if isinstance(rec, dict) else (rec.reason, rec.line, rec.detail))
            for p, n, ln, rec in itertools.islice(it, limit)]


@pytest.mark.parametrize(("bom", "orjson"), [(False, True), (True, True), (False, False)])
@pytest.mark.slow
def test_block_path_equals_line_path_on_every_split_and_resume_point(tmp_path: Path, bom: bool, orjson: bool,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if not orjson:  # the block path's other fast parser: the C scanner
        monkeypatch.setattr(jsonl, "_orjson_loads", None)
    path = tmp_path / "data.jsonl"
    lines = _lines(tmp_path)
    path.write_bytes((BOM if bom else b"") + b"".join(lines) + b'{"text": "last line, no newline"}')
    spec = SourceSpec(path=str(path), split_bytes=1 << 16, max_record_bytes=50_000)
    reader = JsonlReader(spec)
    splits = reader.splits(0, str(path))
    assert len(splits) > 4  # several byte-range splits, aligned to records
    for sp in splits:
        assert _items(reader, sp, sp.start, 0, True) == _items(reader, sp, sp.start, 0, False)
    whole = _items(reader, Split(0, str(path), size=path.stat().st_size), 0, 0, False)
    reasons = {rec[0] for _p, _n, _l, rec in whole if isinstance(rec, tuple)}
    assert {"bad_json", "empty", "missing_field", "not_string", "not_object", "too_large", "bad_utf8"} <= reasons
    # resume after any item, as FileSource does from its state; each compared over its next 1,000 items
    # (~130-200 KB: past the end of the plain path's first block, 64 KiB, into its second), not to the end of the file
    for p, n, ln, _rec in whole[::37]:
        sp = Split(0, str(path), size=path.stat().st_size)
        assert _items(reader, sp, n, ln, True, 1000) == _items(reader, sp, n, ln, False, 1000)
        assert p < n


def test_a_file_that_shrank_and_a_very_long_line(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    lines = _lines(tmp_path)
    path.write_bytes(b"".join(lines[:300]) + json.dumps({"text": "y" * (5 << 20)}).encode() + b"\n" + b"".join(lines[300:400]))
    reader = JsonlReader(SourceSpec(path=str(path)))
    planned = Split(0, str(path), size=path.stat().st_size + 1000)  # held more bytes when planned: it shrank
    plain, slow = _items(reader, planned, 0, 0, True), _items(reader, planned, 0, 0, False)
    assert plain == slow and plain[-1][3][0] == "truncated"
    assert any(isinstance(rec, dict) and len(rec["text"]) == 5 << 20 for *_x, rec in plain)


def _take_all(src: FileSource, sizes: list[int], batched: bool) -> tuple[list[tuple], list[dict], dict[str, int]]:
    """Every record a source's ``take`` gives at the chunk ``sizes`` (cycled), with the state after each take."""
    it = iter(src)
    if not batched:  # the item-at-a-time path the other readers take
        it.src.reader.read_batches = lambda *_a: None  # type: ignore[method-assign]
    recs: list[tuple] = []
    states: list[dict] = []
    for i in range(10_000):
        got = it.take(sizes[i % len(sizes)])
        recs.extend((r.key, r.epoch, r.data["text"]) for r in got)
        states.append(it.get_state())
        if not got:
            break
    return recs, states, dict(it.rejections.counts)


@pytest.mark.slow
def test_take_from_blocks_gives_the_records_and_states_of_the_item_path(tmp_path: Path) -> None:
    lines = _lines(tmp_path)
    for i, name in enumerate(["a.jsonl", "b.jsonl"]):
        (tmp_path / name).write_bytes(b"".join(lines[i * 2000:(i + 1) * 2500]))
    spec = SourceSpec(path=str(tmp_path / "*.jsonl"), split_bytes=1 << 16, max_record_bytes=50_000)

    def source() -> FileSource:
        return FileSource(spec, 0, seed=3, shuffle_splits=True, epochs=2)

    for sizes in ([1], [7, 300, 1], [5000]):
        fast, slow = _take_all(source(), sizes, True), _take_all(source(), sizes, False)
        assert fast == slow
        assert len(fast[0]) > 7000 and {"bad_json", "too_large", "bad_utf8"} <= set(fast[2])
    # resuming from any state the block path saved gives the same records as reading on
    recs, states, _ = _take_all(source(), [97], True)
    for n in (0, 5, 31, len(states) - 3):
        it = iter(source())
        it.set_state(states[n])
        assert [(r.key, r.epoch, r.data["text"]) for r in it.take(200)] == recs[97 * (n + 1):97 * (n + 1) + 200]


def test_take_from_blocks_stops_at_the_reject_limit_like_the_item_path(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_bytes(b"{not json}\n" * 3 + b'{"text": ""}\n' * 3 + b'{"text": "fine"}\n' * 5)
    for limit, raises in ((6, True), (7, False)):
        outcomes = []
        for batched in (True, False):
            src = FileSource(SourceSpec(path=str(tmp_path / "bad.jsonl")), 0, seed=0, shuffle_splits=False,
                             epochs=1, reject_limit=limit)
            try:
                outcomes.append(_take_all(src, [4], batched))
            except SourceError as e:
                outcomes.append(str(e))
        assert outcomes[0] == outcomes[1]
        assert isinstance(outcomes[0], str) == raises


@pytest.mark.parametrize("plain", [True, False])
def test_a_bom_files_first_record_starts_after_the_bom(tmp_path: Path, plain: bool) -> None:
    """The first record of a UTF-8 BOM file is at byte 3 and ends where its line ends: resuming
    after it reads the next record (it once re-read the first line's last 3 bytes as a bad line),
    and a one-record BOM file is not reported truncated."""
    path = tmp_path / "bom.jsonl"
    first, second = b'{"text": "first record"}\n', b'{"text": "second"}\n'
    path.write_bytes(BOM + first + second)
    reader = JsonlReader(SourceSpec(path=str(path)))
    whole = Split(0, str(path), size=path.stat().st_size)
    items = _items(reader, whole, 0, 0, plain)
    assert [(p, n, ln) for p, n, ln, _r in items] == [(3, 3 + len(first), 1), (3 + len(first), path.stat().st_size, 2)]
    assert _items(reader, whole, items[0][1], 1, plain) == items[1:]  # resume after the first: no rejection
    one = tmp_path / "one.jsonl"
    one.write_bytes(BOM + first)
    assert _items(reader, Split(0, str(one), size=one.stat().st_size), 0, 0, plain) == \
        [(3, 3 + len(first), 1, {"text": "first record"})]
    # a state saved when the first record of a BOM file was at byte 0 still resumes
    assert reader.fetch(str(path), [0, 3 + len(first)]) == {0: {"text": "first record"}, 3 + len(first): {"text": "second"}}


@pytest.mark.parametrize("bom", [False, True])
def test_fetch_reads_every_record_at_its_position_from_one_open_file(tmp_path: Path, bom: bool) -> None:
    """A restore fetches thousands of records by position: one open file, a seek per record, the
    records a streaming read gives (CRLF, non-ASCII, a line over max_record_bytes around them); a
    position where no record starts is a SourceError naming the file and byte."""
    import random

    path = tmp_path / "mixed.jsonl"
    path.write_bytes((BOM if bom else b"") + b"".join(_lines(tmp_path)))
    reader = JsonlReader(SourceSpec(path=str(path), max_record_bytes=50_000))
    whole = Split(0, str(path), size=path.stat().st_size)
    records = {p: rec for p, _n, _ln, rec in reader._read_lines(whole, 0, 0) if isinstance(rec, dict)}
    assert len(records) > 3700 and any(r["text"] == "crlf line" for r in records.values())
    wanted = [min(records), *random.Random(0).sample(sorted(records)[1:], 1500)]  # the first: after a BOM
    assert reader.fetch(str(path), wanted) == {p: records[p] for p in wanted}
    inside = min(records) + 2
    with pytest.raises(SourceError, match=f"no record at byte {inside}; the file changed"):
        reader.fetch(str(path), [min(records), inside])
