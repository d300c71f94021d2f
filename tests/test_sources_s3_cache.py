"""The S3 cache when its folder fails: real write failures and real SIGKILLs in child processes.

A write failure makes the cache step aside (every record still comes, from the store, with one
warning); a temporary left by a killed copy is removed by the next start and counts towards
``max_bytes`` while its writer lives.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import test_sources_s3 as base
from heavy import needs
from s3_server import S3Fixture
from test_sources_s3 import BUCKET, _docs, _put, _texts

pytestmark = needs("s3fs", "moto")

s3, _aws_env = base.s3, base._aws_env  # the server and the environment pointing at it (fixtures)

# The child: reads a spec's records with a cache, under a real failure chosen by argv[1]; prints them.
_CHILD = r"""
import json, logging, os, resource, signal, sys, time
mode, spec = sys.argv[1], json.loads(sys.argv[2])
import feedline, fsspec, s3fs  # before any limit: imports write no bytecode past it
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
folder = spec["sources"][0]["cache"]["dir"]
if mode == "fsize":  # a disk-full stand-in: no file of this process may grow past 256 KiB (EFBIG)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))
if mode == "readonly" and os.geteuid() == 0:  # root ignores modes: read as nobody, so that chmod bites
    os.setgid(65534)
    os.setuid(65534)
texts = []
for rec in feedline.records(spec):
    texts.append(rec["text"])
    if mode == "readonly" and len(texts) == 1500:  # mid-run, inside the second object
        os.chmod(folder, 0o500)
    if mode == "hang":
        print("copying", flush=True)
        time.sleep(120)
print(json.dumps(texts))
"""


def _child(mode: str, spec: dict[str, object]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _CHILD, mode, json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _run(mode: str, spec: dict[str, object]) -> tuple[list[str], str]:
    p = _child(mode, spec)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out), err


def _objects(s3: S3Fixture, prefix: str, n: int, docs: int) -> dict[str, object]:
    for i in range(n):
        _put(s3, f"{prefix}/{i}.jsonl", _docs(docs + i, f"{prefix}{i}"))
    return {"sources": [{"path": f"s3://{BUCKET}/{prefix}/"}]}


def _with_cache(spec: dict[str, object], folder: Path | str, max_bytes: int = 1 << 30) -> dict[str, object]:
    source = dict(spec["sources"][0])  # type: ignore[index]
    return {**spec, "sources": [{**source, "cache": {"dir": str(folder), "max_bytes": max_bytes}}]}


def _temporaries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.slow
def test_a_cache_that_cannot_grow_a_file_steps_aside_and_loses_nothing(s3: S3Fixture, tmp_path: Path) -> None:
    """RLIMIT_FSIZE (EFBIG past 256 KiB, SIGXFSZ ignored) stands in for a full disk: objects of
    ~280 KB fail mid-copy. Before, each was cut there and logged as "truncated"."""
    plain = _objects(s3, "full", 3, 2000)
    want = _texts(plain)
    got, err = _run("fsize", _with_cache(plain, tmp_path / "cache"))
    assert got == want and len(want) == 6003
    said = [line for line in err.splitlines() if "the cache steps aside" in line]
    assert len(said) == 1 and "EFBIG" in said[0] and str(tmp_path / "cache") in said[0], err[-2000:]
    assert "truncated" not in err
    assert list((tmp_path / "cache").iterdir()) == []  # the failed copy was dropped, nothing else written


@pytest.mark.slow
def test_a_cache_folder_turned_read_only_mid_run_loses_nothing(s3: S3Fixture) -> None:
    """The folder is chmod 500 after 1,500 records, while the second object or one read ahead is copied (as
    root the child drops to nobody first, so the mode bites: EACCES). The next start, with the
    folder writable again, removes the temporary the failed copy could not delete."""
    plain = _objects(s3, "readonly", 6, 1000)
    want = _texts(plain)
    base = tempfile.mkdtemp(prefix="feedline-ro-")
    try:
        os.chmod(base, 0o777)  # the child (perhaps nobody) makes the cache folder inside
        folder = Path(base) / "cache"
        got, err = _run("readonly", _with_cache(plain, folder))
        assert got == want and len(want) == 6015
        said = [line for line in err.splitlines() if "the cache steps aside" in line]
        assert len(said) == 1 and "EACCES" in said[0], err[-2000:]
        assert "truncated" not in err and "unreadable" not in err
        kept = [p for p in folder.iterdir() if not p.name.startswith(".")]
        assert 1 <= len(kept) < 6  # the copies made before the folder turned read-only (the reader reads ahead)
        os.chmod(folder, 0o700)
        from feedline._sources.cache import ObjectCache

        left = len(_temporaries(folder))
        assert ObjectCache(folder, 1 << 30).swept == left and _temporaries(folder) == []
        assert _texts(_with_cache(plain, folder)) == want  # and the cache serves again
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_temporaries_of_killed_copies_are_swept_and_count_towards_max_bytes(s3: S3Fixture, tmp_path: Path) -> None:
    """Three children are SIGKILLed mid-copy (before: three temporaries, never removed, not counted;
    the second child already found two). Each start removes the one left by the last; a live
    writer's temporary is never removed and counts towards max_bytes while it exists."""
    from feedline._sources.cache import ObjectCache
    from feedline._sources.remote import open_url

    folder = tmp_path / "cache"
    spec = _with_cache(_objects(s3, "killed", 1, 12000), folder)
    small = _put(s3, "killed-small/a.jsonl", _docs(200, "small"))
    small_size = len(_docs(200, "small"))
    for _ in range(3):
        p = _child("hang", spec)
        try:
            assert p.stdout is not None and p.stdout.readline() == "copying\n", p.stderr
            live = _temporaries(folder)
            assert len(live) == 1 and live[0].stat().st_size >= 1 << 20  # this child's copy, 1 MiB in
            # another process's start leaves a live copy alone, and counts it: a small object that would
            # fit alone is not kept beside it
            cache = ObjectCache(folder, small_size + (1 << 20) - 1)
            assert cache.swept == 0 and _temporaries(folder) == live
            with cache.open(small, lambda: open_url(small)) as f:
                assert len(f.read()) == small_size
            assert [p.name for p in folder.iterdir() if not p.name.startswith(".")] == []
        finally:
            p.send_signal(signal.SIGKILL)
            p.communicate(timeout=60)
        assert len(_temporaries(folder)) == 1  # at most one survives: the next start sweeps it
    cache = ObjectCache(folder, small_size + (1 << 20) - 1)
    assert cache.swept == 1 and _temporaries(folder) == []
    with cache.open(small, lambda: open_url(small)) as f:
        f.read()
    assert [p.stat().st_size for p in folder.iterdir()] == [small_size]  # with the dead one gone, it fits


@pytest.mark.slow
def test_a_full_disk_makes_the_cache_step_aside(s3: S3Fixture, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A real ENOSPC: the cache folder on a 512 KiB tmpfs, objects of ~280 KB (root only: mounting
    needs it; elsewhere the RLIMIT_FSIZE test above stands in)."""
    import logging

    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        plain = _objects(s3, "nospace", 3, 2000)
        want = _texts(plain)
        with caplog.at_level(logging.WARNING, logger="feedline"):
            assert _texts(_with_cache(plain, folder / "cache")) == want
        said = [r.getMessage() for r in caplog.records if "the cache steps aside" in r.getMessage()]
        assert len(said) == 1 and "ENOSPC" in said[0], said
        assert not any("truncated" in r.getMessage() for r in caplog.records)
        kept = [p.name for p in (folder / "cache").iterdir()]
        assert len(kept) == 1 and not kept[0].startswith(".")  # the first object (~280 KB) fitted; no partial copy
    finally:
        subprocess.run(["umount", str(folder)], check=False)
