"""The service's seams: errors keep their type across the wire, dispatch logic runs without sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import feedline
from feedline.errors import RecordError
from feedline.service import serve_process
from service_helpers import tokenizer_path


def _bad_corpus(tmp: Path) -> dict[str, Any]:
    lines = [json.dumps({"text": f"document number {i} " * 8}) for i in range(30)]
    lines[17] = '{"text": "a broken line'
    (tmp / "c.jsonl").write_text("\n".join(lines) + "\n")
    return {"sources": [str(tmp / "c.jsonl")], "tokenizer": tokenizer_path(tmp), "on_error": "raise",
            "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pad", "batch_size": 4}}


def _first_error(loader: Any) -> BaseException:
    try:
        for _ in loader:
            pass
    except Exception as e:
        return e
    finally:
        loader.close()
    raise AssertionError("no error raised")


@pytest.mark.timeout(90)
def test_a_record_error_in_the_server_arrives_as_record_error(tmp_path: Path) -> None:
    spec = _bad_corpus(tmp_path)
    local = _first_error(feedline.Loader(spec))
    assert isinstance(local, RecordError) and local.line == 18
    with serve_process(spec, args=["--heartbeat", "0.2", "--timeout", "2"]) as address:
        remote = _first_error(feedline.Loader(address))
    assert type(remote) is RecordError, repr(remote)
    assert (remote.path, remote.line, remote.reason) == (local.path, local.line, local.reason)
    assert str(local) in str(remote)
