"""The loopback store's store-like mode (``LoopbackS3(store_like=True)``, the benchmarks'): the
proxy's own ListObjectsV2 pages equal moto's byte for byte (prefixes, delimiters, pages, start-after,
URL encoding, after writes whichever way they came), its GETs and HEADs moto's bytes and headers,
a wrong ``If-Match`` still 412, and latency and fault rules apply to what it answers itself."""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataprep.testing_store import LoopbackS3

BUCKET = "store-like"  # moto's state is the process's: a name no other test uses
KEYS = ["a/1.wav", "a/2.wav", "a/b/3.wav", "b/x/4.wav", "c.txt", "d&e <f>+.txt", "ü/5.wav"]
#: the volatile headers of an answer (who answered, when)
VOLATILE = {"server", "date", "x-amzn-requestid", "connection", "access-control-allow-origin"}


def _client(endpoint: str, checksums: bool = False) -> Any:
    import boto3
    from botocore.config import Config

    when = "when_supported" if checksums else "when_required"
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing",
                        config=Config(request_checksum_calculation=when, response_checksum_validation=when))


@pytest.fixture(scope="module")
def store() -> Iterator[LoopbackS3]:
    with LoopbackS3(store_like=True) as server:
        server.create_bucket(BUCKET)
        direct = _client(server.direct_endpoint)
        for i, key in enumerate(KEYS):
            direct.put_object(Bucket=BUCKET, Key=key, Body=bytes([i]) * (100 + i))
        # boto3's default: a CRC32 checksum, listed as ChecksumAlgorithm
        _client(server.direct_endpoint, checksums=True).put_object(Bucket=BUCKET, Key="a/sum.bin", Body=b"x" * 9)
        yield server


def _raw(endpoint: str, query: str) -> bytes:
    with urllib.request.urlopen(f"{endpoint}/{BUCKET}?{query}") as r:
        return r.read()


def _same_pages(store: LoopbackS3, **params: str) -> list[bytes]:
    """Every page of a listing from the proxy and from moto directly, checked equal byte for byte
    (each page continued by the token its own server gave) and answered by the proxy itself."""
    import xml.etree.ElementTree as ET

    pages: list[bytes] = []
    token = None
    while True:
        query = urllib.parse.urlencode({"list-type": "2", **params, **({"continuation-token": token} if token else {})})
        before = store.state.store.answered["list"]  # type: ignore[union-attr]
        ours, moto = _raw(store.endpoint, query), _raw(store.direct_endpoint, query)
        assert ours == moto, (query, ours, moto)
        assert store.state.store.answered["list"] == before + 1, "the proxy answered it, not moto"  # type: ignore[union-attr]
        pages.append(ours)
        found = ET.fromstring(ours).find("{http://s3.amazonaws.com/doc/2006-03-01/}NextContinuationToken")
        if found is None:
            return pages
        token = found.text
        assert len(pages) < 20


def test_listings_equal_motos_byte_for_byte(store: LoopbackS3) -> None:
    assert len(_same_pages(store)) == 1
    assert b"<ChecksumAlgorithm>CRC32</ChecksumAlgorithm>" in _same_pages(store, prefix="a/")[0]
    for params in ({"delimiter": "/"}, {"prefix": "a/", "delimiter": "/"}, {"prefix": "a/b", "delimiter": "/"},
                   {"prefix": "zz"}, {"prefix": "", "delimiter": "/"}, {"delimiter": "."},
                   {"start-after": "a/2.wav"}, {"start-after": "a/", "delimiter": "/"},
                   {"start-after": "a/1", "delimiter": "/"}, {"start-after": "zzz"},
                   {"encoding-type": "url"}, {"encoding-type": "url", "delimiter": "/", "prefix": "ü/"},
                   {"fetch-owner": "true", "prefix": "b/"}, {"max-keys": "0"}):
        _same_pages(store, **params)
    # pages of two over the eight keys, with and without a delimiter, from a start-after
    assert len(_same_pages(store, **{"max-keys": "2"})) == 4
    assert len(_same_pages(store, **{"max-keys": "2", "delimiter": "/"})) == 3
    assert len(_same_pages(store, **{"max-keys": "2", "start-after": "a/2.wav"})) == 3
    assert len(_same_pages(store, **{"max-keys": "1", "prefix": "a/", "delimiter": "/"})) == 4


def test_listings_see_writes_through_the_proxy_and_to_moto_directly(store: LoopbackS3) -> None:
    proxied, direct = _client(store.endpoint), _client(store.direct_endpoint)
    proxied.put_object(Bucket=BUCKET, Key="a/15.wav", Body=b"new")
    assert b"<Key>a/15.wav</Key>" in b"".join(_same_pages(store, **{"max-keys": "2", "prefix": "a/"}))
    proxied.delete_object(Bucket=BUCKET, Key="a/15.wav")
    direct.put_object(Bucket=BUCKET, Key="a/0.wav", Body=b"moto's own")
    pages = b"".join(_same_pages(store, **{"max-keys": "2", "delimiter": "/", "prefix": "a/"}))
    assert b"a/15.wav" not in pages and b"<Key>a/0.wav</Key>" in pages
    direct.put_object(Bucket=BUCKET, Key="a/0.wav", Body=b"replaced, same name")  # sizes and ETags read live
    assert b"<Size>19</Size>" in _same_pages(store, prefix="a/0")[0]
    direct.delete_object(Bucket=BUCKET, Key="a/0.wav")
    assert b"a/0.wav" not in _same_pages(store)[0]


def test_gets_and_heads_are_motos_bytes_and_headers(store: LoopbackS3) -> None:
    proxied, direct = _client(store.endpoint), _client(store.direct_endpoint)
    answered = store.state.store.answered  # type: ignore[union-attr]
    before = answered["GET"]
    for key in ("a/2.wav", "d&e <f>+.txt"):
        for rng in ("bytes=2-5", "bytes=0-0", "bytes=-3", "bytes=95-", "bytes=90-5000", None):
            kw = {"Range": rng} if rng else {}
            ours, moto = proxied.get_object(Bucket=BUCKET, Key=key, **kw), direct.get_object(Bucket=BUCKET, Key=key, **kw)
            assert ours["Body"].read() == moto["Body"].read()
            h1, h2 = (({k: v for k, v in r["ResponseMetadata"]["HTTPHeaders"].items() if k not in VOLATILE})
                      for r in (ours, moto))
            assert h1 == h2 and ours["ResponseMetadata"]["HTTPStatusCode"] == moto["ResponseMetadata"]["HTTPStatusCode"]
    assert answered["GET"] == before + 12
    ours, moto = proxied.head_object(Bucket=BUCKET, Key="a/2.wav"), direct.head_object(Bucket=BUCKET, Key="a/2.wav")
    assert ({k: v for k, v in ours["ResponseMetadata"]["HTTPHeaders"].items() if k not in VOLATILE}
            == {k: v for k, v in moto["ResponseMetadata"]["HTTPHeaders"].items() if k not in VOLATILE})
    assert answered["HEAD"] >= 1
    assert proxied.get_object(Bucket=BUCKET, Key="a/2.wav", Range="bytes=1-3")["Body"].read() == bytes([1]) * 3


def test_if_match_pins_the_object(store: LoopbackS3) -> None:
    from botocore.exceptions import ClientError

    proxied = _client(store.endpoint)
    proxied.put_object(Bucket=BUCKET, Key="pinned.bin", Body=b"old bytes")
    etag = proxied.head_object(Bucket=BUCKET, Key="pinned.bin")["ETag"]
    assert proxied.get_object(Bucket=BUCKET, Key="pinned.bin", Range="bytes=0-2", IfMatch=etag)["Body"].read() == b"old"
    proxied.put_object(Bucket=BUCKET, Key="pinned.bin", Body=b"new bytes!")
    with pytest.raises(ClientError) as err:
        proxied.get_object(Bucket=BUCKET, Key="pinned.bin", Range="bytes=0-2", IfMatch=etag)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert proxied.get_object(Bucket=BUCKET, Key="pinned.bin", Range="bytes=0-2")["Body"].read() == b"new"


def test_latency_and_faults_apply_to_what_the_proxy_answers(store: LoopbackS3) -> None:
    with store.faults(store.fault("503", method="GET", path=r"list-type=2", times=1)) as (rule,):
        with pytest.raises(urllib.error.HTTPError) as err:
            _raw(store.endpoint, "list-type=2")
        assert err.value.code == 503 and rule.hits == 1
        assert b"<Key>a/1.wav</Key>" in _raw(store.endpoint, "list-type=2")
    store.state.latency_s = 0.05
    try:
        t = time.perf_counter()
        _client(store.endpoint).get_object(Bucket=BUCKET, Key="a/1.wav", Range="bytes=0-9")
        _raw(store.endpoint, "list-type=2")
        assert time.perf_counter() - t >= 0.1
    finally:
        store.state.latency_s = 0.0
    with store.faults(store.fault("truncate", method="GET", path=r"/c\.txt$", times=1)), \
            pytest.raises(Exception):  # noqa: B017 - a short body, in whichever words the client says it
        _client(store.endpoint).get_object(Bucket=BUCKET, Key="c.txt")["Body"].read()


def test_load_puts_files_and_folders_in_place(store: LoopbackS3, tmp_path: Path) -> None:
    (tmp_path / "set" / "deep").mkdir(parents=True)
    (tmp_path / "set" / "one.wav").write_bytes(b"1" * 10)
    (tmp_path / "set" / "deep" / "two.wav").write_bytes(b"2" * 20)
    (tmp_path / "list.jsonl").write_text("{}\n")
    assert store.load("s3://store-like-load/corpus", tmp_path / "set") == 2
    assert store.load("s3://store-like-load/corpus/list.jsonl", tmp_path / "list.jsonl") == 1
    listed = _client(store.endpoint).list_objects_v2(Bucket="store-like-load")["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [
        ("corpus/deep/two.wav", 20), ("corpus/list.jsonl", 3), ("corpus/one.wav", 10)]
    assert _client(store.endpoint).get_object(Bucket="store-like-load", Key="corpus/deep/two.wav",
                                              Range="bytes=18-")["Body"].read() == b"22"
