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
    """Least max pipeline time for these copies: the smallest breakpoint T whose capacities reach M,
    every copy holding at least one microbatch (a pipeline of a plan has one at least)."""
    first = max(p.a_s[t] for t in range(len(counts)) if counts[t])
    times = sorted({p.a_s[t] + (m - 1) * p.c_s[t] for t in range(len(counts)) if counts[t]
                    for m in range(1, p.microbatches + 1)})
    times = [t for t in times if t >= first]
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


def _least_few_copies(p: AssignProblem, allowed: np.ndarray, copies: int) -> float | None:
    """Brute force: least max pipeline time of exactly `copies` copies (1 or 2) of allowed templates."""
    best = None
    idx = [t for t in range(len(p.a_s)) if allowed[t]]
    for combo in itertools.combinations_with_replacement(idx, copies):
        counts = np.zeros(len(p.a_s), dtype=np.int64)
        for t in combo:
            counts[t] += 1
        if np.any(counts @ p.usage > p.avail):
            continue
        pipe = _pipe_time(p, tuple(counts.tolist()))
        if pipe is not None and all(_pipe_time_ok(p, t, pipe) for t in combo):
            best = pipe if best is None else min(best, pipe)
    return best


def _pipe_time_ok(p: AssignProblem, t: int, pipe: float) -> bool:
    return pipe >= p.a_s[t] - 1e-12  # every copy runs at least one microbatch


@pytest.mark.parametrize("seed", range(40))
def test_best_pair_is_the_least_time_of_one_or_two_copies(seed: int) -> None:
    """`_best_pair` returns copies as fast (to its 1e-9 bisection) as the best one or two copies
    brute force finds, and they fit the GPUs and the replica range."""
    from solvers.assign import SolverStats
    from solvers.assign_lp import _best_pair, _CapacityLP, pipe_time_of, unique_rows

    rng = np.random.default_rng(700 + seed)
    p = _random_problem(rng)
    p = AssignProblem(p.a_s, p.c_s, p.e_s, p.max_microbatches, p.usage, p.avail, p.microbatches,
                      (int(rng.integers(1, 3)), 2))
    allowed = rng.random(len(p.a_s)) < 0.8
    usage, of = unique_rows(p.usage)
    lp = _CapacityLP(usage, of, p.avail, min(p.replicas[1], p.microbatches), SolverStats())
    want = [v for k in range(p.replicas[0], 3) if (v := _least_few_copies(p, allowed, k)) is not None]
    lo = float(np.min(p.a_s))
    hi = float(np.max(p.a_s + p.microbatches * p.c_s)) * 2
    got = _best_pair(p, lp, allowed, lo, hi)
    if not want:
        assert got is None
        return
    assert got is not None
    assert np.all(got @ p.usage <= p.avail) and p.replicas[0] <= got.sum() <= 2 and not np.any(got[~allowed])
    assert pipe_time_of(p, got) <= min(want) * (1 + 1e-8)


@pytest.mark.parametrize("seed", range(30))
def test_dive_copies_fit_and_hold_the_batch(seed: int) -> None:
    """LP diving commits whole copies that fit the GPUs and the pipeline count and, at the trial
    time, hold every microbatch."""
    from solvers.assign import SolverStats, _caps
    from solvers.assign_lp import _CapacityLP, _dive, unique_rows

    p = _random_problem(np.random.default_rng(900 + seed))
    usage, of = unique_rows(p.usage)
    lp = _CapacityLP(usage, of, p.avail, min(p.replicas[1], p.microbatches), SolverStats())
    t = float(np.max(p.a_s + p.microbatches * p.c_s))
    caps = _caps(p, np.ones(len(p.a_s), dtype=bool), t)
    best, rep = lp.best_per_group(caps.astype(float))
    counts = _dive(p, lp, best, rep)
    if counts is None:
        return
    assert np.all(counts @ p.usage <= p.avail)
    assert counts.sum() <= min(p.replicas[1], p.microbatches)
    assert int(caps @ counts) >= p.microbatches


def _least_up_to(p: AssignProblem, copies: int) -> float | None:
    """Brute force: least max pipeline time (tails ignored) of 1..`copies` copies, each running at
    least one microbatch."""
    allowed = np.ones(len(p.a_s), dtype=bool)
    found = [v for k in range(1, copies + 1) if (v := _least_few_copies(p, allowed, k)) is not None]
    return min(found) if found else None


@pytest.mark.parametrize("seed", range(60))
def test_bound_of_few_pipelines_is_the_integer_optimum(seed: int) -> None:
    """With at most `INTEGRAL_COPIES` pipelines the bound is the least pipeline time of whole
    copies (to its bisection's 1e-4), not the LP's: never above brute force, never far below."""
    from solvers.assign_lp import pipeline_time_bound
    from solvers.few_copies import INTEGRAL_COPIES

    rng = np.random.default_rng(1300 + seed)
    p = _random_problem(rng)
    k = int(rng.integers(1, INTEGRAL_COPIES + 1))
    p = AssignProblem(p.a_s, p.c_s, p.e_s, p.max_microbatches, p.usage, p.avail, p.microbatches, (1, k))
    truth = _least_up_to(p, min(k, p.microbatches))
    got = pipeline_time_bound(p)
    if truth is None:
        assert got is None
        return
    assert got is not None
    assert truth * (1 - 2e-4) <= got <= truth * (1 + 1e-9)


def test_bound_with_a_lower_limit_on_pipelines_holds_and_tightens() -> None:
    """Units of at least two pipelines: the LP leaves out templates no plan of that many copies
    can hold (`assign_lp.joinable`) and counts at least that many copies that hold a microbatch
    (`solvers.count_floor`); the bound stays below every plan (oracle), and each of the two lifts
    it above the bound without it on some problems."""
    from dataclasses import replace

    from solvers import assign_lp

    rng = np.random.default_rng(5)
    checked = tighter = floored = 0
    for _ in range(300):
        p = _random_problem(rng)
        lo = int(rng.integers(2, 4))
        p = replace(p, replicas=(lo, lo + int(rng.integers(0, 3))))
        truth = _oracle(p)
        got = solve_assignment_lp(p)
        if truth is None:
            assert got is None or not any(got.counts)
            continue
        assert got is not None and got.bound_s <= truth * (1 + 1e-9)
        checked += 1
        everyone = np.ones(len(p.a_s), dtype=bool)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(assign_lp, "joinable", lambda q: everyone)
            loose = solve_assignment_lp(p)
        tighter += loose is not None and got.bound_s > loose.bound_s * (1 + 1e-6)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(assign_lp, "capacity_with_floor", lambda lp, caps, least, need=None: lp.solve(caps))
            unfloored = solve_assignment_lp(p)
        assert unfloored is not None and got.bound_s >= unfloored.bound_s * (1 - 1e-9)
        floored += got.bound_s > unfloored.bound_s * (1 + 1e-6)
    assert checked > 50 and tighter > 0 and floored > 0


def test_the_lp_precheck_never_rules_out_whole_copies_that_exist() -> None:
    """`assign._lp_short` (fractional copies fall short of M) proves a feasibility check
    infeasible before CP-SAT runs: on random problems and pipeline times it is never true where
    brute force finds whole copies within the GPUs and the pipeline range whose capacities reach
    M, and it settles some checks the capacity duals (`_surely_infeasible`) leave open."""
    from dataclasses import replace

    from solvers.assign import _caps, _Groups, _lp_short, _surely_infeasible, _ub_counts

    settled = 0
    for seed in range(300):
        rng = np.random.default_rng(5000 + seed)
        p = _random_problem(rng)
        if seed % 2:  # a least pipeline count too (priced, `solvers.count_floor`)
            p = replace(p, replicas=(int(rng.integers(1, p.replicas[1] + 1)), p.replicas[1]))
        groups = _Groups.of_problem(p)
        every = np.ones(len(p.a_s), dtype=bool)
        ranges = [range(0, int(min(p.avail[k] // u for k, u in enumerate(p.usage[t]) if u)) + 1)
                  for t in range(len(p.a_s))]
        for t in sorted(rng.uniform(1, 12, size=6)):  # rising T: the LP warm-starts across checks
            caps = _caps(p, every, t)
            # copies of templates that hold no microbatch by t are no pipelines (as in CP-SAT's model)
            whole = any(p.replicas[0] <= sum(n) <= min(p.replicas[1], p.microbatches)
                        and not np.any(np.array(n) @ p.usage > p.avail) and int(np.dot(n, caps)) >= p.microbatches
                        for n in itertools.product(*[r if k > 0 else [0] for r, k in zip(ranges, caps)]))
            if _lp_short(p, caps, groups):
                assert not whole, (seed, t)
                settled += not _surely_infeasible(p, caps, _ub_counts(p))
    assert settled > 0
