"""Plan-driven prefetch against a real S3 API on loopback (moto behind the counting proxy): the
Shar-packed corpus uploaded, its manifest's containers rewritten to ``s3://`` URLs and planned.
The proxy sees exactly one GET per coalesced range of each step (and a HEAD before a container's first reads);
the cuts' samples equal the local copy's; a 503 is retried, a persistent one is one line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dataprep.integrations.lhotse import PlanSampler
from manifests.column_cache import ColumnCache
from manifests.errors import DataprepError
from manifests.manifest_read import read_manifest
from manifests.manifest_write import write_manifest
from tests.integrations.test_prefetch import corpus, expected_requests, planned, samples  # noqa: F401  (fixtures)
from tests.training._consumer import Corpus, invoke


@pytest.fixture()
def in_store(planned: tuple[Path, Path], s3: object, corpus: Corpus, tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """(local manifest, local plan, URL manifest, its plan): the packed corpus uploaded."""
    manifest, plan = planned
    m = read_manifest(manifest)
    if "container" not in m.columns or m["container"].null_count() == m.height:
        pytest.skip("loose files: the packed copy is what goes to the store")
    client, bucket = s3.client(), s3.bucket.removeprefix("s3://")  # type: ignore[attr-defined]
    for c in m["container"].unique().to_list():
        client.upload_file(c, bucket, f"shar/{Path(c).name}")
    folder = str(Path(m["container"][0]).parent) + "/"
    m = m.with_columns(pl.col("container").str.replace(folder, f"s3://{bucket}/shar/", literal=True))
    write_manifest(m, tmp_path / "s3.parquet")
    invoke("plan-batches", str(tmp_path / "s3.parquet"), "--buckets", str(corpus.buckets), "--world-size", "2",
           "--seed", "0", "-o", str(tmp_path / "plan"))
    s3.reset_counts()  # type: ignore[attr-defined]
    return manifest, plan, tmp_path / "s3.parquet", tmp_path / "plan"


def test_prefetch_from_s3_reads_each_steps_ranges_once(in_store: tuple[Path, Path, Path, Path], s3: object) -> None:
    local_m, local_plan, url_m, url_plan = in_store
    got = [samples(c) for c in PlanSampler(url_plan, url_m, rank=0, world_size=2, prefetch_steps=3)]
    counts = s3.counts()  # type: ignore[attr-defined]
    want, _ = expected_requests(ColumnCache.open(url_m), url_plan, 0)
    assert counts["GET"] == len(want)
    # each container's size and ETag asked before its first read (requests in flight at once may each ask)
    assert len({p for p, _, _ in want}) <= counts["HEAD"] <= counts["GET"]
    local = {i: x for s in (samples(c) for c in PlanSampler(local_plan, local_m, rank=0, world_size=2)) for i, x in s}
    assert sum(len(s) for s in got) == len(local)
    for s in got:
        for i, x in s:
            assert np.array_equal(x, local[i]), i


def test_a_throttled_store_is_retried_then_one_line(in_store: tuple[Path, Path, Path, Path], s3: object) -> None:
    _, _, url_m, url_plan = in_store
    s3.fault("503", method="GET", times=2)  # type: ignore[attr-defined]
    first = next(iter(PlanSampler(url_plan, url_m, rank=0, world_size=2, prefetch_steps=2)))
    assert len(samples(first)) == len(first)
    s3.clear_faults()  # type: ignore[attr-defined]
    s3.fault("503", method="GET", times=None)  # type: ignore[attr-defined]
    with pytest.raises(DataprepError, match=r"s3://.*shar/.*\.tar") as err:
        next(iter(PlanSampler(url_plan, url_m, rank=1, world_size=2, prefetch_steps=2)))
    assert "\n" not in str(err.value)
    assert Counter(s3.counts())["GET"] >= 4  # type: ignore[attr-defined]


def test_an_object_gone_after_it_was_seen_is_left_to_the_decoder(in_store: tuple[Path, Path, Path, Path],
                                                                 s3: object) -> None:
    """A container whose size this process remembers, deleted from the store before its step is
    read: no bytes ahead for its rows (the decoder names each), never a stopped step."""
    from dataprep.integrations.prefetch import PrefetchOptions, StepPrefetcher
    from manifests import storage
    from manifests.plan_cursor import PlanCursor
    from manifests.plan_files import PlanShard

    _, _, url_m, url_plan = in_store
    columns = ColumnCache.open(url_m)
    pb = next(PlanShard(url_plan, 0).iter_batches())
    container = columns.gather(pb.rows, pb.ids).container_paths[0]
    storage.stat(container)  # remembered
    bucket, key = container.removeprefix("s3://").split("/", 1)
    s3.client().delete_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined]
    ahead = StepPrefetcher(PlanCursor(url_plan, 0), columns, PrefetchOptions(prefetch_steps=2))
    held = ahead.take(pb.step)
    ahead.close()
    gone = [c == container for c in columns.gather(pb.rows, pb.ids).container_paths]
    assert any(gone) and all(h is None for h, g in zip(held, gone) if g)
    assert all(h is not None for h, g in zip(held, gone) if not g)
