"""Hand-edited or damaged files the tool reads: buckets.json, plan.json, manifests, rejects
files, tokenizers. Each is a one-line ``FILE: field: problem`` and exit 2, never a coercion."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from manifests.plan_meta import plan_hash_of
from tests.hostile.conftest import refused
from tests.training._consumer import Corpus

GOOD_BUCKET = {"index": 0, "max_duration": 30.0, "max_tokens": 400, "batch_size": 4}


def _buckets(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "b.json"
    path.write_text(text, encoding="utf-8")
    return path


def _with(**fields: object) -> str:
    return json.dumps({"version": 1, "buckets": [{**GOOD_BUCKET, **fields}]})


@pytest.mark.parametrize("text,field,problem", [
    (_with(max_duration="30"), "buckets[0].max_duration", "expected a number"),
    (_with(max_duration=None), "buckets[0].max_duration", "expected a number"),
    (_with(max_duration=[30]), "buckets[0].max_duration", "expected a number"),
    (_with(max_duration=True), "buckets[0].max_duration", "expected a number"),
    (_with(max_duration=-1), "buckets[0].max_duration", "must be > 0"),
    (_with(max_duration=0), "buckets[0].max_duration", "must be > 0"),
    (_with(max_tokens=12.5), "buckets[0].max_tokens", "expected an integer"),
    (_with(max_tokens="12"), "buckets[0].max_tokens", "expected an integer"),
    (_with(max_tokens=True), "buckets[0].max_tokens", "expected an integer"),
    (_with(max_tokens=0), "buckets[0].max_tokens", "must be >= 1"),
    (_with(max_tokens=2**40), "buckets[0].max_tokens", "must be <="),
    (_with(batch_size=1e9), "buckets[0].batch_size", "expected an integer"),
    (_with(batch_size=10**9), "buckets[0].batch_size", "must be <="),
    (_with(batch_size=2.5), "buckets[0].batch_size", "expected an integer"),
    (_with(batch_size="8"), "buckets[0].batch_size", "expected an integer"),
    (_with(batch_size=False), "buckets[0].batch_size", "expected an integer"),
    (_with(batch_size=0), "buckets[0].batch_size", "must be >= 1"),
    (_with(index=3), "buckets[0].index", "in order"),
    (_with(min_duration=40.0), "buckets[0].min_duration", "not below max_duration"),
    ('{"version": 1, "buckets": [{"max_duration": Infinity}]}', "not valid JSON", "Infinity"),
    ('{"version": 1, "buckets": [{"max_duration": NaN}]}', "not valid JSON", "NaN"),
    ('{"version": "1", "buckets": []}', "version", "expected an integer"),
    ('{"version": 2, "buckets": [{"max_duration": 1}]}', "version", "unsupported"),
    ('{"version": 1, "buckets": []}', "buckets", "empty"),
    ('{"version": 1, "buckets": {"0": {}}}', "buckets", "expected a list"),
    ('{"version": 1}', "buckets", "missing"),
    ('{"version": 1, "buckets": [{}]}', "buckets[0].max_duration", "missing"),
    ('{"version": 1, "buckets": [3]}', "buckets[0]", "expected an object"),
    ('[1, 2]', "(file)", "expected an object"),  # not the default name buckets.json
    ('{"version": 1, "buckets": [', "not valid JSON", ""),
    ('{"version": 1, "buckets": [{"max_duration": 5}], "fit": 3}', "fit", "expected an object"),
])
def test_buckets_json_field(corpus: Corpus, tmp_path: Path, text: str, field: str, problem: str) -> None:
    b = _buckets(tmp_path, text)
    refused("plan-batches", corpus.manifest, "--buckets", b, "--world-size", "1", "-o", tmp_path / "p",
            match=(str(b), field, problem))
    assert not (tmp_path / "p").exists()


def test_buckets_json_not_utf8_and_not_a_file(corpus: Corpus, tmp_path: Path) -> None:
    b = tmp_path / "b.json"
    b.write_bytes(b'{"version": 1, "buckets": [{"max_duration": 5, "note": "\xff"}]}')
    refused("padding", corpus.manifest, "--buckets", b, match="not valid JSON")
    refused("padding", corpus.manifest, "--buckets", tmp_path, match="is a directory")
    refused("padding", corpus.manifest, "--buckets", tmp_path / "none.json", match="no such file")


def _plan_json(plan_dir: Path) -> dict:
    return json.loads((plan_dir / "plan.json").read_text())


@pytest.mark.parametrize("edit,field", [
    (lambda p: p.pop("world_size"), "world_size: missing"),
    (lambda p: p.update(world_size="1"), "world_size: expected an integer"),
    (lambda p: p.update(world_size=1.0), "world_size: expected an integer"),
    (lambda p: p.update(epochs=0), "epochs: must be >= 1"),
    (lambda p: p.update(num_steps=p["num_steps"] + 1), "steps_per_epoch"),
    (lambda p: p.update(interleave="sideways"), "interleave"),
    (lambda p: p.pop("shards"), "shards: missing"),
    (lambda p: p["shards"][0].pop("footer_sha256"), "shards[0].footer_sha256: missing"),
    (lambda p: p["shards"][0].update(size="5827"), "shards[0].size: expected an integer"),
    (lambda p: p["shards"][0].update(file="../rank-00000.parquet"), "shards[0].file: must be a bare file name"),
    (lambda p: p["shards"][0].update(file="rank-00001.parquet"), "shards: lists 'rank-00001.parquet'"),
    (lambda p: p["inputs"]["manifest"].update(content_hash="abc"), "inputs.manifest.content_hash"),
    (lambda p: p.update(version=None), "unsupported plan version"),
    (lambda p: p.update(plan_hash=7), "plan_hash: expected a non-empty string"),
])
def test_plan_json_field(corpus: Corpus, plan_copy: Path, edit, field: str) -> None:
    obj = _plan_json(plan_copy)
    edit(obj)
    if not field.startswith("plan_hash"):  # the field's own check, not the stale hash, is tested
        obj["plan_hash"] = plan_hash_of(obj)
    (plan_copy / "plan.json").write_text(json.dumps(obj))
    refused("simulate", plan_copy, match=field)
    refused("export", "nemo", plan_copy, "--manifest", corpus.manifest, "-o", plan_copy.parent / "x", match=field)
    line = refused("verify", plan_copy)  # the field, or (valid values) the plan hash that no longer matches
    assert field in line or "plan_hash: differs" in line, line
    assert not (plan_copy.parent / "x").exists()


@pytest.mark.parametrize("value,problem", [
    ([None], "buckets[1].batch_size: expected an integer"),
    (0, "buckets[1].batch_size: must be >= 1"),
    (None, "buckets[1].batch_size: missing"),
])
def test_plan_json_bucket_batch_size(plan_copy: Path, value: object, problem: str) -> None:
    """A bucket's batch size that is not a positive integer ([null], 0, null) is refused by
    PlanMeta in one line, by verify as by simulate (which reads the batch sizes)."""
    obj = _plan_json(plan_copy)
    obj["buckets"][1]["batch_size"] = value
    obj["plan_hash"] = plan_hash_of(obj)
    (plan_copy / "plan.json").write_text(json.dumps(obj))
    for command in ("simulate", "verify"):
        refused(command, plan_copy, match=(str(plan_copy / "plan.json"), problem))


def test_plan_json_garbage(plan_copy: Path) -> None:
    (plan_copy / "plan.json").write_bytes(b"\x00\xff garbage")
    refused("simulate", plan_copy, match="not valid JSON")
    (plan_copy / "plan.json").write_text('{"version": 1, "world_size": NaN}')
    refused("verify", plan_copy, match="NaN")
    (plan_copy / "plan.json").unlink()
    refused("simulate", plan_copy, match="not a plan directory")


def test_plan_hash_edited_is_found_by_verify(plan_copy: Path) -> None:
    obj = _plan_json(plan_copy)
    obj["seed"] = obj["seed"] + 1  # a valid value, a different plan
    (plan_copy / "plan.json").write_text(json.dumps(obj))
    refused("verify", plan_copy, match="plan_hash: differs")


def test_rejects_file_refused_as_a_manifest(corpus: Corpus, tmp_path: Path) -> None:
    rejects = corpus.manifest.with_name("kept.rejects.parquet")
    assert rejects.exists()
    refused("stats", rejects, match=("is a rejects file", str(rejects)))
    refused("filter", rejects, "-o", tmp_path / "k.parquet", match="is a rejects file")
    refused("fit-buckets", rejects, "-o", tmp_path / "b.json", match="is a rejects file")
    assert list(tmp_path.iterdir()) == []


def test_damaged_manifests(corpus: Corpus, tmp_path: Path) -> None:
    garbage = tmp_path / "g.parquet"
    garbage.write_bytes(b"PAR1 not really")
    refused("stats", garbage, match="not a readable Parquet file")
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), other)
    refused("stats", other, match="not a compiled manifest")
    refused("stats", tmp_path, match="not a regular file")
    raw = corpus.manifest.read_bytes()
    half = tmp_path / "half.parquet"
    half.write_bytes(raw[: len(raw) // 2])
    refused("filter", half, "-o", tmp_path / "k.parquet", match=("half.parquet", "Parquet file"))
    bad_meta = tmp_path / "meta.parquet"
    t = pq.read_table(corpus.manifest)
    pq.write_table(t.replace_schema_metadata({**t.schema.metadata, b"speech_dataprep.provenance": b"{not json"}),
                   bad_meta)
    refused("stats", bad_meta, match="metadata is corrupt")


def test_tokenizer_not_a_model(corpus: Corpus, tmp_path: Path) -> None:
    bogus = tmp_path / "spm.model"
    bogus.write_bytes(b"\x00garbage\xff" * 10)
    refused("compile", corpus.source, "--tokenizer", bogus, "-o", tmp_path / "m.parquet",
            match="not a sentencepiece model")
    refused("compile", corpus.source, "--tokenizer", tmp_path, "-o", tmp_path / "m.parquet",
            match="tokenizer model not found")
    assert not (tmp_path / "m.parquet").exists()


@pytest.mark.parametrize("text,field,problem", [
    ("bucket_duration_bins: [[1.0, 10], [2.0, '20']]\nbucket_batch_size: [4, 2]\n",
     "bucket_duration_bins[1][1]", "expected a number"),
    ("bucket_duration_bins: [1.0, 2.0]\nbucket_batch_size: [4, true]\n", "bucket_batch_size[1]", "expected an integer"),
    ("bucket_duration_bins: [2.0, 1.0]\nbucket_batch_size: [4, 2]\n", "max_duration", "non-decreasing"),
    ("bucket_duration_bins: !!python/object/apply:os.system ['true']\n", "not valid YAML", ""),
    ("- 1\n- 2\n", "(file)", "expected an object"),
    ("use_multimodal_sampling: true\nbucket_duration_bins: [[10, 40]]\nbatch_tokens: 100\n",
     "token_equivalent_duration", "missing"),
    ("use_multimodal_sampling: true\ntoken_equivalent_duration: 0.08\nbucket_duration_bins: [[10, 40]]\n"
     "batch_tokens: 100\nmeasure_total_length: false\n", "measure_total_length", "is not read"),
    ("use_multimodal_sampling: true\ntoken_equivalent_duration: 0.08\nbucket_duration_bins: [[10, 40]]\n"
     "batch_tokens: 1e400\n", "batch_tokens", "integer"),
])
def test_nemo_bucketing_yaml_field(corpus: Corpus, tmp_path: Path, text: str, field: str, problem: str) -> None:
    b = tmp_path / "bucketing.yaml"
    b.write_text(text, encoding="utf-8")
    refused("plan-batches", corpus.manifest, "--buckets", b, "--world-size", "1", "-o", tmp_path / "p",
            match=(field, problem))
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("cfg,problem", [
    ("- {type: nemo, manifest_filepath: a.json, weight: .nan}\n", "must be finite"),
    ("- {type: nemo, manifest_filepath: [[a.json, 2.0], [b.json]]}\n", "expected [path, weight]"),
    ("- {type: nemo, manifest_filepath: 'ais://b/a.json'}\n", "only s3://, gs:// and az:// URLs are read"),
    ("- {type: nemo, manifest_filepath: missing.json}\n", "no such file or directory"),
    ("input_cfg: 3\n", "input_cfg: expected a list"),
    ("- {type: group, input_cfg: []}\n", "input_cfg[0].input_cfg: empty"),
    ("- {type: txt, paths: missing.txt}\n", "no such file or directory"),
    ("- {type: txt_pair, source_paths: [a.txt, b.txt], target_paths: a.txt}\n", "1 files for 2 source_paths"),
    ("- {type: nemo_sft_jsonl, paths: []}\n", "input_cfg[0].paths: empty list"),
    ("- {type: share_gpt, manifest_filepath: a.json}\n", "'share_gpt' is not read"),
])
def test_input_cfg_blend(corpus: Corpus, tmp_path: Path, cfg: str, problem: str) -> None:
    path = tmp_path / "input_cfg.yaml"
    path.write_text(cfg, encoding="utf-8")
    refused("compile", path, "--tokenizer", corpus.spm, "-o", tmp_path / "m.parquet", match=(str(path), problem))
    assert not (tmp_path / "m.parquet").exists()
