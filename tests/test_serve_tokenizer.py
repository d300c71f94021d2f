"""``feedline serve`` with partitions in worker processes holds no tokenizer (issue 34 item 3).

The workers encode; the server process only composes steps. Its preflight loads the tokenizer to
check it (and runs a small corpus's first batch), then drops it: while it serves, the server
process neither loads a tokenizer nor keeps one. A real ``feedline serve`` process (its tokenizer
loads counted and its live tokenizers found by a wrapper around the CLI), a real client, real
worker processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

import feedline
from feedline.testing import make_corpus

pytestmark = pytest.mark.slow

RUNNER = textwrap.dedent("""
    import atexit, gc, json, sys


    def run():   # the server process only: its workers import this module too
        from feedline._tokenize import load as L
        from feedline._tokenize.tokenizer import Tokenizer
        from feedline._service.server import Server
        from feedline._cli.__main__ import main

        seen = {"listening": False, "loads_while_serving": 0}
        out = sys.argv[1]
        real_bind, real_load = Server.bind, L.load_tokenizer

        def bind(self):
            out = real_bind(self)
            seen["listening"] = True
            return out

        def load(name):
            if seen["listening"]:
                seen["loads_while_serving"] += 1
            return real_load(name)

        load.cache_clear = real_load.cache_clear
        Server.bind, L.load_tokenizer = bind, load

        def report():
            gc.collect()
            seen["held"] = sum(1 for o in gc.get_objects() if isinstance(o, Tokenizer))
            with open(out, "w") as f:
                json.dump(seen, f)

        atexit.register(report)
        sys.argv = ["feedline", *sys.argv[2:]]
        return main()


    if __name__ == "__main__":
        sys.exit(run())
""")



def test_a_server_with_partitions_in_processes_holds_no_tokenizer(tmp_path: Path, gpt2_path: str) -> None:
    files = make_corpus(tmp_path / "corpus", files=4, docs=120)
    spec = tmp_path / "train.yaml"
    spec.write_text(yaml.safe_dump({
        "sources": [str(Path(files[0]).parent)], "tokenizer": gpt2_path, "epochs": None,
        "task": {"kind": "clm", "max_length": 128}, "batching": {"strategy": "pack", "batch_size": 4},
        "partitions": 2, "parallel": {"placement": "processes", "warm_start": False}}))
    runner, report = tmp_path / "runner.py", tmp_path / "report.json"
    runner.write_text(RUNNER)
    proc = subprocess.Popen([sys.executable, str(runner), str(report), "serve", str(spec), "--bind",
                             "tcp://127.0.0.1:0", "--stop-with-stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if "listening on " not in line:
            proc.kill()
            pytest.fail(f"feedline serve did not start: {line!r} {proc.communicate()[1][-2000:]}")
        address = line.split("listening on ", 1)[1].strip()
        with feedline.Loader(address) as client:
            it = iter(client)
            got = [next(it) for _ in range(12)]
        assert all(np.asarray(b["input_ids"]).shape == (4, 128) for b in got)
        proc.stdin.close()   # the server drains and stops
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    seen = json.loads(report.read_text())
    assert seen["listening"]
    assert seen["loads_while_serving"] == 0, seen
    assert seen["held"] == 0, f"the server process holds {seen['held']} tokenizer(s) (its preflight's kept?)"
