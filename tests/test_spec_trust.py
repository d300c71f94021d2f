"""A spec is code: ``spec --check`` validates import paths without running the modules where Python allows it
(and says when it must import), and the service never takes a spec from a client. Real modules written by
the tests (their top level writes a marker file), the real CLI and server in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from service_helpers import http_get, make_spec, start_http, stop_http, tokenizer_path, write_spec

EXE = [sys.executable, "-m", "feedline"]

TOP_LEVEL = """import pathlib
pathlib.Path({marker!r}).write_text("the top level of {name} ran")
"""


def _module(folder: Path, name: str, body: str = "") -> Path:
    marker = folder / f"{name}.RAN"
    (folder / f"{name}.py").write_text(TOP_LEVEL.format(marker=str(marker), name=name) + body)
    return marker


def _check(spec: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([*EXE, "spec", "--check", str(spec)], capture_output=True, text=True, timeout=60, env=env)


def _spec(tmp: Path, transform: str, kind: str = "clm") -> Path:
    """A spec with real data and a real tokenizer, so ``--check`` runs its data checks too."""
    (tmp / "a.jsonl").write_text("".join(json.dumps({"text": f"record {i} says hello"}) + "\n" for i in range(20)))
    path = tmp / "spec.yaml"
    path.write_text(f"task: {kind}\ntokenizer: {tokenizer_path(tmp)}\nsources: [a.jsonl]\n"
                    f"batching: {{batch_size: 2}}\ntransforms: [{{map: '{transform}'}}]\n")
    return path


@pytest.mark.slow
def test_spec_check_does_not_run_a_transforms_module(tmp_path: Path) -> None:
    marker = _module(tmp_path, "shouts", "\ndef upper(record):\n    return {**record, 'text': record['text'].upper()}\n")
    r = _check(_spec(tmp_path, "shouts:upper"), tmp_path)
    assert r.returncode == 0 and ": valid;" in r.stdout, r.stderr
    assert "note: the spec was not run to its first batch" in r.stderr and "imported" not in r.stderr, r.stderr
    assert not marker.exists(), "spec --check ran the module's top level"
    r = _check(_spec(tmp_path, "shouts:uper"), tmp_path)            # a typo, found in the source
    assert r.returncode == 2 and "transforms[0].map: 'shouts'" in r.stderr and "did you mean 'upper'?" in r.stderr
    r = _check(_spec(tmp_path, "shoutz:upper"), tmp_path)
    assert r.returncode == 2 and "cannot find module 'shoutz'" in r.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_spec_check_does_not_run_parent_packages(tmp_path: Path) -> None:
    pkg = tmp_path / "team"
    pkg.mkdir()
    init_marker = _module(pkg, "__init__")
    mod_marker = _module(pkg, "clean", "\ndef keep(record):\n    return True\n")
    r = _check(_spec(tmp_path, "team.clean:keep"), tmp_path)
    assert r.returncode == 0 and "imported" not in r.stderr, r.stderr
    assert not init_marker.exists() and not mod_marker.exists()


@pytest.mark.slow
def test_spec_check_says_when_it_must_import(tmp_path: Path) -> None:
    """A name that only ``import *`` provides cannot be seen in the source: the module is imported,
    and a note on standard error says so (the one case here where its top level runs)."""
    _module(tmp_path, "helpers_base", "\ndef upper(record):\n    return record\n")
    marker = _module(tmp_path, "star", "from helpers_base import *\n")
    r = _check(_spec(tmp_path, "star:upper"), tmp_path)
    assert r.returncode == 0, r.stderr
    assert "note: transforms[0].map: imported 'star' to check it" in r.stderr and "top-level code ran" in r.stderr
    assert marker.exists()
    r = _check(_spec(tmp_path, "syslog:syslog"), tmp_path)   # an extension module: no source to read
    assert r.returncode == 0 and "imported 'syslog' to check it (an extension module)" in r.stderr, r.stderr
    plugin = _module(tmp_path, "mytask", "\nfrom feedline._tasks.clm import CausalLM as Task\n")
    r = _check(_spec(tmp_path, "helpers_base:upper", kind="mytask:Task"), tmp_path)
    assert r.returncode == 0 and "note: task.kind: imported 'mytask'" in r.stderr, r.stderr
    assert plugin.exists()


@pytest.mark.slow
def test_loading_a_spec_does_import_its_transforms(tmp_path: Path) -> None:
    """What the docs warn of: outside --check, loading a spec runs the modules it names."""
    marker = _module(tmp_path, "loud", "\ndef upper(record):\n    return record\n")
    code = "import sys, feedline; feedline.Spec.load(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code, str(_spec(tmp_path, "loud:upper"))], check=True, timeout=60, env=env)
    assert marker.exists()


@pytest.mark.slow
def test_a_client_cannot_change_the_servers_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hello carrying spec-like fields (a spec, transforms, a tokenizer), and HTTP requests carrying one
    in the query or a POST body, change nothing: same hash, same batches, and the module they name is
    never imported by the server (it is on the server's path)."""
    import zmq

    import feedline
    from feedline._service.protocol import PROTOCOL_VERSION, pack, unpack_header
    from feedline.testing import collect

    marker = _module(tmp_path, "hijack", "\ndef upper(record):\n    return {**record, 'text': 'owned'}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    spec = make_spec(tmp_path, tokenizer_path(tmp_path), docs=20)
    path = write_spec(tmp_path / "train.json", spec)
    hostile = {**spec, "transforms": [{"map": "hijack:upper"}], "task": {"kind": "hijack:Task"}}
    ref = collect(feedline.Loader(spec))
    proc, url = start_http(path, "--http", "127.0.0.1:0")
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(proc.address)   # type: ignore[attr-defined]
        sock.send(pack("hello", v=PROTOCOL_VERSION, stream="train", mode="shared", rank=0, world_size=1, session="x",
                       state=None, spec=hostile, transforms=hostile["transforms"], tokenizer="gpt2", spec_hash=None))
        assert sock.poll(10_000)
        welcome = unpack_header(sock.recv_multipart()[0])
        assert welcome["op"] == "welcome" and welcome["spec_hash"] == feedline.Spec.load(spec).hash()
        sock.send(pack("bye"))
        sock.close()
        req = urllib.request.Request(f"{url}/?stream=train", data=json.dumps(hostile).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError("POST / was accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 405
        got: list[dict[str, Any]] = []
        query = "stream=train&spec=" + urllib.parse.quote(json.dumps(hostile)) + "&transforms=hijack:upper"
        while True:
            status, _, body = http_get(f"{url}/?{query}")
            if status == 204:
                break
            got.append(json.loads(body))
    finally:
        ctx.destroy(linger=0)
        stop_http(proc)
    assert [g["step"] for g in got] == list(range(1, len(ref) + 1))
    for g, r in zip(got, ref, strict=True):
        for k, v in r.items():
            assert g[k] == v.tolist(), k
    assert not marker.exists(), "the server imported a module a client named"
