"""Object-store client choice: range reads against the loopback S3 (moto behind the proxy,
``--latency-ms`` added per request), by each client installed.

    python benchmarks/bench_store_clients.py [--latency-ms 20] [--ranges 64] [--repeats 3]

Clients: obstore (what :mod:`manifests.storage` uses: its ``read_ranges``), s3fs (fsspec's
``cat_ranges``) and pyarrow's ``S3FileSystem`` (``read_at`` per range, in a thread pool of the
same size). Workloads: one 16 KiB range (a header probe's latency), ``--ranges`` scattered 16 KiB
ranges of one 4 MiB object in one call (a prefetch of a step's members), the same ranges in
runs of four adjacent members (what coalescing saves), and one 1 MiB range (bandwidth). Prints
the median milliseconds of each, and the requests each sent; a client not installed is skipped.
"""

from __future__ import annotations

import argparse
import os
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402

from dataprep.testing_store import DUMMY_ENV  # noqa: E402

SIZE = 4 << 20
MEMBER = 16 << 10


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--ranges", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    scattered = sorted((int(o), MEMBER) for o in rng.choice(SIZE // MEMBER - 1, args.ranges, replace=False) * MEMBER)
    runs = [(o + k * MEMBER, MEMBER) for o, _ in scattered[: args.ranges // 4] for k in range(4)]
    # the server in its own process: moto and the proxy must not share the clients' GIL
    server = subprocess.Popen([sys.executable, "-m", "dataprep.testing_store", "--latency-ms", "0"],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        endpoint = server.stdout.readline().strip().partition("=")[2]  # type: ignore[union-attr]
        os.environ.update({**DUMMY_ENV, "AWS_ENDPOINT_URL": endpoint})
        boto = boto3.client("s3", endpoint_url=endpoint)
        boto.create_bucket(Bucket="bench")
        boto.put_object(Bucket="bench", Key="blob.bin", Body=blob)
        admin = f"{endpoint}/__proxy__"
        urllib.request.urlopen(urllib.request.Request(f"{admin}/latency", method="PUT",
                                                      data=json.dumps({"s": args.latency_ms / 1e3}).encode()))

        def requests() -> int:
            req = urllib.request.Request(f"{admin}/counts", method="DELETE")
            return sum(json.loads(urllib.request.urlopen(req).read()).values())

        run(args, blob, scattered, runs, endpoint, requests)
    finally:
        server.terminate()
        server.wait()


def run(args: argparse.Namespace, blob: bytes, scattered: list[tuple[int, int]], runs: list[tuple[int, int]],
        endpoint: str, requests: Callable[[], int]) -> None:
    url, key = "s3://bench/blob.bin", "bench/blob.bin"
    clients: dict[str, Callable[[list[tuple[int, int]]], list[bytes]]] = {}
    try:
        from manifests import storage
        storage.reset_clients()
        info = storage.stat(url)
        clients["obstore"] = lambda rs: storage.read_ranges(url, rs, info=info)
    except ImportError:
        pass
    try:
        import s3fs
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, default_cache_type="none")
        clients["s3fs"] = lambda rs: fs.cat_ranges([key] * len(rs), [o for o, _ in rs], [o + n for o, n in rs])
    except ImportError:
        pass
    from pyarrow import fs as pafs
    pa_fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1",
                              access_key="testing", secret_key="testing")
    pool = ThreadPoolExecutor(16)

    def pa_read(rs: list[tuple[int, int]]) -> list[bytes]:
        f = pa_fs.open_input_file(key)
        return list(pool.map(lambda r: bytes(f.read_at(r[1], r[0])), rs))

    clients["pyarrow"] = pa_read
    print(f"latency {args.latency_ms:g} ms/request, {args.ranges} ranges of {MEMBER >> 10} KiB in a "
          f"{SIZE >> 20} MiB object, median of {args.repeats}")
    print(f"{'client':10} {'1 range ms':>11} {'scattered ms':>13} {'adjacent ms':>12} {'1 MiB ms':>9} "
          f"{'requests (scattered/adjacent)':>30}")
    for name, read in clients.items():
        assert read(scattered[:3]) == [blob[o:o + n] for o, n in scattered[:3]], name
        one = _median_ms(lambda: read(scattered[:1]), args.repeats)
        requests()
        sc = _median_ms(lambda: read(scattered), args.repeats)
        n_sc = requests() // args.repeats
        adj = _median_ms(lambda: read(runs), args.repeats)
        n_adj = requests() // args.repeats
        big = _median_ms(lambda: read([(1 << 20, 1 << 20)]), args.repeats)
        print(f"{name:10} {one:11.1f} {sc:13.1f} {adj:12.1f} {big:9.1f} {f'{n_sc}/{n_adj}':>30}")


if __name__ == "__main__":
    main()
