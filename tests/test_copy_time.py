"""`solvers.copy_time.least_time`: the least pipeline time at which copies hold M microbatches,
exactly at a breakpoint, against bisection on the same step function."""

from __future__ import annotations

import numpy as np
import pytest

from solvers import copy_time
from solvers.copy_time import held_by, least_time, least_true


def _case(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    k = int(rng.integers(1, 6))
    a = rng.uniform(0.5, 3.0, k)
    c = rng.uniform(0.01, 0.5, k)
    cap = rng.integers(1, 40, k).astype(float)
    n = rng.choice([rng.integers(1, 4, k).astype(float), rng.uniform(0.1, 3.0, k)])
    return a, c, cap, n


@pytest.mark.parametrize("merge_limit", [copy_time.MERGE_LIMIT, 0])
def test_least_time_is_the_switch_of_the_step_function(merge_limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copy_time, "MERGE_LIMIT", merge_limit)
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(400):
        a, c, cap, n = _case(rng)
        total = float(n @ cap)
        need = float(rng.uniform(0.2, 1.0) * total)
        lo, hi = 0.0, float(np.max(a + (cap - 1) * c))
        t = least_time(a, c, cap, n, need, lo, hi)
        assert held_by(a, c, cap, n, t) >= need
        # just below, the copies hold less: t is where the count first reaches need
        assert held_by(a, c, cap, n, t * (1 - 1e-9)) < need
        assert t == pytest.approx(least_true(lambda x: held_by(a, c, cap, n, x) >= need, lo, hi, 1e-13), rel=1e-11)
        if merge_limit:  # exact: a breakpoint A + j·C of some template
            j = np.round((t - a) / c)
            assert np.any((np.abs(a + j * c - t) <= 1e-12 * t) & (j >= 0) & (j < cap))
        checked += 1
    assert checked == 400


def test_least_time_respects_the_interval() -> None:
    a, c, cap, n = np.array([1.0, 2.0]), np.array([0.5, 0.25]), np.array([4.0, 4.0]), np.array([1.0, 1.0])
    assert least_time(a, c, cap, n, 2.0, 0.0, 10.0) == 1.5  # 1.0 and 1.5 on the first copy
    assert least_time(a, c, cap, n, 2.0, 1.7, 10.0) == 1.7  # already held at lo
    assert least_time(a, c, cap, n, 8.0, 0.0, 2.75) == 2.75
