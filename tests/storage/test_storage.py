"""manifests.storage against a real S3 API on loopback (moto behind the fault proxy) and on local
files: the same calls, the same bytes; faults retried, never taken for data, one line at the end."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import soundfile

from dataprep.testing_store import LoopbackS3, Rule
from manifests import storage, store_facts
from manifests.errors import DataprepError

BLOB = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()


def test_urls_are_told_from_paths_and_joined_without_mangling() -> None:
    assert storage.is_url("s3://b/x") and storage.is_url("gs://b/x") and storage.is_url("az://c/x")
    assert storage.is_url("abfs://c@acct.dfs.core.windows.net/x") and storage.is_url("S3://b/x")
    assert not storage.is_url("/data/x.wav") and not storage.is_url("file:///data/x") and not storage.is_url("x.wav")
    assert storage.join("s3://b/dir/", "a", "/b.wav") == "s3://b/dir/a/b.wav"
    assert storage.join("s3://b", "x.jsonl") == "s3://b/x.jsonl"
    assert storage.parent("s3://b/dir/x.jsonl") == "s3://b/dir" and storage.parent("s3://b/x") == "s3://b"
    assert storage.name("s3://b/dir/x.jsonl") == "x.jsonl"
    assert storage.resolve("s3://b/dir", "a/x.wav") == "s3://b/dir/a/x.wav"
    assert storage.resolve("s3://b/dir", "/abs/x.wav") == "/abs/x.wav"
    assert storage.resolve("/local", "s3://o/x.wav") == "s3://o/x.wav"
    assert storage.local_path("file:///data/x") == "/data/x"


def test_coalesce_merges_neighbours_and_keeps_each_range() -> None:
    starts, ends, group = storage.coalesce([(100, 10), (0, 10), (5000, 5), (112, 4)], gap=16)
    assert starts.tolist() == [0, 100, 5000] and ends.tolist() == [10, 116, 5005]
    assert group.tolist() == [1, 0, 2, 1]
    starts, ends, _ = storage.coalesce([(0, 100), (10, 5)], gap=0)  # a range inside another
    assert starts.tolist() == [0] and ends.tolist() == [100]


@pytest.fixture()
def blob_url(s3: LoopbackS3) -> str:
    s3.client().put_object(Bucket=s3.bucket[5:], Key="dir/blob.bin", Body=BLOB)
    return f"{s3.bucket}/dir/blob.bin"


RANGES = [(0, 10), (100, 5), (500_000, 1000), (10, 3), ((1 << 20) - 7, 7)]


def test_read_ranges_same_bytes_from_a_url_and_a_local_file(blob_url: str, tmp_path: Path, s3: LoopbackS3) -> None:
    local = tmp_path / "blob.bin"
    local.write_bytes(BLOB)
    want = [BLOB[o:o + n] for o, n in RANGES]
    assert storage.read_ranges(local, RANGES) == want
    info = storage.stat(blob_url)
    assert info.size == len(BLOB) and info.etag
    s3.reset_counts()
    assert storage.read_ranges(blob_url, RANGES, info=info) == want
    assert s3.counts()["GET"] == 3  # the first, fourth and second ranges are one request
    assert storage.read_bytes(blob_url) == BLOB


def test_a_range_past_the_end_is_an_error_not_short_data(blob_url: str, tmp_path: Path) -> None:
    with pytest.raises(storage.StoreError, match=r"blob.bin: byte range ends at .*past the object's end"):
        storage.read_ranges(blob_url, [(len(BLOB) - 5, 10)])
    (tmp_path / "b").write_bytes(BLOB)
    with pytest.raises(storage.StoreError, match="past the object's end"):
        storage.read_ranges(tmp_path / "b", [(len(BLOB) - 5, 10)])


@pytest.mark.parametrize("action", ["503", "500", "reset", "truncate"])
def test_transient_faults_are_retried_and_the_bytes_are_right(blob_url: str, s3: LoopbackS3, action: str) -> None:
    storage.stat(blob_url)
    with s3.faults(Rule(action, method="GET", times=2)) as (rule,):
        got = storage.read_ranges(blob_url, [(1000, 200_000), (900_000, 5)], gap=0)
    assert got == [BLOB[1000:201_000], BLOB[900_000:900_005]]
    assert rule.hits == 2


def test_a_time_out_is_retried(blob_url: str, s3: LoopbackS3, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.stat(blob_url)
    monkeypatch.setenv("DATAPREP_STORE_TIMEOUT_S", "0.5")
    storage.reset_clients()
    with s3.faults(Rule("delay", method="GET", times=1, delay_s=0.8)) as (rule,):  # past the 0.5 s time-out
        assert storage.read_ranges(blob_url, [(0, 100)]) == [BLOB[:100]]
    assert rule.hits == 1
    monkeypatch.undo()
    storage.reset_clients()


@pytest.mark.parametrize(("action", "words"), [
    ("503", "503 SlowDown"), ("500", "500 InternalError"), ("reset", "connection reset"),
    ("truncate", "truncated body (the connection closed mid-body)"), ("delay", "timed out")])
def test_after_the_last_retry_one_line_names_the_object(blob_url: str, s3: LoopbackS3, action: str, words: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    storage.stat(blob_url)
    if action == "delay":  # every GET held past a 0.5 s time-out: 4 attempts wait 2 s, not 4 x the tests' 2 s
        monkeypatch.setenv("DATAPREP_STORE_TIMEOUT_S", "0.5")
        storage.reset_clients()
    with s3.faults(Rule(action, method="GET", times=None, delay_s=0.8)) as (rule,), \
            pytest.raises(DataprepError) as err:
        storage.read_ranges(blob_url, [(0, 100_000)])
    assert str(err.value) == f"{blob_url}: {words} (gave up after 4 attempts)"
    assert rule.hits == 4
    monkeypatch.undo()
    storage.reset_clients()
    with pytest.raises(storage.StoreError, match=r"^s3://.*/dir/absent.bin: no such object$"):
        storage.stat(blob_url.replace("blob", "absent"))
    assert "testing" not in str(err.value)  # the credentials are never in a message


def test_an_object_replaced_between_index_and_read_is_refused(blob_url: str, s3: LoopbackS3) -> None:
    info = storage.stat(blob_url)
    s3.client().put_object(Bucket=s3.bucket[5:], Key="dir/blob.bin", Body=BLOB[::-1])
    with pytest.raises(storage.StoreError, match="changed while being read"):
        storage.read_ranges(blob_url, [(0, 10)], info=info)


def test_open_input_probes_a_wav_header_by_range_reads(s3: LoopbackS3, tmp_path: Path) -> None:
    wav = tmp_path / "a.wav"
    soundfile.write(wav, np.zeros(16000 * 20, dtype=np.int16), 16000)  # 640 KB
    url = f"{s3.bucket}/a.wav"
    with storage.write_atomic(url) as tmp:
        tmp.write_bytes(wav.read_bytes())
    storage.reset_clients()
    s3.reset_counts()
    with storage.open_input(url, buffer_size=16 << 10) as fh:
        info = soundfile.info(fh)
    assert (info.samplerate, info.frames) == (16000, 320_000)
    assert s3.counts()["GET"] <= 4  # a header's few range reads, never the 640 KB


def test_write_atomic_publishes_only_whole_objects(s3: LoopbackS3) -> None:
    url = f"{s3.bucket}/out/x.bin"
    with pytest.raises(RuntimeError), storage.write_atomic(url) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed")
    assert not storage.exists(url)
    with storage.write_atomic(url) as tmp:
        tmp.write_bytes(BLOB)
    assert storage.read_bytes(url) == BLOB


def test_open_output_aborts_its_multipart_upload_on_error(s3: LoopbackS3) -> None:
    url = f"{s3.bucket}/out/big.bin"
    with pytest.raises(RuntimeError), storage.open_output(url, chunk=5 << 20) as out:
        out.write(b"a" * (6 << 20))  # a first part is sent
        raise RuntimeError("killed mid-way")
    c = s3.client()
    assert not storage.exists(url)
    assert not c.list_multipart_uploads(Bucket=s3.bucket[5:]).get("Uploads")
    with storage.open_output(url, chunk=5 << 20) as out:
        out.write(b"a" * (6 << 20))
        out.write(b"b" * 10)
    assert storage.stat(url).size == (6 << 20) + 10


def test_upload_survives_faults(s3: LoopbackS3) -> None:
    url = f"{s3.bucket}/out/faulty.bin"
    with s3.faults(Rule("503", method="PUT", times=1), Rule("reset", method="PUT", times=1)):
        with storage.write_atomic(url) as tmp:
            tmp.write_bytes(BLOB)
    assert storage.read_bytes(url) == BLOB


def test_list_prefix_and_fetch_local_cached_by_etag(blob_url: str, s3: LoopbackS3, tmp_path: Path) -> None:
    assert [u for u, _ in storage.list_prefix(storage.parent(blob_url) + "/")] == [blob_url]
    first = store_facts.fetch_local(blob_url, tmp_path)
    assert first.read_bytes() == BLOB
    s3.reset_counts()
    assert store_facts.fetch_local(blob_url, tmp_path) == first
    assert s3.counts() == {}  # within one command, the object's facts are remembered
    storage.forget_all()  # a new command
    assert store_facts.fetch_local(blob_url, tmp_path) == first
    assert s3.counts() == {"HEAD": 1}  # a rerun on an unchanged object reads only its HEAD


def test_without_obstore_a_url_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    monkeypatch.setitem(sys.modules, "obstore", None)
    storage.reset_clients()
    with pytest.raises(DataprepError, match=r"needs obstore, which is not installed: pip install 'speech-dataprep\[store\]'"):
        storage.stat("s3://b/x")
    assert storage.is_url("s3://b/x") and os.fspath(storage.join("s3://b", "x")) == "s3://b/x"


def _tar_of(sizes: list[int]) -> bytes:
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i, n in enumerate(sizes):
            info = tarfile.TarInfo(f"m{i:04d}.wav")
            info.size = n
            tf.addfile(info, io.BytesIO(bytes([i % 256]) * n))
    return buf.getvalue()


@pytest.mark.parametrize(("sizes", "most_gets"), [([3000] * 400, 12), ([300_000] * 12, 16)])
def test_a_tar_in_the_store_is_indexed_in_few_requests(s3: LoopbackS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       sizes: list[int], most_gets: int) -> None:
    """Small members: many headers a request (one each would be 400 round trips in a chain);
    large members: a header a request, their data skipped."""
    from manifests.containers import index_tar
    monkeypatch.setenv("SPEECH_DATAPREP_CACHE", str(tmp_path / "cache"))
    storage.reset_clients()
    data = _tar_of(sizes)
    (tmp_path / "scan.tar").write_bytes(data)
    s3.client().put_object(Bucket=s3.bucket[5:], Key="scan.tar", Body=data)
    s3.reset_counts()
    idx, local = index_tar(f"{s3.bucket}/scan.tar"), index_tar(tmp_path / "scan.tar")
    assert (idx.names, idx.offsets, idx.sizes, idx.problem) == (local.names, local.offsets, local.sizes, None)
    assert s3.counts()["GET"] <= most_gets, s3.counts()


def test_the_loopback_proxy_can_answer_ranged_gets_itself() -> None:
    """``store_like`` (the benchmarks' server), through our storage layer: the same bytes, ETag
    checks and writes as moto's."""
    with LoopbackS3(store_like=True) as server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        storage.reset_clients()
        try:
            url = f"{server.create_bucket('ranges')}/blob.bin"
            with storage.write_atomic(url) as tmp:
                tmp.write_bytes(BLOB)
            assert storage.read_ranges(url, [(10, 100), (500_000, 7)], gap=0) == [BLOB[10:110], BLOB[500_000:500_007]]
            with storage.write_atomic(url) as tmp:  # replaced through the proxy: never the old bytes
                tmp.write_bytes(BLOB[::-1])
            storage.forget_all()
            assert storage.read_ranges(url, [(0, 64)])[0] == BLOB[::-1][:64]
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
            storage.reset_clients()
