"""Shared fixtures of the service tests: a small corpus, a tokenizer, specs, and servers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from feedline._service.launch import READY_PREFIX
from feedline.testing import make_corpus

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
GPT2 = SHARED / "tokenizers" / "gpt2"


def tokenizer_path(tmp: Path) -> str:
    """The real GPT-2 tokenizer when the shared data is present, else a tiny BPE trained here."""
    if (GPT2 / "tokenizer.json").is_file():
        return str(GPT2)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<unk>"])
    files = make_corpus(tmp / "tok-corpus", files=1, docs=50)
    texts = [json.loads(line)["text"] for line in Path(files[0]).read_text().splitlines()]
    tok.train_from_iterator(texts, trainer)
    path = tmp / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def make_spec(tmp: Path, tokenizer: str, *, name: str = "train", docs: int = 40, batch_size: int = 8,
              seed: int = 3) -> dict[str, Any]:
    corpus = tmp / name
    if not corpus.exists():
        make_corpus(corpus, files=2, docs=docs, seed=seed)
    return {"sources": [{"path": str(corpus / "*.jsonl")}], "tokenizer": tokenizer, "seed": seed,
            "task": {"kind": "clm", "max_length": 48}, "shuffle": {"buffer": 16},
            "batching": {"strategy": "pad", "batch_size": batch_size}}


def write_spec(path: Path, spec: dict[str, Any]) -> str:
    path.write_text(json.dumps(spec))
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(spec_path: str, *args: str, bind: str = "tcp://127.0.0.1:0") -> tuple[subprocess.Popen[str], str]:
    """Start ``feedline serve`` and wait until it listens; returns the process and address."""
    proc = subprocess.Popen([sys.executable, "-m", "feedline", "serve", spec_path, "--bind", bind, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(READY_PREFIX):
            return proc, line[len(READY_PREFIX):].strip()
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"feedline serve did not start (exit code {proc.poll()})")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def rows(batch: dict[str, np.ndarray]) -> list[bytes]:
    """Each row of a batch as bytes (all fields), for order-free comparison."""
    n = len(batch["input_ids"])
    return sorted(b"".join(np.ascontiguousarray(batch[k][i]).tobytes() for k in sorted(batch)) for i in range(n))




# ----------------------------------------------------------------------------- the HTTP gateway
HTTP_FAST = ["--heartbeat", "0.2", "--timeout", "1.5"]


def start_http(spec_path: str, *args: str, stderr: Any = subprocess.DEVNULL,
               preexec_fn: Any = None) -> tuple[subprocess.Popen[str], str]:
    """``feedline serve SPEC --http 127.0.0.1:0 ARGS``; returns the process and the base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "feedline", "serve", spec_path, *HTTP_FAST, *args],
                            stdout=subprocess.PIPE, stderr=stderr, text=True, preexec_fn=preexec_fn)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(READY_PREFIX):
            proc.address = line[len(READY_PREFIX):].strip()  # type: ignore[attr-defined]
        if "HTTP on " in line:
            return proc, line.split("HTTP on ", 1)[1].split("/ ", 1)[0]
    proc.kill()
    proc.stdout.close()
    raise AssertionError(f"no HTTP endpoint (exit {proc.wait()})")


def stop_http(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def http_get(url: str, accept: str = "application/json", token: str | None = None,
             timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept, **({"Authorization": f"Bearer {token}"}
                                                                   if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
