"""A partition worker runs its pipeline on its main thread: it has no thread that the same pipeline
in this process would not have, besides two that sleep (its heartbeat and its watch on the parent)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from feedline import Loader
from feedline.testing import assert_batches_equal, collect

SEEN = textwrap.dedent("""
    import json, os, threading

    LOG = {log!r}

    def seen(rec):
        with open(LOG, "a") as f:
            f.write(json.dumps([os.getpid(), threading.current_thread().name,
                                sorted(t.name for t in threading.enumerate())]) + "\\n")
        return rec
""")


@pytest.mark.slow
def test_a_workers_pipeline_runs_on_its_main_thread_with_no_thread_of_the_wing(
        corpus: str, small_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each partition ran on a thread of its own in its worker, and one more read the parent's
    messages: 3 Python threads handing batches over, contending for the worker's GIL with the pipeline's."""
    log = tmp_path / "seen.jsonl"
    (tmp_path / "seen_map.py").write_text(SEEN.format(log=str(log)))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"sources": [corpus], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 48},
            "batching": {"strategy": "pack", "batch_size": 5}, "transforms": [{"map": "seen_map:seen"}]}
    want = collect(Loader(spec))
    in_process = {name for line in log.read_text().splitlines() for name in json.loads(line)[2]}
    log.unlink()
    got = collect(Loader({**spec, "parallel": {"placement": "processes", "warm_start": False}}))
    assert_batches_equal(got, want)
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert seen and {thread for _pid, thread, _all in seen} == {"MainThread"}, seen[:3]
    extra = {name for *_, names in seen for name in names} - in_process - {"MainThread"}
    assert extra == {"feedline-parent-watch", "feedline-worker-beat"}, extra
