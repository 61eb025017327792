"""Whole-pipeline bounds for a unit refinement has tightened as far as it goes (`lift_unit`),
and the plans near the whole copies that keep such a bound low (`witness_plan`). Both run in the
parent, from `unit_loop.refine`."""

from __future__ import annotations

import time

import numpy as np

from planner.search.tail_plans import nearby_rows
from planner.search.templates import PackedTemplates, skeleton_group
from planner.search.units import (REFINE_RATIOS, SolvedUnit, UnitContext, add_candidate, other_orders, problem_of,
                                  replace_groups)
from solvers.assign import AssignProblem, SolverStats
from solvers.assign_lp import pipeline_time_bound
from solvers.integral_bound import integral_bound
from solvers.integral_plan import integral_plan


LIFT_REFINES = 12  # witness refinements per lift (each: the groups of one set of whole copies found)
LIFT_CHECKS = 64  # feasibility checks per lift's bisection (`solvers.integral_bound.integral_bound`'s budget)


def lift_unit(su: SolvedUnit, ctx: UnitContext, goal_s: float, deadline: float | None = None,
              incumbent_s: float | None = None) -> None:
    """Raise a unit's bound from its LP's to what whole pipelines of its bound templates allow
    (`solvers.integral_bound`), up to `goal_s`: for a unit refinement has tightened as far as tail
    levels go while the gap stays open, which on pools of many GPU types is mostly the LP's
    fractions of pipelines. GPT-3 6.7B on 182 GPUs of seven types (`benchmarks/many_types.py
    --seed 1` pool 14): the lowest unit, six pipelines, bounded at 1.4387 s by the LP, reaches the
    goal (the 1.5093 s plan / 1.015) so, as do the units below it in turn: gap 1.50 % instead of
    4.91 %.

    A bisection on the step T (`integral_bound`, its tail ranges cut at the copies found): each
    check asks whether whole copies of the templates finish below T. Where they do, the groups of
    the copies found (the witness) that this lift has not refined get tail-capped frontiers
    (`units.replace_groups`, at the unit's last ratio, `LIFT_REFINES` times at most) and T is
    checked again (`tighten`). Refinement follows the LP's
    support, and a witness may lean on other groups whose templates are still the search's first
    ones: with ZeRO their memory has optimizer states sharded over every GPU of the pool, so
    splits that fit only so. Llama-2 13B with ZeRO-1 on 36 GPUs of four types (`many_types.py
    --seed 5` pool 17): three pipelines, the witness runs a V100 -> T4 one at C = 0.794 s that is
    0.913 s at best with memory for three; lifted to 196.16 s without the refinements.
    Every template set the checks see is a valid one for the unit (a refined group's templates
    bound all its splits), so a T proven on any of them bounds every plan of the unit.
    `incumbent_s`: the best plan's step (caps the refined groups' tails), else the context's."""
    su.lifted = True
    lb_set = su.lb_set.unpack() if isinstance(su.lb_set, PackedTemplates) else su.lb_set
    if not lb_set or su.bound_s >= goal_s:
        return
    provider, u = su.unit.provider, su.unit
    overhead = ctx.cost.knobs.step_overhead_s
    best = incumbent_s if incumbent_s is not None else min((c.step_s for c in ctx.candidates), default=goal_s)
    stats = SolverStats()
    done: set[tuple] = set()
    refines = 0

    def tighten(p: AssignProblem, witness: np.ndarray) -> AssignProblem | None:
        """The problem with the witness's groups not yet refined by this lift refined, or None
        (then the witness's skeletons are kept for `witness_plan`)."""
        nonlocal lb_set, refines
        if refines >= LIFT_REFINES or not hasattr(provider, "level_templates"):
            return None
        groups = {skeleton_group(lb_set[k].skeleton) for k in np.flatnonzero(witness)
                  if lb_set[k].skeleton is not None} - done
        groups = other_orders(groups, lb_set) - done
        replaced = None
        if groups:
            e_cap = best - overhead - (pipeline_time_bound(p, stats) or 0.0)
            packed = replace_groups(PackedTemplates.of(lb_set), provider, u, groups, e_cap,
                                    su.ratio or REFINE_RATIOS[-1], deadline)
            replaced = None if packed is None else packed.unpack()
            done.update(groups)
            refines += 1
        if replaced is not None:
            lb_set = su.lb_set = replaced
            return problem_of(lb_set, ctx.avail, u.microbatches, (u.lo, u.hi))
        su.witness = frozenset(lb_set[k].skeleton for k in np.flatnonzero(witness))
        return None

    p = problem_of(lb_set, ctx.avail, u.microbatches, (u.lo, u.hi))
    bound = integral_bound(p, su.bound_s - overhead, goal_s - overhead, max_checks=LIFT_CHECKS, deadline=deadline,
                           stats=stats, split=True, tighten=tighten)
    ctx.stats.ilp_solves += stats.ilp_solves
    su.bound_s = max(su.bound_s, (bound + overhead) * (1 - 1e-9))


def witness_plan(su: SolvedUnit, ctx: UnitContext, incumbent_s: float, deadline: float | None) -> bool:
    """Search whole copies of real splits near the skeletons of a lift's witness (`lift_unit`):
    the copies that kept the bound low form a plan of bound templates, and the plan side, which
    rounds LPs and polishes around the groups the LP leans on, may never have looked there.
    Llama-2 13B with ZeRO-1 on 36 GPUs of four types (`many_types.py --seed 5` pool 17): a
    witness of three pipelines at 197.6 s while the best plan took 201.7 s. The plan templates
    are the rows near those skeletons with tails capped as the polish's (`TailPlans`), the search
    `solvers.integral_plan`. True when it added a plan."""
    provider, u = su.unit.provider, su.unit
    if not su.witness or not hasattr(provider, "tail_plan_templates"):
        return False
    if deadline is not None and time.perf_counter() > deadline:
        return False
    overhead = ctx.cost.knobs.step_overhead_s
    rows = nearby_rows({sk for sk in su.witness if sk is not None})
    plan_set = provider.tail_plan_templates(u.lo, rows, e_cap=incumbent_s - overhead)
    if not plan_set:
        return False
    unit = SolverStats()
    found = integral_plan(problem_of(plan_set, ctx.avail, u.microbatches, (u.lo, u.hi)), su.bound_s - overhead,
                          incumbent_s - overhead, deadline=deadline, stats=unit, split=True)
    ctx.stats.ilp_solves += unit.ilp_solves
    if found is None:
        return False
    before = len(ctx.candidates)
    add_candidate(plan_set, found, u, ctx)
    return ctx.candidates[before].step_s < incumbent_s
