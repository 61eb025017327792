"""The order of refinement (`unit_loop.refine`): which of the lowest bounds is tightened next, and
how. A single count goes through every tail-level ratio; a wide replica class is split after its
first; a narrow class is refined at every ratio before it is split (its part with the lowest count
would keep the class's bound, and the others start again from the coarsest ratio).

The pool here is a stub that records what it is asked and moves no bound, so every unit is taken as
far as the policy goes."""

from __future__ import annotations

from types import SimpleNamespace

from planner.search import unit_loop
from planner.search.replica_classes import narrow_class
from planner.search.units import REFINE_RATIOS, SolvedUnit, Unit


class _StubPool:
    """Records refinements (unit, ratio) and splits; bounds stay where they are."""

    def __init__(self, ctx: SimpleNamespace) -> None:
        self.ctx, self.log, self.lifts = ctx, [], []

    def refine(self, sus: list[SolvedUnit], deadline: float | None, goal_s: float | None = None) -> None:
        for su in sus:
            su.ratio = su.next_ratio()
            self.log.append(("refine", su.unit.lo, su.unit.hi, su.ratio))

    def split(self, su: SolvedUnit) -> None:
        self.log.append(("split", su.unit.lo, su.unit.hi))
        self.ctx.solved.remove(su)

    def lift(self, sus: list[SolvedUnit], goal_s: float, deadline: float | None,
             beside: list[SolvedUnit] | None = None) -> None:
        """A lift is not refinement's order: it only marks the units lifted (the refinements
        beside it are recorded)."""
        for su in sus:
            su.lifted = True
        self.lifts.append(([su.unit.lo for su in sus], [su.unit.lo for su in beside or []]))
        self.refine(beside or [], deadline)


def _loop_context(*solved: SolvedUnit) -> SimpleNamespace:
    """What `unit_loop.refine` reads of a search: a best plan of 1 s and these solved units."""
    return SimpleNamespace(candidates=[SimpleNamespace(step_s=1.0)], solved=list(solved), bounds=[],
                           explored={"units_split": 0, "units_refined": 0}, unsolved_sizes=set(), history=[],
                           timeline={"start": 0.0})


def _refine_alone(lo: int, hi: int) -> list[tuple]:
    unit = Unit(b=2, provider=None, lo=lo, hi=hi, microbatches=64)
    ctx = _loop_context(SolvedUnit(0.9, unit, []))
    pool = _StubPool(ctx)
    unit_loop.refine(ctx, 0.015, None, pool)
    return pool.log


def test_a_single_count_is_refined_at_every_ratio() -> None:
    assert _refine_alone(4, 4) == [("refine", 4, 4, r) for r in REFINE_RATIOS]


def test_a_wide_class_is_split_after_its_first_ratio() -> None:
    """[9, 35]: tails costed for 9 pipelines stand for 35; a finer level cannot fix that."""
    assert not narrow_class(9, 35)
    assert _refine_alone(9, 35) == [("refine", 9, 35, REFINE_RATIOS[0]), ("split", 9, 35)]


def test_a_narrow_class_is_refined_at_every_ratio_before_it_is_split() -> None:
    """[9, 13] and [5, 8]: a split would leave the part holding the lowest count with the bound
    that count sets (`chain_check.py --seed 40` pool 18, OPT-350M on 56 GPUs: five single counts of
    [9, 13] each refined at 1.5 and 1.15; refined at 1.15 as a class, it reached the goal at once).
    [22, 33] and [34, 51]: more counts than `SPLIT_SINGLETONS`, so a split peels the top count off
    and refines it from the coarsest ratio again, count after count."""
    from planner.search.replica_classes import SPLIT_SINGLETONS, split_counts

    for lo, hi in ((9, 13), (5, 8), (22, 33), (34, 51)):
        assert narrow_class(lo, hi)
        assert _refine_alone(lo, hi) == [("refine", lo, hi, r) for r in REFINE_RATIOS] + [("split", lo, hi)]
    assert hi - lo + 1 > SPLIT_SINGLETONS and split_counts(lo, hi)[-1] == (hi, hi)


def _big_context() -> tuple:
    """A unit context and a blocks provider (microbatch 1) on `test_search_refine`'s big pool."""
    from planner.search.providers import BlocksProvider
    from planner.search.space import block_types, resource_classes, stage_shapes
    from planner.search.units import UnitContext
    from solvers.assign import SolverStats
    from tests.test_search_refine import BIG_CLUSTER, BIG_MODEL, BIG_TRAINING, COST

    classes = resource_classes(BIG_CLUSTER)
    shapes = {rc.index: stage_shapes(BIG_MODEL, BIG_TRAINING, rc, 1) for rc in classes}
    avail = tuple(rc.gpus for rc in classes)
    provider = BlocksProvider(COST, BIG_MODEL, BIG_TRAINING, classes, block_types(shapes), avail, 1,
                              BIG_CLUSTER.single_node)
    return UnitContext(BIG_MODEL, BIG_TRAINING, BIG_CLUSTER, classes, COST, avail, [], [], set(),
                       SolverStats(), {"assignments": 0}), provider


def test_the_part_keeping_the_lowest_count_goes_on_from_the_class_refinement() -> None:
    """A wide class [9, 16] refined at the first ratio and split: its part [9, 13] has tails costed
    for 9 pipelines as the class had, so it takes the class's refined templates and ratio (next:
    1.15) and a bound at least the class's and its own; [14, 16] starts afresh. No plan of the
    part the split found is faster than that bound."""
    import time

    from planner.search.parallel import UnitPool
    from tests.test_search_refine import BIG_TRAINING

    ctx, provider = _big_context()
    wide = Unit(1, provider, 9, 16, BIG_TRAINING.global_batch)
    with UnitPool([wide], ctx, "cpsat", time.perf_counter(), None, workers=1) as pool:
        pool.solve([wide])
        (whole,) = ctx.solved
        pool.refine([whole], None)
        assert whole.ratio == REFINE_RATIOS[0]
        pool.split(whole)
        low, high = sorted(ctx.solved, key=lambda su: su.unit.lo)
    fresh_ctx, fresh_provider = _big_context()
    alone = Unit(1, fresh_provider, 9, 13, BIG_TRAINING.global_batch)
    with UnitPool([alone], fresh_ctx, "cpsat", time.perf_counter(), None, workers=1) as pool:
        pool.solve([alone])
        (fresh,) = fresh_ctx.solved
    assert (low.unit.lo, low.unit.hi, high.unit.lo, high.unit.hi) == (9, 13, 14, 16)
    assert low.ratio == REFINE_RATIOS[0] and low.lb_set is whole.lb_set and high.ratio is None
    assert low.next_ratio() == REFINE_RATIOS[1]
    assert low.bound_s >= max(whole.bound_s, fresh.bound_s) * (1 - 1e-12)
    found = [c.step_s for c in ctx.candidates if c.unit == (1, 9, 13)]
    assert found and min(found) >= low.bound_s


def test_wide_narrow_classes_reach_the_goal_without_peeling_every_count() -> None:
    """OPT-350M at 8,192 tokens, global batch 64, ZeRO-1, on 64 V100-32 + 16 A10 + 16 L4
    (`benchmarks/many_types.py --seed 2` pool 22): every count's bound sits within 2 % of the plan,
    so refinement takes the narrow classes to the finest ratio before splitting them; split after
    1.15 they were peeled count by count, 200 units refined (114 s), now 25, the same plan and bound."""
    from planner.costmodel.analytic import AnalyticCostModel
    from planner.search import search
    from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
    from planner.specs.models import get_model
    from planner.validate import violations

    cost = AnalyticCostModel()
    cluster = ClusterSpec(nodes=[NodeGroup(gpu=g, nodes=n, gpus_per_node=k) for g, n, k in (
        ("V100-SXM2-32GB", 8, 8), ("A10", 8, 2), ("L4", 16, 1))])
    res = search(get_model("opt-350m"), cluster, TrainingSpec(global_batch=64, seq_len=8192, zero=1),
                 cost=cost, workers=2)
    assert not res.timed_out and res.gap <= 0.015 + 1e-6 and res.lower_bound_s <= res.prediction.step_s
    assert not violations(res.plan, cluster, cost)
    assert res.stats["units_refined"] <= 40


def test_a_lift_runs_beside_the_refinement_that_would_come_next() -> None:
    """The lowest unit is refined as far as it goes (lifted next), the one above it not yet: its
    first refinement runs in the same batch of tasks as the lift, as the loop would take it next
    were the lift to reach the goal (here the lift moves nothing: its bound is the floor, and
    the other unit is refined once)."""
    stuck = SolvedUnit(0.80, Unit(b=2, provider=None, lo=4, hi=4, microbatches=64), [], ratio=REFINE_RATIOS[-1])
    fresh = SolvedUnit(0.85, Unit(b=2, provider=None, lo=5, hi=5, microbatches=64), [])
    ctx = _loop_context(fresh, stuck)
    pool = _StubPool(ctx)
    unit_loop.refine(ctx, 0.015, None, pool)
    assert pool.lifts == [([4], [5])]
    assert pool.log == [("refine", 5, 5, REFINE_RATIOS[0])] and ctx.explored["units_refined"] == 1


def test_every_part_of_a_split_starts_from_the_class_bound() -> None:
    """The class's bound holds for every plan of each part, so a part whose own first bound is
    lower starts from the class's (`UnitPool.split`). The class's bound is set above what either
    part's own LP gives, as if refinement had raised it that far (on `many_types.py --seed 17`
    pool 11 [14, 21] at 0.4164 s split into single counts bounded at 0.399-0.403 s)."""
    import time

    from planner.search.parallel import UnitPool
    from tests.test_search_refine import BIG_TRAINING

    ctx, provider = _big_context()
    wide = Unit(1, provider, 9, 16, BIG_TRAINING.global_batch)
    with UnitPool([wide], ctx, "cpsat", time.perf_counter(), None, workers=1) as pool:
        pool.solve([wide])
        (whole,) = ctx.solved
        whole.bound_s = 2.0 * max(c.step_s for c in ctx.candidates)
        pool.split(whole)
    assert sorted((su.unit.lo, su.unit.hi) for su in ctx.solved) == [(9, 13), (14, 16)]
    assert all(su.bound_s == whole.bound_s for su in ctx.solved)


def test_a_unit_stuck_at_the_lowest_bound_is_lifted_before_those_tied_with_it() -> None:
    """Two single counts at the same lowest bound, one refined as far as it goes: only a lift can
    raise it, and until then refining the other cannot raise the lowest bound, so the lift comes
    first (the other's refinement beside it); before, the other was refined through every ratio."""
    stuck = SolvedUnit(0.80, Unit(b=2, provider=None, lo=4, hi=4, microbatches=64), [], ratio=REFINE_RATIOS[-1])
    tied = SolvedUnit(0.80, Unit(b=2, provider=None, lo=5, hi=5, microbatches=64), [])
    ctx = _loop_context(tied, stuck)
    pool = _StubPool(ctx)
    unit_loop.refine(ctx, 0.015, None, pool)
    assert pool.lifts[0] == ([4], [5])
