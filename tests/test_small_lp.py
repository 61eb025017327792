"""The assignment LPs' simplex (`solvers.small_lp`) against HiGHS: same optimal values, feasible
solutions, and the same answers when warm-started through a sequence of objectives."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.small_lp import SmallLP


def _highs_value(a: np.ndarray, b: np.ndarray, c: np.ndarray, low: np.ndarray | None = None) -> float | None:
    """max c·x s.t. low <= a x <= b (low: -inf where None), x >= 0; None when infeasible."""
    import highspy

    from solvers.quiet import quiet_stdout

    with quiet_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    m, n = a.shape
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, m
    lp.col_cost_ = c.astype(float)
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.full(n, highspy.kHighsInf)
    lp.row_lower_ = np.full(m, -highspy.kHighsInf) if low is None else low.astype(float)
    lp.row_upper_ = b.astype(float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(0, m * n + 1, m)
    lp.a_matrix_.index_ = np.tile(np.arange(m), n)
    lp.a_matrix_.value_ = a.T.astype(float).reshape(-1)
    lp.sense_ = highspy.ObjSense.kMaximize
    h.passModel(lp)
    h.run()
    if h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
        return None
    return float(h.getInfo().objective_function_value)


@pytest.mark.parametrize("seed", range(30))
def test_values_match_highs_through_warm_starts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    classes, groups = int(rng.integers(1, 5)), int(rng.integers(1, 60))
    usage = rng.integers(0, 9, (groups, classes)) * rng.choice([1, 2, 4, 8], (groups, classes))
    usage[usage.sum(axis=1) == 0, 0] = 1  # every pipeline uses some GPU
    avail = rng.integers(1, 64, classes)
    a = np.vstack([usage.T, np.ones((1, groups))])  # one row per class, one for the pipeline count
    b = np.append(avail, rng.integers(1, 20))
    lp = SmallLP(a, b)
    for _ in range(8):
        c = rng.integers(0, 50, groups).astype(float) * (rng.random(groups) < 0.8)  # degenerate ties too
        value, x = lp.solve(c)
        assert value == pytest.approx(_highs_value(a, b, c), rel=1e-9, abs=1e-9)
        assert np.all(x >= 0) and np.all(a @ x <= b + 1e-9)
        assert c @ x == pytest.approx(value, rel=1e-12, abs=1e-12)


def test_needs_nonnegative_constraints() -> None:
    with pytest.raises(ValueError):
        SmallLP(np.array([[1.0, -1.0]]), np.array([1.0]))


@pytest.mark.parametrize("seed", range(40))
def test_priced_lower_limit_matches_highs(seed: int) -> None:
    """`solve_priced`: the optimum with d·x >= least added (HiGHS with that row), a point that meets
    it, None exactly when the row cannot be met; every answer an upper bound, warm-started through
    a sequence of objectives and limits."""
    rng = np.random.default_rng(700 + seed)
    classes, groups = int(rng.integers(1, 5)), int(rng.integers(1, 40))
    usage = rng.integers(0, 9, (groups, classes)) * rng.choice([1, 2, 4, 8], (groups, classes))
    usage[usage.sum(axis=1) == 0, 0] = 1
    avail = rng.integers(1, 64, classes)
    a = np.vstack([usage.T, np.ones((1, groups))])
    b = np.append(avail, rng.integers(1, 20))
    lp = SmallLP(a, b)
    for _ in range(8):
        c = rng.integers(0, 50, groups).astype(float) * (rng.random(groups) < 0.8)
        d = (c > 0).astype(float)
        least = float(rng.integers(1, 12))
        low = np.append(np.full(a.shape[0], -np.inf), least)
        truth = _highs_value(np.vstack([a, d]), np.append(b, np.inf), c, low)
        found = lp.solve_priced(c, d, least)
        if truth is None:
            assert found is None
            continue
        assert found is not None
        value, x = found
        assert value == pytest.approx(truth, rel=1e-9, abs=1e-9)
        assert np.all(x >= -1e-12) and np.all(a @ x <= b + 1e-9) and d @ x >= least * (1 - 1e-9)
        assert c @ x == pytest.approx(value, rel=1e-9, abs=1e-9)
        for need in (0.9 * truth, 1.1 * truth + 1):  # stopped at a proof below `need`: still a bound
            cut = lp.solve_priced(c, d, least, need=need)
            assert cut is not None and cut[0] >= truth * (1 - 1e-9) - 1e-9
