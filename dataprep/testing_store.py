"""A real S3 API on loopback for tests, docs and benchmarks: moto's server with a fault-injecting
proxy in front (:class:`LoopbackS3`). Nothing leaves the machine (127.0.0.1 only).

The proxy forwards every request to moto and, by rule (:meth:`LoopbackS3.fault`), answers 503,
500, resets, truncates the body or delays (past the client's time-out, a time-out); ``latency_s``
adds a fixed delay to every request (a store's round trip). ``store_like`` (the
benchmarks' mode) answers from moto's state in this process, at a store's cost: ListObjectsV2
from each bucket's keys sorted once (moto sorts the bucket for every page), GETs and HEADs read in
place, moto's XML byte for byte and its headers; whatever it cannot answer exactly goes to moto.
Latency and faults apply either way. :meth:`LoopbackS3.load` puts local files into moto in-process.
:meth:`env` is what a client needs (dummy credentials, the proxy as endpoint), :meth:`gcs_env` a
``gs://`` client of the same buckets; neither touches ``os.environ``. Needs moto's server extra (``pip install 'moto[server]'``) and boto3 (dev dependencies).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import itertools
import json
import logging
import re
import secrets
import socket
import struct
import threading
import time
import urllib.parse
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

#: the dummy credentials of the loopback store (moto accepts any)
DUMMY_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
             "AWS_EC2_METADATA_DISABLED": "true"}
#: what the proxy sends moto instead of a ``gs://`` client's empty bearer token: moto reads the
#: service from a SigV4 header's scope (and refuses an anonymous write over an existing object)
_GCS_AS_S3 = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0"
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
#: an answer: status, reason, headers, body
_Answer = tuple[int, str, list[tuple[str, str]], bytes]
#: the query parameters of a ListObjectsV2 the proxy answers itself (any other: moto answers)
_LIST_PARAMS = {"list-type", "prefix", "delimiter", "continuation-token", "start-after", "max-keys", "fetch-owner",
                "encoding-type"}
#: moto's owner of every object (ListObjectsV2 with fetch-owner)
_OWNER = ("<Owner><DisplayName>webfile</DisplayName>"
          "<ID>75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a</ID></Owner>")


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
    #: answers ListObjectsV2, GETs and HEADs from moto's state in-process (``None``: off)
    store: _StoreLike | None = None

    def pick(self, method: str, path: str) -> Rule | None:
        with self.lock:
            self.counts[method] += 1
            for rule in self.rules:
                if rule.matches(method, path):
                    rule.hits += 1
                    return rule
        return None


def _moto_bucket(name: str) -> tuple[Any, Any] | None:
    """(moto's S3 backend, the bucket) of bucket ``name`` in this process, or ``None``."""
    from moto.s3.models import s3_backends
    where = s3_backends.bucket_accounts.get(name)
    if where is None:
        return None
    partition, account = where
    backend = s3_backends[account][partition]
    bucket = backend.buckets.get(name)
    return None if bucket is None else (backend, bucket)


def _el(tag: str, text: str) -> str:
    """One XML element as moto's serializer writes it (``<Tag/>`` when empty)."""
    return f"<{tag}>{escape(text)}</{tag}>" if text else f"<{tag}/>"


class _StoreLike:
    """Answers from moto's state in this process what moto answers at more than a store's cost:
    ListObjectsV2 pages walked from each bucket's keys sorted once, and GETs and HEADs of objects
    read in place. Every method returns ``None`` for a request it does not answer exactly as moto
    would (versioned buckets, CORS, other conditions or query parameters, errors): moto answers
    those. The sorted keys are moto's own, read again at each listing: a listing sees every
    write, whichever way it came (through the proxy, to moto directly, a multipart upload, a
    batch delete); the names are sorted again only when they changed (checked by comparing them,
    in moto's order, with those sorted last: about 1 ms at 100,000 keys)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: bucket name -> (the bucket, its keys in moto's order, sorted)
        self.sorted: dict[str, tuple[Any, list[str], list[str]]] = {}
        #: continuation token -> the last name of the page that gave it
        self.tokens: dict[str, str] = {}
        #: requests answered here, by kind (``list``, ``GET``, ``HEAD``)
        self.answered: Counter[str] = Counter()

    def answer(self, method: str, target: str, headers: dict[str, str]) -> _Answer | None:
        path, _, query = target.partition("?")
        bucket, _, key = path.lstrip("/").partition("/")
        found = _moto_bucket(urllib.parse.unquote(bucket)) if bucket else None
        if found is None or found[1].versioning_status or found[1].cors:
            return None
        out = None
        if method == "GET" and not key and "list-type=2" in query.split("&"):
            out, kind = self.list_v2(*found, query), "list"
        elif method in ("GET", "HEAD") and key and not query:
            out, kind = self.get(found[1], urllib.parse.unquote(key), method,
                                 {k.lower(): v for k, v in headers.items()}), method
        if out is not None:
            with self.lock:
                self.answered[kind] += 1
        return out

    def names(self, bucket: Any) -> list[str]:
        """The bucket's key names, sorted."""
        order = list(dict.keys(bucket.keys))  # moto's own dict, copied whole under the GIL
        with self.lock:
            held = self.sorted.get(bucket.name)
            if held is not None and held[0] is bucket and held[1] == order:
                return held[2]
        names = sorted(order)
        with self.lock:
            self.sorted[bucket.name] = (bucket, order, names)
        return names

    @staticmethod
    def _walk(names: list[str], prefix: str, delimiter: str, after: str | None) -> Iterator[tuple[str, bool]]:
        """(name, is a common prefix) in order, as moto merges keys and common prefixes: those
        after ``after``, under ``prefix``; a common prefix's keys are skipped by bisection."""
        i = bisect_left(names, prefix)
        if after is not None:
            i = max(i, bisect_right(names, after))
        while i < len(names):
            name = names[i]
            if not name.startswith(prefix):
                return
            j = name.find(delimiter, len(prefix)) if delimiter else -1
            if j < 0:
                yield name, False
                i += 1
                continue
            folder = name[: j + len(delimiter)]
            # every name starting with FOLDER sorts before FOLDER with its last character raised
            i = bisect_left(names, folder[:-1] + chr(ord(folder[-1]) + 1), i + 1)
            if after is None or folder > after:
                yield folder, True

    def list_v2(self, backend: Any, bucket: Any, query: str) -> _Answer | None:
        """ListObjectsV2, the XML moto's ``list_objects_v2`` writes, byte for byte."""
        from moto import settings
        q = {k: v[0] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}
        if not set(q) <= _LIST_PARAMS or q.get("encoding-type") not in (None, "url"):
            return None
        prefix, delimiter = q.get("prefix"), q.get("delimiter")
        token, start_after = q.get("continuation-token"), q.get("start-after")
        max_keys = int(q.get("max-keys", settings.get_s3_default_max_keys()))
        if max_keys < 0 or token == "":
            return None
        after = start_after
        if token:
            with self.lock:
                after = self.tokens.get(token) or backend._pagination_tokens.get(token)
            if after is None:
                return None
        walk = self._walk(self.names(bucket), prefix or "", delimiter or "", after)
        items = list(itertools.islice(walk, max_keys + 1)) if max_keys else []
        truncated = len(items) > max_keys
        items = items[:max_keys]
        next_token = None
        if truncated:
            next_token = hashlib.md5(items[-1][0].encode("utf-8")).hexdigest()
            with self.lock:
                self.tokens[next_token] = items[-1][0]
            backend._pagination_tokens[next_token] = items[-1][0]  # moto takes the page on from it too
        url = q.get("encoding-type") == "url"
        contents, folders = [], []
        for name, is_folder in items:
            if is_folder:
                folders.append(f"<CommonPrefixes>{_el('Prefix', urllib.parse.quote(name) if url else name)}"
                               "</CommonPrefixes>")
                continue
            key = bucket.keys.get(name)
            if key is None:  # deleted since the names were read
                continue
            contents.append("<Contents>" + _el("Key", urllib.parse.quote(name) if url else name)
                            + _el("LastModified", key.last_modified_ISO8601) + _el("ETag", key.etag)
                            + (_el("ChecksumAlgorithm", key.checksum_algorithm) if key.checksum_algorithm else "")
                            + _el("Size", str(key.size)) + _el("StorageClass", key.storage_class)
                            + (_OWNER if q.get("fetch-owner") else "") + "</Contents>")
        shown = (urllib.parse.quote(prefix) if prefix else "") if url else (prefix or "")
        body = ('<?xml version="1.0" encoding="utf-8"?>\n'
                '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                + _el("IsTruncated", "true" if truncated else "false") + "".join(contents)
                + _el("Name", bucket.name) + _el("Prefix", shown)
                + (_el("Delimiter", delimiter) if delimiter else "") + _el("MaxKeys", str(max_keys))
                + ("".join(folders) if delimiter else "") + (_el("EncodingType", "url") if url else "")
                + _el("KeyCount", str(len(contents) + len(folders)))
                + (_el("NextContinuationToken", next_token) if next_token else "")
                + (_el("StartAfter", start_after) if start_after and not token else "")
                + "</ListBucketResult>")
        return 200, "OK", [("Content-Type", "application/xml"), ("x-amzn-requestid", secrets.token_hex(16))], \
            body.encode("utf-8")

    @staticmethod
    def get(bucket: Any, name: str, method: str, headers: dict[str, str]) -> _Answer | None:
        """GET (whole, or one range as moto parses it) or HEAD of an object, its bytes read in
        place (moto copies the whole object first); the headers moto sends. A wrong ``If-Match``,
        other conditions and checksums: moto answers."""
        from moto.s3.models import FakeKey
        key = bucket.keys.get(name)
        if not isinstance(key, FakeKey) or key.storage_class != "STANDARD":
            return None
        if any(h in headers for h in ("if-none-match", "if-modified-since", "if-unmodified-since")):
            return None
        match = headers.get("if-match")
        if match and key.etag not in ((match,) if method == "HEAD" else (match, f'"{match}"')):
            return None  # moto answers the precondition (412)
        if headers.get("x-amz-checksum-mode") == "ENABLED" and key.checksum_algorithm:
            return None
        out: dict[str, str] = {}
        if method == "HEAD":
            if "range" in headers:
                return None
            out.update(key.metadata)
            out.update(key.response_dict)
            out["Accept-Ranges"] = "bytes"
            return 200, "OK", list(out.items()), b""
        if key.version_id != "null":
            out["x-amz-version-id"] = key.version_id
        out.update(key.response_dict)
        out.update(key.metadata)
        out["Accept-Ranges"] = "bytes"
        size = key.size
        begin, end, status, reason = 0, size - 1, 200, "OK"
        if "range" in headers:
            unit, _, spec = headers["range"].partition("=")
            m = re.fullmatch(r"(\d*)-(\d*)", spec.strip())
            if unit.strip() != "bytes" or m is None or m.group(0) == "-":
                return None
            a, b = (int(g) if g else None for g in m.groups())
            if a is not None:
                begin, end = a, size - 1 if b is None else min(b, size - 1)
            else:
                assert b is not None
                begin = size - min(b, size)
            if (a is None and b == 0) or begin > size - 1 or begin > end:
                return None  # moto's 416, or its whole-object answer
            out["content-range"] = f"bytes {begin}-{end}/{size}"
            status, reason = 206, "Partial Content"
        with key.lock:  # moto's own lock on the object's buffer
            key._value_buffer.seek(begin)
            data = key._value_buffer.read(end - begin + 1)
        return status, reason, list(out.items()), data


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

        def _as_s3(self) -> None:
            """A ``gs://`` client's request as moto's S3 takes it: the object name's ``/`` and
            ``.`` unescaped (GCS's client escapes them; moto reads ``%2F`` literally in a GET), an
            S3 signature's scope in place of its empty bearer token, or of none (its reads are
            unsigned; moto refuses an anonymous HEAD)."""
            path, sep, query = self.path.partition("?")
            self.path = urllib.parse.quote(urllib.parse.unquote(path), safe="/~") + sep + query
            del self.headers["Authorization"]
            self.headers["Authorization"] = _GCS_AS_S3

        def _any(self) -> None:
            body = self._body()
            if self.path.startswith("/__proxy__/"):
                self._admin(body)
                return
            if self.headers.get("Authorization", "Bearer").startswith("Bearer"):  # gcs_env's client
                self._as_s3()
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
            local = self._local(headers)
            if local is None:
                status, reason, answer, data = self._upstream(self.command, self.path, body, headers)
            else:
                status, reason, answer, data = local
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
                      headers: dict[str, str]) -> _Answer:
            conn = http.client.HTTPConnection(*state.upstream, timeout=60)
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            return resp.status, resp.reason, resp.getheaders(), data

        def _local(self, headers: dict[str, str]) -> _Answer | None:
            """The answer given here rather than by moto (``store_like`` on), or ``None``."""
            if state.store is None:
                return None
            try:
                return state.store.answer(self.command, self.path, headers)
            except Exception:  # anything moto's state did not let us answer exactly: moto answers
                logging.getLogger(__name__).debug("store-like answer failed", exc_info=True)
                return None

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    return Proxy


class LoopbackS3:
    """moto's S3 server on 127.0.0.1 behind a fault-injecting proxy; :attr:`endpoint` is the proxy's."""

    def __init__(self, latency_s: float = 0.0, store_like: bool = False) -> None:
        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.state = _State(upstream=(host, port), latency_s=latency_s, store=_StoreLike() if store_like else None)
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

    def gcs_env(self) -> dict[str, str]:
        """The environment of a ``gs://`` client of the same buckets: GCS's XML API, the one
        obstore's GCS client speaks, is S3's (a service-account key with ``gcs_base_url`` and
        ``disable_oauth``; the proxy takes its requests as S3's: :meth:`_as_s3`)."""
        key = {"gcs_base_url": self.endpoint, "disable_oauth": True, "client_email": "", "private_key": "",
               "private_key_id": ""}
        return {"GOOGLE_SERVICE_ACCOUNT_KEY": json.dumps(key), "GOOGLE_ALLOW_HTTP": "true"}

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

    def load(self, url: str, path: str | Path) -> int:
        """Put the file ``path`` at ``s3://bucket/key``, or every file under the folder ``path`` at
        ``s3://bucket/prefix/<its path under the folder>``, straight into moto's state in this
        process (no HTTP: tens of thousands of objects a second, where moto takes about a hundred
        PUTs a second); creates the bucket. Returns the number of objects."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        self.create_bucket(bucket)
        found = _moto_bucket(bucket)
        assert found is not None, bucket
        root = Path(path)
        if root.is_file():
            files = [(prefix or root.name, root)]
        else:
            files = [("/".join(filter(None, (prefix.rstrip("/"), f.relative_to(root).as_posix()))), f)
                     for f in sorted(root.rglob("*")) if f.is_file()]
        for key, f in files:
            _ = found[0].put_object(bucket, key, f.read_bytes(), disable_notification=True).etag  # as a PUT does
        return len(files)

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
    """``python -m dataprep.testing_store [--latency-ms 20] [--store-like] [--load s3://B/P=PATH ...]``:
    serve until killed; prints the proxy's endpoint as the first line (``AWS_ENDPOINT_URL=...``),
    once every ``--load`` is in the store."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--store-like", action="store_true",
                    help="answer listings, GETs and HEADs from moto's state in-process, at a store's cost")
    ap.add_argument("--load", action="append", default=[], metavar="s3://BUCKET/PREFIX=PATH",
                    help="put a local file or folder into the store before serving (repeatable)")
    args = ap.parse_args()
    with LoopbackS3(latency_s=args.latency_ms / 1e3, store_like=args.store_like) as server:
        for spec in args.load:
            url, _, path = spec.partition("=")
            server.load(url, path)
        print(f"AWS_ENDPOINT_URL={server.endpoint}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
