"""Property tests: random JSON values in buckets.json and plan.json fields, random bytes in
shards and checkpoints. Always a one-line error naming the file, or a correct result (the
values exactly as written, the batches exactly as planned); never a traceback."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import SLOW_EXAMPLES
from typer.testing import CliRunner

from dataprep.cli import app
from manifests.buckets_file import MAX_BATCH_SIZE, read_buckets
from manifests.errors import DataprepError, ManifestError
from manifests.plan_files import PlanShard, verify_plan
from manifests.plan_meta import plan_hash_of, read_plan_meta

FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
json_scalars = st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | \
    st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


def _one_line(exc: BaseException, path: Path) -> None:
    text = str(exc)
    assert "\n" not in text and text.startswith(str(path)), text


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: object) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


@settings(max_examples=150, suppress_health_check=FIXTURES)
@given(field=st.sampled_from(["max_duration", "max_tokens", "batch_size", "index", "num_utterances", "hours",
                              "min_duration", "duration_bin", "token_bin", "note"]), value=json_values)
def test_buckets_json_field_gets_any_json_value(tmp_path: Path, field: str, value: object) -> None:
    path = tmp_path / "b.json"
    bucket = {"index": 0, "max_duration": 20.0, "max_tokens": 300, "batch_size": 8, field: value}
    path.write_text(json.dumps({"version": 1, "buckets": [bucket]}, allow_nan=True))
    try:
        spec = read_buckets(path)
    except ManifestError as exc:
        _one_line(exc, path)
        return
    b = spec.buckets[0]
    got = b.extra["note"] if field == "note" else getattr(b, field)
    assert got == value and type(got) is type(value) or (field in ("max_duration", "hours", "min_duration")
                                                        and got == float(value))  # type: ignore[arg-type]
    assert _is_num(b.max_duration) and b.max_duration > 0
    assert b.max_tokens is None or (_is_int(b.max_tokens) and 1 <= b.max_tokens < 2**31)
    assert b.batch_size is None or (_is_int(b.batch_size) and 1 <= b.batch_size <= MAX_BATCH_SIZE)
    assert b.index == 0 and (b.hours is None or _is_num(b.hours))


def _same(a: object, b: object) -> bool:
    """Equal JSON values, a bool never equal to a number (no coercion hidden by ``True == 1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _leaf_paths(obj: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _leaf_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:2]):
            out += _leaf_paths(v, (*prefix, i))
    return out


def _set(obj: dict, path: tuple, value: object) -> None:
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


@pytest.fixture(scope="module")
def plan_paths(plan: Path) -> list[tuple]:
    return _leaf_paths(json.loads((plan / "plan.json").read_text()))


@settings(max_examples=SLOW_EXAMPLES, suppress_health_check=FIXTURES)
@given(data=st.data())
def test_plan_json_field_gets_any_json_value(plan: Path, plan_paths: list[tuple], tmp_path_factory, data) -> None:
    where = tmp_path_factory.mktemp("pj")
    shutil.copytree(plan, where / "plan")
    obj = json.loads((plan / "plan.json").read_text())
    path = data.draw(st.sampled_from(plan_paths))
    _set(obj, path, data.draw(json_values))
    if path != ("plan_hash",):  # the field's own check, not the (now stale) plan hash, is what is tested
        obj["plan_hash"] = plan_hash_of(obj)
    text = json.dumps(obj, allow_nan=True)
    (where / "plan" / "plan.json").write_text(text)
    try:
        meta = read_plan_meta(where / "plan")
    except ManifestError as exc:
        _one_line(exc, where / "plan" / "plan.json")
    else:
        assert _same(meta.to_json(), json.loads(text))  # exactly what was written (1 and 1.0 are one number)
    res = CliRunner().invoke(app, ["simulate", str(where / "plan"), "--world-sizes", "2"])
    assert res.exit_code in (0, 2), (path, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), (path, repr(res.exception))
    if res.exit_code == 2:
        assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error: ")


def _batches(plan_dir: Path) -> list[tuple]:
    return [(b.epoch, b.step, b.bucket, tuple(b.ids), tuple(b.rows.tolist()))
            for b in PlanShard(plan_dir, 0).iter_batches()]


damage = st.one_of(
    st.tuples(st.just("truncate"), st.integers(min_value=0, max_value=10**6)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(min_value=0, max_value=10**6),
                                                  st.integers(min_value=1, max_value=255)), min_size=1, max_size=4)),
    st.tuples(st.just("random"), st.binary(max_size=4096)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
)


def _damaged(raw: bytes, how: tuple) -> bytes:
    kind, arg = how
    if kind == "truncate":
        return raw[: arg % max(1, len(raw))]
    if kind == "flip":
        b = bytearray(raw)
        for pos, mask in arg:
            b[pos % len(b)] ^= mask
        return bytes(b)
    if kind == "random":
        return arg
    return raw + arg


@settings(max_examples=120, suppress_health_check=FIXTURES)
@given(how=damage)
def test_shard_with_random_bytes(plan: Path, tmp_path_factory, how: tuple) -> None:
    where = tmp_path_factory.mktemp("shard") / "plan"
    shutil.copytree(plan, where)
    shard = where / "rank-00000.parquet"
    raw = shard.read_bytes()
    shard.write_bytes(_damaged(raw, how))
    try:
        got = _batches(where)
    except ManifestError as exc:
        assert "\n" not in str(exc) and "rank-00000.parquet" in str(exc)
    else:
        assert got == _batches(plan)  # anything read is exactly the plan (CRC-checked pages)
    if shard.read_bytes() != raw:
        with pytest.raises(ManifestError, match="rank-00000.parquet"):
            verify_plan(where)


@pytest.fixture(scope="module")
def checkpoint_bytes(trained: Path) -> bytes:
    return (trained / "last.pt").read_bytes()


def _bit_identical(a: object, b: object) -> bool:
    """Same structure, same types, tensors of the same dtype and shape with the same bytes."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.contiguous().reshape(-1).view(torch.uint8).tolist()
                == b.contiguous().reshape(-1).view(torch.uint8).tolist())
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_bit_identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_bit_identical(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return type(a) is type(b) and a == b


@pytest.fixture(scope="module")
def checkpoint_loaded(trained: Path) -> dict:
    import torch

    return torch.load(trained / "last.pt", weights_only=True)


@settings(max_examples=SLOW_EXAMPLES, suppress_health_check=FIXTURES)
@given(how=damage)
def test_checkpoint_with_random_bytes(checkpoint_bytes: bytes, checkpoint_loaded: dict, tmp_path_factory,
                                      how: tuple) -> None:
    """Refused with one line naming the file, or loaded bit-identical to what was written."""
    from dataprep.training.checkpoint import load_checkpoint

    path = tmp_path_factory.mktemp("ck") / "last.pt"
    path.write_bytes(_damaged(checkpoint_bytes, how))
    try:
        ckpt = load_checkpoint(path)
    except DataprepError as exc:
        _one_line(exc, path)
        return
    assert _bit_identical(ckpt, checkpoint_loaded), how


def test_random_bytes_never_decode_to_a_different_shard(plan: Path, tmp_path: Path) -> None:
    """Every byte of a rank shard flipped in turn (its data pages, row-group statistics and
    footer): reading the damaged shard either fails with one line naming it, or gives exactly the
    planned batches. Data pages are guarded by their CRC only (size and footer are unchanged)."""
    want = _batches(plan)
    assert want and np.diff([b[1] for b in want]).tolist() == [1] * (len(want) - 1)
    where = tmp_path / "plan"
    shutil.copytree(plan, where)
    shard = where / "rank-00000.parquet"
    raw = shard.read_bytes()
    outcomes = {"refused": 0, "same": 0}
    for i in range(len(raw)):
        shard.write_bytes(raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:])
        try:
            got = _batches(where)
        except ManifestError as exc:
            assert "\n" not in str(exc) and "rank-00000.parquet" in str(exc), (i, str(exc))
            outcomes["refused"] += 1
        else:
            assert got == want, f"byte {i} of {len(raw)} flipped decodes to a different shard"
            outcomes["same"] += 1
    assert outcomes["refused"] > len(raw) // 2, outcomes  # most bytes matter