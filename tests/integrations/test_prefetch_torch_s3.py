"""``PlanBatchSampler``'s plan-driven prefetch against the loopback S3 (moto behind the counting
proxy), on the Shar-packed corpus of :mod:`tests.integrations.test_prefetch_s3`: one GET per
coalesced range of each step, from the resumed step after ``load_state_dict``; the bytes it
hands out decode to the local copy's samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dataprep.integrations.lhotse import PlanSampler
from dataprep.integrations.torch import PlanBatchSampler
from manifests.audio import load_audio
from manifests.column_cache import ColumnCache
from manifests.errors import OptionError
from manifests.manifest_read import read_manifest
from tests.integrations.test_prefetch import corpus, expected_requests, planned, samples  # noqa: F401  (fixtures)
from tests.integrations.test_prefetch_s3 import in_store  # noqa: F401  (fixture)


def decoded(manifest: Path, batches: list[list[tuple[int, bytes | None]]]) -> dict[str, np.ndarray]:
    """Each handed-out row's samples by id (channels x samples), decoded from the bytes the sampler carried."""
    columns, ids = ColumnCache.open(manifest), read_manifest(manifest)["id"].to_list()
    out = {}
    for batch in batches:
        rows = np.asarray([r for r, _ in batch], np.int64)
        meta = columns.gather(rows, [ids[r] for r in rows.tolist()])
        for i, (_, data) in enumerate(batch):
            assert data is not None
            out[meta.ids[i]] = load_audio(meta.ids[i], meta.audio_paths[i], float(meta.offsets[i]),
                                          float(meta.durations[i]), data=data, channel="all").T
    return out


def test_batch_sampler_prefetch_reads_each_steps_ranges_once(in_store: tuple[Path, Path, Path, Path], s3: object) -> None:
    local_m, local_plan, url_m, url_plan = in_store
    plain = list(PlanBatchSampler(url_plan, rank=0))
    got = list(PlanBatchSampler(url_plan, rank=0, manifest=url_m, prefetch_steps=3, prefetch_bytes=1 << 20))
    assert [[r for r, _ in b] for b in got] == plain
    want, _ = expected_requests(ColumnCache.open(url_m), url_plan, 0)
    assert s3.counts()["GET"] == len(want)  # type: ignore[attr-defined]
    local = {i: x for s in (samples(c) for c in PlanSampler(local_plan, local_m, rank=0, world_size=2)) for i, x in s}
    mine = decoded(url_m, got)
    assert mine.keys() == local.keys()
    for i, x in mine.items():
        assert np.array_equal(x, local[i]), i  # channels x samples, as Lhotse's


def test_resumed_batch_sampler_prefetches_from_the_resumed_step(in_store: tuple[Path, Path, Path, Path], s3: object) -> None:
    _, _, url_m, url_plan = in_store
    first = PlanBatchSampler(url_plan, rank=1)  # the saved run (its reads would race the counters)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    assert state["next_step"] == 2
    resumed = PlanBatchSampler(url_plan, rank=1, manifest=url_m, prefetch_steps=2, with_sequences=True)
    resumed.load_state_dict(state)
    got = list(resumed)
    assert [[(r, q) for r, q, _ in b] for b in got] == list(PlanBatchSampler(url_plan, rank=1, start_step=2,
                                                                             with_sequences=True))
    want, _ = expected_requests(ColumnCache.open(url_m), url_plan, 1, start=state["next_step"])
    assert s3.counts()["GET"] == len(want)  # type: ignore[attr-defined]
    assert all(d is not None for b in got for _, _, d in b)


def test_prefetch_needs_the_manifest(corpus: object) -> None:
    with pytest.raises(OptionError, match="manifest"):
        PlanBatchSampler(corpus.plan(2), rank=0, prefetch_steps=2)  # type: ignore[attr-defined]
