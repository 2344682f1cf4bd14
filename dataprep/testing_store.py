"""A real S3 API on loopback for tests, docs and benchmarks: moto's server with a fault-injecting
proxy in front (:class:`LoopbackS3`). Nothing leaves the machine (127.0.0.1 only).

The proxy forwards every request to moto and, by rule (:meth:`LoopbackS3.fault`), answers 503
SlowDown or 500 instead, resets the connection, truncates the body (full ``Content-Length``,
half the bytes), or delays (``delay_s``; a delay past the client's time-out is a time-out).
``latency_s`` adds a fixed delay to every request (a store's round trip); ``serve_ranges``
answers ranged GETs from each object read whole once (moto copies the whole object for each,
which a store does not; for benchmarks, objects written through the proxy). :meth:`env` is what a
client needs (dummy credentials, the proxy as endpoint); it never touches ``os.environ``.
Needs moto's server extra (``pip install 'moto[server]'``) and boto3 (dev dependencies).
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: the dummy credentials of the loopback store (moto accepts any)
DUMMY_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
             "AWS_EC2_METADATA_DISABLED": "true"}
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclass
class Rule:
    """Answer ``action`` (``"503"``, ``"500"``, ``"reset"``, ``"truncate"``, ``"delay"``) to the
    next ``times`` requests (``None``: all) whose method and path match."""

    action: str
    method: str | None = None
    path: str | None = None
    times: int | None = 1
    delay_s: float = 0.0
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return ((self.times is None or self.hits < self.times)
                and (self.method is None or self.method == method)
                and (self.path is None or re.search(self.path, path) is not None))


@dataclass
class _State:
    upstream: tuple[str, int]
    latency_s: float = 0.0
    rules: list[Rule] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: path -> (headers, bytes) of objects read whole once, ranged GETs answered from them
    #: (``None``: off; every request goes to moto)
    objects: dict[str, tuple[dict[str, str], bytes]] | None = None

    def pick(self, method: str, path: str) -> Rule | None:
        with self.lock:
            self.counts[method] += 1
            for rule in self.rules:
                if rule.matches(method, path):
                    rule.hits += 1
                    return rule
        return None


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # headers and body go out as two writes: without this, Nagle meets the client's
            # delayed ACK and every small answer waits 40 ms
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _reset(self) -> None:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

        def _error(self, code: int, s3code: str, message: str) -> None:
            body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{s3code}</Code>'
                    f"<Message>{message}</Message></Error>").encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _admin(self, body: bytes) -> None:
            """``/__proxy__/counts`` (GET: requests by method; DELETE: zero them) and
            ``/__proxy__/latency`` (PUT ``{"s": 0.02}``): a server in another process, driven."""
            if self.path.endswith("/latency") and self.command == "PUT":
                state.latency_s = float(json.loads(body)["s"])
            with state.lock:
                out = json.dumps(dict(state.counts)).encode()
                if self.path.endswith("/counts") and self.command == "DELETE":
                    state.counts.clear()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def _any(self) -> None:
            body = self._body()
            if self.path.startswith("/__proxy__/"):
                self._admin(body)
                return
            if state.latency_s:
                time.sleep(state.latency_s)
            rule = state.pick(self.command, self.path)
            action = rule.action if rule else None
            if action == "delay" and rule is not None:
                time.sleep(rule.delay_s)
            if action == "reset":
                self._reset()
                return
            if action == "503":
                self._error(503, "SlowDown", "Please reduce your request rate.")
                return
            if action == "500":
                self._error(500, "InternalError", "We encountered an internal error. Please try again.")
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            ranged = self._ranged(headers)
            if ranged is None:
                status, reason, answer, data = self._upstream(self.command, self.path, body, headers)
            else:
                status, reason, answer, data = ranged
            self.send_response(status, reason)
            for k, v in answer:
                if k.lower() not in _HOP and k.lower() not in ("content-length", "date", "server"):
                    self.send_header(k, v)
            # a HEAD answer has no body: its Content-Length is the object's size
            self.send_header("Content-Length", dict((k.lower(), v) for k, v in answer).get("content-length", "0")
                             if self.command == "HEAD" else str(len(data)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if action == "truncate" and len(data) > 1:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self._reset()
                return
            self.wfile.write(data)

        def _upstream(self, method: str, path: str, body: bytes,
                      headers: dict[str, str]) -> tuple[int, str, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*state.upstream, timeout=60)
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            return resp.status, resp.reason, resp.getheaders(), data

        def _ranged(self, headers: dict[str, str]) -> tuple[int, str, list[tuple[str, str]], bytes] | None:
            """A ranged GET of an object answered from its bytes read once (``objects`` on):
            moto copies a whole object for every ranged GET, which a store does not."""
            if state.objects is None:
                return None
            key = self.path.split("?")[0]
            if self.command != "GET" or "?" in self.path:
                if self.command in ("PUT", "POST", "DELETE"):
                    with state.lock:
                        state.objects.pop(key, None)
                return None
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", headers.get("Range", headers.get("range", "")))
            if m is None:
                return None
            with state.lock:
                held = state.objects.get(key)
            if held is None:
                plain = {k: v for k, v in headers.items() if k.lower() not in ("range", "if-match")}
                status, _, answer, data = self._upstream("GET", self.path, b"", plain)
                if status != 200:
                    return None
                held = ({k.lower(): v for k, v in answer}, data)
                with state.lock:
                    state.objects[key] = held
            meta, data = held
            match = headers.get("If-Match", headers.get("if-match"))
            if match is not None and match != meta.get("etag"):
                return None  # moto answers the precondition
            a, b = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
            if a > b:
                return None
            out = [(k, meta[k]) for k in ("etag", "last-modified", "content-type") if k in meta]
            return 206, "Partial Content", out + [("Content-Range", f"bytes {a}-{b}/{len(data)}")], data[a:b + 1]

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    return Proxy


class LoopbackS3:
    """moto's S3 server on 127.0.0.1 behind a fault-injecting proxy; :attr:`endpoint` is the proxy's."""

    def __init__(self, latency_s: float = 0.0, serve_ranges: bool = False) -> None:
        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.state = _State(upstream=(host, port), latency_s=latency_s, objects={} if serve_ranges else None)
        self._proxy = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self._proxy.daemon_threads = True
        self._proxy.handle_error = lambda request, address: None  # type: ignore[method-assign] # a client gone mid-answer
        self._thread = threading.Thread(target=self._proxy.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._proxy.server_address[1]}"
        self.direct_endpoint = f"http://{host}:{port}"

    def env(self) -> dict[str, str]:
        """The environment a client of this store needs (dummy credentials, the proxy endpoint)."""
        return {**DUMMY_ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self) -> Any:
        """A boto3 S3 client talking to moto directly (set-up and inspection, never faulted)."""
        import boto3
        return boto3.client("s3", endpoint_url=self.direct_endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def create_bucket(self, bucket: str) -> str:
        """Create ``bucket`` (if absent) and return ``s3://bucket``."""
        c = self.client()
        try:
            c.create_bucket(Bucket=bucket)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        return f"s3://{bucket}"

    def fault(self, action: str, *, method: str | None = None, path: str | None = None,
              times: int | None = 1, delay_s: float = 0.0) -> Rule:
        """Add a fault rule (see :class:`Rule`); returns it (its ``hits`` count what it did)."""
        rule = Rule(action, method, path, times, delay_s)
        with self.state.lock:
            self.state.rules.append(rule)
        return rule

    def clear_faults(self) -> None:
        with self.state.lock:
            self.state.rules.clear()

    @contextmanager
    def faults(self, *rules: Rule) -> Iterator[list[Rule]]:
        """The given rules for the body of a ``with``, then none."""
        with self.state.lock:
            self.state.rules.extend(rules)
        try:
            yield list(rules)
        finally:
            self.clear_faults()

    def counts(self) -> Counter[str]:
        """Requests the proxy has seen, by method."""
        with self.state.lock:
            return Counter(self.state.counts)

    def reset_counts(self) -> None:
        with self.state.lock:
            self.state.counts.clear()

    def close(self) -> None:
        self._proxy.shutdown()
        self._proxy.server_close()
        self._moto.stop()

    def __enter__(self) -> LoopbackS3:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    """``python -m dataprep.testing_store [--latency-ms 20]``: serve until killed; prints the
    proxy's endpoint as the first line (``AWS_ENDPOINT_URL=...``)."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--serve-ranges", action="store_true",
                    help="answer ranged GETs from each object read whole once (objects written only through the proxy)")
    args = ap.parse_args()
    with LoopbackS3(latency_s=args.latency_ms / 1e3, serve_ranges=args.serve_ranges) as server:
        print(f"AWS_ENDPOINT_URL={server.endpoint}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
