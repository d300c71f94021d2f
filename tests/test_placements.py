"""Placement is not identity: the same partitions give the same batches and states on threads,
in worker processes and on Ray actors; processes survive a killed worker and never outlive the parent."""

from __future__ import annotations

import doctest
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from feedline import Loader, Spec
from feedline._core.cores import usable_cores
from feedline._partitions import processes, ring
from feedline._partitions.ring import HAS_RING
from feedline._pipeline import Pipeline
from feedline.testing import assert_batches_equal, assert_resumes_exactly, assert_stage_resumes, collect


def spec(corpus: str, tok: str, k: int, placement: str, **kw: Any) -> dict[str, Any]:
    """Processes without warm start, so that every batch comes from a worker (warm start: its own tests)."""
    parallel = {"placement": placement, "prefetch": 2, **({"warm_start": False} if placement == "processes" else {})}
    return {"sources": [corpus], "tokenizer": tok, "task": {"kind": "clm", "max_length": 48},
            "batching": {"strategy": "pack", "batch_size": 5, "window": 16, "first_window": 4}, "shuffle": {"buffer": 16},
            "partitions": k, "parallel": parallel, **kw}


def until_workers_serve(loader: Any, limit: int = 4000) -> list[dict[str, Any]]:
    """Batches of a warm-started processes loader until every partition is served by its worker."""
    got = [dict(next(loader))]
    placement = runner(loader)
    while placement.serving() != ["worker"] * placement.k:
        assert len(got) < limit, "the workers never took over from the threads"
        got.append(dict(next(loader)))
    return got


def runner(loader: Any) -> Any:
    """The placement under a loader: Prefetch (or Inline: partitions in processes) -> RankSlice -> GlobalStream -> Composed."""
    stage = loader._stage
    if hasattr(stage, "start"):
        stage.start()
    else:   # Inline: the composing stage is built in the caller's thread
        stage._ensure_parent()
    while stage._parent is None:
        time.sleep(0.01)
    return stage._parent.parent.parent.runner


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by a dead parent's init) is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.slow
def test_processes_give_the_batches_and_states_of_threads(corpus: str, small_tokenizer: str, k: int) -> None:
    a, sa = collect(Loader(spec(corpus, small_tokenizer, k, "threads")), with_states=True)
    b, sb = collect(Loader(spec(corpus, small_tokenizer, k, "processes", parallel={"placement": "processes", "processes": 2,
                                                                                  "warm_start": False})), with_states=True)
    assert len(a) > 10
    assert_batches_equal(a, b, f"K={k} threads vs processes")
    assert sa == sb


@pytest.mark.slow
def test_auto_is_processes_for_several_partitions(corpus: str, small_tokenizer: str) -> None:
    s = Spec.load({**spec(corpus, small_tokenizer, 2, "auto")})
    assert s.parallel.resolve(2) == "processes" and s.parallel.resolve(1) == "threads"
    loader = Loader(s)
    next(loader)
    assert type(runner(loader)).__name__ == "ProcessPlacement"
    loader.close()


@pytest.mark.slow
def test_processes_resume_exactly(corpus: str, small_tokenizer: str) -> None:
    s = spec(corpus, small_tokenizer, 2, "processes", epochs=1)
    assert assert_resumes_exactly(s, every=8, check=3, limit=16) >= 3   # (the tail's carried rows: test_partitions)
    assert assert_stage_resumes(Pipeline(s).batches(), max_steps=6, check=2, every=3) >= 3


@pytest.mark.slow
def test_warm_start_serves_from_threads_until_the_workers_take_over(corpus: str, small_tokenizer: str) -> None:
    """The first steps come from threads here; each worker starts where they were and drops what they gave."""
    warm = {"placement": "processes", "processes": 2, "prefetch": 2, "warm_start": True}
    loader = Loader(spec(corpus, small_tokenizer, 3, "processes", epochs=None, parallel=warm))
    got = until_workers_serve(loader)
    got += [dict(next(loader)) for _ in range(6)]
    placement = runner(loader)
    os.kill(placement.pids()[0], signal.SIGKILL)  # its partitions run here again until the new worker is ready
    while not placement.restarts[0]:   # (what it sent before dying is taken first)
        assert len(got) < 4000, "the killed worker was never restarted"
        got.append(dict(next(loader)))
    got += until_workers_serve(loader) + [dict(next(loader)) for _ in range(6)]
    loader.close()
    want = collect(Loader(spec(corpus, small_tokenizer, 3, "threads", epochs=None)), limit=len(got))
    assert_batches_equal(want, got, "warm start: threads, then workers, then threads and a new worker")


@pytest.mark.slow
def test_warm_start_auto_waits_for_the_workers_without_a_core_for_each(corpus: str, small_tokenizer: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``warm_start: auto`` serves from threads only where each worker has a core to start on beside
    two for the parent (the core counts of other machines are patched in: they cannot run here)."""
    assert doctest.testmod(processes).failed == 0
    for cores, workers, warm in [(2, 1, False), (2, 2, False), (4, 2, True), (16, 14, True), (16, 15, False)]:
        monkeypatch.setattr(processes, "usable_cores", lambda c=cores: c)
        assert processes.warm_start("auto", workers) is warm, (cores, workers)
        assert processes.warm_start(True, workers) and not processes.warm_start(False, workers)
    monkeypatch.undo()
    loader = Loader(spec(corpus, small_tokenizer, 2, "processes", parallel={"placement": "processes", "processes": 2}))
    next(loader)
    placement = runner(loader)
    assert placement.warm is (usable_cores() >= 4)
    if not placement.warm:   # every batch from a worker, none from a thread here
        assert all(stream.owner is None for stream in placement.streams.values())
    loader.close()


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.slow
def test_a_pipeline_that_cannot_start_in_a_worker_raises_its_own_error(small_tokenizer: str, tmp_path: Path,
                                                                       warm: bool) -> None:
    """A source path that does not exist fails the stream with the pipeline's SourceError naming
    the path, whether the partitions start here (warm) or only in their workers: a worker whose
    pipeline cannot be built reports it instead of dying (restarted, and blamed on the main guard)."""
    from feedline import SourceError

    missing = tmp_path / "missing.jsonl"
    s = spec(str(missing), small_tokenizer, 2, "processes", parallel={"placement": "processes", "warm_start": warm})
    loader = Loader(s)
    with pytest.raises(SourceError, match=f"{missing}: no such file"):
        next(loader)
    assert not any(runner(loader).restarts)
    loader.close()


@pytest.mark.slow
def test_a_killed_worker_is_restarted_from_its_partitions_states(corpus: str, small_tokenizer: str) -> None:
    s = spec(corpus, small_tokenizer, 3, "processes", parallel={"placement": "processes", "processes": 3, "warm_start": False})
    want = collect(Loader(spec(corpus, small_tokenizer, 3, "threads")))
    loader = Loader(s)
    got = [dict(next(loader)) for _ in range(4)]
    placement = runner(loader)
    victim = placement.pids()[1]
    os.kill(victim, signal.SIGKILL)
    got += collect(loader)
    assert placement.restarts[1] >= 1 and victim not in placement.pids()
    assert_batches_equal(want, got, "after a killed worker")
    loader.close()
    assert placement.pids() == []


CHILD = textwrap.dedent("""
    import signal, sys, time
    import feedline

    if __name__ == "__main__":
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
        loader = feedline.Loader(eval(sys.argv[1]))
        next(loader)
        stage = loader._stage
        try:  # entered before the pids are told: the test's Ctrl-C may follow them at once
            while len(stage._parent.parent.parent.runner.pids()) < 2:  # warm start: still starting
                time.sleep(0.02)
            print(" ".join(str(p) for p in stage._parent.parent.parent.runner.pids()), flush=True)
            time.sleep(120)
        except KeyboardInterrupt:
            loader.close()
            print("interrupted", flush=True)
""")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
@pytest.mark.slow
def test_no_worker_outlives_its_parent(corpus: str, small_tokenizer: str, tmp_path: Path, how: int) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    s = spec(corpus, small_tokenizer, 2, "processes", epochs=None, parallel={"placement": "processes", "warm_start": True})
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    child = subprocess.Popen([sys.executable, str(script), repr(s)], stdout=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    try:
        assert child.stdout is not None
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        os.killpg(child.pid, how) if how == signal.SIGINT else os.kill(child.pid, how)  # Ctrl-C reaches the group
        child.wait(timeout=60)  # a clean stop, not a deadline: on a loaded CI box workers take seconds to leave
        deadline = time.monotonic() + 15
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if alive(p)], "worker processes outlived their parent"
        if how == signal.SIGINT:
            assert child.returncode == 0 and "interrupted" in child.stdout.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.slow
def test_the_service_runs_the_same_partitions(corpus: str, small_tokenizer: str) -> None:
    from feedline.service import serve_process

    s = spec(corpus, small_tokenizer, 2, "processes")
    want, want_states = collect(Loader(s), with_states=True)
    src = str(Path(__file__).resolve().parents[1] / "src")
    with serve_process(s, env={"PYTHONPATH": src}) as address:
        loader = Loader(address)
        got, states = collect(loader, with_states=True)
        loader.close()
    assert_batches_equal(want, got, "service vs in-process, K=2")
    assert [st["pipeline"] for st in states] == [st["pipeline"] for st in want_states]



@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.slow
def test_processes_resume_at_random_points_from_states_of_threads(corpus: str, small_tokenizer: str, seed: int) -> None:
    import random

    want, states = collect(Loader(spec(corpus, small_tokenizer, 3, "threads", epochs=1)), with_states=True)
    at = random.Random(seed).randrange(1, len(want))   # any step, the tail's carried rows included
    loader = Loader(spec(corpus, small_tokenizer, 3, "processes", epochs=1), state=states[at - 1])
    got = collect(loader, limit=3)
    loader.close()
    assert_batches_equal(want[at:at + 3], got, f"processes resumed at step {at} from a threads state")


WORKER_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])  # a checkout put on the path by the script, not by PYTHONPATH
    import feedline
    assert feedline.__file__.startswith(sys.argv[1]), feedline.__file__
    if __name__ == "__main__":
        with feedline.Loader(eval(sys.argv[2])) as loader:
            for _ in range(6):
                next(loader)
""")


def _copy_that_marks_its_importers(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of feedline whose worker module notes the pid of each process that imports it."""
    import shutil

    import feedline

    copy = tmp_path / "checkout"
    shutil.copytree(Path(feedline.__file__).parent, copy / "feedline", ignore=shutil.ignore_patterns("__pycache__"))
    marks = tmp_path / "marks"
    worker_py = copy / "feedline" / "_partitions" / "worker.py"
    worker_py.write_text(worker_py.read_text() + f"\nimport os as _os\nopen({str(marks)!r}, 'a').write(f'{{_os.getpid()}}\\n')\n")
    (tmp_path / "run.py").write_text(WORKER_SCRIPT)
    return copy, marks


@pytest.mark.slow
def test_workers_run_the_parents_feedline_not_another_on_the_default_path(corpus: str, small_tokenizer: str,
                                                                          tmp_path: Path) -> None:
    """The fork server imports its preloads with the interpreter's default path (the installed
    feedline here): were feedline preloaded, the workers would run it, not the parent's copy."""
    copy, marks = _copy_that_marks_its_importers(tmp_path)
    s = spec(corpus, small_tokenizer, 2, "processes", epochs=None)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "run.py", str(copy), repr(s)], check=True, timeout=120, env=env, cwd=tmp_path)
    pids = set(marks.read_text().split())
    assert len(pids) >= 3, f"the workers imported another feedline: only {len(pids)} process(es) imported the copy"


@pytest.mark.slow
def test_workers_fork_with_feedline_imported_where_the_server_finds_the_same_copy(corpus: str, small_tokenizer: str,
                                                                                  tmp_path: Path) -> None:
    """With the copy on ``PYTHONPATH`` the fork server imports that very feedline, so it preloads it:
    the parent and the server import the worker module, and no worker imports it again."""
    copy, marks = _copy_that_marks_its_importers(tmp_path)
    s = spec(corpus, small_tokenizer, 2, "processes", epochs=None)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    subprocess.run([sys.executable, "run.py", str(copy), repr(s)], check=True, timeout=120, env=env, cwd=tmp_path)
    pids = marks.read_text().split()
    assert len(pids) == len(set(pids)) == 2, f"{len(pids)} imports of the worker module, in {len(set(pids))} processes"


@pytest.mark.slow
def test_a_script_without_a_main_guard_fails_at_once_naming_the_fix(corpus: str, small_tokenizer: str,
                                                                    tmp_path: Path) -> None:
    """Each worker runs the script's top level again: it must not start workers of its own (a
    process tree growing level by level) and the parent must not go on restarting it."""
    script = tmp_path / "train.py"
    s = spec(corpus, small_tokenizer, 2, "processes", epochs=None, parallel={"placement": "processes"})
    script.write_text(f"import time, feedline\nloader = feedline.Loader({s!r})\nt = time.monotonic()\n"
                      "while time.monotonic() - t < 90:\n    next(loader)\nprint('finished')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    t = time.monotonic()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 1 and "finished" not in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert "failed to start" in last and "if __name__ == '__main__':" in last, last
    assert "asked to start workers of its own" in out.stderr   # what each worker said, on stderr
    assert out.stderr.count("Traceback") <= 4, out.stderr[-3000:]   # the parent's and one per worker start
    assert time.monotonic() - t < 60


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.slow
def test_one_partition_in_a_worker_process_is_the_plain_loader_bit_for_bit(corpus: str, small_tokenizer: str,
                                                                          warm: bool) -> None:
    """``partitions: 1`` with ``placement: processes`` moves the pipeline out of this process (and
    its GIL) and changes nothing: the same batches, the same states (a plain loader's), and either
    resumes the other's."""
    plain = {k: v for k, v in spec(corpus, small_tokenizer, 1, "threads").items() if k not in ("partitions", "parallel")}
    off = {**plain, "parallel": {"placement": "processes", "prefetch": 2, "warm_start": warm}}
    loader = Loader(off)
    start = loader.state_dict()  # before any batch: the plain pipeline's start state
    assert start == Loader(plain).state_dict()
    a, sa = collect(Loader(plain), with_states=True)
    b, sb = collect(loader, with_states=True)
    assert len(a) > 10 and type(runner(loader)).__name__ == "ProcessPlacement"
    assert_batches_equal(a, b, "partitions: 1, processes vs in-process")
    assert sa == sb
    mid = len(a) // 2
    assert_batches_equal(a[mid:], collect(Loader(off, state=sa[mid - 1])), "in-process state, resumed in a process")
    assert_batches_equal(b[mid:], collect(Loader(plain, state=sb[mid - 1])), "process state, resumed in-process")


USER_MAPS = textwrap.dedent("""
    import sys


    def explode(rec):
        if rec["text"].startswith("Document 1-5:"):
            return {**rec, "text": rec["text"][1 / 0]}  # THE USER'S LINE
        return rec


    def leave(rec):
        if rec["text"].startswith("Document 1-5:"):
            sys.exit(3)
        return rec


    def interrupt(rec):
        if rec["text"].startswith("Document 1-5:"):
            raise KeyboardInterrupt
        return rec


    def dawdle(rec):
        if rec["text"].startswith("Document 1-5:"):
            import time
            time.sleep(2.5)
        return rec
""")


def user_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module of transforms, importable here and in the workers (their sys.path is the parent's)."""
    (tmp_path / "user_maps.py").write_text(USER_MAPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "user_maps.py"


def causes(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and len(chain) < 20:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


@pytest.mark.slow
def test_a_transform_that_raises_in_a_worker_shows_its_own_frame(corpus: str, small_tokenizer: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A pickled exception loses its traceback: the worker sends it formatted, and it comes back as the
    cause of the error raised here, with the user's file, line and function."""
    from feedline import TransformError
    from feedline._partitions import remote

    assert doctest.testmod(remote).failed == 0
    module = user_maps(tmp_path, monkeypatch)
    s = spec(corpus, small_tokenizer, 2, "processes", transforms=[{"map": "user_maps:explode"}])
    loader = Loader(s)
    with pytest.raises(TransformError, match=r"transforms\[0\] \(map user_maps:explode, \S+user_maps\.py:\d+\) raised ZeroDivisionError") as got:
        collect(loader)
    remote = [e for e in causes(got.value) if type(e).__name__ == "RemoteTraceback"]
    assert remote, f"no remote traceback in the chain: {causes(got.value)}"
    line = 1 + USER_MAPS.splitlines().index('        return {**rec, "text": rec["text"][1 / 0]}  # THE USER\'S LINE')
    assert f'File "{module}", line {line}, in explode' in str(remote[0]), str(remote[0])
    assert not any(runner(loader).restarts)
    loader.close()


@pytest.mark.parametrize("fn, what", [("leave", "SystemExit(3)"), ("interrupt", "KeyboardInterrupt()")])
@pytest.mark.slow
def test_sys_exit_in_a_workers_transform_is_an_error_naming_it_without_restarts(
        corpus: str, small_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fn: str, what: str) -> None:
    """It used to end the worker, which was restarted 3 times, and the stream failed blaming the main guard."""
    from feedline import TransformError

    user_maps(tmp_path, monkeypatch)
    loader = Loader(spec(corpus, small_tokenizer, 2, "processes", transforms=[{"map": f"user_maps:{fn}"}]))
    t = time.monotonic()
    with pytest.raises(TransformError, match=rf"part-001.jsonl:6: transforms\[0\] \(map user_maps:{fn}, \S+user_maps\.py:\d+\) raised "
                                             rf"{what.replace('(', '[(]').replace(')', '[)]')}"):
        collect(loader)
    assert not any(runner(loader).restarts) and time.monotonic() - t < 60
    loader.close()


def test_closing_a_loader_whose_worker_is_blocked_sending_through_the_pipe_is_prompt(corpus: str, small_tokenizer: str) -> None:
    """A consumer that keeps its batches fills its worker's shared-memory ring; the worker then sends
    the arrays through the pipe and, with nobody reading, blocks there. Closing the loader waited the
    5 s allowed for a stop, then killed it: the pipe is now shut once the stop is on it."""
    s = spec(corpus, small_tokenizer, 1, "processes", epochs=None, task={"kind": "clm", "max_length": 1024},
             batching={"strategy": "pack", "batch_size": 16, "window": 8})
    loader = Loader(s)
    kept = [next(loader) for _ in range(16)]   # 16 x 16 x 1024 int64 per array: more than the 4 MB ring
    worker = runner(loader).pids()[0]
    time.sleep(1.5)   # the worker sends what its credit allows, beyond what the pipe holds
    t = time.monotonic()
    loader.close()
    took = time.monotonic() - t
    assert took < 3, f"closing took {took:.1f} s"
    assert not alive(worker)
    del kept   # (held until the close)


@pytest.mark.skipif(not HAS_RING, reason="credit in shared memory (Linux)")
def test_a_worker_whose_wakes_are_lost_goes_on_after_a_heartbeat_and_says_so(
        corpus: str, small_tokenizer: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A worker out of credit sleeps until the parent's take that reaches the count it asked for sends
    a wake. Were a wake ever lost (a bug in that protocol), the worker slept forever while the parent
    waited for its batch: it now looks again after a heartbeat, goes on and says so."""
    from feedline._partitions.ring import RingReader

    monkeypatch.setattr(RingReader, "took", _counts_without_waking)   # this process: the parent
    want = collect(Loader(spec(corpus, small_tokenizer, 1, "threads", epochs=None)), limit=12)
    loader = Loader(spec(corpus, small_tokenizer, 1, "processes", epochs=None, parallel={
        "placement": "processes", "prefetch": 2, "warm_start": False, "hang_timeout": 60}))
    with caplog.at_level("WARNING", logger="feedline"):
        got = [dict(next(loader))]
        time.sleep(0.5)   # the worker uses its credit meanwhile and sleeps: it is woken by takes, or not at all
        t = time.monotonic()
        got += [dict(next(loader)) for _ in range(11)]
        took = time.monotonic() - t
    loader.close()
    assert_batches_equal(want, got, "with wakes lost")
    assert 0.4 <= took < 30, took   # a heartbeat's wait at least once (no take sent a wake)
    said = [r.getMessage() for r in caplog.records if "credit came without a wake" in r.getMessage()]
    assert said and "partitions [0]" in said[0] and "(pid " in said[0], caplog.text


def _counts_without_waking(self: Any, slot: int) -> bool:
    at = ring._SLOTS_AT + slot * ring._SLOT   # the parent's count of the partition's batches taken
    n = int.from_bytes(self.map[at:at + 8], "little") + 1
    self.map[at:at + 8] = n.to_bytes(8, "little")
    return False


@pytest.mark.slow
def test_a_stopped_worker_is_named_then_restarted_and_the_stream_resumes_exactly(
        corpus: str, small_tokenizer: str, caplog: pytest.LogCaptureFixture) -> None:
    """SIGSTOP froze the stream for as long as the worker stayed stopped, and nothing was logged.
    A live worker says so every beat; a silent one is named, then killed and restarted from its states."""
    parallel = {"placement": "processes", "processes": 2, "prefetch": 2, "warm_start": False, "hang_timeout": 2}
    s = spec(corpus, small_tokenizer, 2, "processes", epochs=None, parallel=parallel)
    want = collect(Loader(spec(corpus, small_tokenizer, 2, "threads", epochs=None)), limit=60)
    loader = Loader(s)
    got = [dict(next(loader)) for _ in range(10)]
    placement = runner(loader)
    victim = placement.pids()[1]
    os.kill(victim, signal.SIGSTOP)
    try:
        with caplog.at_level("WARNING", logger="feedline"):
            t = time.monotonic()
            got += [dict(next(loader)) for _ in range(50)]
            took = time.monotonic() - t
    finally:
        os.kill(victim, signal.SIGKILL) if alive(victim) else None
    named = [r.getMessage() for r in caplog.records if f"(pid {victim})" in r.getMessage()]
    assert named and "partitions [1]" in named[0] and "said nothing" in named[0], caplog.text
    assert placement.restarts[1] == 1 and victim not in placement.pids(), placement.restarts
    assert took < 30, f"the stream stalled {took:.0f} s"
    assert_batches_equal(want, got, "after a stopped worker was restarted")
    loader.close()


@pytest.mark.slow
def test_the_composing_process_loads_no_tokenizer_where_the_workers_encode(corpus: str, small_tokenizer: str) -> None:
    """With the partitions in workers, this process never encodes: the pad values (read only where
    rows of a short tail batch are joined) and a server's backend check used to load the tokenizer
    here anyway, after step 1 and before listening. The tail of a finite stream still joins (the
    tests above compare it with threads)."""
    from feedline._pipeline import Pipeline
    from feedline._service import server
    from feedline._tokenize.load import load_tokenizer

    load_tokenizer.cache_clear()
    s = spec(corpus, small_tokenizer, 2, "processes", epochs=None)
    loader = Loader(s)
    for _ in range(8):
        next(loader)
    time.sleep(0.5)  # (the pad values' thread, had it started)
    server._settle_backend(Pipeline(Spec.load(s)))
    assert load_tokenizer.cache_info().currsize == 0, "the composing process loaded the tokenizer"
    loader.close()


@pytest.mark.slow
def test_warm_start_makes_again_at_most_the_batch_a_thread_was_making(corpus: str, small_tokenizer: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """When a worker is ready, its partitions' threads here are cut: what they queued is handed out, the
    worker starts after the last of it, and the batch a thread was making is dropped (the worker makes
    it). The threads used to run on, prefetching, while the worker made again every batch they handed
    out meanwhile: those were dropped, and what they had prefetched too."""
    from feedline._core import prefetch

    handed: dict[int, int] = {}
    closed: list[tuple[int, int]] = []   # (made, handed) of each thread here that handed something out
    take, close = prefetch.Prefetch._take, prefetch.Prefetch.close

    def counting_take(self: Any, block: bool) -> Any:
        got = take(self, block)
        if got is not None:
            handed[id(self)] = handed.get(id(self), 0) + 1
        return got

    def recording_close(self: Any) -> None:
        if self.name.startswith("feedline-partition-") and handed.get(id(self)):
            closed.append((self.pulled, handed.pop(id(self))))
        close(self)

    monkeypatch.setattr(prefetch.Prefetch, "_take", counting_take)
    monkeypatch.setattr(prefetch.Prefetch, "close", recording_close)
    warm = {"placement": "processes", "processes": 2, "prefetch": 3, "warm_start": True}
    loader = Loader(spec(corpus, small_tokenizer, 2, "processes", epochs=None, parallel=warm))
    got = until_workers_serve(loader) + [dict(next(loader)) for _ in range(8)]
    loader.close()
    want = collect(Loader(spec(corpus, small_tokenizer, 2, "threads", epochs=None)), limit=len(got))
    assert_batches_equal(want, got, "warm start handed over without making a batch twice")
    assert closed and all(out <= made <= out + 1 for made, out in closed), closed


@pytest.mark.slow
def test_a_worker_alive_but_stuck_in_its_pipeline_is_named_not_killed(
        corpus: str, small_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Its heartbeat comes, so it is not silent; but the wait for its partition's batch is named
    (a transform that does not return), and the stream goes on when it does."""
    import re

    user_maps(tmp_path, monkeypatch)
    parallel = {"placement": "processes", "processes": 2, "prefetch": 2, "warm_start": False, "hang_timeout": 2}
    loader = Loader(spec(corpus, small_tokenizer, 2, "processes", epochs=1, parallel=parallel,
                         transforms=[{"map": "user_maps:dawdle"}]))
    with caplog.at_level("WARNING", logger="feedline"):
        got = collect(loader)
    placement = runner(loader)
    named = [m for m in (r.getMessage() for r in caplog.records) if "which is alive but sent none" in m]
    assert named and re.search(r"a batch of partition [01] from its worker process \(pid \d+\)", named[0]), caplog.text
    assert not any(placement.restarts)
    assert_batches_equal(collect(Loader(spec(corpus, small_tokenizer, 2, "threads", epochs=1))), got, "after the wait")
    loader.close()
