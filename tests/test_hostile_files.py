"""Hostile spec and ``serve --state`` files: one line and exit 2 within seconds, never a hang, a traceback or a
memory blow-up. Real files, the real CLI in subprocesses (each with a short timeout), ``feedline.Loader`` too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service_helpers import make_spec, tokenizer_path, write_spec

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# served stream (a feedline serve process, its tokenizer and first batches) and fixtures start once, not once a worker.
pytestmark = pytest.mark.xdist_group("hostile_files")

EXE = [sys.executable, "-m", "feedline"]
TIMEOUT = 30


def _bomb() -> str:
    """A "billion laughs" spec: nine anchors of nine aliases each, 9^9 values once expanded, in a free-form
    field (``data_files``) that validation keeps, so the old loader walked the whole tree (hung, growing)."""
    parts = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        name, prev = chr(ord("a") + i), chr(ord("a") + i - 1)
        parts.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "task: clm\nsources:\n  - path: a.jsonl\n    data_files: {" + ", ".join(parts) + "}\n"


HOSTILE_SPECS: dict[str, tuple[str, bytes, str]] = {
    "alias-bomb": ("bomb.yaml", _bomb().encode(), r"bomb.yaml:4: expands, with its aliases .* to more than"),
    "nested-20000": ("deep.yaml", b"task: " + b"[" * 20_000 + b"]" * 20_000 + b"\n",
                     r"deep.yaml:1: nested deeper than 64 levels"),
    "nested-json": ("deep.json", b'{"task": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", r"deep.json: nested deeper"),
    "not-utf8": ("latin.yaml", "task: clm\n# caf\xe9\nsources: [a.jsonl]\n".encode("latin-1"),
                 r"latin.yaml:2: not UTF-8 text \(byte 0xe9 at offset 15\)"),
    "recursive-alias": ("loop.yaml", b"task: clm\nsources: &s [a.jsonl, *s]\n", r"loop.yaml:2: alias \*s refers to"),
}


def _one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert re.search(needle, r.stderr), r.stderr


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


@pytest.fixture(params=sorted(HOSTILE_SPECS))
def hostile_spec(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    name, data, needle = HOSTILE_SPECS[request.param]
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / name).write_bytes(data)
    return str(tmp_path / name), needle


@pytest.mark.slow
def test_spec_check_refuses_a_hostile_spec_file_in_one_line(hostile_spec: tuple[str, str]) -> None:
    path, needle = hostile_spec
    _one_line_error(_run("spec", "--check", path), needle)


@pytest.mark.slow
def test_serve_refuses_a_hostile_spec_file_in_one_line(hostile_spec: tuple[str, str]) -> None:
    path, needle = hostile_spec
    _one_line_error(_run("serve", path, "--bind", "tcp://127.0.0.1:0"), needle)


@pytest.mark.slow
def test_loader_raises_a_spec_error_for_a_hostile_spec_file(hostile_spec: tuple[str, str]) -> None:
    path, needle = hostile_spec
    code = ("import sys, feedline\ntry:\n    feedline.Loader(sys.argv[1])\nexcept feedline.SpecError as e:\n"
            "    print(e)\n    sys.exit(2)\n")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2 and r.stderr == "", (r.returncode, r.stderr[-2000:])
    assert r.stdout.count("\n") == 1 and re.search(needle, r.stdout), r.stdout


def test_aliases_within_the_bounds_still_load(tmp_path: Path) -> None:
    from feedline._spec.files import MAX_DEPTH, read_spec_file

    (tmp_path / "ok.yaml").write_text("task: clm\nsources:\n  - path: a.jsonl\n    data_files: "
                                      "{a: &a [x, y], b: [*a, *a], c: {<<: {k: 1}, j: 2}}\n")
    got = read_spec_file(tmp_path / "ok.yaml")
    assert got["sources"][0]["data_files"] == {"a": ["x", "y"], "b": [["x", "y"], ["x", "y"]], "c": {"k": 1, "j": 2}}
    nested = "task: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"   # the top mapping is level 1
    (tmp_path / "deep-ok.yaml").write_text(nested)
    assert read_spec_file(tmp_path / "deep-ok.yaml")["task"] is not None


# ---------------------------------------------------------------------------------------------- --state files

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("state-files")
    return write_spec(tmp / "train.json", make_spec(tmp, tokenizer_path(tmp), docs=20))


def _state_file(kind: str, tmp: Path, spec_path: str) -> tuple[Path, str]:
    path = tmp / f"{kind}.json"
    if kind == "random-bytes":
        path.write_bytes(bytes(range(128, 256)) * 32)
        return path, "not a feedline state file .byte 0x80 at offset 0 is not UTF-8 text"
    if kind == "fifo":
        os.mkfifo(path)
        return path, "the --state file is a FIFO"
    if kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
        return path, "the --state file is a device"
    if kind == "folder":
        path.mkdir()
        return path, "the --state file is a folder"
    if kind == "truncated-json":
        path.write_text('{"feedline_server_state": 1, "streams": {"train": {"version": 1, ')
        return path, "resume state is not valid JSON"
    if kind == "wrong-spec":
        path.write_text(json.dumps({"feedline_server_state": 1, "streams": {"train": {
            "version": 1, "spec_hash": "0123", "step": 3, "world_size": 1, "pipeline": {}}}}))
        return path, "saved under spec"
    if kind == "not-a-state":
        path.write_text("[1, 2]")
        return path, "not a feedline state file"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["random-bytes", "fifo", "link-to-dev-zero", "folder", "truncated-json",
                                  "wrong-spec", "not-a-state"])
@pytest.mark.slow
def test_serve_refuses_a_bad_state_file_in_one_line_and_exit_2(kind: str, served: str, tmp_path: Path) -> None:
    path, needle = _state_file(kind, tmp_path, served)
    r = _run("serve", served, "--http", "127.0.0.1:0", "--state", str(path))
    _one_line_error(r, needle)
    assert str(path) in r.stderr


def test_the_state_file_refuses_more_than_its_bound(tmp_path: Path, monkeypatch: Any) -> None:
    from feedline._service import statefile
    from feedline.errors import SpecError

    monkeypatch.setattr(statefile, "MAX_BYTES", 1000)
    (tmp_path / "big.json").write_text(" " * 1001)
    with pytest.raises(SpecError, match="larger than"):
        statefile.StateFile(tmp_path / "big.json", {"train": "0123"}).load()


def test_a_fifo_given_as_the_spec_is_one_line_not_a_hang(tmp_path: Path) -> None:
    """open() of a FIFO blocks until a writer comes: spec --check hung on one, in silence."""
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    _one_line_error(_run("spec", "--check", str(fifo)), r"spec.yaml: not a regular file \(a pipe or device\)")
