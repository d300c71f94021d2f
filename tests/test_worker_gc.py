"""A worker process tunes its own garbage collector (worker.py), and never the caller's."""

from __future__ import annotations

import gc
import os
import textwrap
from pathlib import Path

import pytest

from feedline import Loader
from feedline._partitions.worker import GC_YOUNG

PROBE = textwrap.dedent("""
    import gc, os
    from pathlib import Path

    OUT = Path(__file__).with_suffix(".seen")


    def probe(rec):
        with OUT.open("a") as f:   # where this record is made: its process and its collector's settings
            f.write(f"{os.getpid()} {gc.get_threshold()[0]} {gc.get_freeze_count()}\\n")
        return rec
""")


@pytest.mark.parametrize("k", [1, 2])
def test_a_worker_freezes_what_lives_after_its_first_batch_and_collects_the_young_less_often(
        corpus: str, small_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    (tmp_path / "gc_probe.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))   # (the workers' sys.path is this process's)
    threshold, frozen_here = gc.get_threshold(), gc.get_freeze_count()
    spec = {"sources": [corpus], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 48},
            "batching": {"strategy": "pack", "batch_size": 2, "window": 2, "first_window": 1}, "partitions": k, "transforms": [{"map": "gc_probe:probe"}],
            "parallel": {"placement": "processes", "prefetch": 2, "warm_start": False}}
    with Loader(spec) as loader:
        batches = sum(1 for _ in loader)
    assert batches > 2
    seen = [line.split() for line in (tmp_path / "gc_probe.seen").read_text().splitlines()]
    workers = {pid for pid, _, _ in seen}
    assert str(os.getpid()) not in workers and 1 <= len(workers) <= k   # every record made in a worker
    assert {int(young) for _, young, _ in seen} == {GC_YOUNG}
    for pid in workers:   # frozen once its partitions made a batch: the records after it see it
        frozen = [int(n) for p, _, n in seen if p == pid]
        assert frozen[-1] > 1000, frozen[-5:]
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, frozen_here)   # the caller's process: untouched
