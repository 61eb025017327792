"""The lift's witnesses (`lift.lift_unit`, `solvers.integral_bound.reach`): a tail range is cut at
the largest tail of the copies found until they fit at their own tail, so one coarse range gives
the exact whole-copy bound (brute force over every copy count); the groups of those copies are
refined and whole copies of real splits near them searched (`lift.witness_plan`)."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.assign import AssignProblem, SolverStats
from solvers.integral_bound import integral_bound, reach
from tests.test_assign_lp import _oracle, _random_problem


def _bisect(p: AssignProblem, lo: float, hi: float, split: bool, buckets: int) -> float:
    """The largest T in [lo, hi] proven out of reach, to 0.01 %, with no cap on the checks."""
    return integral_bound(p, lo, hi, rel_tol=1e-4, buckets=buckets, max_checks=10**6, split=split)


@pytest.mark.parametrize("seed", range(40))
def test_one_range_cut_at_the_witnesses_is_exact_and_never_above_the_optimum(seed: int) -> None:
    p = _random_problem(np.random.default_rng(2000 + seed))
    truth = _oracle(p)
    if truth is None:
        return
    goal = 2 * truth
    split = _bisect(p, 0.0, goal, split=True, buckets=1)
    coarse = _bisect(p, 0.0, goal, split=False, buckets=1)
    assert coarse <= split + 1e-9
    assert truth * (1 - 2e-4) <= split <= truth + 1e-9


def test_a_wide_tail_range_reaches_below_every_plan_until_cut() -> None:
    """Two copies of 3 GPUs each (A = 1 s, C = 0.25 s), tails 0 and 0.5 s, 8 microbatches: both
    copies take four each, 1.75 s + 0.5 s = 2.25 s; one alone 2.75 s. One range [0, 0.5] lets
    both run to T with no tail: 1.75 s. Cut at the witness's 0.5 s tail, the bound is 2.25 s."""
    p = AssignProblem(a_s=np.array([1.0, 1.0]), c_s=np.array([0.25, 0.25]), e_s=np.array([0.0, 0.5]),
                      max_microbatches=np.array([10**9, 10**9]), usage=np.array([[3, 0], [0, 3]]),
                      avail=np.array([3, 3]), microbatches=8, replicas=(1, 2))
    assert _oracle(p) == pytest.approx(2.25)
    assert _bisect(p, 0.0, 4.0, split=False, buckets=1) == pytest.approx(1.75, rel=1e-3)
    assert _bisect(p, 0.0, 4.0, split=True, buckets=1) == pytest.approx(2.25, rel=1e-3)
    reached, witness = reach(p, 2.3, SolverStats(), buckets=1, split=True)
    assert reached and witness is not None and witness.tolist() == [1, 1]


def test_the_lift_refines_its_witnesses_groups_and_plans_near_them() -> None:
    """Llama-2 13B at 4,096 tokens, global batch 1,024, ZeRO-1, on 36 GPUs of four types
    (`benchmarks/many_types.py --seed 5` pool 17). The lifted unit (three pipelines) was held at
    196.16 s by a V100 -> T4 copy whose split fits only with optimizer states sharded over every
    GPU of the pool (the first bound templates' memory), and the best plan was 201.74 s. With its
    witnesses' groups refined (memory for three pipelines) the bound rises, and whole copies near
    the witness give a plan below 199 s: gap 2.85 % before, within the 1.5 % target now."""
    from planner.costmodel.analytic import AnalyticCostModel
    from planner.evaluate import evaluate
    from planner.search import search
    from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
    from planner.specs.models import get_model
    from planner.validate import violations

    cost = AnalyticCostModel()
    cluster = ClusterSpec(nodes=[NodeGroup(gpu=g, nodes=n, gpus_per_node=k) for g, n, k in (
        ("T4", 1, 8), ("RTX-3090", 16, 1), ("A10", 1, 8), ("V100-SXM2-16GB", 2, 2))])
    res = search(get_model("llama2-13b"), cluster, TrainingSpec(global_batch=1024, seq_len=4096, zero=1),
                 cost=cost, workers=2)
    assert res.stats["units_lifted"] > 0 and not res.timed_out
    assert res.lower_bound_s > 197.0 and res.prediction.step_s < 199.0
    assert res.gap <= 0.015 + 1e-6 and res.lower_bound_s <= res.prediction.step_s
    assert not violations(res.plan, cluster, cost)
    assert abs(evaluate(res.plan, cluster, cost).step_s - res.prediction.step_s) <= 1e-9 * res.prediction.step_s


def test_the_whole_copy_plan_search_finds_plans_inside_a_tail_range() -> None:
    """Three copies of 3 GPUs (A = 1 s, C = 0.25 s), tails 0, 0.2 and 0.5 s, 8 microbatches: the
    first two take four each, 1.75 s + 0.2 s = 1.95 s; all three 1.5 s + 0.5 s = 2.0 s. Below a
    2.0 s incumbent, one range checked at its top tail (0.5 s) needs the copies to finish by
    1.5 s and finds nothing; cut at the copies found (`integral_plan(split=True)`), the search
    returns the 1.95 s plan."""
    from solvers.integral_plan import integral_plan

    p = AssignProblem(a_s=np.array([1.0, 1.0, 1.0]), c_s=np.array([0.25, 0.25, 0.25]),
                      e_s=np.array([0.0, 0.2, 0.5]), max_microbatches=np.array([10**9] * 3),
                      usage=np.array([[3, 0, 0], [0, 3, 0], [0, 0, 3]]), avail=np.array([3, 3, 3]),
                      microbatches=8, replicas=(1, 3))
    assert _oracle(p) == pytest.approx(1.95)
    assert integral_plan(p, 0.0, 2.0, buckets=1, rel_tol=1e-4) is None
    cut = integral_plan(p, 0.0, 2.0, buckets=1, rel_tol=1e-4, split=True)
    assert cut is not None and cut.objective_s == pytest.approx(1.95) and cut.counts == (1, 1, 0)
    assert sum(sum(m) for m in cut.microbatches) == 8
