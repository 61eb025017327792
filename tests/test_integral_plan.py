"""Whole-copy plans (`solvers.integral_plan`): real plans (GPUs, pipeline counts and microbatches
as the problem allows, step as stated), never below the true optimum (brute force over every copy
count), within the bisection's tolerance of it when every tail has its own range, and found where
rounding the LP's copies misses."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.assign import AssignProblem, Assignment, _caps
from solvers.assign_lp import solve_assignment_lp
from solvers.integral_plan import integral_plan
from tests.test_assign_lp import _oracle, _pipe_time, _random_problem


def _check_real(p: AssignProblem, sol: Assignment) -> None:
    """The plan runs: GPUs and pipeline counts within the problem's, every microbatch dealt, each
    copy within its template's capacity at the stated pipeline time, the step as stated."""
    counts = np.array(sol.counts)
    assert np.all(counts @ p.usage <= p.avail)
    assert p.replicas[0] <= counts.sum() <= min(p.replicas[1], p.microbatches)
    assert sum(sum(m) for m in sol.microbatches) == p.microbatches
    caps = _caps(p, counts > 0, sol.pipe_s * (1 + 1e-12))
    for t, per_copy in enumerate(sol.microbatches):
        assert len(per_copy) == counts[t] and all(1 <= m <= caps[t] for m in per_copy)
    assert sol.tail_s == pytest.approx(max(p.e_s[counts > 0]))
    assert sol.pipe_s == pytest.approx(_pipe_time(p, tuple(int(c) for c in counts)), rel=1e-9)


@pytest.mark.parametrize("seed", range(60))
def test_real_plans_within_tolerance_of_the_optimum(seed: int) -> None:
    p = _random_problem(np.random.default_rng(2000 + seed))
    truth = _oracle(p)
    lp = solve_assignment_lp(p)
    upper = 2 * (truth if truth is not None else 1.0)
    found = integral_plan(p, 0.0 if lp is None else lp.bound_s, upper)  # three tail values: a range each
    if truth is None:
        assert found is None
        return
    assert found is not None
    _check_real(p, found)
    assert truth - 1e-9 <= found.objective_s <= truth * (1 + 1.001e-3)


def test_whole_copies_where_lp_rounding_misses() -> None:
    """Two templates on two GPU classes (3 GPUs of one, 2 of the other), 10 microbatches: the LP
    leans on the 2+1-GPU template, rounding keeps one copy of it (3 + 9 x 1 + 0.1 = 12.1 s) whose
    GPU blocks the other; one copy of the 2-GPU template alone takes all 10 in 1 + 9 x 0.75 + 0.5
    = 8.25 s."""
    p = AssignProblem(a_s=np.array([1.0, 3.0]), c_s=np.array([0.75, 1.0]), e_s=np.array([0.5, 0.1]),
                      max_microbatches=np.array([10**9, 10**9]), usage=np.array([[0, 2], [2, 1]]),
                      avail=np.array([3, 2]), microbatches=10, replicas=(1, 5))
    rounded = solve_assignment_lp(p)
    assert _oracle(p) == pytest.approx(8.25) and rounded.objective_s == pytest.approx(12.1)
    found = integral_plan(p, rounded.bound_s, rounded.objective_s)
    _check_real(p, found)
    assert found.counts == (1, 0) and found.objective_s == pytest.approx(8.25)


def test_a_deadline_passed_stops_it_and_says_so() -> None:
    from solvers.assign import SolverStats

    p = _random_problem(np.random.default_rng(2001))
    stats = SolverStats()
    assert integral_plan(p, 0.0, 2 * _oracle(p), deadline=0.0, stats=stats) is None and stats.truncated


def test_nothing_below_a_bound_reached() -> None:
    """With the upper step at the optimum there is nothing to find: None, not a plan at it."""
    p = _random_problem(np.random.default_rng(2001))
    truth = _oracle(p)
    assert truth is not None and integral_plan(p, 0.5 * truth, truth) is None


def test_polish_finds_whole_copy_plans_rounding_misses(monkeypatch) -> None:
    """Llama-2 7B at 65,536 tokens, global batch 512, ZeRO-1, on 8 H100 + 32 A100-40 + 4 V100-16
    (`benchmarks/many_types.py --seed 3` pool 9): the polish's whole-copy search (`units.polish_unit`)
    finds a plan faster than any rounding of the LP found: 406.01 s against 407.11 s (0.27 %; it was
    409.32 s, gap 1.59 %, before the polish capped its extra templates' tails by the bound templates'
    pipeline time instead of the plan templates')."""
    from planner.costmodel.analytic import AnalyticCostModel
    from planner.evaluate import evaluate
    from planner.search import search, units
    from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
    from planner.specs.models import get_model
    from planner.validate import violations

    cost = AnalyticCostModel()
    cluster = ClusterSpec(nodes=[NodeGroup(gpu=g, nodes=n, gpus_per_node=k) for g, n, k in (
        ("H100-SXM5-80GB", 4, 2), ("A100-SXM4-40GB", 8, 4), ("V100-SXM2-16GB", 1, 4))])
    args = (get_model("llama2-7b"), cluster, TrainingSpec(global_batch=512, seq_len=65536, zero=1))
    res = search(*args, cost=cost, workers=2)
    assert not res.timed_out and res.gap <= 0.015 + 1e-6 and res.lower_bound_s <= res.prediction.step_s
    assert not violations(res.plan, cluster, cost)
    assert abs(evaluate(res.plan, cluster, cost).step_s - res.prediction.step_s) <= 1e-9 * res.prediction.step_s
    monkeypatch.setattr(units, "integral_plan", lambda *a, **k: None)
    rounded = search(*args, cost=cost, workers=2)
    assert rounded.prediction.step_s > (1 + 1e-3) * res.prediction.step_s
