"""The LP assignment (large pools): its bound never exceeds the true optimum, its plan is real."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solvers.assign import AssignProblem, solve_assignment
from solvers.assign_lp import solve_assignment_lp


def _random_problem(rng: np.random.Generator) -> AssignProblem:
    n_t, n_k = int(rng.integers(2, 6)), int(rng.integers(1, 3))
    usage = rng.integers(0, 3, size=(n_t, n_k))
    usage[usage.sum(axis=1) == 0, 0] = 1
    a = rng.uniform(1, 4, n_t)
    c = a / rng.integers(1, 4, n_t)
    e = rng.choice([0.1, 0.3, 0.5], size=n_t)
    caps = np.where(rng.random(n_t) < 0.2, rng.integers(1, 4, n_t), 10**9)
    avail = rng.integers(2, 6, size=n_k)
    return AssignProblem(a, c, e, caps.astype(np.int64), usage.astype(np.int64), avail.astype(np.int64),
                         int(rng.integers(2, 12)), (1, int(rng.integers(1, 6))))


def _pipe_time(p: AssignProblem, counts: tuple[int, ...]) -> float | None:
    """Least max pipeline time for these copies: the smallest breakpoint T whose capacities reach M."""
    times = sorted({p.a_s[t] + (m - 1) * p.c_s[t] for t in range(len(counts)) if counts[t]
                    for m in range(1, p.microbatches + 1)})
    for t in times:
        caps = [min(int(np.floor((t - p.a_s[i]) / p.c_s[i] + 1e-12)) + 1 if t >= p.a_s[i] else 0,
                    int(p.max_microbatches[i]), p.microbatches) for i in range(len(counts))]
        if sum(caps[i] * counts[i] for i in range(len(counts))) >= p.microbatches:
            return t
    return None


def _oracle(p: AssignProblem) -> float | None:
    best = None
    ranges = [range(0, int(min(p.avail[k] // u for k, u in enumerate(p.usage[t]) if u)) + 1)
              for t in range(len(p.a_s))]
    for counts in itertools.product(*ranges):
        r = sum(counts)
        if not (p.replicas[0] <= r <= min(p.replicas[1], p.microbatches)):
            continue
        if np.any(np.array(counts) @ p.usage > p.avail):
            continue
        pipe = _pipe_time(p, counts)
        if pipe is None:
            continue
        obj = pipe + max(p.e_s[t] for t in range(len(counts)) if counts[t])
        best = obj if best is None else min(best, obj)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_lp_bound_below_optimum_and_plan_is_feasible(seed: int) -> None:
    p = _random_problem(np.random.default_rng(seed))
    truth = _oracle(p)
    got = solve_assignment_lp(p)
    exact = solve_assignment(p)
    if truth is None:
        assert exact is None
        assert got is None or not any(got.counts)
        return
    assert exact is not None and exact.objective_s == pytest.approx(truth, rel=1e-9)
    assert got is not None
    assert got.bound_s <= truth * (1 + 1e-9)
    if any(got.counts):  # the rounded plan is a real plan: within the GPUs and replica range
        counts = np.array(got.counts)
        assert np.all(counts @ p.usage <= p.avail)
        assert p.replicas[0] <= counts.sum() <= p.replicas[1]
        assert sum(sum(m) for m in got.microbatches) == p.microbatches
        assert got.objective_s >= truth * (1 - 1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_lp_time_floor_keeps_the_bound(seed: int) -> None:
    """A known lower bound (`floor`) only shortens the search for a feasible T: the result stays a
    lower bound on every plan's pipeline time and within rel_tol of the search without it."""
    from dataclasses import replace

    from solvers.assign import SolverStats
    from solvers.assign_lp import _CapacityLP, _lp_time

    p = _random_problem(np.random.default_rng(700 + seed))
    p = replace(p, e_s=np.zeros(len(p.a_s)))  # the oracle's objective is then the pipeline time
    allowed = np.ones(len(p.a_s), dtype=bool)

    def lp() -> _CapacityLP:
        usage, of = np.unique(p.usage, axis=0, return_inverse=True)
        return _CapacityLP(usage, of.reshape(-1), p.avail, min(p.replicas[1], p.microbatches), SolverStats())

    plain = _lp_time(p, lp(), allowed, None, 1e-4)
    best = _oracle(p)
    if plain is None:
        assert _lp_time(p, lp(), allowed, None, 1e-4, floor=1.0) is None
        return
    for floor in (0.5 * plain, 0.99 * plain, plain):
        hinted = _lp_time(p, lp(), allowed, None, 1e-4, floor=floor)
        assert hinted is not None and abs(hinted - plain) <= 2e-4 * plain
        if best is not None:
            assert hinted <= best * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_unique_rows_matches_numpy_unique_on_rows(seed: int) -> None:
    from solvers.assign_lp import unique_rows

    rng = np.random.default_rng(seed)
    high = int(rng.choice([2, 9, 300, 20000]))
    usage = rng.integers(0, high, (int(rng.integers(1, 40)), int(rng.integers(1, 5)))).astype(np.int64)
    found, inverse = unique_rows(usage)
    want, want_inverse = np.unique(usage, axis=0, return_inverse=True)
    assert np.array_equal(found, want) and np.array_equal(inverse, want_inverse.reshape(-1))
