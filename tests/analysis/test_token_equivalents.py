"""Token-equivalents (:mod:`bucketing.token_equivalents`) and NeMo's multimodal sampling options
read from a bucketing YAML (:mod:`manifests.nemo_buckets`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from bucketing.token_equivalents import TokenEquivalentOptions, token_batch_sizes, token_cost, token_equivalents
from manifests.buckets_file import read_buckets
from manifests.errors import ManifestError, OptionError
from tests.conftest import read_shared_csv


def test_token_equivalents_audio_plus_tokens_text_rows_their_tokens() -> None:
    te = token_equivalents([1.0, 2.24, 0.0, 0.001], [5, 0, 7, 1], 12.5)
    # 1 s at 12.5/s = 12.5 -> 13; 2.24 / 0.08 is 28.000000000000004 in floats: 29, as NeMo computes it
    assert te.tolist() == [13 + 5, 29, 7, 1 + 1] and te.dtype == np.int64
    with pytest.raises(OptionError, match="audio_token_rate"):
        token_equivalents([1.0], [1], 0)


def test_token_equivalents_vectorized_on_real_durations() -> None:
    df = read_shared_csv("librispeech.dev-clean.csv")
    d = df["duration"].to_numpy()
    t = np.arange(d.shape[0]) % 50
    te = token_equivalents(d, t, 12.5)
    import math
    assert te.tolist() == [math.ceil(x / 0.08) + int(k) for x, k in zip(d.tolist(), t.tolist())]


def test_costs_and_batch_sizes() -> None:
    assert token_cost([100, 200]).tolist() == [100.0, 200.0]
    assert token_cost([100], 1000).tolist() == [110.0]
    sizes = token_batch_sizes([100, 110, 3000], 1000, 1000)
    assert sizes.tolist() == [9, 8, 0]  # 110 -> 9 x 110 = 990; 121 -> 8; 12000 > 1000
    assert token_batch_sizes([250], 1000).tolist() == [4]  # exact: 4 x 250 == 1000 fits


@pytest.mark.parametrize(("kw", "field"), [({"audio_token_rate": 0}, "audio_token_rate"),
                                           ({"audio_token_rate": float("nan")}, "audio_token_rate"),
                                           ({"audio_token_rate": 12.5, "batch_tokens": 0}, "batch_tokens"),
                                           ({"audio_token_rate": 12.5, "quadratic_factor": -1}, "quadratic_factor")])
def test_options_checked(kw: dict[str, float], field: str) -> None:
    with pytest.raises(OptionError, match=field):
        TokenEquivalentOptions(**kw)  # type: ignore[arg-type]
    assert TokenEquivalentOptions.from_nemo(0.08).audio_token_rate == 12.5


def _yaml(tmp_path: Path, **opts: object) -> Path:
    path = tmp_path / "train.yaml"
    base = {"use_multimodal_sampling": True, "token_equivalent_duration": 0.08,
            "bucket_duration_bins": [[10, 40], [10, 200], [13, 200]]}
    path.write_text(yaml.safe_dump({"model": {"train_ds": {**base, **opts}}}), encoding="utf-8")
    return path


def test_nemo_batch_tokens_sizes_are_token_batch_sizes(tmp_path: Path) -> None:
    spec = read_buckets(_yaml(tmp_path, batch_tokens=2000, quadratic_factor=4000))
    te = np.asarray([10 + 40, 10 + 200, 13 + 200])
    assert list(spec.batch_sizes()) == token_batch_sizes(te, 2000, 4000).tolist() == [39, 9, 8]
    assert [b.max_duration for b in spec.buckets] == pytest.approx([0.8, 0.8, 1.04])
    assert spec.batch_size_source["rule"] == "nemo batch_tokens"
    linear = read_buckets(_yaml(tmp_path, batch_tokens=2000))
    assert list(linear.batch_sizes()) == token_batch_sizes(te, 2000).tolist() == [40, 9, 9]


@pytest.mark.parametrize(("opts", "msg"), [
    ({"token_equivalent_duration": None, "batch_tokens": 100}, "token_equivalent_duration: expected a number"),
    ({"batch_tokens": 100, "measure_total_length": False}, "measure_total_length: False is not read"),
    ({"batch_tokens": 100, "bucket_duration_bins": [10, 20]}, "bucket_duration_bins: 1D bins"),
    ({"batch_tokens": 30}, "batch_tokens: 30 token-equivalents hold no row of bucket 0"),
    ({"batch_duration": 600}, "batch_duration: not read with use_multimodal_sampling"),
    ({"use_multimodal_sampling": "yes", "batch_tokens": 100}, "use_multimodal_sampling: expected true or false"),
])
def test_bad_multimodal_options_one_line(tmp_path: Path, opts: dict[str, object], msg: str) -> None:
    with pytest.raises(ManifestError, match=msg):
        read_buckets(_yaml(tmp_path, **opts))
