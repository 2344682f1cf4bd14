"""Plan-driven prefetch (issue 40, item 3) on a real corpus, loose and packed as Lhotse Shar: each
step's requests are exactly its rows' byte ranges (neighbours within 4 KiB joined, a file two
rows share read once), the cuts and batches built over the fetched bytes equal those read
directly, a resumed iteration prefetches from the resumed step, the bytes held stay within the
budget, bad options are one line, the rows of a cut-short or missing container are left to
the decoder's one line per utterance (and ``--skip-bad-audio``)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dataprep.integrations.lhotse import PlanSampler
from dataprep.integrations.prefetch import PrefetchOptions, StepPrefetcher, read_ranges
from dataprep.planning.step_reads import DEFAULT_MAX_GAP
from dataprep.training.batches import BatchBuilder
from manifests.audio import AudioError
from manifests.column_cache import ColumnCache
from manifests.errors import DataprepError, OptionError
from manifests.manifest_read import read_manifest
from manifests.plan_cursor import PlanCursor
from manifests.plan_files import PlanShard
from tests.training._consumer import Corpus, invoke, shared_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return shared_corpus(tmp_path_factory)


@pytest.fixture(scope="module", params=["loose", "shar"])
def planned(request: pytest.FixtureRequest, corpus: Corpus, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, Path]:
    """(manifest, 2-rank plan): the corpus's loose files, or its copy packed as Lhotse Shar."""
    if request.param == "loose":
        return corpus.manifest, corpus.plan(2)
    root = tmp_path_factory.mktemp("prefetch-shar")
    invoke("pack", str(corpus.manifest), "-o", str(root / "shar"), "--layout", "shar", "--container-size", "200KB")
    manifest = root / "packed.parquet"
    invoke("compile", str(root / "shar"), "--tokenizer", str(corpus.spm), "-o", str(manifest))
    invoke("plan-batches", str(manifest), "--buckets", str(corpus.buckets), "--world-size", "2", "--seed", "0",
           "-o", str(root / "plan"))
    return manifest, root / "plan"


class Counting:
    """The real range reader, recording every request as (path, offset, length)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        with self.lock:
            self.calls += [(path, o, n) for o, n in ranges]
        return read_ranges(path, ranges)


def expected_requests(columns: ColumnCache, plan: Path, rank: int, start: int = 0) -> tuple[list[tuple[str, int, int]], int]:
    """The requests of every step from ``start`` (an oracle, a plain loop): per step and object,
    the rows' ranges sorted and joined when they overlap or lie within 4 KiB; and the bytes used."""
    out, used = [], 0
    for pb in PlanShard(plan, rank).iter_batches(start):
        meta = columns.gather(pb.rows, pb.ids)
        ranges: dict[str, list[tuple[int, int]]] = {}
        for i, c in enumerate(meta.container_paths):
            if c is None:
                path = meta.audio_paths[i]
                ranges.setdefault(path, []).append((0, Path(path).stat().st_size))
            else:
                o, n = int(meta.member_offsets[i]), int(meta.member_sizes[i])
                ranges.setdefault(c, []).append((o, o + n))
        for path, rs in ranges.items():
            merged: list[list[int]] = []
            for s, e in sorted(rs):
                if merged and s <= merged[-1][1] + DEFAULT_MAX_GAP:
                    merged[-1][1] = max(merged[-1][1], e)
                else:
                    merged.append([s, e])
            out += [(path, s, e - s) for s, e in merged]
            covered = sorted(set(rs))
            used += sum(e - s for s, e in _union(covered))
    return out, used


def _union(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in ranges:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def drain(ahead: StepPrefetcher, plan: Path, rank: int, start: int = 0, pause: float = 0.0) -> list[list[bytes | None]]:
    got = []
    for pb in PlanShard(plan, rank).iter_batches(start):
        got.append(ahead.take(pb.step))
        time.sleep(pause)
    ahead.close()
    return got


def test_each_step_reads_exactly_its_rows_bytes(planned: tuple[Path, Path]) -> None:
    manifest, plan = planned
    columns = ColumnCache.open(manifest)
    reader = Counting()
    ahead = StepPrefetcher(PlanCursor(plan, 0), columns, PrefetchOptions(prefetch_steps=3), reader=reader)
    drain(ahead, plan, 0)
    want, used = expected_requests(columns, plan, 0)
    assert Counter(reader.calls) == Counter(want)
    fetched = sum(n for _, _, n in reader.calls)
    assert used <= fetched <= 1.05 * used  # Shar: a member's header and JSON between two neighbours


def test_segments_of_one_file_in_a_step_read_it_once(corpus: Corpus) -> None:
    plan = corpus.plan(1)
    columns = ColumnCache.open(corpus.manifest)
    shared = [pb for pb in PlanShard(plan, 0).iter_batches()
              if len(set(columns.gather(pb.rows, pb.ids).audio_paths)) < len(pb.rows)]
    assert shared, "the corpus has steps holding two segments of long.flac"
    reader = Counting()
    drain(StepPrefetcher(PlanCursor(plan, 0), columns, PrefetchOptions(prefetch_steps=2), reader=reader), plan, 0)
    per_file = Counter(p for p, _, _ in reader.calls)
    steps_with_long = sum("long.flac" in "".join(columns.gather(pb.rows, pb.ids).audio_paths)
                          for pb in PlanShard(plan, 0).iter_batches())
    assert per_file[str(corpus.root / "audio" / "long.flac")] == steps_with_long


def samples(cuts: object) -> list[tuple[str, np.ndarray]]:
    return [(c.id, c.load_audio()) for c in cuts]  # type: ignore[attr-defined]


def test_cuts_over_fetched_bytes_equal_direct_reads(planned: tuple[Path, Path]) -> None:
    manifest, plan = planned
    direct = [samples(c) for c in PlanSampler(plan, manifest, rank=1, world_size=2)]
    ahead = PlanSampler(plan, manifest, rank=1, world_size=2, prefetch_steps=2, prefetch_bytes=1 << 20)
    got = [samples(c) for c in ahead]
    assert [[i for i, _ in s] for s in got] == [[i for i, _ in s] for s in direct]
    for a, b in zip(got, direct):
        for (_, x), (_, y) in zip(a, b):
            assert np.array_equal(x, y)
    assert all(c.recording.sources[0].type == "memory" for c in next(iter(ahead)))


def test_loader_batches_over_fetched_bytes_equal(planned: tuple[Path, Path], corpus: Corpus) -> None:
    import torch

    from dataprep.training import BatchBuilder
    from dataprep.training.loader import PlanDataset

    manifest, plan = planned
    builder = BatchBuilder(manifest, [str(corpus.spm)], io_threads=1)
    plain = list(PlanDataset(plan, 0, builder))
    ahead = list(PlanDataset(plan, 0, builder, start_step=1, prefetch=PrefetchOptions(prefetch_steps=2)))
    assert [b.step for b in ahead] == [b.step for b in plain[1:]]
    for a, b in zip(ahead, plain[1:]):
        assert a.ids == b.ids and torch.equal(a.features, b.features)


def test_resume_prefetches_from_the_resumed_step(planned: tuple[Path, Path]) -> None:
    manifest, plan = planned
    columns = ColumnCache.open(manifest)
    first = PlanSampler(plan, manifest, rank=0, world_size=2, prefetch_steps=2)
    it = iter(first)
    seen = [samples(next(it)) for _ in range(2)]
    state = first.state_dict()
    assert state["next_step"] == 2
    resumed = PlanSampler(plan, manifest, rank=0, world_size=2, prefetch_steps=2)
    resumed.load_state_dict(state)
    rest = [samples(c) for c in resumed]
    whole = [samples(c) for c in PlanSampler(plan, manifest, rank=0, world_size=2)]
    assert [[i for i, _ in s] for s in seen + rest] == [[i for i, _ in s] for s in whole]
    # the reads start at the resumed step: nothing of steps 0 and 1 is fetched
    cursor = PlanCursor(plan, 0)
    cursor.seek(2)
    reader = Counting()
    drain(StepPrefetcher(cursor, columns, PrefetchOptions(prefetch_steps=2), reader=reader), plan, 0, start=2)
    assert Counter(reader.calls) == Counter(expected_requests(columns, plan, 0, start=2)[0])


def test_bytes_held_stay_within_the_budget(planned: tuple[Path, Path]) -> None:
    manifest, plan = planned
    columns = ColumnCache.open(manifest)
    steps = [sum(n for _, _, n in expected_requests_of_step(columns, pb)) for pb in PlanShard(plan, 0).iter_batches()]
    budget = max(steps) + min(steps)  # room for the largest step and a small one, never three steps
    ahead = StepPrefetcher(PlanCursor(plan, 0), columns, PrefetchOptions(prefetch_steps=50, prefetch_bytes=budget))
    got = drain(ahead, plan, 0, pause=0.01)
    assert len(got) == len(steps) and ahead.peak_bytes <= budget
    # a budget below every step: each step is read alone (none is ever skipped)
    alone = StepPrefetcher(PlanCursor(plan, 0), columns, PrefetchOptions(prefetch_steps=50, prefetch_bytes=1))
    assert len(drain(alone, plan, 0, pause=0.01)) == len(steps) and alone.peak_bytes == max(steps)


def expected_requests_of_step(columns: ColumnCache, pb: object) -> list[tuple[str, int, int]]:
    meta = columns.gather(pb.rows, pb.ids)  # type: ignore[attr-defined]
    ranges: dict[str, list[tuple[int, int]]] = {}
    for i, c in enumerate(meta.container_paths):
        if c is None:
            ranges.setdefault(meta.audio_paths[i], []).append((0, Path(meta.audio_paths[i]).stat().st_size))
        else:
            o = int(meta.member_offsets[i])
            ranges.setdefault(c, []).append((o, o + int(meta.member_sizes[i])))
    out = []
    for path, rs in ranges.items():
        merged: list[list[int]] = []
        for s, e in sorted(rs):
            if merged and s <= merged[-1][1] + DEFAULT_MAX_GAP:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        out += [(path, s, e - s) for s, e in merged]
    return out


@pytest.mark.parametrize(("kwargs", "field"), [({"prefetch_steps": -1}, "prefetch_steps"),
                                               ({"prefetch_steps": 2, "prefetch_bytes": 0}, "prefetch_bytes"),
                                               ({"prefetch_steps": True}, "prefetch_steps"),
                                               ({"prefetch_steps": 2, "prefetch_bytes": "1GB"}, "prefetch_bytes")])
def test_bad_options_are_one_line(corpus: Corpus, kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(OptionError, match=field) as err:
        PlanSampler(corpus.plan(2), corpus.manifest, rank=0, world_size=2, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_nemo_config_prefetch_keys_checked(corpus: Corpus) -> None:
    from dataprep.integrations.nemo import get_plan_dataloader

    config = {"plan_dir": str(corpus.plan(2)), "manifest": str(corpus.manifest), "prefetch_steps": "4"}
    with pytest.raises(DataprepError, match="config: prefetch_steps: must be an integer"):
        get_plan_dataloader(config, 0, 2, dataset=None)  # type: ignore[arg-type]
    loader = get_plan_dataloader({**config, "prefetch_steps": 4}, 0, 2, dataset=lambda cuts: cuts)  # type: ignore[arg-type]
    assert loader.plan_sampler.prefetch.prefetch_steps == 4


@pytest.fixture()
def damaged(planned: tuple[Path, Path], tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, set[str]]]:
    """(how, ids): the container of rank 0's first step cut to 10 bytes or moved away (put
    back after the test), and the ids of the rows it holds."""
    manifest, plan = planned
    columns = ColumnCache.open(manifest)
    pb = next(PlanShard(plan, 0).iter_batches())
    container = columns.gather(pb.rows, pb.ids).container_paths[0]
    if container is None:
        pytest.skip("loose files are the corpus's own (never cut here)")
    victim, keep = Path(container), tmp_path / "keep"
    shutil.copy(victim, keep)
    m = read_manifest(manifest)
    ids = set(m.filter(m["container"] == container)["id"].to_list())
    try:
        if request.param == "truncated":
            with open(victim, "r+b") as fh:
                fh.truncate(10)
        else:
            victim.unlink()
        yield request.param, ids
    finally:
        shutil.copy(keep, victim)


@pytest.mark.parametrize("damaged", ["truncated", "missing"], indirect=True)
def test_a_cut_short_or_missing_container_is_left_to_the_decoder(planned: tuple[Path, Path], corpus: Corpus,
                                                                 damaged: tuple[str, set[str]]) -> None:
    """The prefetch gives no bytes for the rows of a container that is gone or ends early (the
    others' bytes as read); the decoder then names each utterance in one line."""
    manifest, plan = planned
    how, ids = damaged
    columns = ColumnCache.open(manifest)
    pb = next(PlanShard(plan, 0).iter_batches())
    ahead = StepPrefetcher(PlanCursor(plan, 0), columns, PrefetchOptions(prefetch_steps=2))
    held = ahead.take(pb.step)
    ahead.close()
    hit = [i in ids for i in pb.ids]
    assert any(hit) and all(h is None for h, x in zip(held, hit) if x)
    assert all(h is not None for h, x in zip(held, hit) if not x)
    waves = BatchBuilder(manifest, [str(corpus.spm)], skip_bad_audio=True).read_audio(
        columns.gather(pb.rows, pb.ids), held)
    want = "container not found" if how == "missing" else "cut short"
    for utt, wave, x in zip(pb.ids, waves, hit):
        assert isinstance(wave, AudioError) == x
        if x:
            assert str(wave).startswith(f"utterance {utt!r}: ") and want in str(wave) and "\n" not in str(wave)


@pytest.mark.parametrize("damaged", ["missing"], indirect=True)
def test_train_skips_the_rows_of_a_missing_container_with_prefetch(planned: tuple[Path, Path], corpus: Corpus,
                                                                   damaged: tuple[str, set[str]], tmp_path: Path) -> None:
    """``train --skip-bad-audio --prefetch-steps 2`` over a plan whose tar is gone: the run ends,
    each of its rows in the skipped log."""
    manifest, plan = planned
    _, ids = damaged
    invoke("train", str(plan), "--manifest", str(manifest), "--tokenizer", str(corpus.spm), "--checkpoint-dir",
           str(tmp_path / "run"), "--timeout", "90", "--quiet", "--nproc", "2", "--skip-bad-audio",
           "--prefetch-steps", "2")
    skipped = [json.loads(x)["id"] for r in range(2) if (tmp_path / "run" / f"skipped-rank-{r:05d}.jsonl").exists()
               for x in (tmp_path / "run" / f"skipped-rank-{r:05d}.jsonl").read_text().splitlines() if x]
    assert sorted(skipped) == sorted(ids)


def test_simulate_counts_what_the_prefetch_reads(planned: tuple[Path, Path]) -> None:
    from dataprep.planning.simulate import store_reads
    from dataprep.planning.step_reads import StoreModel

    manifest, plan = planned
    columns = ColumnCache.open(manifest)
    reads = store_reads(plan, manifest, store=StoreModel(latency_s=0.02, bandwidth=1e8, concurrency=4))
    for rank in (0, 1):
        reader = Counting()
        drain(StepPrefetcher(PlanCursor(plan, rank), columns, PrefetchOptions(prefetch_steps=2), reader=reader),
              plan, rank)
        assert int(reads.requests[:, rank].sum()) == len(reader.calls)
        assert int(reads.nbytes[:, rank].sum()) == sum(n for _, _, n in reader.calls)
    assert 1.0 <= reads.fetched_per_used <= 1.05
    first = reads.requests[0].max()
    assert reads.first_batch_s >= 0.02 * np.ceil(first / 4)
    assert reads.utt_per_s > 0 and reads.steps_per_s > 0


def test_simulate_prints_the_store_reads(planned: tuple[Path, Path]) -> None:
    manifest, plan = planned
    text = invoke("simulate", str(plan), "--manifest", str(manifest), "--reads", "--store", "latency_s=0.05",
                  "--store", "request_rate=100")
    assert "store reads per rank-step" in text and "latency 50 ms" in text and "100 req/s" in text
    from typer.testing import CliRunner

    from dataprep.cli import app

    res = CliRunner().invoke(app, ["simulate", str(plan), "-m", str(manifest), "--reads", "--store", "latency=1"])
    assert res.exit_code == 2 and res.output.strip().splitlines()[-1].startswith("error: --store: 'latency=1'")
