"""``feedline shard``: every record once, shuffled, deterministic by seed, readable as a source."""

from __future__ import annotations

import json
from pathlib import Path

from feedline._cli.__main__ import main
from feedline._records import records
from feedline._tools.shard import shard
from feedline.testing import make_corpus


def _texts(paths: list[str]) -> list[str]:
    return [r["text"] for p in paths for r in records({"sources": [p]})]


def test_shards_hold_every_record_once_and_are_deterministic(tmp_path: Path) -> None:
    inputs = make_corpus(tmp_path / "in", files=3, docs=50, fmt="jsonl.zst")
    (tmp_path / "in" / "extra.txt").write_text("plain line one\n\nplain line two\n")
    src = [str(tmp_path / "in" / "*.jsonl.zst"), str(tmp_path / "in" / "extra.txt")]
    a = shard(src, str(tmp_path / "a"), num_shards=4, seed=3)
    b = shard(src, str(tmp_path / "b"), num_shards=4, seed=3)
    c = shard(src, str(tmp_path / "c"), num_shards=4, seed=4)
    original = [*_texts(inputs), "plain line one", "plain line two"]
    got = _texts(a.files)
    assert sorted(got) == sorted(original) and got != original
    assert [Path(f).read_bytes() for f in a.files] == [Path(f).read_bytes() for f in b.files]
    assert _texts(c.files) != got
    assert sum(a.records) == 152 and all(n > 0 for n in a.records)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [f"shard-{i:05d}-of-00004.jsonl.zst" for i in range(4)]


def test_shard_keeps_fields_counts_rejections_and_cli(tmp_path: Path, capsys: object) -> None:
    (tmp_path / "b.txt").write_text("S one.\nS two.\n\nT one.\n")
    (tmp_path / "x.jsonl").write_text('{"text": "ok", "label": 2}\n{broken\n')
    rep = shard([str(tmp_path / "x.jsonl")], str(tmp_path / "o"), num_shards=1)
    assert rep.rejected == {"bad_json": 1}
    assert [r["label"] for r in records({"sources": rep.files})] == [2]
    assert main(["shard", str(tmp_path / "b.txt"), "--format", "bert", "-o", str(tmp_path / "s"), "-n", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    sents = sorted(tuple(r["sentences"]) for r in records({"sources": out["files"]}))
    assert sents == [("S one.", "S two."), ("T one.",)] and out["total"] == 2
