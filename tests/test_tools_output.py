"""export, pack and shard never destroy an input nor leave half-written output under a final name.

Real files, real subprocesses of the CLI, and a run killed with SIGKILL mid-write.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from feedline._records import records
from feedline._tools.export import export
from feedline._tools.shard import shard
from feedline.errors import SpecError

EXE = [sys.executable, "-m", "feedline"]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], input=stdin, capture_output=True, text=True, timeout=240)


def one_line_error(r: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    return r.stderr


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def visible(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if not p.name.startswith("."))


def clm(corpus: str, tok: str) -> dict[str, Any]:
    return {"sources": [corpus], "tokenizer": tok, "task": {"kind": "clm", "max_length": 32},
            "batching": {"strategy": "pad", "batch_size": 4}}


@pytest.fixture
def chat_file(tmp_path: Path) -> Path:
    p = tmp_path / "chats.jsonl"
    p.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                  {"role": "assistant", "content": f"a{i}"}]}) + "\n"
                         for i in range(5)))
    return p


# ------------------------------------------------------------------ item 16
@pytest.mark.slow
def test_pack_refuses_to_write_over_its_input(chat_file: Path) -> None:
    before = digest(chat_file)
    err = one_line_error(cli("pack", "-i", str(chat_file), "-o", str(chat_file), "-t", "no-such-tok", "-m", "64",
                             "-f", "jsonl"))
    assert "also an input" in err
    # The default format (arrow) turns the same command into "a folder named like the input".
    err = one_line_error(cli("pack", "-i", str(chat_file), "-o", str(chat_file), "-t", "no-such-tok", "-m", "64"))
    assert "input" in err
    # A folder packed into itself would put outputs beside (or over) its inputs.
    err = one_line_error(cli("pack", "-i", str(chat_file.parent), "-o", str(chat_file.parent), "-t", "x", "-m", "64",
                             "-f", "jsonl", "--overwrite"))
    assert "input" in err
    assert digest(chat_file) == before


# ------------------------------------------------------------------ item 17
def test_export_needs_overwrite_and_then_removes_stale_shards(tmp_path: Path, corpus: str, small_tokenizer: str) -> None:
    out = tmp_path / "out"
    m = export(clm(corpus, small_tokenizer), str(out), "jsonl", shard_rows=20)
    assert len(m["shards"]) > 2
    assert visible(out) == sorted([s["path"] for s in m["shards"]] + ["manifest.json"])
    with pytest.raises(SpecError, match="not empty.*--overwrite"):
        export(clm(corpus, small_tokenizer), str(out), "jsonl", shard_rows=1000)
    m2 = export(clm(corpus, small_tokenizer), str(out), "jsonl", shard_rows=1000, overwrite=True)
    assert [s["path"] for s in m2["shards"]] == ["examples-00000.jsonl"]
    assert visible(out) == ["examples-00000.jsonl", "manifest.json"]  # the old shards are gone
    assert json.loads((out / "manifest.json").read_text())["rows"] == m["rows"] == m2["rows"]
    # Files of other origins in the directory are never removed.
    (out / "notes.txt").write_text("mine")
    export(clm(corpus, small_tokenizer), str(out), "jsonl", shard_rows=50, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and "examples-00000.jsonl" in visible(out)


@pytest.mark.slow
def test_export_to_an_existing_file_is_one_line(tmp_path: Path, corpus: str, small_tokenizer: str) -> None:
    target = tmp_path / "out.arrow"
    target.write_bytes(b"keep")
    err = one_line_error(cli("export", "-", "-o", str(target), stdin=json.dumps(clm(corpus, small_tokenizer))))
    assert "existing file" in err and target.read_bytes() == b"keep"


@pytest.mark.slow
def test_killed_export_leaves_nothing_final_and_a_rerun_cleans_up(tmp_path: Path, corpus: str, small_tokenizer: str) -> None:
    out = tmp_path / "out"
    spec = json.dumps(clm(corpus, small_tokenizer))
    # A real process killed with SIGKILL after 60 rows (three shards of 20 started).
    code = ("import json, os, signal\n"
            "from feedline._tools import writers\n"
            "orig = writers.RowWriter.write\n"
            "n = [0]\n"
            "def write(self, row):\n"
            "    n[0] += 1\n"
            "    if n[0] == 60: os.kill(os.getpid(), signal.SIGKILL)\n"
            "    orig(self, row)\n"
            "writers.RowWriter.write = write\n"
            "from feedline._tools.export import export\n"
            f"export(json.loads({spec!r}), {str(out)!r}, 'jsonl', shard_rows=20, flush_rows=5)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    assert visible(out) == []  # no shard and no manifest under a final name
    leftovers = [p.name for p in out.iterdir()]
    assert leftovers and all(n.startswith(".feedline-tmp-") for n in leftovers)
    # The next run (no --overwrite needed: nothing final is there) removes the dead run's files.
    m = export(json.loads(spec), str(out), "jsonl", shard_rows=20)
    assert sorted(p.name for p in out.iterdir()) == sorted([s["path"] for s in m["shards"]] + ["manifest.json"])


@pytest.mark.slow
def test_shard_rerun_with_another_count_does_not_double_the_records(tmp_path: Path, corpus: str) -> None:
    out = tmp_path / "shards"
    first = shard([corpus], str(out), num_shards=4, seed=1)
    total = sum(first.records)
    err = one_line_error(cli("shard", corpus, "-o", str(out), "-n", "2"))
    assert "--overwrite" in err
    r = cli("shard", corpus, "-o", str(out), "-n", "2", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert visible(out) == ["shard-00000-of-00002.jsonl.zst", "shard-00001-of-00002.jsonl.zst"]
    assert len(list(records({"sources": [str(out)]}))) == total
    # Sharding into a folder inside the input folder would read its own output next time.
    err = one_line_error(cli("shard", corpus, "-o", os.path.join(corpus, "sub"), "-n", "2"))
    assert "input" in err
