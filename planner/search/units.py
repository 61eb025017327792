"""Units of the search: one microbatch size and one replica class, solved into a plan and a bound.

`api.search` builds the units; this module solves one (exact integer assignment on small pools, LP
bound and rounded plans on larger ones), ranks units by a cheap bound for the best-first order on
large pools, and turns an assignment into a scored candidate plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import chain

import numpy as np

from planner.costmodel.base import CostModel
from planner.evaluate import evaluate
from planner.plan import Plan, Prediction
from planner.search.history import Milestone
from planner.search.placement import build_plan
from planner.search.space import ResourceClass
from planner.search.tail_plans import nearby_rows
from planner.search.templates import (PackedTemplates, Template, bound_key, prune_templates, run_skeleton_counts,
                                      skeleton_group)
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.assign import BIG_M, AssignProblem, Assignment, SolverStats, solve_assignment
from solvers.assign_lp import lp_support, pipeline_time_bound, solve_assignment_lp
from solvers.integral_plan import integral_plan


RESOLVES = 3  # re-solves of a unit's plan with tails costed for the pipeline count it chose


@dataclass(frozen=True, slots=True)
class Candidate:
    """A built plan with its evaluated prediction (the evaluator's step, not the assignment's)."""

    step_s: float
    plan: Plan
    prediction: Prediction
    micro_batch: int
    unit: tuple[int, int, int] | None = None  # (microbatch size, lo, hi) of the unit it came from


def problem_of(templates: list[Template] | PackedTemplates, avail: tuple[int, ...], microbatches: int,
               replicas: tuple[int, int]) -> AssignProblem:
    # column by column with np.fromiter: about 3x faster than transposing the named tuples and
    # converting nested tuples (a 32-GPU search asks this 65 times, of 5,000 templates each)
    n, width = len(templates), len(avail)
    if isinstance(templates, PackedTemplates):  # the columns are there: the same arrays, no template built
        m = templates.max_microbatches
        return AssignProblem(a_s=templates.times[:, 0].copy(), c_s=templates.times[:, 1].copy(),
                             e_s=templates.times[:, 2].copy(), max_microbatches=np.where(m > 0, m, BIG_M),
                             usage=templates.usage.reshape(n, width), avail=np.array(avail, dtype=np.int64),
                             microbatches=microbatches, replicas=replicas)
    return AssignProblem(
        a_s=np.fromiter((t.a_s for t in templates), dtype=float, count=n),
        c_s=np.fromiter((t.c_s for t in templates), dtype=float, count=n),
        e_s=np.fromiter((t.e_s for t in templates), dtype=float, count=n),
        max_microbatches=np.fromiter((t.max_microbatches or BIG_M for t in templates), dtype=np.int64, count=n),
        usage=np.fromiter(chain.from_iterable(t.usage for t in templates), dtype=np.int64,
                          count=n * width).reshape(n, width),
        avail=np.array(avail, dtype=np.int64), microbatches=microbatches, replicas=replicas)


def _extended(problem: AssignProblem, templates: list[Template]) -> AssignProblem:
    """`problem` with `templates` appended: the arrays `problem_of` builds for the joined list,
    converting only the new templates."""
    if not templates:
        return problem
    more = problem_of(templates, tuple(problem.avail.tolist()), problem.microbatches, problem.replicas)
    return replace(problem, **{name: np.concatenate([getattr(problem, name), getattr(more, name)])
                               for name in ("a_s", "c_s", "e_s", "max_microbatches", "usage")})


@dataclass(frozen=True, slots=True)
class Unit:
    """One microbatch size and one replica class [lo, hi]: one assignment problem (two with ZeRO)."""

    b: int
    provider: object
    lo: int
    hi: int
    microbatches: int


@dataclass(frozen=True, slots=True)
class UnitContext:
    """What every unit of one search shares: the inputs, and the lists units add candidates and
    bounds to."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    classes: list[ResourceClass]
    cost: CostModel
    avail: tuple[int, ...]
    candidates: list[Candidate]  # appended to
    bounds: list[float]  # appended to: bounds of skipped units and sizes
    unsolved_sizes: set[int]  # added to
    stats: SolverStats
    explored: dict[str, int]
    solved: list["SolvedUnit"] = field(default_factory=list)  # appended to: solved units' bounds
    history: list[Milestone] = field(default_factory=list)  # appended to by `history.mark`, in the parent
    # seconds (`time.perf_counter`) at which the search started ("start") and every unit was solved
    # or bounded ("bounded"; from then on `history.lowest_bound` is a bound)
    timeline: dict[str, float] = field(default_factory=lambda: {"start": time.perf_counter()})
    # the best Megatron grid, searched before the frontiers when `api.search` caps them by its step
    # (`candidates.early_grid`): (its plan and prediction, or None, and the seconds it took)
    early_grid: tuple[tuple[Plan, Prediction] | None, float] | None = None


REFINE_RATIOS = (1.5, 1.15, 1.05)  # tail-level ratios of a unit's successive refinements
# The refinement LP stops within its 0.1 % tolerance of the cut it is given: a bound within this
# slack of the cut counts as reached, and a cut this far above a goal leaves bounds at the goal.
CUT_SLACK = 2e-3


@dataclass(slots=True)
class SolvedUnit:
    """A solved unit's bound (step, overhead included) and the bound templates it came from, kept
    so the bound can be tightened later (`refine_unit`), with the tail-level ratio it was last
    refined at (None: not yet). Between worker processes the templates wait packed
    (`parallel`); `refine_unit` reads them as a list."""

    bound_s: float
    unit: Unit
    lb_set: list[Template] | PackedTemplates
    ratio: float | None = None
    polished: tuple[float | None] | None = None  # (ratio,) when its plan was last polished
    lifted: bool = False  # its bound raised to what whole pipelines allow (`lift_unit`)
    # the skeletons of the whole copies that kept the lift from going higher (`lift_unit`)
    witness: frozenset | None = None

    def polish_due(self) -> bool:
        """Whether polishing would start from bound templates not polished from yet: never
        polished, or refined since (the polish takes the groups the bound leans on)."""
        return self.polished != (self.ratio,)

    def next_ratio(self) -> float | None:
        """The ratio of its next refinement: the first, then finer ones; None when done."""
        finer = [r for r in REFINE_RATIOS if self.ratio is None or r < self.ratio]
        return finer[0] if finer else None


def coverage_rank(name: str) -> tuple[int, int]:
    """Narrowest first: blocks<=1, then blocks<=2 with the shortest mixed pipelines, ..., blocks<=3,
    exact."""
    if name == "exact":
        return (9, 0)
    parts = dict(p.split("<=") for p in name.split(","))
    return (int(parts["blocks"]), int(parts.get("mixed", 10**6)))


def mixed_lengths(types: list, avail: tuple[int, ...], n_slots: int, limits: tuple[int, ...],
                  max_blocks: int) -> dict[int, int]:
    """For r = 2 .. `max_blocks` runs, the longest pipelines (in stages) that keep the r-run
    skeletons within `limits[r - 2]` (the last limit for more runs); stops at the first r for
    which not even r stages fit (then no pipeline of r or more runs is searched)."""
    out: dict[int, int] = {}
    for runs in range(2, max_blocks + 1):
        limit = limits[min(runs - 2, len(limits) - 1)]
        counts = run_skeleton_counts(types, avail, n_slots, runs)  # by length cap, non-decreasing
        if counts[n_slots] <= limit:
            out[runs] = n_slots
            continue
        fits = [length for length in range(runs, n_slots + 1) if counts[length] <= limit]
        if not fits:
            break
        out[runs] = fits[-1]
    return out


def skip_units(keyed: list[tuple[float | None, int, Unit]], overhead: float, ctx: UnitContext) -> None:
    """Units left unsolved: their cheap bound stands, unless their frontier was cut short (then
    the fluid bound covers their microbatch size)."""
    for cheap, _, u in keyed:
        if getattr(u.provider, "truncated", False):
            ctx.unsolved_sizes.add(u.b)
        elif cheap is not None:
            ctx.bounds.append(cheap + overhead)


def cheap_bound(u: Unit, avail: tuple[int, ...], stats: SolverStats, floor: float = 0.0) -> float | None:
    """Least pipeline time of the unit's bound templates with their tails dropped (LP), or None.
    `floor`: a lower bound on it, e.g. the cheap bound of a unit of the same microbatch size with
    a larger `hi` (the LP drops the lower limit on pipelines, so its time only falls with `hi`)."""
    zero = u.provider.relaxed_templates()
    if not zero:
        return None
    return pipeline_time_bound(problem_of(zero, avail, u.microbatches, (u.lo, u.hi)), stats, floor=floor)


def solve_unit(u: Unit, ctx: UnitContext, solver: str, start: float, time_limit: float | None,
               incumbent_s: float | None = None, prune: float = 1e-3) -> bool:
    """Solve one unit, adding its plan (if any) and bound to the context; True if it timed out.
    `incumbent_s` (default: the best candidate in the context) lets the LP skip tail levels that
    cannot beat it; a unit whose bound is within `prune` of it gets no plan (`_solve_lp`)."""
    provider = u.provider
    overhead = ctx.cost.knobs.step_overhead_s
    problem_args = (ctx.avail, u.microbatches, (u.lo, u.hi))
    unit = SolverStats()  # this unit's flags; counts are added to ctx.stats
    if provider.coverage == "exact":
        plan_set, lb_set = provider.templates(u.lo, u.hi)
        sol, lb = _solve_exact(plan_set, lb_set, problem_args, solver, start, time_limit, unit)
    else:
        incumbent = incumbent_s if incumbent_s is not None else min((c.step_s for c in ctx.candidates), default=None)
        lb_set = provider.bound_set(u.lo, u.hi)
        plan_set, sol, lb = _solve_lp(lambda: provider.plan_templates(u.lo), lb_set, problem_args,
                                      None if incumbent is None else incumbent - overhead, start, time_limit, unit,
                                      prune)
    ctx.explored["assignments"] += 1
    # the templates this unit's LPs chose among: counted per solve, so the same whichever
    # process built the split frontiers they come from
    ctx.explored["templates"] = ctx.explored.get("templates", 0) + len(lb_set or ()) + len(plan_set or ())
    ctx.stats.ilp_solves += unit.ilp_solves
    ctx.stats.feasibility_checks += unit.feasibility_checks
    if unit.timed_out or getattr(provider, "truncated", False):
        # an ILP gave up or the frontier was cut short: no claim here, the fluid bound covers it
        ctx.unsolved_sizes.add(u.b)
    elif lb is not None and not getattr(provider, "truncated", False):
        ctx.solved.append(SolvedUnit((lb.bound_s + overhead) * (1 - 1e-9), u, lb_set))
    resolves_cut = False  # the time limit stopped the re-solves: the plan may be poorer, the bound holds
    if sol is not None and any(sol.counts):
        add_candidate(plan_set, sol, u, ctx)
        copies, seen = int(sum(sol.counts)), {u.lo}
        while provider.coverage != "exact" and copies not in seen and len(seen) <= RESOLVES:
            # tails were costed for another pipeline count: re-solve with them costed for the
            # count chosen (any count of the class allowed), until the count repeats or time is up
            if time_limit is not None and time.perf_counter() - start >= time_limit:
                resolves_cut = True
                break
            seen.add(copies)
            exact_set = provider.plan_templates(copies)
            again = _solve_lp(lambda: exact_set, None, (ctx.avail, u.microbatches, (u.lo, u.hi)),
                              None, start, time_limit, unit)[1]
            if again is None or not any(again.counts):
                break
            add_candidate(exact_set, again, u, ctx)
            copies = int(sum(again.counts))
    return unit.truncated or unit.timed_out or resolves_cut or getattr(provider, "truncated", False)


def replace_groups(lb_set: PackedTemplates, provider, u: Unit, groups: set[tuple], e_cap: float, ratio: float,
                   deadline: float | None) -> PackedTemplates | None:
    """`lb_set` with the templates of `groups` replaced by their tail-capped frontiers
    (`BlocksProvider.level_templates`), or None when none of them got any. The set stays as
    `prune_templates(..., bound_key)` leaves it, ordered by key: the other groups' templates are
    pruned already and share no key with the new ones, so only those are pruned and the two merged
    (pruning the whole set again was 15 % of refinement). As columns (`PackedTemplates.replaced`):
    on `many_types.py --seed 17` pool 11 a refinement round had spent more on turning its thousands
    of templates into objects and back (filtering, merging, the LP's arrays, packing for the parent)
    than on its LPs."""
    new, covered = provider.level_templates(u.lo, u.hi, groups, e_cap, ratio, deadline)
    if not covered:
        return None
    return lb_set.replaced(covered, PackedTemplates.of(prune_templates(new, bound_key)))


def refine_unit(su: SolvedUnit, ctx: UnitContext, incumbent_s: float, deadline: float | None,
                ratio: float = REFINE_RATIOS[0], max_rounds: int = 6) -> None:
    """Tighten a solved unit's bound: the skeleton groups the LP bound leans on get tail-capped
    frontiers (`BlocksProvider.level_templates`, levels `ratio` apart), round after round until the
    LP uses no group not yet refined at this ratio, or the bound is within the LP's tolerance of
    `incumbent_s` (the best plan, or a lower goal: then only that much is proved). A group's other
    run orders present (L4 -> A100 beside A100 -> L4) are refined with it: bound templates are
    pruned within their group (`templates.bound_key`), so once one order's tails rise the LP turns
    to the other (`benchmarks/chain_check.py --seed 11` pool 38: 81 units refined, 10 with the
    orders together). Every round's template set is valid, so the bound only rises."""
    provider, u = su.unit.provider, su.unit
    su.ratio = ratio
    if not hasattr(provider, "level_templates") or su.bound_s >= incumbent_s / (1 + CUT_SLACK):
        return
    overhead = ctx.cost.knobs.step_overhead_s
    lb_set, done = su.lb_set if isinstance(su.lb_set, PackedTemplates) else PackedTemplates.of(su.lb_set), set()
    # tails above e_cap cannot be in a plan that beats the incumbent: the levels stop there
    # each round's problem is the next round's start (building it is a pass over every template)
    problem = problem_of(lb_set, ctx.avail, u.microbatches, (u.lo, u.hi))
    pipe = pipeline_time_bound(problem, ctx.stats)
    e_cap = incumbent_s - overhead - (pipe or 0.0)
    for _ in range(max_rounds):
        if deadline is not None and time.perf_counter() > deadline:
            break
        used = lp_support(problem, su.bound_s - overhead, stats=ctx.stats, fewest=True)
        rows = set(lb_set.skeleton[np.flatnonzero(used)].tolist())  # skeleton indices, -1: none
        groups = {provider.skeleton_group(lb_set.skeletons[k]) for k in rows if k >= 0} - done - {None}
        if not groups:
            break
        groups = other_orders(groups, lb_set) - done
        replaced = replace_groups(lb_set, provider, u, groups, e_cap, ratio, deadline)
        done |= groups
        if replaced is None:
            break
        lb_set = replaced
        if not len(lb_set):
            # no group the unit's bound leaned on has a split in memory for this class's pipelines
            # (optimizer states sharded over fewer replicas than the search-wide templates
            # assumed), and no other group is left: the unit holds no plan at all
            su.bound_s, su.lb_set = max(su.bound_s, incumbent_s), lb_set
            break
        unit = SolverStats()
        problem = problem_of(lb_set, ctx.avail, u.microbatches, (u.lo, u.hi))
        lb = solve_assignment_lp(problem, unit, incumbent_s=incumbent_s - overhead, deadline=deadline,
                                 bound_only=True)
        ctx.stats.ilp_solves += unit.ilp_solves
        if lb is None or unit.truncated:
            break
        su.bound_s = max(su.bound_s, (lb.bound_s + overhead) * (1 - 1e-9))
        su.lb_set = lb_set
        if su.bound_s >= incumbent_s / (1 + CUT_SLACK):  # as far as the LP's tolerance goes
            break


def inherit_refinement(part: SolvedUnit, whole: SolvedUnit, ctx: UnitContext, incumbent_s: float) -> None:
    """A part of a split class (`parallel.UnitPool.split`: the one that keeps its lowest count,
    and any whose own bound is at most the class's) goes on from the class's refined bound
    templates and ratio: their tails are costed for the class's lowest count (sync for the fewest
    replicas; with ZeRO, optimizer states sharded over the most) and their memory for its most
    pipelines, so they bound every split of every count of the class, the part's own included.
    Its bound is the most of its own, the class's and the LP's over those templates under its
    fewer pipelines. Refined again from the coarsest ratio instead, such parts mostly came back
    to the class's bound (`chain_check.py --seed 40` pool 18: 18 units refined, 14 with the
    lowest count's part going on; `many_types.py --seed 14` pool 23: 49 s, 39 s with every part
    at or below the class's bound going on)."""
    u = part.unit
    overhead = ctx.cost.knobs.step_overhead_s
    templates = whole.lb_set  # a list or columns: `problem_of` reads either
    unit = SolverStats()
    lb = solve_assignment_lp(problem_of(templates, ctx.avail, u.microbatches, (u.lo, u.hi)), unit,
                             incumbent_s=incumbent_s - overhead, bound_only=True) if templates else None
    ctx.stats.ilp_solves += unit.ilp_solves
    bound = whole.bound_s
    if lb is not None and not unit.truncated:
        bound = max(bound, (lb.bound_s + overhead) * (1 - 1e-9))
    part.bound_s, part.lb_set, part.ratio = max(part.bound_s, bound), whole.lb_set, whole.ratio


def other_orders(groups: set[tuple], lb_set: list[Template] | PackedTemplates) -> set[tuple]:
    """`groups` and the other run orders of the same GPU groups among `lb_set`'s skeleton groups
    (A100 -> L4 for L4 -> A100), refined together (`refine_unit`)."""
    kinds = {frozenset(g) for g in groups}
    skeletons = lb_set.skeletons if isinstance(lb_set, PackedTemplates) else (t.skeleton for t in lb_set)
    present = {skeleton_group(sk) for sk in skeletons if sk is not None}
    return groups | {g for g in present if frozenset(g) in kinds}


def polish_unit(su: SolvedUnit, ctx: UnitContext, incumbent_s: float, deadline: float | None,
                whole_gap: float | None = None) -> bool:
    """Re-solve a unit's plan with tail-capped plan templates added (`TailPlans`) for the rows
    near (`tail_plans.nearby_rows`) the skeletons its bound leans on and those its plan LP reaches
    the incumbent with, adding the plan. For when the gap target is missed or tails weigh heavily
    (`unit_loop.finish`): refining the bound cannot help where tail-blind stage options made the
    plan slow. (Whole skeleton groups, as before, took 12 % more search time on 40 random pools,
    with the same plan on 39: docs/search.md, "Plan polish".) Where the incumbent is more than
    `whole_gap` above the unit's bound and this problem's LP bound, whole copies of its
    templates are searched too (`solvers.integral_plan`, tail ranges cut at the copies found): the
    LP's rounding can sit far above the best whole plan on pools of many GPU types. True when
    `deadline` cut it short (not started, or its LP stopped early), so the search can say its time
    limit cut work."""
    provider, u = su.unit.provider, su.unit
    if not hasattr(provider, "tail_plan_templates"):  # exact coverage: its templates have tails
        return False
    if deadline is not None and time.perf_counter() > deadline:
        return True
    overhead = ctx.cost.knobs.step_overhead_s
    plan_set = provider.plan_templates(u.lo)
    if not plan_set:
        return False
    # the groups the unit's bound leans on (where a plan near the bound may be), and those its
    # plan templates reach the incumbent with
    lb_set = su.lb_set.unpack() if isinstance(su.lb_set, PackedTemplates) else su.lb_set
    args = (ctx.avail, u.microbatches, (u.lo, u.hi))
    lb_problem = problem_of(lb_set, *args) if lb_set else None
    used_lb = lp_support(lb_problem, su.bound_s - overhead, stats=ctx.stats) if lb_problem else []
    plan_problem = problem_of(plan_set, *args)
    used = lp_support(plan_problem, incumbent_s - overhead, stats=ctx.stats)
    protos = provider.plan_protos
    skeletons = {lb_set[k].skeleton for k in np.flatnonzero(used_lb)}
    # and those the bound leans on once pruned across groups (each GPU usage's best templates
    # whatever their group): the LP may take either of two equally good groups
    across = prune_templates(lb_set)
    used_x = lp_support(problem_of(across, *args), su.bound_s - overhead, stats=ctx.stats) if across else []
    skeletons |= {across[k].skeleton for k in np.flatnonzero(used_x)}
    skeletons |= {protos[plan_set[k].proto].skeleton for k in np.flatnonzero(used)}
    # tails above e_cap cannot be in a plan that beats the incumbent: the pipeline time under it
    # comes from the bound templates, which hold every plan of the unit (the extras' too); the
    # plan templates' own (a plan of one pipeline in a unit of two, say) capped the extras at a
    # tail below the one a faster plan needs
    pipe = pipeline_time_bound(lb_problem, ctx.stats) if lb_problem else None
    extra = provider.tail_plan_templates(u.lo, nearby_rows(skeletons - {None}),
                                         e_cap=incumbent_s - overhead - (pipe or 0.0))
    # whole copies only where the incumbent is more than whole_gap above the unit's bound
    whole = whole_gap is not None and incumbent_s - overhead > (1 + whole_gap) * (su.bound_s - overhead)
    if not extra and not whole:
        return False
    plan_set = plan_set + extra
    problem = _extended(plan_problem, extra)
    unit = SolverStats()
    sol = solve_assignment_lp(problem, unit, incumbent_s=incumbent_s - overhead, deadline=deadline)
    if extra and sol is not None and any(sol.counts):  # without extras: the unit's own plan again
        add_candidate(plan_set, sol, u, ctx)
    upper = min(incumbent_s - overhead, sol.objective_s if sol is not None and any(sol.counts) else np.inf)
    if whole and sol is not None and upper > (1 + whole_gap) * sol.bound_s:
        # whole copies below the rounded plan and the best plan, down to this problem's LP bound
        found = integral_plan(problem, sol.bound_s, upper, deadline=deadline, stats=unit, split=True)
        if found is not None:
            add_candidate(plan_set, found, u, ctx)
    ctx.stats.ilp_solves += unit.ilp_solves
    return unit.truncated


def add_candidate(templates: list[Template], sol: Assignment, u: Unit, ctx: UnitContext) -> None:
    resolve = getattr(u.provider, "resolved", lambda t: t)
    chosen = [(resolve(templates[t]), sol.microbatches[t]) for t in range(len(templates)) if sol.counts[t]]
    plan = build_plan(ctx.model, ctx.training, ctx.cluster, ctx.classes, u.b, chosen)
    pred = evaluate(plan, ctx.cluster, ctx.cost)
    ctx.candidates.append(Candidate(pred.step_s, plan, pred, u.b, (u.b, u.lo, u.hi)))


def _solve_exact(plan_set: list[Template], lb_set: list[Template], problem_args: tuple, solver: str,
                 start: float, time_limit: float | None,
                 unit: SolverStats) -> tuple[Assignment | None, Assignment | None]:
    """Exact assignment of the plan templates, and of the bound templates when they differ."""
    remaining = None if time_limit is None else max(0.05, time_limit - (time.perf_counter() - start))
    deadline = None if time_limit is None else start + time_limit
    sol = solve_assignment(problem_of(plan_set, *problem_args), solver, time_limit_s=remaining,
                           stats=unit, deadline=deadline) if plan_set else None
    if lb_set is plan_set:
        return sol, sol
    lb = solve_assignment(problem_of(lb_set, *problem_args), solver, time_limit_s=remaining,
                          stats=unit, deadline=deadline) if lb_set else None
    return sol, lb


def _solve_lp(plan_set_of: Callable[[], list[Template]], lb_set: list[Template] | None, problem_args: tuple,
              incumbent_s: float | None, start: float, time_limit: float | None,
              unit: SolverStats, prune: float = 1e-3
              ) -> tuple[list[Template], Assignment | None, Assignment | None]:
    """Plan templates, LP bound and rounded plan (large pools). Classes that cannot beat the
    incumbent by more than `prune` are only bounded: the bound templates go first, and when their
    bound is within `prune` of the incumbent the plan templates are never built (every plan
    template is dominated by a bound template). `prune` is 0.1 %, or the search's `stop_gap`, as
    a branch-and-bound with a relative gap limit prunes nodes within it of the incumbent. Without
    `lb_set` the plan templates give both."""
    deadline = None if time_limit is None else start + time_limit
    lb = None
    if lb_set is not None:
        lb = solve_assignment_lp(problem_of(lb_set, *problem_args), unit, incumbent_s=incumbent_s,
                                 deadline=deadline, bound_only=True) if lb_set else None
        if incumbent_s is not None and lb is not None and lb.bound_s >= incumbent_s / (1 + prune):
            return [], None, lb
    plan_set = plan_set_of()
    sol = solve_assignment_lp(problem_of(plan_set, *problem_args), unit, incumbent_s=incumbent_s,
                              deadline=deadline) if plan_set else None
    return plan_set, sol, (sol if lb_set is None else lb)
