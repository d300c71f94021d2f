"""A real S3-compatible server for tests (moto's, in a thread) behind a proxy that can misbehave.

``S3Fixture`` starts ``moto.server.ThreadedMotoServer`` on a free loopback port and an HTTP proxy
in front of it; clients are pointed at the proxy with the standard ``AWS_ENDPOINT_URL_S3``. The
proxy forwards every request and records ``(method, path, Range)``; a test can make it answer the
next GETs of an object with a 503, cut a body short and drop the connection, or ignore ``Range``.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fixture: S3Fixture

    def log_message(self, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        fx = self.fixture
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = urlsplit(self.path).path
        rng = self.headers.get("Range")
        body_read = self.command == "GET" and rng not in ("bytes=0-1", "bytes=0-3")  # faults hit reads of the body
        with fx.lock:
            fx.requests.append((self.command, self.path, rng))
            fail = body_read and fx.fail[key] > 0
            cut = body_read and not fail and fx.cut[key] > 0
            if fail:
                fx.fail[key] -= 1
            if cut:
                fx.cut[key] -= 1
        if fail:
            msg = b"<Error><Code>SlowDown</Code><Message>injected 503</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        conn = http.client.HTTPConnection("127.0.0.1", fx.moto_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP
                       and not (k.lower() == "range" and key in fx.ignore_range)}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and (k.lower() != "content-length" or self.command == "HEAD"):
                self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if cut and len(data) > 1:
            self.wfile.write(data[: len(data) // 2])  # the announced length is never reached
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


class S3Fixture:
    """moto's S3 server plus a recording, fault-injecting proxy; ``endpoint`` is the proxy's URL."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.moto_port = free_port()
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.moto_port, verbose=False)
        self.moto.start()
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str | None]] = []
        self.fail: Counter[str] = Counter()
        self.cut: Counter[str] = Counter()
        self.ignore_range: set[str] = set()  # objects whose GETs are forwarded without Range (answered whole)
        handler = type("Proxy", (_Proxy,), {"fixture": self})
        self.proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.proxy.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.proxy.server_address[1]}"
        self._thread = threading.Thread(target=self.proxy.serve_forever, daemon=True)
        self._thread.start()

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.moto_port}", region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def gets(self, key: str) -> list[str | None]:
        """The Range headers of the GETs of one object (``/bucket/key``) so far, not counting the
        few-byte reads of its head (the UTF-16 check)."""
        with self.lock:
            return [r for m, p, r in self.requests if m == "GET" and urlsplit(p).path == key
                    and r not in ("bytes=0-1", "bytes=0-3")]

    def close(self) -> None:
        self.proxy.shutdown()
        self.proxy.server_close()
        self.moto.stop()
