"""The loader service end to end: real `feedline serve` processes and real sockets on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

import feedline
from feedline._cli.commands.stats import fetch_stats
from feedline._service.auth import generate_keys
from feedline._service.protocol import PROTOCOL_VERSION, pack, unpack_header
from feedline.errors import AuthError, ProtocolError, SpecError, StateError, TransportTimeout
from feedline.testing import assert_batches_equal, collect
from service_helpers import free_port, make_spec, rows, rss_kb, start_server, stop, tokenizer_path, write_spec

FAST = ["--heartbeat", "0.2", "--timeout", "1.5"]
# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# served stream (a feedline serve process, its tokenizer and first batches) and fixtures start once, not once a worker.
pytestmark = [pytest.mark.timeout(90), pytest.mark.xdist_group("service")]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("service")
    tok = tokenizer_path(tmp)
    spec = make_spec(tmp, tok)
    val = make_spec(tmp, tok, name="val", docs=12, seed=9)
    return {"tmp": tmp, "spec": spec, "path": write_spec(tmp / "train.json", spec), "val": val,
            "val_path": write_spec(tmp / "val.json", val)}


@pytest.fixture(scope="module")
def server(env: dict[str, Any]) -> Any:
    proc, address = start_server(env["path"], *FAST, "--stream", f"validation={env['val_path']}",
                                 "--metrics-port", "0")
    yield proc, address
    stop(proc)


def reference(spec: dict[str, Any], rank: int = 0, world_size: int = 1, state: Any = None) -> tuple[list, list]:
    loader = feedline.Loader(spec, rank, world_size, state=state)
    try:
        return collect(loader, with_states=True)
    finally:
        loader.close()


def consume_ranks(loaders: list[Any], steps: int | None = None) -> tuple[list[list], list[list]]:
    """Round-robin over the ranks (as lockstep trainers do) until the end or ``steps`` steps."""
    its = [iter(lo) for lo in loaders]
    batches: list[list] = [[] for _ in loaders]
    states: list[list] = [[] for _ in loaders]
    while steps is None or len(batches[0]) < steps:
        got = [next(it, None) for it in its]
        if got[0] is None:
            assert all(g is None for g in got), "ranks ended at different steps"
            break
        for r, (b, lo) in enumerate(zip(got, loaders)):
            batches[r].append({k: np.array(v) for k, v in b.items()})
            states[r].append(json.loads(json.dumps(lo.state_dict())))
    return batches, states


@pytest.mark.slow
def test_one_client_gets_the_in_process_batches_and_states(env: dict, server: Any) -> None:
    _, address = server
    want, want_states = reference(env["spec"])
    with feedline.Loader(address, 0, 1) as loader:
        assert loader.state_dict() == json.loads(json.dumps(feedline.Loader(env["spec"]).state_dict()))
        got, got_states = collect(loader, with_states=True)
        assert loader.step == len(want)
    assert len(want) > 5
    assert_batches_equal(want, got, "remote W=1")
    assert got_states == want_states


def test_four_ranks_reassemble_the_global_stream(env: dict, server: Any) -> None:
    _, address = server
    loaders = [feedline.Loader(address, r, 4, prefetch=2) for r in range(4)]
    try:
        got, states = consume_ranks(loaders)
    finally:
        for lo in loaders:
            lo.close()
    global_batches, _ = reference(env["spec"])
    assert len(got[0]) == len(global_batches)
    for step, full in enumerate(global_batches):
        merged = {k: np.concatenate([got[r][step][k] for r in range(4)]) for k in full}
        assert rows(merged) == rows(full), f"step {step + 1}: rank slices do not reassemble the global batch"
    for r in range(4):
        want, want_states = reference(env["spec"], r, 4)
        assert_batches_equal(want, got[r], f"rank {r}")
        assert states[r] == want_states
        assert states[r] == [{**s, "world_size": 4} for s in states[0]]  # one global state for every rank


def test_resume_from_a_remote_state_elsewhere_and_with_another_world_size(env: dict, server: Any) -> None:
    _, address = server
    with feedline.Loader(address, 2, 4) as loader:
        collect(loader, limit=3)
        state = loader.state_dict()
    assert state["step"] == 3 and state["world_size"] == 4
    loaders = [feedline.Loader(address, r, 2, state=state) for r in range(2)]   # ranks run in lockstep
    try:
        got, got_states = consume_ranks(loaders)
    finally:
        for lo in loaders:
            lo.close()
    for r in range(2):
        want, want_states = reference(env["spec"], r, 2, state=state)   # in-process, W=2
        assert_batches_equal(want, got[r], f"elastic resume W=4 -> 2, rank {r}")
        assert got_states[r] == want_states


def test_named_stream_unknown_stream_and_mismatches_are_refused(env: dict, server: Any) -> None:
    _, address = server
    want, _ = reference(env["val"])
    with feedline.Loader(address, stream="validation") as loader:
        assert_batches_equal(want, collect(loader), "validation stream")
    with pytest.raises(SpecError, match="no stream named 'test'.*train, validation"):
        first(feedline.Loader(address, stream="test"))
    with pytest.raises(SpecError, match="expects spec"):
        first(feedline.Loader(address, spec=env["val"]))
    val_state = feedline.Loader(env["val"]).state_dict()
    with pytest.raises(StateError, match="saved under spec"):
        first(feedline.Loader(address, state=val_state))
    with pytest.raises(SpecError, match="not a multiple"):
        first(feedline.Loader(address, 0, 3))


@contextlib.contextmanager
def served(spec_path: str, *args: str) -> Iterator[str]:
    """``feedline serve`` for the block (its address), then SIGKILLed: the tests that use it assert nothing of
    a server's stop, and serve_process's SIGTERM and drain took ~1 s a test."""
    proc, address = start_server(spec_path, *args)
    try:
        yield address
    finally:
        stop(proc)


def first(loader: Any) -> Any:
    try:
        return next(iter(loader))
    finally:
        loader.close()


def raw_socket(address: str) -> tuple[zmq.Context, zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return ctx, sock


def test_protocol_version_mismatch_gets_a_clear_error(server: Any) -> None:
    _, address = server
    ctx, sock = raw_socket(address)
    try:
        sock.send(pack("hello", v=99, stream="train", rank=0, world_size=1))
        assert sock.poll(5000)
        h = unpack_header(sock.recv())
        assert h["op"] == "error" and h["kind"] == "ProtocolError"
        assert "protocol version 99" in h["message"] and f"speaks {PROTOCOL_VERSION}" in h["message"]
    finally:
        sock.close()
        ctx.term()


def test_a_client_refuses_a_server_of_another_protocol_version() -> None:
    """A server of another version answers the hello with its own ``v``: the client stops with a clear error."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def answer() -> None:
        if router.poll(10_000):
            ident, _hello = router.recv_multipart()
            router.send_multipart([ident, pack("welcome", v=1, stream="train", spec_hash="x", state="{}",
                                               heartbeat=1.0, timeout=10.0)])

    thread = threading.Thread(target=answer)
    thread.start()
    loader = feedline.Loader(f"tcp://127.0.0.1:{port}", timeout=5.0, reconnect=5.0)
    try:
        with pytest.raises(ProtocolError, match=f"speaks protocol version 1, this client speaks {PROTOCOL_VERSION}"):
            next(iter(loader))
    finally:
        loader.close()
        thread.join()
        router.close()
        ctx.term()


@pytest.mark.slow
def test_stats_command_and_prometheus_endpoint(server: Any) -> None:
    proc, address = server
    with feedline.Loader(address) as loader:
        collect(loader, limit=2)
        out = subprocess.run([sys.executable, "-m", "feedline", "stats", address, "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        stats = json.loads(out.stdout)
        assert {"train", "validation"} <= set(stats["streams"])
        train = stats["streams"]["train"]
        assert train["batches"] >= 2 and train["tokens"] > 0 and 0 < train["efficiency"] <= 1
        assert any(c["stream"] == "train" for c in stats["clients"])
        text = subprocess.run([sys.executable, "-m", "feedline", "stats", address],
                              capture_output=True, text=True, timeout=60).stdout
        assert "stream train" in text and "tokens/s" in text
    port = None
    # the serve command printed the metrics URL on stdout after the ready line
    assert proc.stdout is not None
    for _ in range(3):
        line = proc.stdout.readline()
        if "metrics on" in line:
            port = int(line.rsplit(":", 1)[1].split("/")[0])
            break
    assert port is not None
    deadline = time.monotonic() + 10
    while True:   # the endpoint serves the snapshot taken once a second: the first one after the batches above
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        if 'feedline_batches_total{stream="train"}' in body or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert 'feedline_batches_total{stream="train"}' in body and "feedline_tokens_per_s" in body


@pytest.mark.slow
def test_malformed_frames_leave_the_server_serving_with_flat_memory(env: dict, server: Any) -> None:
    proc, address = server
    ctx, sock = raw_socket(address)
    rng = np.random.default_rng(0)
    garbage = [
        b"", b"\xc1", b"\x92\x01", pack("nonsense"), pack("credit", n=5), pack("hello", v="x"),
        pack("hello", v=PROTOCOL_VERSION, stream=["x"]), pack("hello", v=PROTOCOL_VERSION, rank=7, world_size=2),
        pack("hello", v=PROTOCOL_VERSION, state="{not json"), pack("hello", v=PROTOCOL_VERSION, state='{"version": 1}'),
        pack("batch", fields=[["x", "|O", [1]]]), pack("credit", n=10**9),
    ]

    def blast(n: int) -> None:
        for i in range(n):
            kind = i % 4
            if kind == 0:
                sock.send(garbage[i % len(garbage)])
            elif kind == 1:
                sock.send(rng.bytes(int(rng.integers(1, 300))))
            elif kind == 2:
                sock.send_multipart([pack("ping"), b"extra", b"frames"])
            else:
                sock.send(garbage[(i // 4) % len(garbage)][: max(1, i % 7)])  # truncated
            if i % 500 == 0:  # keep the client's inbound queue short (the server answers errors)
                while sock.poll(0):
                    sock.recv_multipart()

    try:
        blast(2000)
        time.sleep(0.5)
        before = rss_kb(proc.pid)
        blast(10_000)
        with feedline.Loader(address) as loader:   # everyone else is still served
            assert len(collect(loader, limit=3)) == 3
        after = rss_kb(proc.pid)
        assert after - before < 20_000, f"server memory grew by {after - before} kB over 10k malformed messages"
        assert proc.poll() is None
        big = ctx.socket(zmq.DEALER)  # an oversized message only drops that connection
        big.setsockopt(zmq.LINGER, 0)
        big.connect(address)
        big.send(b"\x00" * (17 << 20))
        big.close()
        with feedline.Loader(address) as loader:
            assert len(collect(loader, limit=1)) == 1
    finally:
        sock.close()
        ctx.term()


@pytest.mark.slow
def test_kill_9_then_restart_every_rank_resumes_exactly(env: dict) -> None:
    port = free_port()
    bind = f"tcp://127.0.0.1:{port}"
    proc, address = start_server(env["path"], *FAST, bind=bind)
    loaders = [feedline.Loader(address, r, 4, prefetch=3, timeout=1.0, reconnect=60) for r in range(4)]
    try:
        its = [iter(lo) for lo in loaders]
        got: list[list] = [[] for _ in range(4)]
        for _ in range(3):
            for r, it in enumerate(its):
                got[r].append({k: np.array(v) for k, v in next(it).items()})
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        stop(proc)
        proc, _ = start_server(env["path"], *FAST, bind=bind)   # the same address, no memory of the run
        while True:
            step = [next(it, None) for it in its]
            if step[0] is None:
                assert all(s is None for s in step)
                break
            for r, b in enumerate(step):
                got[r].append({k: np.array(v) for k, v in b.items()})
        for r in range(4):
            want, _ = reference(env["spec"], r, 4)
            assert_batches_equal(want, got[r], f"rank {r} across a kill -9 restart")
    finally:
        for lo in loaders:
            lo.close()
        stop(proc)


_SHARED_CLIENT = textwrap.dedent("""
    import sys, time, feedline
    loader = feedline.Loader(sys.argv[1], mode="shared", prefetch=3)
    for i, batch in enumerate(loader):
        print(int(batch["input_ids"][0, 0]), loader.state_dict()["step"], flush=True)
        if i + 1 == int(sys.argv[2]):
            time.sleep(600)   # hold the last batch (unacked) and two prefetched ones, until killed
""")


@pytest.mark.slow
def test_shared_mode_redelivers_a_killed_clients_batches(env: dict, tmp_path: Path) -> None:
    want, _ = reference(env["spec"])
    n = len(want)
    with served(env["path"], *FAST) as address:
        script = tmp_path / "client.py"
        script.write_text(_SHARED_CLIENT)
        victim = subprocess.Popen([sys.executable, str(script), address, "3"], stdout=subprocess.PIPE, text=True)
        assert victim.stdout is not None
        seen_by_victim = [victim.stdout.readline() for _ in range(3)]
        assert all(seen_by_victim)
        deadline = time.monotonic() + 30   # acks travel asynchronously: wait until the server has both
        while fetch_stats(address)["streams"]["train"]["shared"]["watermark"] < 2:
            assert time.monotonic() < deadline, "the victim's acks never reached the server"
            time.sleep(0.05)
        victim.kill()
        victim.wait()
        victim.stdout.close()
        delivered: list[dict[str, np.ndarray]] = []

        def consume() -> None:  # shared consumers are independent: each runs on its own
            with feedline.Loader(address, mode="shared", prefetch=2) as loader:
                for b in loader:
                    delivered.append({k: np.array(v) for k, v in b.items()})

        threads = [threading.Thread(target=consume) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    # the victim consumed (acked) its first two batches; the third and its prefetched ones came back
    assert len(delivered) == n - 2
    key = [rows(b) for b in want]
    got_keys = [rows(b) for b in delivered]
    assert sorted(map(str, got_keys)) == sorted(map(str, key[2:])), "each batch exactly once after the first two"


@pytest.mark.slow
def test_unauthenticated_client_gets_nothing(env: dict, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    out = subprocess.run([sys.executable, "-m", "feedline", "keys", "generate", str(keys)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    other = tmp_path / "other"
    generate_keys(other)   # another server's keys, made here: the CLI made the first ones (and test_keys_permissions.py)
    with served(env["path"], "--keys", str(keys), *FAST) as address:
        with feedline.Loader(address, keys=keys) as loader:
            assert len(collect(loader, limit=2)) == 2
        with pytest.raises((AuthError, TransportTimeout)):
            first(feedline.Loader(address, timeout=1.0, reconnect=3))                 # plaintext
        with pytest.raises((AuthError, TransportTimeout)):
            first(feedline.Loader(address, keys=other, timeout=1.0, reconnect=3))    # not authorized
        ctx, sock = raw_socket(address)
        try:
            sock.send(pack("stats"))
            assert not sock.poll(750), "an unauthenticated peer received an answer"
        finally:
            sock.close()
            ctx.term()


@pytest.mark.slow
def test_open_bind_without_keys_is_refused(env: dict) -> None:
    out = subprocess.run([sys.executable, "-m", "feedline", "serve", env["path"], "--bind", "tcp://0.0.0.0:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "refusing to bind tcp://0.0.0.0:0 without encryption" in out.stderr and "--insecure" in out.stderr


@pytest.mark.slow
def test_sigterm_drains_and_exits_cleanly(env: dict) -> None:
    proc, address = start_server(env["path"], *FAST)
    try:
        with feedline.Loader(address) as loader:
            collect(loader, limit=1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None and "stopped" in proc.stdout.read()
    finally:
        stop(proc)


def test_refused_hello_raises_typed_errors_in_the_client(server: Any) -> None:
    _, address = server
    from feedline._service.client import RemoteLoader

    with pytest.raises(SpecError, match="prefetch=5000"):   # this client refuses it before asking
        RemoteLoader(address, mode="shared", prefetch=5000)
    loader = RemoteLoader(address, mode="shared")
    loader.prefetch = 5000   # a client that does not check (another implementation): the server refuses it
    with pytest.raises(ProtocolError):
        first(loader)


@pytest.mark.parametrize("limit", [["--max-prefetch", "2"], ["--window", "2"]], ids=["max-prefetch", "window"])
@pytest.mark.slow
def test_a_prefetch_above_the_servers_limits_still_streams_to_the_end(env: dict, limit: list[str]) -> None:
    """The server sends at most ``max_prefetch`` unacked batches, and a ranked cursor produces at most
    ``window`` steps past the last ack; a client asking for more must ack within those limits.

    A client that waited for ``prefetch // 2`` consumed batches before acking stalled for good
    once either limit was below that: it held every batch the server would send.
    """
    proc, address = start_server(env["path"], *FAST, *limit)
    try:
        want, want_states = reference(env["spec"])
        assert len(want) > 4
        out: dict[str, Any] = {}

        def consume() -> None:
            with feedline.Loader(address, prefetch=8) as loader:
                out["got"] = collect(loader, with_states=True)

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        t.join(30)
        assert not t.is_alive(), "the client stalled: it never granted credit within the server's cap"
        got, got_states = out["got"]
        assert_batches_equal(want, got, f"prefetch 8, server {limit}")
        assert got_states == want_states
    finally:
        stop(proc)


@pytest.mark.slow
def test_a_rank_waiting_on_a_stalled_stream_is_told_why(env: dict, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Rank 0 of 2 alone: the window fills and rank 0 waits; its log says which rank holds it back."""
    from feedline._service import client as client_module

    monkeypatch.setattr(client_module, "WAIT_WARN_S", 1.5)
    proc, address = start_server(env["path"], *FAST, "--window", "2")
    got: list[int] = []
    try:
        def consume() -> None:
            try:
                with feedline.Loader(address, 0, 2, reconnect=2.0) as loader:
                    for _ in loader:
                        got.append(1)
            except Exception:  # the server is stopped under it at the end of the test
                pass

        with caplog.at_level("WARNING", logger="feedline.service"):
            threading.Thread(target=consume, daemon=True).start()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not any("the server says" in r.message for r in caplog.records):
                time.sleep(0.2)
        told = [r.message for r in caplog.records if "the server says" in r.message]
        assert told, f"no warning while rank 0 waited; got {[r.message for r in caplog.records]}"
        assert "rank 0 of 2" in told[0] and "rank 1 (consumed up to step 0, not connected)" in told[0]
        assert len(got) == 2   # the window's two steps, then the wait
    finally:
        stop(proc)


@pytest.mark.slow
def test_a_client_without_a_server_says_so_then_times_out(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from feedline._service import client as client_module

    monkeypatch.setattr(client_module, "WAIT_WARN_S", 1.0)
    address = f"tcp://127.0.0.1:{free_port()}"
    with (caplog.at_level("WARNING", logger="feedline.service"), pytest.raises(TransportTimeout),
          feedline.Loader(address, timeout=1.0, reconnect=2.0) as loader):
        next(iter(loader))
    assert any("no answer from the loader service" in r.message and "is 'feedline serve' running there" in r.message
               for r in caplog.records), [r.message for r in caplog.records]


@pytest.mark.slow
def test_serve_process_takes_the_server_with_it_when_the_parent_dies(env: dict, tmp_path: Path) -> None:
    """A parent that ends without unwinding (here ``os._exit``; SIGKILL alike) leaves no server behind."""
    import psutil

    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import os, psutil
        from feedline.service import serve_process
        with serve_process({str(env["path"])!r}) as address:
            print(psutil.Process().children()[0].pid, flush=True)
            os._exit(0)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-2000:]
    server = psutil.Process(int(out.stdout.split()[0]))
    try:
        server.wait(timeout=20)
    except psutil.TimeoutExpired:
        server.kill()
        pytest.fail("the server outlived its parent")


def test_a_server_watching_its_stdin_exits_cleanly_when_stopped(env: dict) -> None:
    """SIGTERM to ``serve --stop-with-stdin`` while its parent still holds the pipe open (as
    ``serve_process`` stops it): the drain ends in exit code 0. Its watching thread reads the pipe's
    descriptor, not ``sys.stdin``: blocked inside the buffered reader, it held that reader's lock, and
    the exit aborted a second later ("Fatal Python error: _enter_buffered_busy", exit code -6)."""
    proc = subprocess.Popen([sys.executable, "-m", "feedline", "serve", str(env["path"]), "--bind", "tcp://127.0.0.1:0",
                             "--stop-with-stdin", *FAST], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            if line.startswith("feedline serve: listening on "):
                break
        proc.terminate()
        code = proc.wait(timeout=30)   # stdin still open: the watcher is still blocked in its read
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert code == 0 and "Fatal Python error" not in err, err[-2000:]


def test_a_server_whose_stdin_is_already_at_its_end_says_why_it_stops(env: dict) -> None:
    """``--stop-with-stdin`` with an input at its end from the start (``</dev/null``, a detached job: a
    likely mistake) stops the server at once, as asked; it says why instead of stopping unexplained."""
    out = subprocess.run([sys.executable, "-m", "feedline", "serve", str(env["path"]), "--bind", "tcp://127.0.0.1:0",
                          "--stop-with-stdin", *FAST], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "standard input ended (--stop-with-stdin): stopping" in out.stderr, out.stderr[-2000:]
