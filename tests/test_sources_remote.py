"""URLs: streamed through fsspec from a real HTTP server on loopback that drops connections."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import ClassVar

import pytest

from feedline._records import records
from feedline._sources.remote import open_url
from feedline.errors import RecordError, SourceError
from heavy import needs

pytestmark = needs("aiohttp")


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``files``; the first ``drops[path]`` full requests are cut off halfway."""

    files: ClassVar[dict[str, bytes]] = {}
    drops: ClassVar[dict[str, int]] = {}
    unsized: ClassVar[set[str]] = set()  # answered with no Content-Length (the body ends at the close)
    ranges_seen: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _head(self, code: int, length: int, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        if self.path in self.unsized:
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def do_HEAD(self) -> None:
        body = self.files.get(self.path)
        if body is None:
            self._head(404, 0)
        else:
            self._head(200, len(body))

    def do_GET(self) -> None:
        body = self.files.get(self.path)
        if body is None:
            self._head(404, 0)
            return
        rng = self.headers.get("Range")
        if rng:
            self.ranges_seen.append(rng)
            start = int(rng.split("=")[1].split("-")[0])
            part = body[start:]
            self._head(206, len(part), {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"})
            self.wfile.write(part)
            return
        if self.drops.get(self.path, 0) > 0:
            self.drops[self.path] -= 1
            self._head(200, len(body))
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            time.sleep(0.3)  # let the client consume the first half before the drop
            self.close_connection = True
            self.connection.shutdown(2)  # drop the connection mid-body
            return
        self._head(200, len(body))
        self.wfile.write(body)


@pytest.fixture()
def server() -> Iterator[str]:
    _Handler.files, _Handler.drops, _Handler.ranges_seen, _Handler.unsized = {}, {}, [], set()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _corpus(n: int = 3000) -> bytes:
    return "".join(json.dumps({"text": f"remote document {i} " + "word " * (i % 40)}) + "\n" for i in range(n)).encode()


@pytest.mark.slow
def test_open_url_resumes_a_dropped_connection_with_a_range_request(server: str) -> None:
    body = _corpus()
    _Handler.files["/c.jsonl"] = body
    _Handler.drops["/c.jsonl"] = 1
    with open_url(f"{server}/c.jsonl", backoff=0.01) as f:
        got = f.read()
    assert got == body
    assert _Handler.ranges_seen and _Handler.ranges_seen[0] != "bytes=0-"


@pytest.mark.slow
def test_seek_from_the_end_of_an_object_of_unknown_size_is_refused(server: str) -> None:
    """SEEK_END needs the size: with none reported it raises (it seeked from 0 and read the start)."""
    import io

    body = _corpus(50)
    _Handler.files["/sized.jsonl"] = _Handler.files["/unsized.jsonl"] = body
    _Handler.unsized.add("/unsized.jsonl")
    with open_url(f"{server}/sized.jsonl", backoff=0.01) as f:
        assert f.seek(-10, io.SEEK_END) == len(body) - 10 and f.read() == body[-10:]
    with open_url(f"{server}/unsized.jsonl", backoff=0.01) as f:
        with pytest.raises(io.UnsupportedOperation, match=r"unsized\.jsonl: cannot seek from the end"):
            f.seek(-10, io.SEEK_END)
        assert f.tell() == 0 and f.read() == body  # still readable from the start
        with pytest.raises(ValueError, match="whence 7"):
            f.raw.seek(0, 7)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_url_source_delivers_every_record_across_a_drop(server: str) -> None:
    body = _corpus()
    _Handler.files["/c.jsonl"] = body
    _Handler.drops["/c.jsonl"] = 2
    recs = list(records({"sources": [f"{server}/c.jsonl"]}))
    assert [r["text"] for r in recs] == [json.loads(x)["text"] for x in body.splitlines()]


@pytest.mark.slow
def test_url_404_stops_the_run_unless_on_unreadable_skip(server: str) -> None:
    _Handler.files["/ok.jsonl"] = _corpus(10)
    spec = {"sources": [{"path": f"{server}/missing.jsonl"}, {"path": f"{server}/ok.jsonl"}]}
    with pytest.raises(SourceError, match=r"missing\.jsonl.*on_unreadable: skip"):
        list(records(spec))  # half the data is not lost quietly
    assert len(list(records({**spec, "on_unreadable": "skip"}))) == 10  # counted, the other file read
    with pytest.raises(RecordError, match=r"missing\.jsonl.*unreadable"):
        list(records({**spec, "on_unreadable": "skip", "on_error": "raise"}))


@pytest.mark.slow
def test_open_url_gives_up_after_retries(server: str) -> None:
    _Handler.files["/c.jsonl"] = _corpus(100)
    with pytest.raises(SourceError, match="not found"):
        open_url(f"{server}/nope.jsonl", backoff=0.01).read()
