"""What a deadline does to the search: frontiers cut short keep a valid bound and a real plan,
units of cut-short sizes wait for the others, and refinement, the polish and the engine candidates
say when the time limit, not the gap target, stopped them (`SearchResult.timed_out`)."""

from __future__ import annotations

import math

import pytest

from planner.search import search
from planner.search.providers import BlocksProvider
from planner.search.space import block_types, resource_classes, stage_shapes
from tests.test_search_refine import BIG_CLUSTER, BIG_MODEL, BIG_TRAINING, COST, _provider


@pytest.mark.parametrize("workers", [1, 2])
def test_a_deadline_inside_the_frontiers_still_gives_a_real_plan(workers: int) -> None:
    """Past the deadline the split frontiers keep only each skeleton's least-A split: the search
    still returns a valid plan and says it timed out. Its bound comes from the cut frontiers and
    their screens (`protos.screens_of`), so it is above the fluid bound it used to fall
    back to, and still below the plan the full search finds."""
    from planner.evaluate import evaluate
    from planner.search.api import _fluid, micro_batch_sizes
    from planner.validate import violations

    result = search(BIG_MODEL, BIG_CLUSTER, BIG_TRAINING, cost=COST, time_limit=1e-6, workers=workers)
    assert result.timed_out
    assert not violations(result.plan, BIG_CLUSTER, COST)
    assert evaluate(result.plan, BIG_CLUSTER, COST).step_s == pytest.approx(result.prediction.step_s, rel=1e-9)
    assert 0 < result.lower_bound_s <= result.prediction.step_s
    full = search(BIG_MODEL, BIG_CLUSTER, BIG_TRAINING, cost=COST, workers=workers)
    assert result.lower_bound_s <= full.prediction.step_s
    classes = resource_classes(BIG_CLUSTER)
    fluid = min(_fluid(COST, BIG_MODEL, BIG_TRAINING, classes, b) for b in micro_batch_sizes(BIG_TRAINING))
    assert result.lower_bound_s > 1.03 * fluid


@pytest.mark.parametrize("zero", [0, 1])
def test_a_cut_frontier_keeps_a_valid_bound(zero: int) -> None:
    """A provider whose frontiers a deadline cut after the first round: plan protos are real
    splits, the bound protos add a screen per cut row, and every bound proto of the uncut provider
    is dominated (A and C, same skeleton) by one of them; nothing is left to the fluid bound. With
    a distributed optimizer (zero 1) the bound protos have their own frontiers (memory for every
    replica) and their own screens."""
    training = BIG_TRAINING.model_copy(update={"zero": zero})
    classes = resource_classes(BIG_CLUSTER)
    shapes = {rc.index: stage_shapes(BIG_MODEL, training, rc, 1) for rc in classes}
    avail = tuple(rc.gpus for rc in classes)

    def provider(deadline: float | None) -> BlocksProvider:
        return BlocksProvider(COST, BIG_MODEL, training, classes, block_types(shapes), avail, 1,
                              BIG_CLUSTER.single_node, deadline=deadline)

    cut, full = provider(0.0), provider(None)
    assert all(p.at >= 0 for p in cut.plan_protos)
    screens = [p for p in cut.lb_protos if p.at < 0]
    assert screens and not cut.truncated
    kept: dict[tuple, list[tuple[float, float]]] = {}
    for p in cut.lb_protos:
        kept.setdefault(p.skeleton, []).append((p.a_s, p.c_s))
    left_out = 0
    for p in full.lb_protos:
        assert any(a <= p.a_s * (1 + 1e-12) and c <= p.c_s * (1 + 1e-12) for a, c in kept[p.skeleton]), p
        left_out += all((a, c) != (p.a_s, p.c_s) for a, c in kept[p.skeleton])
    assert left_out > 0  # the cut really left frontier points out


def test_general_levels_past_the_deadline_leave_the_groups_as_they_were() -> None:
    """The general DP's levels stop at the deadline; a group cut short is not covered (its old
    bound templates stay), so the bound stays valid."""
    provider = _provider(1)
    _, lb_set = provider.templates(2, 2)
    provider._uniform = dict.fromkeys(provider._uniform, False)
    groups = {provider.skeleton_group(t.skeleton) for t in lb_set} - {None}
    new, covered = provider.level_templates(2, 2, groups, e_cap=math.inf, deadline=0.0)
    assert not new and not covered
    new, covered = provider.level_templates(2, 2, groups, e_cap=math.inf)
    assert covered == groups and new  # cut-short groups were not cached as done


def test_units_of_cut_short_sizes_are_solved_after_the_others() -> None:
    """`unit_loop.best_first` takes units by cheap bound, but those of a microbatch size whose
    frontiers a deadline cut short (low cheap bounds from their screens, plans from few splits)
    only after every other unit; units that cannot beat the best plan are only bounded."""
    from types import SimpleNamespace

    from planner.search.unit_loop import best_first
    from planner.search.units import Candidate, Unit, UnitContext
    from solvers.assign import SolverStats

    cut, whole = SimpleNamespace(cut_short=True), SimpleNamespace(cut_short=False)
    units = [Unit(1, cut, 1, 1, 8), Unit(2, whole, 1, 1, 4), Unit(1, cut, 2, 2, 8), Unit(2, whole, 2, 2, 4),
             Unit(4, whole, 1, 1, 2)]
    cheap = [1.0, 2.0, 1.5, 2.5, 9.0]
    ctx = UnitContext(BIG_MODEL, BIG_TRAINING, BIG_CLUSTER, resource_classes(BIG_CLUSTER), COST, (8,), [], [],
                      set(), SolverStats(), {"assignments": 0})
    order: list[Unit] = []

    class Pool:
        def __init__(self) -> None:
            self.units = units

        def cheap_bounds(self) -> list[float]:
            return cheap

        def solve(self, batch: list[Unit], prune: float = 1e-3, ahead: object = None) -> bool:
            order.extend(batch)
            ctx.candidates.append(Candidate(5.0, None, None, batch[0].b))  # a plan of 5 s
            return False

    best_first(Pool(), ctx, 0.0, None, None)
    overhead = COST.knobs.step_overhead_s
    assert order == [units[1], units[3], units[0], units[2]]  # whole size first, each tier by bound
    assert ctx.bounds == [9.0 + overhead]  # cannot beat 5 s: bounded, never solved


def test_a_deadline_that_stops_refinement_or_polish_is_reported() -> None:
    """`refine` and `polish` say when the deadline, not the gap target, stopped them, so the search
    reports `timed_out` (a 64-GPU ladder search with a 4 s limit ended at gap 2.49 % but said it had
    not timed out)."""
    from types import SimpleNamespace

    from planner.search.unit_loop import finish, refine
    from planner.search.units import Candidate, SolvedUnit, Unit, UnitContext
    from solvers.assign import SolverStats

    def context(plan_s: float) -> UnitContext:
        ctx = UnitContext(BIG_MODEL, BIG_TRAINING, BIG_CLUSTER, resource_classes(BIG_CLUSTER), COST, (8,), [], [],
                          set(), SolverStats(), {"assignments": 0, "units_polished": 0})
        ctx.candidates.append(Candidate(plan_s, None, SimpleNamespace(tail_s=0.0), 1))
        ctx.solved.append(SolvedUnit(1.0, Unit(1, object(), 1, 1, 8), []))
        return ctx

    assert refine(context(2.0), 0.015, 0.0, pool=None) is True  # gap 100 %, deadline passed
    assert refine(context(1.01), 0.015, 0.0, pool=None) is False  # within the target: nothing was cut
    def polish(ctx: UnitContext) -> bool:
        return finish(ctx, 0.015, 0.0, pool=None, sizes=[1], polish="auto", engines=[])[0]

    assert polish(context(2.0)) is True
    assert polish(context(1.01)) is True  # within target: the two lowest units, cut short
    assert polish(context(1.0005)) is False  # nothing to polish: the bound is within 0.1 %


def test_a_deadline_that_leaves_out_engine_candidates_or_a_polish_is_reported() -> None:
    """Engine candidates skipped because the deadline passed, and a polish that starts past it, count
    as work the time limit cut short (an 8-GPU ladder search with a 0.95 s limit returned a 0.11 %
    slower plan than without a limit, its polish cut short, and said it had not timed out). The
    Megatron grid, the floor, still runs past the deadline (`candidates.FLOOR_ENGINES`), early or
    late, and alone is nothing cut short."""
    from types import SimpleNamespace

    from planner.search.unit_loop import close_gap
    from planner.search.units import Candidate, SolvedUnit, Unit, UnitContext, polish_unit
    from solvers.assign import SolverStats

    def context() -> UnitContext:
        ctx = UnitContext(BIG_MODEL, BIG_TRAINING, BIG_CLUSTER, resource_classes(BIG_CLUSTER), COST, (8,), [], [],
                          set(), SolverStats(), {"assignments": 0, "units_polished": 0})
        ctx.candidates.append(Candidate(1.0, None, SimpleNamespace(tail_s=0.0), 1))
        return ctx

    class Pool:  # records what runs; the deadline (0.0) has passed
        parallel = False

        def __init__(self) -> None:
            self.ran: list[list[str]] = []

        def finish(self, sus: list, engines: list[str], sizes: list[int], deadline: float | None,
                   whole_gap: float | None = None) -> tuple:
            assert not sus  # no polish past the deadline
            self.ran.append(list(engines))
            return [(None, 0.25) for _ in engines], False

    for early, late, cut_short in ((["megatron_grid", "chain"], [], True), ([], ["megatron_grid", "chain"], True),
                                   ([], ["megatron_grid"], False)):
        pool = Pool()
        cut, seconds = close_gap(context(), pool, [1], None, None, early, lambda gap_open: late, 0.0)
        assert pool.ran == [["megatron_grid"]] and seconds == {"megatron_grid": 0.25}
        assert cut is cut_short
    # pool=None: nothing may run
    assert close_gap(context(), None, [1], None, None, [], lambda gap_open: [], 0.0) == (False, {})
    provider = SimpleNamespace(tail_plan_templates=None)
    su = SolvedUnit(0.9, Unit(1, provider, 1, 1, 8), [])
    assert polish_unit(su, context(), 1.0, deadline=0.0) is True
