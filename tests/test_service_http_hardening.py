"""The HTTP gateway across pauses, restarts and hostile connections: real `feedline serve --http` processes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from service_helpers import http_get, make_spec, start_http, stop_http, tokenizer_path, write_spec

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# corpus, spec and GPT-2 tokenizer are set up once, not once a worker.
pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("service_http_hardening")]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("http-hard")
    spec = make_spec(tmp, tokenizer_path(tmp), docs=60)
    return {"tmp": tmp, "spec": spec, "path": write_spec(tmp / "train.json", spec)}


def _steps(url: str, n: int | None = None, **kw: Any) -> list[int]:
    """The steps of the next ``n`` GETs (all of them until 204 when ``n`` is None)."""
    out: list[int] = []
    while n is None or len(out) < n:
        status, headers, body = http_get(f"{url}/?stream=train", **kw)
        if status == 204:
            break
        assert status == 200, body[:300]
        out.append(int(headers["X-Feedline-Step"]))
    return out


@pytest.mark.slow
def test_a_pause_longer_than_the_lease_repeats_no_batch(env: dict[str, Any]) -> None:
    proc, url = start_http(env["path"], "--http", "127.0.0.1:0", "--lease", "2")
    try:
        first = _steps(url, 1)
        time.sleep(3.0)   # the gateway held the next 4 batches; their 2 s leases would have run out
        rest = _steps(url)
        stats = json.loads(http_get(f"{url}/stats")[2])
    finally:
        stop_http(proc)
    steps = first + rest
    assert steps == list(range(1, len(steps) + 1)), f"repeated or lost: {steps}"
    assert len(steps) >= 8 and stats["server"]["streams"]["train"]["shared"]["lease_expired"] == 0


@pytest.mark.slow
def test_a_given_back_batch_keeps_its_age_across_a_pause_longer_than_the_lease(env: dict[str, Any]) -> None:
    """Two GETs at once: the first one's client is slow and hangs up after the second was served, so its
    batch is given back when the feed's other credits are young. The feed still gives it back to the
    server before its lease runs out (its age counts from its own grant), so over a pause longer
    than the lease no lease expires, and every step goes out exactly once."""
    from feedline._service.http_feed import StreamFeed
    from feedline._service.options import ServerOptions
    from feedline._service.server import Server
    from feedline._service.streams import load_streams

    server = Server(load_streams(env["spec"]), ServerOptions(bind="tcp://127.0.0.1:0", lease=2.0))
    thread = threading.Thread(target=server.serve, daemon=True)
    feed = StreamFeed(server.bind(), "train", keys=None, prefetch=2, timeout=30.0, hold=1.0)
    thread.start()
    try:
        slow, served = feed.take(), feed.take()
        assert slow is not None and served is not None
        time.sleep(1.4)
        assert not feed.release_stale()   # a GET is being served: nothing is given back under it
        feed.ack(served)                  # a young credit ...
        feed.giveback(slow)               # ... and a batch granted 1.4 s ago, back at the front
        steps, released_at = [served.step], None
        pause_end = time.monotonic() + 2.7   # longer than the lease; the gateway checks every lease / 8
        while time.monotonic() < pause_end:
            if feed.release_stale() and released_at is None:
                released_at = time.monotonic()
            time.sleep(0.25)
        assert released_at is not None and released_at < pause_end - 2.0, "the given-back batch was held too long"
        while (d := feed.take()) is not None:
            steps.append(d.step)
            feed.ack(d)
        queue = server.dispatcher.queues["train"]   # type: ignore[union-attr]
        assert queue.lease_expired == 0 and feed.released == 1
    finally:
        feed.close()
        feed.executor.shutdown()
        server.stop()
        thread.join(timeout=30)
    assert sorted(steps) == list(range(1, feed.ended_at + 1)) and len(steps) >= 8, f"repeated or lost: {steps}"


def _file_step(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["streams"]["train"]["step"])
    except FileNotFoundError:
        return None


@pytest.mark.slow
def test_kill_9_and_restart_with_state_continues_after_the_acked_step(env: dict[str, Any], tmp_path: Path) -> None:
    import feedline
    from feedline.testing import collect

    ref = collect(feedline.Loader(env["spec"]))
    state = tmp_path / "serve-state.json"
    proc, url = start_http(env["path"], "--http", "127.0.0.1:0", "--state", str(state))
    try:
        assert _steps(url, 5) == [1, 2, 3, 4, 5]
        deadline = time.monotonic() + 10
        while _file_step(state) != 5:   # the acks of the written responses reach the file
            assert time.monotonic() < deadline, f"the state file says step {_file_step(state)}, not 5"
            time.sleep(0.02)
    finally:
        proc.kill()   # kill -9: no drain, no bye
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert not list(tmp_path.glob(".*tmp")), "a temporary state file was left behind"
    proc, url = start_http(env["path"], "--http", "127.0.0.1:0", "--state", str(state))
    try:
        status, headers, body = http_get(f"{url}/?stream=train")
        assert status == 200 and headers["X-Feedline-Step"] == "6"
        got = json.loads(body)
        for k, v in ref[5].items():
            assert got[k] == v.tolist(), k
        rest = _steps(url)
    finally:
        stop_http(proc)
    assert [6, *rest] == list(range(6, len(ref) + 1))
    assert _file_step(state) == len(ref)


def test_a_state_file_is_checked_against_the_streams(env: dict[str, Any], tmp_path: Path) -> None:
    from feedline._service.statefile import StateFile
    from feedline._service.streams import load_streams
    from feedline.errors import SpecError, StateError

    h = load_streams(env["spec"])["train"].spec.hash()
    f = StateFile(tmp_path / "s.json", {"train": h})
    assert f.load() == {}
    f.save({"train": json.dumps({"version": 1, "spec_hash": h, "step": 3, "world_size": 1, "pipeline": {}})})
    assert json.loads((tmp_path / "s.json").read_text())["streams"]["train"]["step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
    with pytest.raises(StateError, match="s.json.*saved under spec"):
        StateFile(tmp_path / "s.json", {"train": "0123"}).load()
    with pytest.raises(StateError, match="stream 'train'.*does not serve"):
        StateFile(tmp_path / "s.json", {"val": h}).load()
    (tmp_path / "s.json").write_text('{"feedline_server_state": 1, "streams": {"train": {"step": NaN}}}')
    with pytest.raises(StateError, match="s.json"):
        f.load()
    (tmp_path / "s.json").write_text("[1, 2]")
    with pytest.raises(SpecError, match="not a feedline state file"):
        f.load()


def _serve_in_thread(spec: Any, state: Path) -> tuple[Any, threading.Thread, str]:
    from feedline._service.options import ServerOptions
    from feedline._service.server import Server
    from feedline._service.streams import load_streams

    server = Server(load_streams(spec), ServerOptions(bind="tcp://127.0.0.1:0", state=str(state), drain_timeout=5.0))
    address = server.bind()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    return server, thread, address


def _shared_steps(address: str, n: int | None = None) -> list[int]:
    """The steps a shared-mode consumer (the gateway's) takes and acks: ``n``, or all of them."""
    from feedline._service.http_feed import StreamFeed

    feed = StreamFeed(address, "train", keys=None, prefetch=4, timeout=30.0)
    steps: list[int] = []
    try:
        while len(steps) != n and (d := feed.take()) is not None:
            steps.append(d.step)
            feed.ack(d)
    finally:
        feed.close()
        feed.executor.shutdown()
    return steps


def test_the_state_file_is_written_per_tick_and_before_goodbye_not_per_ack(env: dict[str, Any], tmp_path: Path) -> None:
    """The event loop writes ``--state`` at most once per tick (a second) and once when it stops, never
    per ack; the last write, before the goodbye, holds the last acked step."""
    state = tmp_path / "serve-state.json"
    server, thread, address = _serve_in_thread(env["spec"], state)
    try:
        t0 = time.monotonic()
        steps = _shared_steps(address)
        elapsed = time.monotonic() - t0
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 20
        saves = server._statefile.saves
        assert saves <= elapsed + 2, f"{saves} writes of the state file for {len(steps)} acks in {elapsed:.1f}s"
    finally:
        server.stop()
        thread.join(timeout=30)
    assert not thread.is_alive() and _file_step(state) == len(steps)
    assert server._statefile.saves <= saves + 1


def test_a_state_saved_under_the_earlier_hash_of_the_spec_resumes(env: dict[str, Any], tmp_path: Path) -> None:
    """``--state`` accepts every hash the spec accepts (``Spec.accepted_hashes``: an earlier release's
    too), as ``Loader(state=...)`` does; a client given the spec accepts such a state as well."""
    from feedline._service.client import RemoteLoader
    from feedline._service.statefile import StateFile
    from feedline._spec import Spec

    path = env["tmp"] / "relative.json"   # sources relative to the spec file: the earlier hash differs
    path.write_text(json.dumps({**env["spec"], "sources": [{"path": "train/*.jsonl"}]}))
    current, legacy = Spec.load(str(path)).accepted_hashes()
    state = tmp_path / "serve-state.json"
    server, thread, address = _serve_in_thread(str(path), state)
    try:
        assert _shared_steps(address, 3) == [1, 2, 3]
    finally:
        server.stop()
        thread.join(timeout=30)
    doc = json.loads(state.read_text())
    assert doc["streams"]["train"]["spec_hash"] == current and doc["streams"]["train"]["step"] == 3
    doc["streams"]["train"]["spec_hash"] = legacy   # as the first releases wrote it
    state.write_text(json.dumps(doc))
    assert StateFile(state, {"train": (current, legacy)}).load()["train"]["step"] == 3
    single = tmp_path / "one-state.json"   # one state, as GET /state gives it
    single.write_text(json.dumps(doc["streams"]["train"]))
    assert list(StateFile(single, {"train": (current, legacy)}).load()) == ["train"]
    RemoteLoader(address, mode="shared", state=doc["streams"]["train"], spec=str(path)).close()
    server, thread, address = _serve_in_thread(str(path), state)
    try:
        assert _shared_steps(address, 2) == [4, 5]
    finally:
        server.stop()
        thread.join(timeout=30)
    assert _file_step(state) == 5


def _low_fd_limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))   # the hard limit too: serve cannot raise it


def _connected(socks: list[Any], at_least: int, within: float) -> int:
    """Wait until ``at_least`` of the non-blocking ``socks`` are connected (or ``within`` seconds passed)."""
    import select

    deadline, done = time.monotonic() + within, 0
    while time.monotonic() < deadline:
        _, writable, _ = select.select([], socks, [], 0.2)
        done = len(writable)
        if done >= at_least:
            break
    return done


@pytest.mark.slow
def test_slow_and_idle_sockets_starve_neither_authorized_gets_nor_zeromq_trainers(env: dict[str, Any],
                                                                                   tmp_path: Path) -> None:
    import socket
    import threading

    import numpy as np

    import feedline

    token = "s3cret-token-0123456789"
    (tmp_path / "token").write_text(token)
    err = (tmp_path / "stderr").open("w")
    proc, url = start_http(env["path"], "--http", "127.0.0.1:0", "--http-token-file", str(tmp_path / "token"),
                           "--http-header-timeout", "3", stderr=err, preexec_fn=_low_fd_limit)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    hostile: list[socket.socket] = []
    try:
        for _ in range(300):   # more than the server's 256 descriptors, connecting at once
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((host, int(port)))
            hostile.append(s)
        _connected(hostile, at_least=250, within=10.0)   # a small accept queue makes the kernel retry some
        for i, s in enumerate(hostile):   # silent, half a header, or a whole one without the token
            try:
                s.send([b"", b"GET /?stream=train HTTP/1.1\r\nHost: x\r\n",
                        b"GET /?stream=train HTTP/1.1\r\nHost: x\r\n\r\n"][i % 3])
            except OSError:   # not connected yet (the server's accept queue was full: the kernel retries)
                pass
        got: list[int] = []

        def train() -> None:
            with feedline.Loader(proc.address, timeout=10, reconnect=10) as loader:   # type: ignore[attr-defined]
                for b in loader:
                    got.append(int(np.asarray(b["input_ids"]).shape[0]))
                    if len(got) == 3:
                        return

        trainer = threading.Thread(target=train, daemon=True)
        trainer.start()
        t0 = time.monotonic()
        assert _steps(url, 3, token=token, timeout=10) == [1, 2, 3]
        get_s = time.monotonic() - t0
        trainer.join(20)
        assert len(got) == 3, "the ZeroMQ trainer starved"
        assert http_get(f"{url}/?stream=train", timeout=10)[0] == 401   # and a token is still needed
        deadline = time.monotonic() + 5
        while True:   # the kernel hands the server the last hostile connections over a few seconds
            stats = json.loads(http_get(f"{url}/stats", token=token, timeout=10)[2])["http"]["connections"]
            turned_away = stats["evicted"] + stats["timed_out"] + stats["unauthorized"]
            if turned_away >= 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for s in hostile:   # (else one of them connecting late could evict the two below)
            s.close()
        silent = socket.create_connection((host, int(port)), timeout=10)
        huge = socket.create_connection((host, int(port)), timeout=10)
        huge.sendall(b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * (17 << 10))
        assert huge.recv(64).startswith(b"HTTP/1.1 431")
        assert silent.recv(64).startswith(b"HTTP/1.1 408")   # after --http-header-timeout 3
        silent.close()
        huge.close()
    finally:
        for s in hostile:
            s.close()
        stop_http(proc)
        err.close()
    # how many hostile connections get through the kernel's full accept queue varies with the load
    assert get_s < 10 and stats["max"] == 64 and stats["peak_open"] <= 64, stats
    assert turned_away >= 50 and stats["unauthorized"] >= 10, stats
    logged = (tmp_path / "stderr").read_text(errors="replace")
    assert len(logged) < 64 << 10, f"the server logged without bound: {logged[:3000]}"


def test_a_flood_of_one_message_is_logged_a_few_times_then_counted() -> None:
    import logging

    from feedline._service.lograte import RateLimit

    now = [0.0]
    f = RateLimit(burst=3, period=10.0, clock=lambda: now[0])
    rec = [logging.LogRecord("asyncio", logging.ERROR, "x", 1, "accept failed: %s", ("EMFILE",), None)
           for _ in range(1000)]
    assert sum(f.filter(r) for r in rec) == 3 and f.suppressed == 997
    now[0] = 11.0
    later = logging.LogRecord("asyncio", logging.ERROR, "x", 1, "accept failed: %s", ("EMFILE",), None)
    assert f.filter(later) and "997 similar messages suppressed" in later.getMessage()
    other = logging.LogRecord("asyncio", logging.ERROR, "x", 1, "another message", (), None)
    assert f.filter(other)
