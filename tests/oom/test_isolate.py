from __future__ import annotations

import pytest

from oom.isolate import ProbeCrashed, run_isolated


def test_crash_without_record_is_retried_not_oom(tmp_path) -> None:
    counter = tmp_path / "n"
    res, attempts = run_isolated("tests.oom.probes:crash_first", {"counter": str(counter), "batch_size": 3})
    assert attempts == 2 and counter.read_text() == "2"
    assert res.fits and not res.oom and res.peak_bytes == 3000


def test_persistent_crash_raises_not_oom(tmp_path) -> None:
    counter = tmp_path / "n"
    with pytest.raises(ProbeCrashed, match="without an OOM record"):
        run_isolated("tests.oom.probes:always_crash", {"counter": str(counter)}, retries=1)
    assert counter.read_text() == "2"


def test_cuda_oom_record_means_does_not_fit() -> None:
    res, attempts = run_isolated("tests.oom.probes:oom_above", {"limit": 4, "batch_size": 5})
    assert attempts == 1 and res.oom and not res.fits  # an OOM is not retried
