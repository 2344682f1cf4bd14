"""CLI: oomptimize --loss-mode / --exact-trace / --explain (tiny transducer, estimate)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dataprep.cli import app


BUCKETS = [{"index": 0, "max_duration": 2.0, "max_tokens": 18}, {"index": 1, "max_duration": 8.0, "max_tokens": 66}]


def _write(tmp_path, buckets: list[dict] = BUCKETS) -> str:
    src = tmp_path / "buckets.json"
    src.write_text(json.dumps({"version": 1, "buckets": buckets}))
    return str(src)


def _run(tmp_path, *extra: str, buckets: list[dict] = BUCKETS) -> tuple[dict, str]:
    out = tmp_path / "sized.json"
    args = ["oomptimize", _write(tmp_path, buckets), "--model", "tiny-rnnt", "--estimate", "--gpu-memory", "200MiB",
            "--tolerance", "0", "--no-cache", "-o", str(out), *extra]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text()), r.output


def test_loss_mode_explain_and_exact_trace(tmp_path) -> None:
    batched, _ = _run(tmp_path)
    sample, text = _run(tmp_path, "--loss-mode", "sample-wise", "--explain")
    assert batched["batch_size_source"]["loss_mode"] == "batched"
    assert sample["batch_size_source"]["loss_mode"] == "sample-wise"
    assert sample["batch_size_source"]["estimator"] == "fitted"
    assert sample["buckets"][1]["batch_size"] > batched["buckets"][1]["batch_size"]
    for b in sample["buckets"]:
        br = b["oom_breakdown"]
        assert br["peak_bytes"] == b["oom_peak_bytes"]
        assert sum(br[c] for c in ("parameters", "gradients", "optimizer", "activations", "attention", "joint")) == br["peak_bytes"]
    assert "activations" in text and "joint" in text and "sample-wise loss" in text
    assert "oom_breakdown" not in batched["buckets"][0]
    # full traces of the short bucket's shape give the same batch (tests/oom/test_fit.py: same peaks)
    exact, _ = _run(tmp_path, "--loss-mode", "sample-wise", "--exact-trace", buckets=BUCKETS[:1])
    assert exact["batch_size_source"]["estimator"] == "exact-trace"
    assert exact["buckets"][0]["batch_size"] == sample["buckets"][0]["batch_size"]


def test_bad_loss_mode_is_a_usage_error(tmp_path) -> None:
    r = CliRunner().invoke(app, ["oomptimize", _write(tmp_path), "--model", "tiny", "--estimate", "--gpu-memory", "1GiB",
                                 "--loss-mode", "sample-wise", "-o", str(tmp_path / "o.json")])
    assert r.exit_code == 2 and "only transducer" in r.output


def test_probe_cache_follows_the_cache_directory(tmp_path, monkeypatch) -> None:
    """Without --cache-dir the probes are cached under $SPEECH_DATAPREP_CACHE/oom, read when
    the command runs (not when the module was imported)."""
    monkeypatch.setenv("SPEECH_DATAPREP_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "sized.json"
    r = CliRunner().invoke(app, ["oomptimize", _write(tmp_path), "--model", "tiny", "--estimate", "--gpu-memory",
                                 "200MiB", "-o", str(out)])
    assert r.exit_code == 0, r.output
    kept = [json.loads(f.read_text()) for f in (tmp_path / "cache" / "oom").glob("*.json")]
    assert sum("probes" in k for k in kept) == len(BUCKETS)  # one per bucket shape
    assert [k["value"] for k in kept if "value" in k] == ["fitted"]  # and the estimator the model gets


def test_a_rerun_the_cache_answers_traces_nothing(tmp_path) -> None:
    """The estimator a model gets is kept beside its probes: a re-run of the same search traces no
    step and sizes every bucket the same; a damaged record is a miss (traced again)."""
    from oom.fit import fitted_model

    cache = tmp_path / "cache"

    def run(name: str) -> dict:
        r = CliRunner().invoke(app, ["oomptimize", _write(tmp_path), "--model", "tiny", "--estimate", "--gpu-memory",
                                     "200MiB", "--cache-dir", str(cache), "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        return json.loads((tmp_path / name).read_text())

    fitted_model.cache_clear()
    first = run("a.json")
    assert fitted_model.cache_info().currsize == 1
    fitted_model.cache_clear()
    assert run("b.json") == first
    assert fitted_model.cache_info().currsize == 0  # every probe and the estimator from the cache
    (record,) = [f for f in cache.glob("*.json") if "value" in json.loads(f.read_text())]
    record.write_text('{"context": ')
    assert run("c.json") == first
    assert fitted_model.cache_info().currsize == 1 and json.loads(record.read_text())["value"] == "fitted"


def test_options_out_of_range_name_the_flag(tmp_path) -> None:
    for flag, value, problem in [("--max-batch", "0", "must be >= 1"), ("--memory-fraction", "1.5", "must be <= 1"),
                                 ("--tolerance", "nan", "finite"), ("--margin", "lots", "not a memory size"),
                                 ("--loss-mode", "fused", "must be batched or sample-wise")]:
        r = CliRunner().invoke(app, ["oomptimize", _write(tmp_path), "--model", "tiny", "--estimate", "--gpu-memory",
                                     "200MiB", "-o", str(tmp_path / "o.json"), flag, value])
        assert r.exit_code == 2 and f"error: {flag}: " in r.output and problem in r.output, r.output
    assert not (tmp_path / "o.json").exists()


def test_format_nemo_writes_the_bucketing_yaml_nemo_reads(tmp_path) -> None:
    import yaml

    from manifests.buckets_file import read_buckets

    sized, _ = _run(tmp_path)
    out = tmp_path / "bucketing.yaml"
    r = CliRunner().invoke(app, ["oomptimize", _write(tmp_path), "--model", "tiny-rnnt", "--estimate", "--gpu-memory",
                                 "200MiB", "--tolerance", "0", "--no-cache", "--format", "nemo", "-o", str(out)])
    assert r.exit_code == 0, r.output
    cfg = yaml.safe_load(out.read_text())
    assert cfg["bucket_duration_bins"] == [[2.0, 18], [8.0, 66]]
    assert cfg["bucket_batch_size"] == [b["batch_size"] for b in sized["buckets"]]
    assert [b.batch_size for b in read_buckets(out).buckets] == cfg["bucket_batch_size"]
    r = CliRunner().invoke(app, ["oomptimize", _write(tmp_path), "--model", "tiny", "--estimate", "--gpu-memory",
                                 "1GiB", "--format", "csv", "-o", str(out)])
    assert r.exit_code == 2 and "--format must be json or nemo" in r.output
