"""Balanced steps on real data (LibriSpeech train-clean-100 metadata, ../shared/data): the
balance goals of issue 22 that hold there, asserted with the margin measured by
``benchmarks/bench_fill.py --goals`` (figures in docs/benchmarks.md). Tokens are words + a
9-token prompt (deterministic and fast; the benchmark's sentencepiece tokens give the same
picture). 30x2 buckets, 600 s padded budget, seed 0, one epoch, as in the benchmark."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from bucketing.allocate import assign
from bucketing.budget import cost_equal_batch_sizes, padded_budget_batch_sizes
from bucketing.costmodel import CostModel
from bucketing.fit_passes import fit_buckets
from bucketing.steps_report import epoch_report, plan_in_memory
from tests.conftest import shared_file


@pytest.fixture(scope="module")
def librispeech() -> tuple[np.ndarray, np.ndarray]:
    df = pl.read_csv(shared_file("librispeech.train-clean-100.csv"), columns=["duration", "text"]).drop_nulls()
    words = df["text"].str.split(" ").list.len().to_numpy().astype(np.int64)
    return df["duration"].to_numpy().astype(np.float64), words + 9


@pytest.mark.parametrize("sizing", ["budget", "cost-equal"])
def test_librispeech_steps_meet_the_balance_goals(librispeech, sizing: str) -> None:
    d, t = librispeech
    cost = CostModel()
    fit = fit_buckets(d, t, 30, 2)
    bs = padded_budget_batch_sizes(fit.grid.max_duration, max_duration_budget=600)
    if sizing == "cost-equal":
        bs = cost_equal_batch_sizes(fit.grid.max_duration, fit.grid.max_tokens, bs, cost)[0]
    a = assign(d, t, fit.grid, bs, strict=False, carry=True, world_size=None)
    B = int(np.sum(-(-np.bincount(a.bucket[a.bucket >= 0], minlength=bs.shape[0]) // bs)))  # batches at W = 1
    # the straggler goal (2%) is met at W = 32 with cost-equal sizes only (its few-step epoch
    # keeps the layout that meets the most goals: balance.goals_unmet)
    for W, strag in ((8, 0.02), (32, 0.02 if sizing == "cost-equal" else 0.03)):
        ep = plan_in_memory(d, t, fit.grid, bs, W, 0.05, cost=cost)
        rep = epoch_report(ep, bs, cost)
        # every row once, whole steps at the packing bound: fill is the bound
        assert ep.rows.shape[0] == d.shape[0] and ep.num_steps == math.ceil(B / W)
        assert rep.balance_mean <= 1.05  # the goal; measured 1.020-1.021 (W = 8), 1.039-1.041 (W = 32)
        assert rep.balance_over_1_10 <= 0.02  # measured 1.1-1.2% (W = 8: one step), 0 (W = 32)
        assert rep.straggler <= strag  # goal 2%; measured 1.4% (W = 8); W = 32: 2.3% (unmet), 1.96% cost-equal
        assert ep.split_batches == 0  # near-equal batches filled the last step: none halved
        assert ep.audio_padding <= 0.008 and ep.token_padding <= 0.034  # measured 0.71-0.74% / 2.97-3.16%
