"""`search`: the fastest plan for a model on a (mixed) cluster, with a lower bound and its gap.

Outer loops: microbatch size b, then the number of pipelines R (exactly for small R, in classes
above: `replica_classes`). Inner problems: the layer split of every pipeline skeleton
(`solvers.partition`, and `solvers.uniform_layers` / `solvers.two_runs` for identical decoder
layers) and the choice of templates and microbatch counts (`solvers.assign` exactly,
`solvers.assign_lp` on larger pools), one (b, replica class) unit at a time (`units`).

Why the bound holds: for a replica class [lo, hi] the templates are costed with gradient sync for
`lo` replicas (sync only grows with more replicas) and, with a distributed optimizer, with optimizer
states sharded over `hi` replicas (only shrinks memory and optimizer time), so every plan with R in
the class costs at least what the assignment problem (exact over those templates) returns. With
R fixed (lo = hi) the templates are exact and the bound equals the best plan of that class. The
minimum over all classes and microbatch sizes therefore bounds every plan in the searched space;
classes a time limit left unsolved are covered by the fluid compute bound (`bounds`).
"""

from __future__ import annotations

import functools
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import ParamSpec, TypeVar

import numpy as np

from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import CostModel
from planner.errors import HetplanError, InfeasibleError
from planner.plan import Plan, Prediction
from planner.search.bounds import (fluid_bound_s, fluid_work, flight_limits, memory_bound_s, plan_positions,
                                   shape_limits)
from planner.search.candidates import early_grid, wants_chains, wants_early_grid
from planner.search.exact_provider import ExactProvider
from planner.search.explain import alternatives_of, explain, outside_coverage
from planner.search.fit_proof import fits_nowhere
from planner.search.history import Milestone, close, mark
from planner.search.no_plan import after_exact_fallback, raise_no_plan
from planner.search.frontier_workers import prefetch_frontiers
from planner.search.parallel import UnitPool
from planner.search.providers import BlocksProvider
from planner.search.replica_classes import replica_classes
from planner.search.space import ResourceClass, block_types, costable_shapes, resource_classes
from planner.search.templates import count_sequences
from planner.search.unit_loop import Progress, beyond_coverage, best_first, close_gap
from planner.search.units import Candidate, Unit, UnitContext, coverage_rank, mixed_lengths, solve_unit
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.assign import SolverStats


TIMING_STATS = ("search_s", "megatron_grid_s", "chain_s")  # wall-clock entries of `SearchResult.stats`
# where nothing of the blocks coverage fits a model of at most `exact_max_layers` slots, the search runs
# again on the exact coverage up to this many group sequences per microbatch size (0.1-0.5 s on 6-8 GPUs)
EXACT_FALLBACK_LIMIT = 5000
# with a stop gap, the sizes swept after the early grid (but the smallest of them) take their
# bound's split frontiers from this many rounds of the sweep (rows cut there bounded by their
# screens) and sweep their plans' whole only when a unit asks for plans (`frontier_workers`):
# on the 64-GPU ladder rung sizes 8 / 16 in about 0.065 / 0.045 s instead of 0.09 / 0.07 s, every
# unit's bound the same, no plan asked of them. After 6 rounds `chain_check.py --seed 40` pool 34
# ended at a bound 0.12 % lower (a screen below the whole frontier's least point), after 8 the same
BOUND_ROUNDS = 8
GRID_TARGETS = ("megatron", "flagscale", "torchtitan", "deepspeed")  # engines a search can be restricted to
CHOICES = {"solver": ("cpsat", "cbc", "highs"), "polish": ("auto", "always", "never"),
           "chains": ("auto", "always", "never"), "target": (*GRID_TARGETS, "slurm", "any")}


def check_choice(keyword: str, value: str | None, field: str | None = None) -> None:
    """Refuse a value of `keyword` outside `CHOICES` (None: its default), naming `field` (the CLI's option)."""
    if value is not None and value not in CHOICES[keyword]:
        raise HetplanError(field or keyword, f"unknown value '{value}' ({', '.join(CHOICES[keyword])})")


@dataclass
class SearchResult:
    plan: Plan
    prediction: Prediction
    lower_bound_s: float
    gap: float
    alternatives: list[Plan]
    coverage: str
    idle_gpus: dict[str, int]
    explanation: list[str]
    stats: dict[str, float] = field(default_factory=dict)
    timed_out: bool = False
    # the bound of the covered space alone; above `lower_bound_s` when a candidate from outside
    # the coverage (a Megatron grid, a capped three-run pipeline) beats every plan in it
    coverage_bound_s: float | None = None
    # when the search found its plans and raised its bound (`history`: the last is this result's)
    history: list[Milestone] = field(default_factory=list)

    def counts(self) -> dict[str, float]:
        """`stats` without the wall-clock times: the same for the same input."""
        return {k: v for k, v in self.stats.items() if k not in TIMING_STATS}


BLOCKS_CLASSES = {"exact_upto": 4, "edges": (8,)}  # replica classes on the blocks coverage


def micro_batch_sizes(training: TrainingSpec) -> list[int]:
    gb = training.global_batch
    if training.micro_batches:
        ok = sorted(b for b in set(training.micro_batches) if gb % b == 0)
        if not ok:
            sizes = training.micro_batches
            multiples = {(gb // b) * b for b in sizes} | {-(-gb // b) * b for b in sizes}
            near = sorted(multiples - {0}, key=lambda x: (abs(x - gb), x))
            raise HetplanError("global_batch", f"no microbatch size in {sorted(training.micro_batches)} divides "
                               f"{gb}; nearest valid global batches: {', '.join(map(str, near[:4]))}")
        return ok
    return [b for b in (1, 2, 4, 8, 16) if gb % b == 0]


def _fluid(cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
           micro_batch: int, cross_node: bool = False) -> float:
    """A bound on the step of every plan at this microbatch size, over every costable shape: the
    fluid bound or, where larger, the memory bound (`bounds`; inf where no plan fits), plus the
    step overhead."""
    shapes = [(rc.index, shape) for rc in classes
              for shape in costable_shapes(cost, model, training, rc, micro_batch, cross_node)]
    work = fluid_work(cost, model, training, classes, shapes, micro_batch)
    gpus = np.array([rc.gpus for rc in classes], dtype=float)
    microbatches = training.global_batch // micro_batch
    memory = memory_bound_s(shape_limits(cost, model, training, classes, shapes, micro_batch), gpus,
                            model.num_layers, microbatches,
                            lambda: flight_limits(cost, model, training, classes, shapes, micro_batch),
                            plan_positions(model, classes))
    return max(fluid_bound_s(work, gpus, microbatches), memory) + cost.knobs.step_overhead_s


_P = ParamSpec("_P")
_R = TypeVar("_R")
GC_GEN0_THRESHOLD = 50_000  # allocations between young collections while a search runs (CPython: 700)


def _deferred_gc(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run `fn` with young-generation collections 70x rarer, then restore the thresholds. The search
    allocates millions of small acyclic objects (split tuples, templates) and the default threshold
    rescans them all again and again: 0.4-0.6 s of 4-5.5 s at 32-64 GPUs, as much as disabling
    the collector saves. Collections still run; forked workers inherit the setting."""
    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        old = gc.get_threshold()
        gc.set_threshold(max(old[0], GC_GEN0_THRESHOLD), *old[1:])
        try:
            return fn(*args, **kwargs)
        finally:
            gc.set_threshold(*old)
    return run


@_deferred_gc
def search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *, cost: CostModel | None = None,
           time_limit: float | None = None, solver: str = "cpsat", max_blocks: int = 3,
           exact_limit: int = 200, exact_max_layers: int = 12, mixed_limit: int = 2000, triple_limit: int = 400,
           top_k: int = 3, refine_gap: float | None = 0.015, workers: int = 1,
           progress: Progress | None = None, target: str | None = None, polish: str = "auto",
           chains: str = "auto", stop_gap: float | None = None) -> SearchResult:
    """Best plan, its prediction, a lower bound valid for the searched space, and alternatives.

    Coverage per microbatch size: "exact" when the model has at most `exact_max_layers` slots and
    there are at most `exact_limit` ordered group sequences; else pipelines of up to `max_blocks`
    runs of identical groups, the two-run ones limited to the most stages that keep them within
    `mixed_limit` skeletons ("blocks<=2,mixed<=K"), the three-run ones within `triple_limit`
    (one V100 -> A100 -> H100 pipeline on 8 GPUs is 5 % faster than any plan of two runs), or
    homogeneous pipelines only when not even two-stage mixed ones fit ("blocks<=1"; pipelines
    still differ from each other). Three-run pipelines are in the bound ("blocks<=3") only when
    all of them fit the limit; capped in length they are plan candidates outside the bound's space
    (the coverage names the bound's space; a plan may beat the bound, gap then 0, and the
    explanation says which pipelines lie outside it). The result's coverage is the narrowest one
    used. Where nothing of the blocks coverage (nor a mesh chain, below) fits a model of at most
    `exact_max_layers` slots, the search runs again on the exact coverage up to
    `EXACT_FALLBACK_LIMIT` sequences (a pipeline that returns to a GPU type, A -> B -> A, may be the
    only plan); the model is said to fit nowhere only where the exact coverage, the pool's memory or
    `fit_proof` (small pools, any pipeline order) shows it, else the error names the space searched.

    On the blocks coverage, once the best plan is known, the lowest unit bounds are tightened
    (tail-capped split frontiers for the skeletons the LP bound leans on, `units.refine_unit`, then
    split replica classes and finer tail levels; `unit_loop.refine`) until the gap is at most `refine_gap`
    (None: never), the lowest bound cannot be tightened further, or the time limit passes.

    `polish` ("auto", "always", "never"): how many of the best units' plans are re-solved with
    tail-capped stage options (`unit_loop.finish`): "auto" the two lowest-bound units, four where
    the gap target is missed or the tails are large; "always" four; then the units the best plan
    came from; "never" none, nor the search near a short lift's witness (`lift.witness_plan`).
    Where the gap is open after the best-first units the polish also runs before
    refinement, so that its plan sets refinement's goal (`unit_loop.close_gap`). The two lowest found 0.02-1.26 %
    faster plans on 4 of 20 pools (the 16 bench scenarios and the 8-64 GPU ladder rungs,
    `benchmarks/polish_check.py`), which a trigger on the gap alone had left unpolished.

    On the blocks coverage the best Megatron grid is searched with the best plan so far as a
    cutoff and taken if faster (`candidates.megatron_grid_candidate`), after refinement alongside
    the polish, or before refinement where the chains below run whatever the gap
    (`unit_loop.close_gap`), so the answer is never slower than any
    grid (on the exact coverage the grids are inside the exactly solved space); so are, with
    `chains` ("auto", "always", "never"), the most promising FlagScale mesh chains
    (`candidates.chain_candidate`), pipelines of any number of runs the coverage may leave out:
    "auto" runs them on pools of at most 64 GPUs with more GPU classes than the coverage's runs,
    whose coverage caps mixed pipelines, or whose gap refinement left above `refine_gap`.

    `stop_gap` (None: off) ends the blocks coverage's search once the best plan is within that relative
    gap of the lower bound, as a MIP solver's gap limit does: units whose cheap bound is within it of
    the best plan are only bounded (and units whose bound is, not polished), and once the gap is met the
    polish, refinement and the mesh chains run only to close the gap are skipped (the Megatron grid, and
    the chains run for pipelines the coverage leaves out, still run: `unit_loop.close_gap`); the
    result's `stats["stopped_at_gap"]` and explanation say when it stopped early.

    `workers` > 1 computes the split frontiers in that many forked processes, then runs the cheap
    bounds, the units of each batch of `parallel.UNIT_BATCH` and the refinements in one pool of that
    many (`parallel`); the batches do not depend on `workers`, so neither does the result.

    `target` restricts the search to plans one engine runs: "megatron", "torchtitan" and "deepspeed"
    search Megatron's grid (`megatron_grid`; their emitters refuse, with the reason, what they cannot
    express), "flagscale" searches per-mesh tp / stage-dp chains (`flagscale_grid`); "slurm" and
    "any" take the full search."""
    start = time.perf_counter()
    cost = cost or AnalyticCostModel()
    for keyword, value in (("polish", polish), ("chains", chains), ("target", target), ("solver", solver)):
        check_choice(keyword, value)
    if stop_gap is not None and not stop_gap >= 0:
        raise HetplanError("stop_gap", f"{stop_gap}: a relative gap, 0 or more (0.02 = 2 %)")
    if target in GRID_TARGETS:
        return _grid_search(model, cluster, training, cost, start, target)
    if max_blocks not in (1, 2, 3):
        raise HetplanError("max_blocks", f"{max_blocks} runs per pipeline: 1, 2 or 3 are searched")
    if training.schedule != "1f1b":
        raise HetplanError("training.schedule", "the search plans 1F1B schedules; GPipe plans can be "
                           "evaluated and simulated but are not searched")
    classes = resource_classes(cluster)
    if not classes:
        raise InfeasibleError("cluster", "the cluster has no GPUs: nothing to plan")
    avail = tuple(rc.gpus for rc in classes)
    n_slots = model.num_layer_slots
    sizes = micro_batch_sizes(training)
    stats = SolverStats()
    candidates: list[Candidate] = []
    bounds: list[float] = []
    coverages: set[str] = set()
    timed_out = False
    grid_s = chain_s = 0.0  # seconds spent on the Megatron-grid and the mesh-chain candidates
    unsolved_sizes: set[int] = set()
    shape_sets: dict[int, dict] = {}
    explored = {"skeletons": 0, "templates": 0, "templates_pruned": 0, "assignments": 0, "units_refined": 0,
                "units_split": 0, "units_lifted": 0, "units_polished": 0, "megatron_grid_added": 0, "chain_added": 0,
                "stopped_at_gap": 0}
    providers: list = []
    pending: list[Unit] = []
    ctx = UnitContext(model, training, cluster, classes, cost, avail, candidates, bounds, unsolved_sizes, stats,
                      explored, timeline={"start": start})
    # whether no plan of any shape or order fits (`fit_proof`): asked only once the coverage has none
    fits_nowhere_proven = functools.cache(
        lambda: fits_nowhere(cost, model, training, classes, shape_sets, cluster.single_node))
    for bi, b in enumerate(sizes):
        if time_limit is not None and time.perf_counter() - start > time_limit and candidates:
            timed_out = True
            unsolved_sizes.add(b)
            continue
        shapes = {rc.index: costable_shapes(cost, model, training, rc, b, cluster.allow_cross_node_tp)
                  for rc in classes}
        types = block_types(shapes)
        shape_sets[b] = types  # for the no-plan proof (`fit_proof`)
        if not types:
            continue
        type_list = list(types)
        args = (cost, model, training, classes, types, avail, b, cluster.single_node)
        if n_slots <= exact_max_layers and count_sequences(type_list, avail, n_slots, exact_limit) <= exact_limit:
            provider = ExactProvider(*args)
        else:
            # the frontier enumeration stops at 80 % of the time limit (what it skipped is then
            # covered by the fluid bound); protos are built when a unit of this size is solved
            deadline = None if time_limit is None else start + 0.8 * time_limit
            # runs are on pairwise different GPU classes: no more runs than classes (two at least,
            # so one- and two-type pools keep the name blocks<=2)
            runs = min(max_blocks, max(2, len(classes)))
            lens = mixed_lengths(type_list, avail, n_slots, (mixed_limit, triple_limit), runs)
            # three-run pipelines capped in length are plan candidates only: in the bound they
            # sent refinement through every unit on 24-GPU pools (34 s against 6 s)
            bound_blocks = 1 + (2 in lens) + (lens.get(3) == n_slots)
            provider = BlocksProvider(*args, max_blocks=1 + len(lens), deadline=deadline, mixed_lens=lens,
                                      bound_blocks=bound_blocks)
        coverages.add(provider.coverage)
        providers.append(provider)
        microbatches = training.global_batch // b
        r_max = min(microbatches, sum(avail) // min(bt.gpus for bt in type_list))
        # Exact coverage costs every replica count separately up to 8 (exactness); the blocks
        # coverage groups them more coarsely, from 5 up (the bound absorbs the difference, see
        # module doc; refinement splits the class whose bound is lowest).
        exact = provider.coverage == "exact"
        rclasses = (replica_classes(max(1, r_max)) if exact
                    else replica_classes(max(1, r_max), **BLOCKS_CLASSES))
        units = [Unit(b, provider, lo, hi, microbatches) for lo, hi in rclasses]
        if not exact:  # large pools: solved best-first across microbatch sizes, below
            pending.extend(units)
            continue
        for k, u in enumerate(units):
            if time_limit is not None and time.perf_counter() - start > time_limit and candidates:
                timed_out = True
                unsolved_sizes.add(b)
                break
            if progress:
                progress((bi + k / len(units)) / len(sizes), f"micro_batch {b}, pipelines {u.lo}-{u.hi}")
            timed_out = solve_unit(u, ctx, solver, start, time_limit) or timed_out
            mark(ctx, "units")
    if not pending:
        ctx.timeline["bounded"] = time.perf_counter()  # exact coverage: every unit solved (or its size unsolved)
        mark(ctx, "units")
    else:
        # on small pools the best Megatron grid first: its step caps the frontiers' A (`early_grid`)
        rows = sum(len(p.skeletons) for p in providers if getattr(p, "needs_frontiers", False))  # a row each
        pilot = (lambda: early_grid(ctx, sizes)) if wants_early_grid(sum(avail), rows, time_limit) else None
        # with a stop gap the larger sizes swept after the grid sweep for their bound first: their
        # units are seldom solved for plans (`BOUND_ROUNDS`)
        rounds = BOUND_ROUNDS if stop_gap is not None else None
        ctx = replace(ctx, early_grid=prefetch_frontiers(providers, workers, pilot, rounds))
        with UnitPool(pending, ctx, solver, start, time_limit, workers) as pool:
            if wants_chains(chains, coverages, classes):
                # the engine candidates run before refinement whatever the plans: started at the first
                # plan, beside the units (32-GPU ladder rung with `stop_gap`: 0.99 -> 0.90 s)
                pool.start_engines_at_first_plan(["megatron_grid", "chain"], sizes)
            timed_out = best_first(pool, ctx, start, time_limit, progress, stop_gap) or timed_out
            deadline = None if time_limit is None else start + time_limit
            if candidates:
                # where the chains run whatever the gap, they (and the grid) run before refinement,
                # so that a faster chain sets its goal; else after it, beside the polish
                idle = 1 - min(candidates, key=lambda c: c.step_s).plan.num_gpus / sum(avail)
                early = (["megatron_grid", "chain"] if wants_chains(chains, coverages, classes, idle_share=idle)
                         else [])

                def late(gap_open: bool) -> list[str]:
                    return ["megatron_grid"] + (["chain"] if wants_chains(chains, coverages, classes, gap_open) else [])

                mode = polish if polish == "always" or (polish == "auto" and refine_gap is not None) else None
                cut, seconds = close_gap(ctx, pool, sizes, refine_gap, mode, early, late, deadline, stop_gap)
                timed_out = cut or timed_out
                grid_s, chain_s = seconds.get("megatron_grid", 0.0), seconds.get("chain", 0.0)
            elif not timed_out and "exact" not in coverages and not fits_nowhere_proven():
                # no engine candidate can fit where no plan does: shown first, the error comes at
                # once (Llama-2 70B at 256k tokens on 832 small GPUs: 64 s, most of it the grids)
                grid_s, chain_s, timed_out = beyond_coverage(ctx, pool, sizes, chains, coverages, deadline,
                                                             refine_gap, polish != "never")
    bounds.extend(su.bound_s for su in ctx.solved)
    # a frontier the deadline cut short leaves poorer plans (the bound holds): work cut short too
    timed_out = timed_out or any(getattr(p, "cut_short", False) for p in providers)
    for provider in providers:
        explored["skeletons"] += provider.stats.skeletons
        explored["templates_pruned"] += provider.stats.pruned
    if progress:
        progress(1.0, "done")
    if not candidates:
        if not timed_out and n_slots <= exact_max_layers and exact_limit < EXACT_FALLBACK_LIMIT \
                and coverages - {"exact"} and not fits_nowhere_proven():
            spent = time.perf_counter() - start
            left = None if time_limit is None else time_limit - spent
            if left is None or left > 0:
                again = search(model, cluster, training, cost=cost, time_limit=left, solver=solver,
                               max_blocks=max_blocks, exact_limit=EXACT_FALLBACK_LIMIT,
                               exact_max_layers=exact_max_layers, mixed_limit=mixed_limit, triple_limit=triple_limit,
                               top_k=top_k, refine_gap=refine_gap, workers=workers, progress=progress,
                               polish=polish, chains=chains)
                return after_exact_fallback(again, min(coverages, key=coverage_rank), spent, EXACT_FALLBACK_LIMIT)
            timed_out = True
        raise_no_plan(model, training, classes, cost, timed_out,
                      None if coverages <= {"exact"} else min(coverages, key=coverage_rank),
                      chains != "never" and "exact" not in coverages,
                      fits_nowhere_proven)
    candidates.sort(key=lambda c: (c.step_s, c.micro_batch, c.plan.num_gpus))
    best = candidates[0]
    for b in sorted(unsolved_sizes):
        bounds.append(_fluid(cost, model, training, classes, b, cluster.allow_cross_node_tp))
    # no bound at all: no plan of the coverage fits and the plan is an engine candidate's; the
    # fluid bound holds for every plan
    covered = min(bounds) if bounds else min(_fluid(cost, model, training, classes, b, cluster.allow_cross_node_tp)
                                             for b in sizes)
    if ctx.early_grid is not None and ctx.early_grid[0] is not None:
        # frontiers capped at the grid's step (`candidates.early_grid`): the bounds hold for plans
        # at most that fast, and every other plan of the coverage is slower than the grid's
        covered = min(covered, ctx.early_grid[0][1].step_s)
    lower = min(covered, best.step_s)
    gap = best.step_s / lower - 1 if lower > 0 else float("inf")
    pred = best.prediction.model_copy(update={"lower_bound_s": lower, "gap": gap})
    plan = best.plan.model_copy(update={"predicted": pred})
    alternatives = alternatives_of(candidates, top_k)
    used: dict[str, int] = {}
    for p in plan.pipelines:
        for s in p.stages:
            used[s.gpu] = used.get(s.gpu, 0) + s.num_gpus
    idle = {rc.name: 0 for rc in classes}
    for rc in classes:
        idle[rc.name] += rc.gpus
    for g, n in used.items():
        idle[g] -= n
    idle = {g: n for g, n in idle.items() if n}
    coverage = min(coverages, key=coverage_rank) if coverages else "exact"
    explanation = explain(plan, pred, idle, coverage, engines_only=not bounds)
    explanation += outside_coverage(plan, coverage) if bounds else []
    if not bounds:
        explanation.append(f"no plan of the covered space ({coverage}) fits: this plan lies outside it, and the "
                           "lower bound is the fluid one (every layer's work spread over every GPU at its best "
                           "efficiency; where larger, what each stage's memory lets it hold), valid for every plan")
    if explored["stopped_at_gap"]:
        explanation.append(f"the search stopped once the gap was within stop_gap ({stop_gap:.2%}): the plan polish, "
                           "further refinement and the mesh chains run only to close the gap were skipped, so a "
                           "full search may find a plan up to that much faster within the lower bound's coverage")
    if best.step_s < covered:
        explanation.append(f"the lower bound of the covered space ({coverage}) is {covered:.4f} s, above this "
                           "plan's step: the plan lies outside that space and beats every plan in it, so the "
                           "gap is 0 against that space and this plan, not against plans outside it")
    out_stats = {**explored, "ilp_solves": stats.ilp_solves, "feasibility_checks": stats.feasibility_checks,
                 "plans_scored": len(candidates),
                 "megatron_grid_s": grid_s + (ctx.early_grid[1] if ctx.early_grid else 0.0), "chain_s": chain_s,
                 "search_s": time.perf_counter() - start}
    close(ctx.history, best.step_s, lower, out_stats["search_s"])
    return SearchResult(plan, pred, lower, gap, alternatives, coverage, idle, explanation, out_stats, timed_out,
                        coverage_bound_s=covered if bounds else None, history=ctx.history)


def _grid_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                 start: float, target: str) -> SearchResult:
    from planner.search.flagscale_grid import best_flagscale_plan
    from planner.search.megatron_grid import best_megatron_plan, best_single_type_plan

    if not cluster.node_list:
        raise InfeasibleError("cluster", "the cluster has no GPUs: nothing to plan")
    sizes = micro_batch_sizes(training)
    if target == "flagscale":
        found = best_flagscale_plan(model, cluster, training, cost, sizes)
    else:  # prefixes of the node list, then each GPU type alone (a grid runs on any set of nodes)
        found = best_megatron_plan(model, cluster, training, cost, sizes)
        alone = best_single_type_plan(model, cluster, training, cost, sizes,
                                      cutoff_s=found[1].step_s if found is not None else math.inf)
        found = alone if alone is not None else found
    if found is None and target == "flagscale":
        raise InfeasibleError("target", "no FlagScale mesh chain (identical replicas, one cp and recompute mode, "
                              "every stage holding a decoder layer) fits this model on this cluster")
    if found is None:
        raise InfeasibleError("target", "no Megatron grid (identical pipelines, one tp/cp, Megatron rank "
                              "order over the nodes in file order) fits this model on this cluster")
    plan, pred = found
    pred = pred.model_copy(update={"lower_bound_s": pred.step_s, "gap": 0.0})
    plan = plan.model_copy(update={"predicted": pred})
    used = sum(s.num_gpus for p in plan.pipelines for s in p.stages)
    idle = dict(cluster.counts_by_type())
    for p in plan.pipelines:
        for s in p.stages:
            idle[s.gpu] -= s.num_gpus
    idle = {g: n for g, n in idle.items() if n}
    stats = {"gpus_used": used, "search_s": time.perf_counter() - start}
    coverage = "flagscale-meshes" if target == "flagscale" else "megatron-grid"
    return SearchResult(plan, pred, pred.step_s, 0.0, [], coverage, idle, explain(plan, pred, idle, coverage), stats,
                        history=[Milestone(coverage, pred.step_s, pred.step_s, stats["search_s"])])
