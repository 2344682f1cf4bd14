"""PlanBatchSampler (torch) and PlanSampler (Lhotse) replay the plan exactly, resume, and build
cuts that load the right samples (segments, stereo) on real audio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from dataprep.planning.options import PlanOptions
from dataprep.integrations.torch import PlanBatchSampler
from manifests.errors import DataprepError
from manifests.plan_files import open_shard
from tests.integrations._rich import Rich, rich_corpus
from tests.warm_python import COMMANDS, run_python

lhotse = pytest.importorskip("lhotse", reason="lhotse (dev extra) is needed")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Rich:
    return rich_corpus(tmp_path_factory)


@pytest.fixture()
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def plan_ids(plan: Path, rank: int) -> list[list[str]]:
    return [b.ids for b in open_shard(plan, rank)]


class ManifestAudio(Dataset[dict[str, Any]]):
    """A map-style dataset over the compiled manifest: row i -> id and its audio (soundfile)."""

    def __init__(self, manifest: Path) -> None:
        self.rows = pq.read_table(manifest, columns=["id", "audio_path", "offset", "duration"]).to_pylist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        r = self.rows[i]
        sr = soundfile.info(r["audio_path"]).samplerate
        audio, _ = soundfile.read(r["audio_path"], start=round(r["offset"] * sr),
                                  frames=round(r["duration"] * sr), dtype="float32", always_2d=True)
        return {"id": r["id"], "audio": torch.from_numpy(audio.mean(axis=1))}


def ids_collate(items: list[dict[str, Any]]) -> list[str]:
    assert all(x["audio"].numel() > 0 for x in items)
    return [x["id"] for x in items]


def test_plan_batch_sampler_over_a_map_style_dataset_and_resume(rich: Rich) -> None:
    ds = ManifestAudio(rich.manifest)
    for rank in range(2):
        sampler = PlanBatchSampler(rich.plan, rank)
        assert len(sampler) == len(plan_ids(rich.plan, rank))
        got = list(DataLoader(ds, batch_sampler=sampler, collate_fn=ids_collate))
        assert got == plan_ids(rich.plan, rank)
    # resume: stop after k batches, save, restore into a fresh sampler
    k = 3
    first = PlanBatchSampler(rich.plan, 1)
    it = iter(DataLoader(ds, batch_sampler=first, collate_fn=ids_collate))
    head = [next(it) for _ in range(k)]
    state = first.state_dict()
    assert state["next_step"] == k
    again = PlanBatchSampler(rich.plan, 1)
    again.load_state_dict(state)
    assert len(again) == len(plan_ids(rich.plan, 1)) - k
    assert head + list(DataLoader(ds, batch_sampler=again, collate_fn=ids_collate)) == plan_ids(rich.plan, 1)
    with pytest.raises(DataprepError, match="another plan"):
        again.load_state_dict({**state, "plan_hash": "0" * 64})
    with pytest.raises(DataprepError, match="rank 2"):
        PlanBatchSampler(rich.plan, 2)


_HF = """
import json, sys
import datasets
from torch.utils.data import DataLoader
from dataprep.integrations.torch import PlanBatchSampler
hf = datasets.Dataset.from_parquet(sys.argv[2], cache_dir=sys.argv[3]).with_format("python")
loader = DataLoader(hf, batch_sampler=PlanBatchSampler(sys.argv[1], 0, start_step=2),
                    collate_fn=lambda rows: [r["id"] for r in rows])
print(json.dumps(list(loader)))
"""


def test_plan_batch_sampler_over_a_hugging_face_dataset(rich: Rich, tmp_path: Path) -> None:
    pytest.importorskip("datasets", reason="Hugging Face datasets (dev extra) is needed")
    # in a child process: datasets leaves threads behind that deadlock DataLoader workers forked
    # later in the same process (seen with tests/training/test_loader.py)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = run_python(["-c", _HF, str(rich.plan), str(rich.manifest), str(tmp_path / "hf")], env=env, timeout=300,
                     preload=COMMANDS)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.splitlines()[-1]) == plan_ids(rich.plan, 0)[2:]


@pytest.mark.parametrize("rank", [0, 1])
def test_plan_sampler_yields_the_plan(rich: Rich, cache: Path, rank: int) -> None:
    from dataprep.integrations.lhotse import PlanSampler

    sampler = PlanSampler(rich.plan, rich.manifest, rank=rank, world_size=2, cache_dir=cache)
    assert isinstance(sampler, lhotse.dataset.sampling.base.CutSampler)
    batches = list(sampler)
    assert [[c.id for c in cs] for cs in batches] == plan_ids(rich.plan, rank)
    assert all(isinstance(cs, lhotse.CutSet) for cs in batches)
    steps = [b.step for b in open_shard(rich.plan, rank)]
    assert [cs[0].custom["plan_step"] for cs in batches] == steps
    assert [[c.id for c in cs] for cs in sampler] == plan_ids(rich.plan, rank)  # a new iter() starts over


def test_plan_sampler_with_workers_and_lhotse_dataset(rich: Rich, cache: Path) -> None:
    from lhotse.dataset import IterableDatasetWrapper, UnsupervisedWaveformDataset

    from dataprep.integrations.lhotse import PlanSampler, wrapper_warning_filter

    wrapper_warning_filter()
    for workers in (0, 2):
        sampler = PlanSampler(rich.plan, rich.manifest, rank=1, world_size=2, cache_dir=cache, channel=0)
        loader = DataLoader(IterableDatasetWrapper(UnsupervisedWaveformDataset(), sampler), batch_size=None,
                            num_workers=workers)
        got = []
        for batch in loader:
            assert batch["audio"].shape[0] == len(batch["cuts"])
            got.append([c.id for c in batch["cuts"]])
        assert got == plan_ids(rich.plan, 1), workers


def test_plan_data_loader_resumes_exactly_with_workers(rich: Rich, cache: Path) -> None:
    from lhotse.dataset import UnsupervisedWaveformDataset

    from dataprep.integrations.lhotse import PlanDataLoader, PlanSampler

    def run(state: dict[str, Any] | None, stop: int | None) -> tuple[list[list[str]], dict[str, Any]]:
        sampler = PlanSampler(rich.plan, rich.manifest, rank=0, world_size=2, cache_dir=cache, channel=0)
        loader = PlanDataLoader(UnsupervisedWaveformDataset(), sampler, num_workers=2)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for batch in loader:
            out.append([c.id for c in batch["cuts"]])
            if stop is not None and len(out) == stop:
                break
        return out, loader.state_dict()

    full, _ = run(None, None)
    assert full == plan_ids(rich.plan, 0)
    head, state = run(None, 4)
    assert state["next_step"] == 4  # the loader ran ahead; its state is what the trainer got
    tail, _ = run(state, None)
    assert head + tail == full


def test_cuts_load_the_right_samples(rich: Rich, cache: Path) -> None:
    from dataprep.integrations.lhotse import PlanSampler

    cuts = [c for cs in PlanSampler(rich.plan, rich.manifest, rank=0, world_size=2, cache_dir=cache) for c in cs]
    cuts += [c for cs in PlanSampler(rich.plan, rich.manifest, rank=1, world_size=2, cache_dir=cache) for c in cs]
    kinds = set()
    for cut in cuts:
        path = cut.recording.sources[0].source
        info = soundfile.info(path)
        start, n = round(cut.start * info.samplerate), round(cut.duration * info.samplerate)
        ref, _ = soundfile.read(path, start=start, frames=n, dtype="float32", always_2d=True)
        audio = cut.load_audio()
        assert audio.shape[0] == info.channels == cut.num_channels
        m = min(audio.shape[1], ref.shape[0])
        assert abs(audio.shape[1] - ref.shape[0]) <= 1
        np.testing.assert_allclose(audio[:, :m], ref[:m].T, atol=1e-4)
        assert cut.supervisions[0].start == 0 and cut.supervisions[0].duration == cut.duration
        assert cut.custom["source_lang"] == cut.custom["target_lang"] and cut.custom["taskname"] == "asr"
        assert "speaker" in cut.custom and "pnc" in cut.custom
        kinds.add((type(cut).__name__, cut.start > 0))
    assert {("MonoCut", False), ("MonoCut", True), ("MultiCut", False), ("MultiCut", True)} <= kinds
    # one channel of stereo audio with channel=1
    sampler = PlanSampler(rich.plan, rich.manifest, rank=0, world_size=2, cache_dir=cache, channel=1)
    with pytest.raises(DataprepError, match="channel"):
        list(sampler)  # mono files have no channel 1


def test_plan_sampler_state_dict_resume(rich: Rich, cache: Path) -> None:
    from dataprep.integrations.lhotse import PlanSampler

    a = PlanSampler(rich.plan, rich.manifest, rank=1, world_size=2, cache_dir=cache)
    it = iter(a)
    head = [[c.id for c in next(it)] for _ in range(5)]
    state = a.state_dict()
    b = PlanSampler(rich.plan, rich.manifest, rank=1, world_size=2, cache_dir=cache)
    b.load_state_dict(state)
    assert head + [[c.id for c in cs] for cs in b] == plan_ids(rich.plan, 1)
    with pytest.raises(DataprepError, match="world size 3"):
        PlanSampler(rich.plan, rich.manifest, rank=0, world_size=3, cache_dir=cache)


def test_samplers_over_a_replanned_plan_yield_len_batches(rich: Rich, cache: Path, tmp_path: Path) -> None:
    """A re-planned plan starts at its at_step: len() is the batches yielded (it once counted
    the parent's consumed steps too), and a start before at_step is refused."""
    from dataprep.integrations.lhotse import PlanSampler
    from dataprep.planning.replan import replan

    at = len(plan_ids(rich.plan, 0)) // 2
    meta = replan(rich.plan, rich.manifest, tmp_path / "re", PlanOptions(world_size=3), at_step=at)
    for rank in range(3):
        torch_sampler = PlanBatchSampler(tmp_path / "re", rank)
        n = len(torch_sampler)
        assert n == meta.num_steps - at == len(list(torch_sampler))
        lhotse_sampler = PlanSampler(tmp_path / "re", rich.manifest, rank=rank, world_size=3, cache_dir=cache)
        assert len(lhotse_sampler) == n == len(list(lhotse_sampler))
    with pytest.raises(DataprepError, match=f"re-planned at step {at}"):
        PlanBatchSampler(tmp_path / "re", 0, start_step=0)


@pytest.mark.parametrize("bad", [{"next_step": "3"}, {"next_step": 3.0}, {"rank": "1"}, {"rank": 0.5},
                                 {"next_step": True}, {"plan_hash": None}, {"extra": 1}])
def test_sampler_states_are_not_coerced(rich: Rich, cache: Path, bad: dict[str, Any]) -> None:
    from dataprep.integrations.lhotse import PlanSampler
    from manifests.plan_cursor import PlanStateError

    torch_sampler = PlanBatchSampler(rich.plan, 0)
    with pytest.raises(PlanStateError):
        torch_sampler.load_state_dict({**torch_sampler.state_dict(), **bad})
    assert torch_sampler.next_step == 0
    lhotse_sampler = PlanSampler(rich.plan, rich.manifest, rank=0, world_size=2, cache_dir=cache)
    with pytest.raises(PlanStateError):
        lhotse_sampler.load_state_dict({**lhotse_sampler.state_dict(), **bad})


@pytest.mark.parametrize(("bad", "problem"), [
    ({"world_size": 3}, "world_size: 3 in the state"), ({"world_size": 2.0}, "world_size: expected an integer"),
    ({"seed": "x"}, "seed: expected an integer"), ({"diagnostics": 5}, "diagnostics: expected an object"),
    ({"diagnostics": {"x": 1}}, "diagnostics do not fit"), ({"drop_last": None}, "drop_last: expected false"),
    ({"epoch": -1}, "epoch: must be >= 0"),
])
def test_lhotse_part_of_a_bad_state_is_a_one_line_error(rich: Rich, cache: Path, bad: dict[str, Any],
                                                        problem: str) -> None:
    from dataprep.integrations.lhotse import PlanSampler
    from manifests.plan_cursor import PlanStateError

    sampler = PlanSampler(rich.plan, rich.manifest, rank=0, world_size=2, cache_dir=cache)
    state = sampler.state_dict()
    with pytest.raises(PlanStateError, match=problem) as exc:
        sampler.load_state_dict({**state, **bad, "next_step": 2})
    assert "\n" not in str(exc.value) and sampler.next_step == 0
    state.pop("diagnostics")
    with pytest.raises(PlanStateError, match="diagnostics: missing"):
        sampler.load_state_dict(state)


def test_importing_the_lhotse_sampler_loads_no_training_stage() -> None:
    code = ("import sys; import dataprep.integrations.lhotse, dataprep.integrations.torch; "
            "print(sorted(m for m in sys.modules if m.startswith('dataprep.training')))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, timeout=300)
    assert res.stdout.strip() == "[]"


class CutIds(Dataset[list[str]]):
    """A Lhotse-style dataset: a step's CutSet -> its cut ids."""

    def __getitem__(self, cuts: Any) -> list[str]:  # type: ignore[override]
        return [c.id for c in cuts]


def test_replan_mid_run_then_resume_serves_exactly_the_replanned_steps(rich: Rich, cache: Path, tmp_path: Path) -> None:
    """A 2-rank run stopped at step k, re-planned at k for 3 ranks: every sampler's and loader's
    state of the parent resumes on the re-plan (also with the parent's other world size), its
    ``len`` is the re-plan's steps from k, and the batches served are exactly the re-plan's
    shard from k; a parent state at another step, or a re-plan state before k, is refused."""
    from dataprep.integrations.lhotse import PlanDataLoader, PlanEnded, PlanSampler
    from dataprep.planning.replan import replan
    from manifests.plan_cursor import PlanStateError

    n = len(plan_ids(rich.plan, 0))
    k = n // 2
    re = tmp_path / "re"
    meta = replan(rich.plan, rich.manifest, re, PlanOptions(world_size=3), at_step=k)
    torch_parent = PlanBatchSampler(rich.plan, 1)
    head = iter(torch_parent)
    for _ in range(k):
        next(head)
    lhotse_parent = PlanSampler(rich.plan, rich.manifest, rank=1, world_size=2, cache_dir=cache)
    head_cuts = iter(lhotse_parent)
    for _ in range(k):
        next(head_cuts)
    loader_parent = PlanDataLoader(CutIds(), PlanSampler(rich.plan, rich.manifest, rank=0, world_size=2, cache_dir=cache))
    head_ids = iter(loader_parent)
    for _ in range(k):
        next(head_ids)
    states = [s.state_dict() for s in (torch_parent, lhotse_parent, loader_parent)]
    assert [s["next_step"] for s in states] == [k, k, k] and states[1]["world_size"] == 2
    for rank in range(3):
        want_rows = [b.rows.tolist() for b in open_shard(re, rank)]
        want_ids = plan_ids(re, rank)
        assert len(want_ids) == meta.num_steps - k
        torch_sampler = PlanBatchSampler(re, rank)
        torch_sampler.load_state_dict(states[0])
        assert len(torch_sampler) == meta.num_steps - k and list(torch_sampler) == want_rows
        lhotse_sampler = PlanSampler(re, rich.manifest, rank=rank, world_size=3, cache_dir=cache)
        lhotse_sampler.load_state_dict(states[1])
        assert len(lhotse_sampler) == meta.num_steps - k
        assert [[c.id for c in cs] for cs in lhotse_sampler] == want_ids
        loader = PlanDataLoader(CutIds(), PlanSampler(re, rich.manifest, rank=rank, world_size=3, cache_dir=cache))
        loader.load_state_dict(states[2])
        # the pass the parent's trainer started at step 0 goes on: Lightning counts k batches of it done
        assert len(loader) == meta.num_steps and list(loader) == want_ids
        with pytest.raises(PlanEnded) as ended:  # the steps are global: the end is the re-plan's num_steps
            iter(loader)
        assert f"up to step {meta.num_steps} (plan.json num_steps {meta.num_steps})" in str(ended.value)
    for state in states[:2]:
        with pytest.raises(PlanStateError, match=f"re-planned at step {k}"):
            PlanSampler(re, rich.manifest, rank=0, world_size=3, cache_dir=cache).load_state_dict(
                {**state, "next_step": k - 1})
    lhotse_re = PlanSampler(re, rich.manifest, rank=0, world_size=3, cache_dir=cache)
    with pytest.raises(PlanStateError, match=f"next_step: {k - 1} is outside the plan's steps {k}"):
        lhotse_re.load_state_dict({**lhotse_re.state_dict(), "next_step": k - 1})
    with pytest.raises(PlanStateError, match="world_size: 3 in the state, expected 2"):  # the parent had 2 ranks
        lhotse_re.load_state_dict({**states[1], "world_size": 3})


@pytest.mark.parametrize("epoch", [-1, 2**31, 10**400, True, 1.0, "1", None])
def test_lhotse_set_epoch_is_checked(rich: Rich, cache: Path, epoch: Any) -> None:
    from dataprep.integrations.lhotse import PlanSampler
    from manifests.plan_cursor import PlanStateError

    sampler = PlanSampler(rich.plan, rich.manifest, rank=0, world_size=2, cache_dir=cache)
    with pytest.raises(PlanStateError, match="set_epoch: epoch: ") as exc:
        sampler.set_epoch(epoch)
    assert "\n" not in str(exc.value) and sampler.epoch == 0
    sampler.set_epoch(3)
    assert sampler.epoch == 3


@pytest.mark.parametrize("workers", [0, 2])
def test_plan_iterable_loader_state_resumes_exactly(rich: Rich, cache: Path, workers: int) -> None:
    """The iterable loader (NeMo's ``force_iterable_dataset``) has a state too: without one a
    resumed trainer silently started the plan again at its first step."""
    from dataprep.integrations.lhotse import PlanIterableLoader, PlanSampler

    want = plan_ids(rich.plan, 1)
    k = 3
    first = PlanIterableLoader(CutIds(), PlanSampler(rich.plan, rich.manifest, rank=1, world_size=2, cache_dir=cache),
                               num_workers=workers)
    it = iter(first)
    head = [next(it) for _ in range(k)]
    state = first.state_dict()
    assert state["next_step"] == k and head == want[:k]
    del it
    resumed = PlanIterableLoader(CutIds(), PlanSampler(rich.plan, rich.manifest, rank=1, world_size=2,
                                                       cache_dir=cache), num_workers=workers)
    resumed.load_state_dict(state)
    assert list(resumed) == want[k:]


_HUGE = st.sampled_from([400, 5000]).map(lambda n: 10**n) | st.sampled_from([400, 5000]).map(lambda n: -(10**n))
_GARBAGE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20), _HUGE),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5) | st.integers(0, 3), c, max_size=3),
    max_leaves=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_garbage_lhotse_states_are_refused_in_one_line_or_resume_exactly(rich: Rich, cache: Path,
                                                                         data: st.DataObject) -> None:
    """Lhotse's part of a state (epoch, drop_last, world_size, seed, shuffle, diagnostics) and the
    cursor's, each right or garbage: a one-line PlanStateError that changes nothing, or exactly
    the plan's batches from the state's step; never Lhotse's AssertionError or a raw KeyError."""
    from dataprep.integrations.lhotse import PlanSampler
    from manifests.plan_cursor import PlanStateError

    sampler = PlanSampler(rich.plan, rich.manifest, rank=1, world_size=2, cache_dir=cache)
    want = plan_ids(rich.plan, 1)
    good = {**sampler.state_dict(), "next_step": data.draw(st.integers(0, len(want)))}
    state: dict[Any, Any] = {k: data.draw(st.just(v) | _GARBAGE) if data.draw(st.booleans()) else v
                             for k, v in good.items()}
    for key in data.draw(st.lists(st.sampled_from(sorted(good)), max_size=1)):
        state.pop(key)
    try:
        sampler.load_state_dict(state)
    except PlanStateError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"{rich.plan}: sampler state") and len(str(exc)) < 400
        assert sampler.next_step == 0 and sampler.epoch == 0
        return
    assert type(state["next_step"]) is int and sampler.next_step == state["next_step"]
    assert [[c.id for c in cs] for cs in sampler] == want[state["next_step"]:]
