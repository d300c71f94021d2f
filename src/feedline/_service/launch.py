"""Run ``feedline serve`` as a child process, for demos, tests and single-machine jobs.

    >>> with serve_process("train.yaml") as address:            # doctest: +SKIP
    ...     for batch in feedline.Loader(address): ...

The child binds a free loopback port (unless ``bind`` is given), prints its address once ready,
and is stopped with SIGTERM (drain, then exit) when the block ends; SIGKILL follows if it has not
exited within ``stop_timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from feedline._spec import Spec
from feedline.errors import TransportError, TransportTimeout

__all__ = ["READY_PREFIX", "serve_process"]

READY_PREFIX = "feedline serve: listening on "


@contextlib.contextmanager
def serve_process(spec: str | os.PathLike[str] | Mapping[str, Any] | Spec, bind: str | None = None, *,
                  args: Sequence[str] = (), ready_timeout: float = 60.0, stop_timeout: float = 15.0,
                  env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Start ``feedline serve`` on ``spec``; yields the address to pass to ``feedline.Loader``.

    Args:
        spec: a spec file, or a mapping/``Spec`` (written to a temporary JSON file; its relative
            paths are read from the working directory, as ``feedline.Loader(mapping)`` reads them,
            unless it names a ``root``).
        bind: the address to bind (default: a free port on 127.0.0.1).
        args: more ``feedline serve`` options, e.g. ``["--window", "16"]``.
        ready_timeout: seconds to wait for the server to be listening.
        stop_timeout: seconds to wait after SIGTERM before SIGKILL.
        env: extra environment variables for the child.

    Raises:
        TransportError: the server exited before it was ready (its error output is included).
        TransportTimeout: it did not become ready in time.
    """
    tmp: str | None = None
    if isinstance(spec, (str, os.PathLike)):
        path = str(spec)
    else:
        data = spec.to_dict() if isinstance(spec, Spec) else dict(spec)
        if data.get("root") is None:
            data["root"] = os.getcwd()  # the temporary file's folder is not where the user's paths are
        fd, tmp = tempfile.mkstemp(prefix="feedline-spec-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, default=str)
        path = tmp
    # --stop-with-stdin: the server holds the read end of a pipe only this process writes to, so it
    # stops when this process ends, even by SIGKILL or os._exit, instead of outliving it.
    cmd = [sys.executable, "-m", "feedline", "serve", path, "--bind", bind or "tcp://127.0.0.1:0", "--stop-with-stdin",
           *args]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    stderr: list[str] = []
    drain = threading.Thread(target=lambda: stderr.extend(proc.stderr or ()), daemon=True)
    drain.start()
    try:
        address = _wait_ready(proc, ready_timeout, stderr, drain)
        yield address
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        drain.join(timeout=5)   # it reads the last of stderr: closing the pipe under it raised in its thread
        for stream in (proc.stdin, proc.stdout, proc.stderr if not drain.is_alive() else None):
            if stream is not None:
                stream.close()
        if tmp is not None:
            os.unlink(tmp)


def _wait_ready(proc: subprocess.Popen[str], timeout: float, stderr: list[str], drain: threading.Thread) -> str:
    result: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY_PREFIX):
                result.append(line[len(READY_PREFIX):].strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if result:
        return result[0]
    if not reader.is_alive():  # its standard output ended: it is exiting (a refused spec exits at once)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    if proc.poll() is not None:
        reader.join(1)
        drain.join(5)  # the whole of its error output
        raise TransportError(f"feedline serve exited with code {proc.returncode}: {''.join(stderr).strip()[-2000:]}")
    raise TransportTimeout(f"feedline serve was not listening after {timeout:.0f}s")
