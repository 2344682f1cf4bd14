"""Token-equivalents and batch_tokens sizes against NeMo's own multimodal sampling constraint
(lhotse's ``TokenConstraint`` inside), on real LibriSpeech durations."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lhotse import MonoCut, Recording, SupervisionSegment
from lhotse.audio.source import AudioSource

from bucketing.token_equivalents import token_batch_sizes, token_cost, token_equivalents
from tests.conftest import needs_module, read_shared_csv

pytestmark = [pytest.mark.nemo, needs_module("nemo.collections.common.data.lhotse.sampling",
                                             "nemo_toolkit is not installed (make test-nemo)")]

TED = 0.08  # token_equivalent_duration: 12.5 tokens per second of audio


def _cut(i: int, duration: float, tokens: int) -> MonoCut:
    rec = Recording(id=f"r{i}", sources=[AudioSource(type="file", channels=[0], source="/dev/null")],
                    sampling_rate=16000, num_samples=int(round(duration * 16000)), duration=duration)
    sup = SupervisionSegment(id=f"s{i}", recording_id=rec.id, start=0.0, duration=duration)
    sup.tokens = list(range(tokens))  # NeMo's pretokenized supervision: measured by len()
    return MonoCut(id=f"c{i}", start=0.0, duration=duration, channel=0, recording=rec, supervisions=[sup])


def _text(tokens: int) -> Any:
    """NeMo's formatted text example of ``tokens`` tokens (imported when a test runs, not at collection)."""
    from nemo.collections.common.data.lhotse.text_adapters import TextExample

    ex = TextExample("x")
    ex.input_ids = np.zeros(tokens, dtype=np.int64)  # prompt + answer, as the prompt formatter gives
    return ex


def test_token_equivalents_equal_nemo_measure_length() -> None:
    from nemo.collections.common.data.lhotse.sampling import MultimodalSamplingConstraint

    df = read_shared_csv("librispeech.dev-clean.csv").head(400)
    d = df["duration"].to_numpy()
    t = (np.arange(d.shape[0]) * 7) % 90
    c = MultimodalSamplingConstraint(token_equivalent_duration=TED, batch_tokens=1000, measure_total_length=True)
    nemo = [c.measure_length(_cut(i, float(x), int(k))) for i, (x, k) in enumerate(zip(d, t))]
    assert token_equivalents(d, t, 1 / TED).tolist() == nemo
    # a text-only row (duration 0): its tokens, as NeMo's total_length of a formatted text example
    assert token_equivalents([0.0, 0.0], [17, 300], 1 / TED).tolist() == [c.measure_length(_text(17)),
                                                                          c.measure_length(_text(300))]


@pytest.mark.parametrize("quadratic_factor", [None, 1500.0])
def test_batch_sizes_equal_lhotse_token_constraint(quadratic_factor: float | None) -> None:
    """The most rows of cost c a batch of batch_tokens takes before lhotse's constraint is exceeded."""
    from nemo.collections.common.data.lhotse.sampling import MultimodalSamplingConstraint

    budget = 4000
    for te in (1, 13, 50, 199, 200, 333, 999, 1700, 4000):
        c = MultimodalSamplingConstraint(token_equivalent_duration=TED, batch_tokens=budget,
                                         quadratic_factor=quadratic_factor, measure_total_length=True)
        n = 0
        while True:
            c.add(_text(te))
            if c.exceeded():
                break
            n += 1
        assert token_batch_sizes([te], budget, quadratic_factor).tolist() == [n], te
        assert c._internal.longest_seen == pytest.approx(float(token_cost([te], quadratic_factor)[0]))
