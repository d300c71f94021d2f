"""Fault injection against real `feedline serve` processes on loopback: crafted and oversized
messages, cursor floods, restarts (SIGTERM with a successor, SIGKILL), a stuck shared consumer,
and clients that exit without closing. Each test reproduces a failure seen on an earlier version."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import zmq

import feedline
from feedline._cli.commands.stats import fetch_stats
from feedline._service.protocol import PROTOCOL_VERSION, pack, unpack_header
from feedline.errors import StateError
from feedline.service import ServerOptions
from feedline.testing import assert_batches_equal, collect
from service_helpers import free_port, make_spec, rows, start_server, stop, tokenizer_path, write_spec

FAST = ["--heartbeat", "0.2", "--timeout", "1.5"]
# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# served stream (a feedline serve process, its tokenizer and first batches) and fixtures start once, not once a worker.
pytestmark = [pytest.mark.timeout(90), pytest.mark.xdist_group("faults")]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("faults")
    tok = tokenizer_path(tmp)
    spec = make_spec(tmp, tok)
    # the tokenizers encoder: RSS figures here measure cursors, not a fastokens load that `auto`
    # starts once the server has encoded 256 KiB (the backend is not hashed: states are the same)
    spec["tokenizer"] = {"path": tok, "backend": "hf"}
    return {"tmp": tmp, "spec": spec, "path": write_spec(tmp / "train.json", spec),
            "hash": feedline.Spec.load(spec).hash()}


@pytest.fixture(scope="module")
def server(env: dict[str, Any]) -> Any:
    # raw peers below do not ping: a 5 s timeout keeps them seated on a busy machine
    proc, address = start_server(env["path"], "--heartbeat", "0.2", "--timeout", "5", "--max-cursors", "3",
                                 "--max-prefetch", "4")
    yield proc, address
    stop(proc)


def reference(spec: dict[str, Any], rank: int = 0, world_size: int = 1) -> list[dict[str, np.ndarray]]:
    loader = feedline.Loader(spec, rank, world_size)
    try:
        return collect(loader)
    finally:
        loader.close()


class Peer:
    """A raw DEALER socket speaking the protocol by hand."""

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        assert self.sock.poll(int(timeout * 1000)), "no answer from the server"
        return unpack_header(self.sock.recv_multipart()[0])

    def answer_to(self, frame: bytes, ops: tuple[str, ...] = ("error", "welcome")) -> dict[str, Any]:
        self.send(frame)
        seen = []
        for _ in range(100):
            h = self.recv()
            if h["op"] in ops:
                return h
            seen.append(h["op"])
        raise AssertionError(f"no {ops} among the server's answers: {seen}")

    def close(self) -> None:
        self.sock.close(linger=0)


def hello(state: str | None = None, *, rank: int = 0, world_size: int = 1, session: str = "s", **kw: Any) -> bytes:
    return pack("hello", v=PROTOCOL_VERSION, stream="train", rank=rank, world_size=world_size, session=session, state=state, **kw)


# ----------------------------------------------------------------------------- 1. crafted messages
@pytest.mark.slow
def test_crafted_states_are_refused_and_the_server_keeps_serving(env: dict, server: Any) -> None:
    proc, address = server
    h = env["hash"]
    crafted = {
        "infinite step": f'{{"version":1,"spec_hash":"{h}","step":Infinity,"world_size":1,"pipeline":{{}}}}',
        "NaN in the pipeline": f'{{"version":1,"spec_hash":"{h}","step":1,"world_size":1,"pipeline":{{"a":NaN}}}}',
        "negative step": f'{{"version":1,"spec_hash":"{h}","step":-3,"world_size":1,"pipeline":{{}}}}',
        "100k-deep array": f'{{"version":1,"spec_hash":"{h}","step":1,"pipeline":' + "[" * 100_000 + "]" * 100_000 + "}",
        "200-deep object": f'{{"version":1,"spec_hash":"{h}","step":1,"pipeline":' + '{"a":' * 200 + "1" + "}" * 201,
        "huge integer": f'{{"version":1,"spec_hash":"{h}","step":{10**30},"world_size":1,"pipeline":{{}}}}',
        "float world size": f'{{"version":1,"spec_hash":"{h}","step":1,"world_size":1.5,"pipeline":{{}}}}',
    }
    ctx = zmq.Context()
    peer = Peer(ctx, address)
    try:
        for what, state in crafted.items():
            answer = peer.answer_to(hello(state))
            assert answer["op"] == "error" and answer["kind"] == "StateError", (what, answer)
            assert proc.poll() is None, f"the server died on a state with {what}"
        deep = b"\x91" * 50_000 + b"\xc0"   # a 50k-deep msgpack array as the whole header
        assert peer.answer_to(deep)["kind"] == "ProtocolError"
    finally:
        peer.close()
        ctx.destroy(linger=0)   # closes any socket an assertion left open (term() would block)
    with feedline.Loader(address) as loader:   # everyone else is still served
        assert len(collect(loader, limit=2)) == 2


def test_in_process_loader_validates_states_as_strictly(env: dict) -> None:
    good = feedline.Loader(env["spec"]).state_dict()
    for bad, match in [({**good, "step": -1}, "non-negative"), ({**good, "step": True}, "non-negative"),
                       ({**good, "pipeline": {"x": [1, -2]}}, r"pipeline\.x\[1\]"),
                       ({**good, "pipeline": {"x": float("inf")}}, "finite"),
                       (json.dumps(good).replace('"step": 0', '"step": Infinity'), "Infinity")]:
        with pytest.raises(StateError, match=match):
            feedline.Loader(env["spec"], state=bad)


# ----------------------------------------------------------------------------- 2. cursor floods
def _server_usage(pid: int) -> tuple[float, int]:
    p = psutil.Process(pid)
    return p.memory_info().rss / 2**20, p.num_threads()


@pytest.mark.slow
def test_a_hello_flood_for_a_held_rank_does_not_leak_cursors(env: dict) -> None:
    proc, address = start_server(env["path"], *FAST)
    ctx = zmq.Context()
    peers: list[Peer] = []
    try:
        with feedline.Loader(address) as loader:      # states of a trainer's old checkpoints
            collect(loader, limit=2)
            old = json.dumps(loader.state_dict())
        time.sleep(0.5)
        rss0, threads0 = _server_usage(proc.pid)
        for i in range(200):   # a trainer crash-looping: a new process (connection, session) each time
            peer = Peer(ctx, address)
            assert peer.answer_to(hello([None, old][i % 2], session=f"crash-{i}"))["op"] == "welcome"
            peers.append(peer)
            if len(peers) > 4:
                peers.pop(0).close()   # dies without a bye
        time.sleep(1.0)
        rss1, threads1 = _server_usage(proc.pid)
        cursors = fetch_stats(address)["streams"]["train"]["cursors"]
        print(f"\n200-hello flood: server RSS {rss0:.0f} -> {rss1:.0f} MB, threads {threads0} -> {threads1}, "
              f"cursors {len(cursors)}")
        assert len(cursors) <= 2, cursors
        assert threads1 <= threads0 + 4, f"threads grew from {threads0} to {threads1}"
        assert rss1 - rss0 < 100, f"server RSS grew from {rss0:.0f} to {rss1:.0f} MB"
    finally:   # also when an assertion failed: open peers would block ctx.term() and leak the server
        for peer in peers:
            peer.close()
        ctx.destroy(linger=0)
        stop(proc)


def test_cursors_per_stream_are_capped_and_idle_ones_released(env: dict, server: Any) -> None:
    _proc, address = server
    ctx = zmq.Context()
    peers = []
    try:
        for w in (1, 2, 4):   # three jobs with live clients fill the cap of 3
            peer = Peer(ctx, address)
            assert peer.answer_to(hello(rank=0, world_size=w, session=f"job-{w}"))["op"] == "welcome"
            peers.append(peer)
        refused = Peer(ctx, address)
        peers.append(refused)
        answer = refused.answer_to(hello(rank=0, world_size=8, session="job-8"))
        assert answer["op"] == "error" and "--max-cursors" in answer["message"], answer
        peers[0].send(pack("bye"))      # job 1 leaves: its idle cursor makes room for a new job
        deadline = time.monotonic() + 10  # the bye and the hello travel on two connections: either may come first
        while (again := refused.answer_to(hello(rank=0, world_size=8, session="job-8")))["op"] != "welcome":
            assert "--max-cursors" in again["message"] and time.monotonic() < deadline, again
            time.sleep(0.1)
        stats = fetch_stats(address)["streams"]["train"]["cursors"]
        assert sorted(c["world_size"] for c in stats) == [2, 4, 8]
    finally:
        for peer in peers:
            peer.send(pack("bye"))
            peer.close()
        ctx.destroy(linger=0)   # closes any socket an assertion left open (term() would block)


# ----------------------------------------------------------------------------- 3. restarts
def _graceful(env: dict, proc: subprocess.Popen[str], bind: str) -> subprocess.Popen[str]:
    proc.send_signal(signal.SIGTERM)    # the documented procedure: drain, bye, then the successor
    assert proc.wait(timeout=30) == 0
    stop(proc)
    return start_server(env["path"], *FAST, bind=bind)[0]


def _killed(env: dict, proc: subprocess.Popen[str], bind: str) -> subprocess.Popen[str]:
    os.kill(proc.pid, signal.SIGKILL)
    stop(proc)
    return start_server(env["path"], *FAST, bind=bind)[0]


@pytest.mark.slow
def test_sigterm_then_sigkill_restarts_keep_both_ranks_exact(env: dict) -> None:
    """Two ranks take 3 steps, SIGTERM + successor, 3 more, SIGKILL + restart, then finish bit-exactly."""
    bind = f"tcp://127.0.0.1:{free_port()}"
    proc, address = start_server(env["path"], *FAST, bind=bind)
    loaders = [feedline.Loader(address, r, 2, prefetch=2, timeout=1.5, reconnect=60) for r in range(2)]
    try:
        its = [iter(lo) for lo in loaders]
        got: list[list] = [[] for _ in range(2)]
        for restart in (_graceful, _killed, None):
            for _ in range(3 if restart else 10**6):
                step = [next(it, None) for it in its]
                if step[0] is None:
                    assert all(s is None for s in step), "ranks ended at different steps"
                    break
                for r, b in enumerate(step):
                    got[r].append({k: np.array(v) for k, v in b.items()})
            if restart is not None:
                proc = restart(env, proc, bind)
        for r in range(2):
            assert_batches_equal(reference(env["spec"], r, 2), got[r], f"rank {r} across both restarts")
    finally:
        for lo in loaders:
            lo.close()
        stop(proc)


@pytest.mark.slow
def test_a_peer_closing_during_the_handshake_is_retried_not_an_auth_error(env: dict) -> None:
    """A server socket closing mid-handshake (a draining server as its successor starts) is no AuthError."""
    import socket as pysocket

    port = free_port()
    listener = pysocket.socket()
    listener.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(16)
    listener.settimeout(0.2)
    resets = 0
    got: list[Any] = []
    loader = feedline.Loader(f"tcp://127.0.0.1:{port}", timeout=1.0, reconnect=60)
    consumer = threading.Thread(target=lambda: got.append(_first_or_error(loader)))
    consumer.start()
    start = time.monotonic()
    # accept and drop every connection attempt for a second, and until the client's first one came
    while time.monotonic() < start + 1.0 or (resets == 0 and time.monotonic() < start + 20):
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        conn.close()
        resets += 1
    listener.close()
    proc, _ = start_server(env["path"], *FAST, bind=f"tcp://127.0.0.1:{port}")
    try:
        consumer.join(30)
        assert resets >= 1 and got, "the client neither connected nor failed"
        assert isinstance(got[0], dict), f"the client failed instead of reconnecting: {got[0]!r}"
        assert_batches_equal(reference(env["spec"])[:1], got, "first batch after the handshake failures")
    finally:
        loader.close()
        stop(proc)


def _first_or_error(loader: Any) -> Any:
    try:
        return {k: np.array(v) for k, v in next(iter(loader)).items()}
    except Exception as e:
        return e


# ----------------------------------------------------------------------------- 5. clients that just end
_TAKE_ONE = textwrap.dedent("""
    import sys, time, feedline
    loader = feedline.Loader(sys.argv[1], rank=int(sys.argv[2]), world_size=int(sys.argv[3]), prefetch=3)
    batch = next(iter(loader))
    print("took", int(batch["input_ids"].shape[0]), flush=True)
    print(time.monotonic(), flush=True)
    if sys.argv[4] == "keep":
        globals()["kept"] = iter(loader)   # a live generator and a loader reachable at exit
""")


@pytest.mark.parametrize("how", ["keep", "drop"])
@pytest.mark.slow
def test_a_client_that_ends_without_close_exits_promptly(env: dict, server: Any, tmp_path: Path, how: str) -> None:
    _, address = server
    script = tmp_path / "take_one.py"
    script.write_text(_TAKE_ONE)
    proc = subprocess.Popen([sys.executable, str(script), address, "0", "1", how], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().startswith("took")
        printed = float(proc.stdout.readline())
        code = proc.wait(timeout=10)
        exit_s = time.monotonic() - printed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    print(f"\nclient without close() ({how}): exited {exit_s:.2f}s after its last line")
    assert code == 0
    assert exit_s < 5


def test_ranks_of_one_job_have_distinct_client_ids_in_stats(server: Any) -> None:
    _, address = server
    loaders = [feedline.Loader(address, r, 2) for r in range(2)]
    try:
        for lo in loaders:
            lo.state_dict()   # connected and welcomed
        clients = [c for c in fetch_stats(address)["clients"] if c["world_size"] == 2]
        assert sorted(c["rank"] for c in clients) == [0, 1]
        assert len({c["id"] for c in clients}) == 2, clients
    finally:
        for lo in loaders:
            lo.close()


# ----------------------------------------------------------------------------- 4. a stuck shared consumer
_STUCK = textwrap.dedent("""
    import sys, time, feedline
    loader = feedline.Loader(sys.argv[1], mode="shared", prefetch=int(sys.argv[2]))
    batch = next(iter(loader))
    print(int(batch["input_ids"][0, 0]), flush=True)
    time.sleep(600)   # alive (its connection thread heartbeats) but never acks, until killed
""")


@pytest.mark.slow
def test_a_stuck_shared_consumer_does_not_stop_the_others(env: dict, tmp_path: Path) -> None:
    want = reference(env["spec"])
    proc, address = start_server(env["path"], *FAST, "--window", "2", "--lease", "1")
    script = tmp_path / "stuck.py"
    script.write_text(_STUCK)
    stuck = subprocess.Popen([sys.executable, str(script), address, "3"], stdout=subprocess.PIPE, text=True)
    delivered: list[dict[str, np.ndarray]] = []
    try:
        assert stuck.stdout is not None and stuck.stdout.readline().strip()

        def consume() -> None:
            with feedline.Loader(address, mode="shared", prefetch=1) as loader:
                for b in loader:
                    delivered.append({k: np.array(v) for k, v in b.items()})

        threads = [threading.Thread(target=consume, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
        assert not any(t.is_alive() for t in threads), (
            f"the other consumers stalled after {len(delivered)} of {len(want)} batches")
        shared = fetch_stats(address)["streams"]["train"]["shared"]
        assert stuck.poll() is None, "the stuck consumer was not alive throughout"
    finally:
        stuck.kill()
        stuck.wait()
        if stuck.stdout is not None:
            stuck.stdout.close()
        stop(proc)
    # at-least-once: every batch reached a live consumer, the stuck one's after their leases ran out
    assert sorted(map(str, (rows(b) for b in delivered))) == sorted(map(str, (rows(b) for b in want)))
    assert shared["lease_expired"] >= 1


@pytest.mark.slow
def test_the_server_caps_what_a_client_makes_it_hold(server: Any) -> None:
    _, address = server   # --max-prefetch 4, the default --window
    window = ServerOptions().window
    ctx = zmq.Context()
    try:
        idle = Peer(ctx, address)   # declares the largest prefetch, grants all its credit, never reads on
        assert idle.answer_to(pack("hello", v=PROTOCOL_VERSION, stream="train", mode="shared", prefetch=1024))["op"] == "welcome"
        idle.send(pack("credit", n=64))
        deadline = time.monotonic() + 10
        while fetch_stats(address)["streams"]["train"]["shared"]["in_flight"] < 4 and time.monotonic() < deadline:
            time.sleep(0.1)   # until the server holds its cap's worth for it ...
        time.sleep(0.5)       # ... and then a while: a server without the cap would go on to the 64 granted
        shared = fetch_stats(address)["streams"]["train"]["shared"]
        assert shared["in_flight"] <= 4 and shared["in_flight"] + shared["queued"] <= window + 4, shared
        idle.send(pack("bye"))
        idle.close()
    finally:
        ctx.destroy(linger=0)   # closes any socket an assertion left open (term() would block)


# ----------------------------------------------------------------------------- 7. keys, stats, metrics
def _keys(tmp: Path, name: str = "keys") -> Path:
    from feedline._service.auth import generate_keys

    generate_keys(tmp / name)
    return tmp / name


@pytest.mark.slow
def test_secret_key_files_are_created_private(tmp_path: Path) -> None:
    """Created 0600, not created world-readable and chmod-ed afterwards (umask 0, chmod disabled)."""
    code = textwrap.dedent("""
        import os, sys
        os.umask(0)
        os.chmod = lambda *a, **k: None   # whatever is not private at creation stays visible
        from feedline._service.auth import generate_keys
        generate_keys(sys.argv[1])
        generate_keys(sys.argv[1], client="second")
    """)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "k")], check=True, timeout=60)
    secrets = sorted((tmp_path / "k").glob("*.key_secret"))
    assert [p.name for p in secrets] == ["client.key_secret", "second.key_secret", "server.key_secret"]
    for p in secrets:
        assert p.stat().st_mode & 0o777 == 0o600, f"{p.name} created with mode {oct(p.stat().st_mode & 0o777)}"
    from feedline._service.auth import ClientKeys, ServerKeys

    ServerKeys.load(tmp_path / "k")
    ClientKeys.load(tmp_path / "k", "second")


@pytest.mark.slow
def test_metrics_off_loopback_with_keys_is_refused_unless_forced(env: dict, tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    cmd = [sys.executable, "-m", "feedline", "serve", env["path"], "--bind", "tcp://127.0.0.1:0",
           "--keys", str(keys), "--metrics-port", "0", "--metrics-host", "0.0.0.0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "refusing to serve metrics on 0.0.0.0" in out.stderr and "--metrics-insecure" in out.stderr
    from feedline._service.auth import ServerKeys
    from feedline.service import ServerOptions

    server_keys = ServerKeys.load(keys)
    for host in ("127.0.0.1", "localhost", "::1"):
        ServerOptions(keys=server_keys, metrics_port=0, metrics_host=host)
    ServerOptions(keys=server_keys, metrics_port=0, metrics_host="0.0.0.0", metrics_insecure=True)
    ServerOptions(metrics_port=0, metrics_host="0.0.0.0")   # no keys: the service itself is loopback-only


@pytest.mark.slow
def test_stats_are_answered_only_to_authenticated_peers(env: dict, tmp_path: Path) -> None:
    """Even when the authenticator is gone (CurveZMQ then accepts any key), nothing is answered."""
    from feedline._service.auth import ClientKeys, ServerKeys
    from feedline.service import Server, ServerOptions, load_streams

    keys, other = _keys(tmp_path), _keys(tmp_path, "other")
    server = Server(load_streams(env["spec"]), ServerOptions(bind="tcp://127.0.0.1:0", keys=ServerKeys.load(keys)))
    address = server.bind()
    loop = threading.Thread(target=server.serve, daemon=True)
    loop.start()
    ctx = zmq.Context()
    try:
        good = ctx.socket(zmq.DEALER)
        good.setsockopt(zmq.LINGER, 0)
        ClientKeys.load(keys).apply(good)
        good.connect(address)
        good.send(pack("stats"))
        assert good.poll(10_000) and unpack_header(good.recv())["op"] == "stats"
        good.close()
        server._auth.stop()    # fault: the authentication thread is gone
        foreign = ClientKeys.load(other)    # right server key (it is public), unauthorized client key
        strangers = ClientKeys(server=ClientKeys.load(keys).server, public=foreign.public, secret=foreign.secret)
        # A stranger whose handshake began while the stopped authenticator's endpoint was still bound waits on a
        # ZAP reply that never comes, and its message never reaches the server: on a loaded machine that can be the
        # first one, so strangers keep coming (each a new handshake) until the server has counted one refused.
        deadline = time.monotonic() + 20
        while server.stats()["unauthenticated"] < 1 and time.monotonic() < deadline:
            stranger = ctx.socket(zmq.DEALER)
            stranger.setsockopt(zmq.LINGER, 0)
            strangers.apply(stranger)
            stranger.connect(address)
            stranger.send(pack("stats"))
            answered = stranger.poll(750)   # a server answers stats in ms
            stranger.close()
            assert not answered, "an unauthenticated peer received stats"
        assert server.stats()["unauthenticated"] >= 1
    finally:
        server._auth = None
        server.stop()
        loop.join(30)
        ctx.destroy(linger=0)   # closes any socket an assertion left open (term() would block)


# ----------------------------------------------------------------------------- 6. a stalled ranked window
# feedline's command line, with the server logging a window stalled for 1 s rather than 3 (the test's wait)
SERVE_STALL_LOGGED_AFTER_1S = ("import sys; from feedline._service import dispatch; dispatch._STALL_LOG_AFTER = 1.0; "
                               "from feedline._cli.__main__ import main; sys.exit(main())")


@pytest.mark.slow
def test_a_stalled_window_is_logged_with_the_rank_behind(env: dict, tmp_path: Path) -> None:
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-c", SERVE_STALL_LOGGED_AFTER_1S, "serve", env["path"], "--bind",
                                 "tcp://127.0.0.1:0", "--window", "2", *FAST],
                                stdout=subprocess.PIPE, stderr=log_file, text=True)
    loaders: list[Any] = []
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().split("listening on ")[1].strip()
        loaders = [feedline.Loader(address, r, 2, prefetch=1) for r in range(2)]
        loaders[1].state_dict()           # rank 1 joins, then reads nothing (as under accelerate's dispatcher)
        it = iter(loaders[0])
        got = [next(it) for _ in range(2)]   # the window: rank 0 can run 2 steps ahead of rank 1
        assert len(got) == 2
        deadline = time.monotonic() + 20
        while "window full" not in log_path.read_text():
            assert time.monotonic() < deadline, f"no stall logged: {log_path.read_text()[-2000:]}"
            time.sleep(0.2)
        line = next(x for x in log_path.read_text().splitlines() if "window full" in x)
        assert "waiting for rank 1 (consumed up to step 0, connected)" in line, line
        assert "rank 0 waits" in line, line
    finally:
        for lo in loaders:
            lo.close()
        stop(proc)
