"""Samplers and loaders opened for the wrong rank or asked for sizes beyond bounds: a process
of a real torch.distributed group (gloo) that opens another rank's shard is refused in one line;
DataLoader workers and prefetch depth are bounded before anything starts."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError, OptionError
from tests.warm_python import COMMANDS, run_ranks

REPO = Path(__file__).resolve().parents[2]

#: one rank of a 2-process gloo group: opens rank 0's shard (every process, as a common slip
#: does), then its own; prints what each gave
_RANK = """
import json, sys
import torch.distributed as dist
from dataprep.integrations.torch import PlanBatchSampler
from manifests.errors import DataprepError
plan, port, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
out = {}
try:
    out["rank 0"] = len(PlanBatchSampler(plan, 0))
except DataprepError as exc:
    out["rank 0"] = str(exc)
out["own"] = [b for b in PlanBatchSampler(plan, rank)][:2]
dist.barrier()
dist.destroy_process_group()
print(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_process_opening_another_ranks_shard_is_refused(tmp_path: Path) -> None:
    manifest, buckets = write_plan_inputs(tmp_path, 200, seed=5, num_buckets=3)
    plan = tmp_path / "plan"
    build_plan(manifest, buckets, plan, PlanOptions(world_size=2))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    port = str(_free_port())
    # two processes at once, each forked from a server that imported torch
    runs = run_ranks(2, lambda r: (["-c", _RANK, str(plan), port, str(r)], env), timeout=300, preload=COMMANDS)
    outs = []
    for res in runs:
        assert res.returncode == 0, res.stderr[-3000:]
        outs.append(json.loads(res.stdout.splitlines()[-1]))
    assert isinstance(outs[0]["rank 0"], int)  # rank 0 opening its own shard
    msg = outs[1]["rank 0"]
    assert msg == f"{plan}: rank 0 given, but this process is rank 1 of 2 (torch.distributed): open rank 1's shard"
    from manifests.plan_files import open_shard
    for r in range(2):  # each process's own shard is its own batches
        assert outs[r]["own"] == [b.rows.tolist() for b in open_shard(plan, r)][:2]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_workers": 10**6}, "num_workers"), ({"num_workers": -1}, "num_workers"), ({"num_workers": 1.0}, "num_workers"),
    ({"prefetch_depth": 10**9}, "prefetch_depth"), ({"prefetch_depth": True}, "prefetch_depth"),
    ({"timeout_s": float("inf")}, "timeout_s"),
])
def test_loader_sizes_are_bounded_before_anything_starts(tmp_path: Path, kwargs: dict, field: str) -> None:
    from dataprep.training.loader import make_loader

    with pytest.raises(OptionError, match=field) as exc:
        make_loader(None, **kwargs)  # type: ignore[arg-type]  (refused before the dataset is touched)
    assert isinstance(exc.value, DataprepError) and "\n" not in str(exc.value)


@pytest.mark.parametrize(("field", "value"), [("workers", 10**6), ("prefetch", 10**5)])
def test_train_config_bounds_workers_and_prefetch(tmp_path: Path, field: str, value: int) -> None:
    from dataprep.training_config import TrainConfig

    with pytest.raises(OptionError, match=f"{field}: must be <= "):
        TrainConfig(plan_dir=str(tmp_path), manifest=str(tmp_path / "m.parquet"), tokenizer=["spm.model"],
                    checkpoint_dir=str(tmp_path / "ck"), **{field: value})


_HUGE = st.sampled_from([400, 600]).map(lambda n: 10**n) | st.sampled_from([400, 600]).map(lambda n: -(10**n))
_GARBAGE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20), _HUGE),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=6)


@pytest.fixture(scope="module")
def replanned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """(plan, its re-plan at step k for 3 ranks, k)."""
    from dataprep.planning.replan import replan

    root = tmp_path_factory.mktemp("ckpt-plans")
    manifest, buckets = write_plan_inputs(root, 300, seed=9, num_buckets=3)
    meta = build_plan(manifest, buckets, root / "plan", PlanOptions(world_size=2))
    k = meta.num_steps // 2
    replan(root / "plan", manifest, root / "re", PlanOptions(world_size=3), at_step=k)
    return root / "plan", root / "re", k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_garbage_checkpoints_are_one_line_naming_the_file_or_resume_exactly(
        replanned: tuple[Path, Path, int], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """The loop's resume (:func:`dataprep.training.loop._resume`, the real one) on a checkpoint
    sealed with its hash but holding garbage: a DataprepError of one line naming the file, or the
    plan's next step with the model's weights."""
    import torch

    from dataprep.training.checkpoint import save_checkpoint
    from dataprep.training.loop import _resume
    from manifests.plan_meta import read_plan_meta

    plan, re, k = replanned
    target = data.draw(st.sampled_from([plan, re]))
    meta, parent = read_plan_meta(target), read_plan_meta(plan)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    good = {"next_step": data.draw(st.integers(meta.first_step, meta.num_steps)), "model": model.state_dict(),
            "optimizer": opt.state_dict(), "plan_hash": meta.plan_hash, "config": {}}
    fields = {key: data.draw(st.just(v) | _GARBAGE) if data.draw(st.booleans()) else v for key, v in good.items()}
    if data.draw(st.booleans()):
        fields["plan_hash"] = data.draw(st.sampled_from([parent.plan_hash, "0" * 64]))
    path = tmp_path_factory.mktemp("ck") / "last.pt"
    save_checkpoint(path, fields)
    try:
        step = _resume(path, meta, torch.nn.Linear(3, 2), torch.optim.AdamW(torch.nn.Linear(3, 2).parameters()),
                       "cpu")
    except DataprepError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"{path}: ") and len(str(exc)) < 400, str(exc)
        return
    assert type(fields["next_step"]) is int and step == fields["next_step"]
    if fields["plan_hash"] == meta.plan_hash:
        assert meta.first_step <= step <= meta.num_steps
    else:  # the re-plan's parent at exactly the step the plan was re-planned at
        assert target == re and fields["plan_hash"] == parent.plan_hash and step == k
