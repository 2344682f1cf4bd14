"""NeMo's bucketing YAML as ``--buckets``: what our ``export nemo`` writes plans to the same
batches as our ``buckets.json``; hand-written NeMo files are checked field by field."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from manifests.buckets_file import read_buckets
from manifests.errors import ManifestError
from manifests.nemo_buckets import write_nemo_buckets
from tests.training._consumer import Corpus, invoke, shared_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return shared_corpus(tmp_path_factory)


def _shards(plan: Path) -> list[bytes]:
    return [pq.read_table(p, columns=["epoch", "step", "bucket", "rows", "ids"]).to_pylist().__repr__().encode()
            for p in sorted(plan.glob("rank-*.parquet"))]


@pytest.mark.parametrize("balance", ["0", "0.05"])
def test_exported_nemo_yaml_plans_to_the_same_buckets(corpus: Corpus, tmp_path: Path, balance: str) -> None:
    invoke("export", "nemo", str(corpus.buckets), "--manifest", str(corpus.manifest), "-o", str(tmp_path / "nemo"))
    yaml_file = tmp_path / "nemo" / "bucketing.yaml"
    ours, theirs = read_buckets(corpus.buckets), read_buckets(yaml_file)
    assert [b.batch_size for b in theirs.buckets] == [b.batch_size for b in ours.buckets]
    assert [b.max_duration for b in theirs.buckets] == [b.max_duration for b in ours.buckets]
    plans = []
    for name, buckets in (("json", corpus.buckets), ("yaml", yaml_file)):
        out = tmp_path / f"plan-{name}"
        invoke("plan-batches", str(corpus.manifest), "--buckets", str(buckets), "--world-size", "2", "--epochs", "2",
               "--balance", balance, "-o", str(out))
        plans.append(_shards(out))
    assert plans[0] == plans[1]


def test_oomptimize_style_yaml_round_trip(tmp_path: Path, corpus: Corpus) -> None:
    spec = read_buckets(corpus.buckets)
    write_nemo_buckets(spec.to_json()["buckets"], tmp_path / "b.yaml", max_tps=12.5)
    again = read_buckets(tmp_path / "b.yaml")
    assert [(b.max_duration, b.max_tokens, b.batch_size) for b in again.buckets] == \
        [(b.max_duration, b.max_tokens, b.batch_size) for b in spec.buckets]
    assert again.fit["max_tps"] == 12.5


@pytest.mark.parametrize(("text", "msg"), [
    ("bucket_duration_bins: [[1.0, 10], [2.0]]\n", r"bucket_duration_bins\[1\]: expected \[max_duration, max_tokens\]"),
    ("bucket_duration_bins: [1.0, '2.0']\n", r"bucket_duration_bins\[1\]: expected a number"),
    ("bucket_duration_bins: [1.0, 2.0]\nbucket_batch_size: [3]\n", "bucket_batch_size: 1 sizes for 2 bins"),
    ("bucket_duration_bins: [1.0, 2.0]\nbucket_batch_size: [3, 2.5]\n", r"bucket_batch_size\[1\]: expected an integer"),
    ("bucket_duration_bins: [[1.0, 10.5]]\n", r"whole number of tokens"),
    ("train_ds: {batch_size: 3}\n", "bucket_duration_bins: missing"),
    ("bucket_duration_bins: [1.0, .nan]\n", "must be finite"),
    ("a: [\n", "not valid YAML"),
    ("bucket_duration_bins: !!python/object:os.system {}\n", "not valid YAML"),
])
def test_bad_nemo_yaml_is_one_line(tmp_path: Path, text: str, msg: str) -> None:
    path = tmp_path / "b.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ManifestError, match=msg) as err:
        read_buckets(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
