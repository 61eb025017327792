"""Units of the search done in worker processes, with the same answer (the split frontiers before
them: `frontier_workers`).

The best-first loop takes units in batches of `UNIT_BATCH`, each solved against the best plan
known when its batch started; a batch's units run in worker processes forked once for the whole
loop (`UnitPool`, `workers > 1`) or in turn, and their plans, bounds and counts are merged in batch
order. The batch size is fixed, so the plan, the bound and the counts never depend on `workers` (a
test checks it). Two kinds of task run ahead of their turn without changing that: the engine
candidates started at the first plan, against it, beside the units
(`UnitPool.start_engines_at_first_plan`; in one process they run there and then; a last step, such
as the chains' re-split, waits until they are taken, against the best plan then), and the polish
beside the early engine candidates (`UnitPool.speculate`), taken only where its arguments are
those of the polish that comes next, and the next batch's units, started as a batch's faster
units leave workers idle (`early_tasks.EarlyTasks`), taken only where the next batch asks for
them with the same arguments.

Platforms without fork, and daemon processes (pool workers, which may not start processes), do the
same work in turn.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from planner.search.candidates import ENGINE_CANDIDATES, ENGINE_STEPS
from planner.search.early_tasks import EarlyTasks
from planner.search.frontier_workers import can_fork
from planner.search.lift import lift_unit
from planner.search.replica_classes import split_counts
from planner.search.templates import PackedTemplates, Template
from planner.search.units import (CUT_SLACK, SolvedUnit, Unit, UnitContext, cheap_bound, inherit_refinement,
                                  polish_unit, refine_unit, solve_unit)
from solvers.assign import SolverStats

UNIT_BATCH = 2  # units solved (or refined) between updates of the best plan; fixed for determinism


@dataclass
class _Outcome:
    """What solving one unit added to a context, to merge into the parent's."""

    candidates: list = field(default_factory=list)
    bounds: list[float] = field(default_factory=list)
    solved: list[tuple[float, list]] = field(default_factory=list)
    unsolved_sizes: set[int] = field(default_factory=set)
    stats: SolverStats = field(default_factory=SolverStats)
    assignments: int = 0
    templates: int = 0
    pruned: int = 0
    timed_out: bool = False


@dataclass(frozen=True)
class _Search:
    """What the unit workers read: the units (by index) and the shared context as at the fork."""

    units: list[Unit]
    ctx: UnitContext
    solver: str
    start: float
    time_limit: float | None


_SEARCH: _Search | None = None  # set before the workers fork; they inherit it
_RETIRED: list = []  # the last search's unit pool, closed with nothing left to run (`UnitPool.__exit__`)


def _cheap_task(members: list[int]) -> tuple[list[float | None], int]:
    """Cheap bounds of one microbatch size's units, widest `hi` first: each starts from the last."""
    assert _SEARCH is not None
    local = SolverStats()
    units = _SEARCH.units
    found: dict[int, float | None] = {}
    floor = 0.0
    for i in sorted(members, key=lambda i: (-units[i].hi, i)):
        found[i] = cheap_bound(units[i], _SEARCH.ctx.avail, local, floor)
        floor = found[i] if found[i] is not None else floor
    return [found[i] for i in members], local.ilp_solves


def _best_of(out: _Outcome) -> float | None:
    """The fastest plan a unit's solve found (None: none)."""
    return min((c.step_s for c in out.candidates), default=None)


def _unit(index: int, lo: int, hi: int) -> Unit:
    """Unit `index` of the search, or the part [lo, hi] of its replica class (a split class)."""
    assert _SEARCH is not None
    u = _SEARCH.units[index]
    return u if (u.lo, u.hi) == (lo, hi) else replace(u, lo=lo, hi=hi)


def _solve_task(args: tuple[int, int, int, float | None, float]) -> _Outcome:
    assert _SEARCH is not None
    index, lo, hi, incumbent_s, prune = args
    u, ctx = _unit(index, lo, hi), _SEARCH.ctx
    local = replace(ctx, candidates=[], bounds=[], unsolved_sizes=set(), stats=SolverStats(),
                    explored={"assignments": 0, "templates": 0}, solved=[])
    pruned = u.provider.stats.pruned
    timed_out = solve_unit(u, local, _SEARCH.solver, _SEARCH.start, _SEARCH.time_limit, incumbent_s, prune)
    return _Outcome(local.candidates, local.bounds, [(s.bound_s, _packed(s.lb_set)) for s in local.solved],
                    local.unsolved_sizes, local.stats, local.explored["assignments"],
                    local.explored["templates"], u.provider.stats.pruned - pruned, timed_out)


def _refine_task(args: tuple[int, int, int, float, PackedTemplates | list, float, float | None, float]
                 ) -> tuple[float, int, PackedTemplates]:
    assert _SEARCH is not None
    index, lo, hi, bound_s, lb_set, incumbent_s, deadline, ratio = args
    local = replace(_SEARCH.ctx, stats=SolverStats())
    mine = SolvedUnit(bound_s, _unit(index, lo, hi), lb_set)  # refined as columns (`units.replace_groups`)
    refine_unit(mine, local, incumbent_s, deadline, ratio)
    return mine.bound_s, local.stats.ilp_solves, _packed(mine.lb_set)


def _lift_task(args: tuple[int, int, int, float, PackedTemplates | list, float | None, float, float, float | None]
               ) -> tuple[float, PackedTemplates, frozenset | None, int]:
    """Lift one unit's bound (`lift.lift_unit`): its bound, templates, witness and LP solves."""
    assert _SEARCH is not None
    index, lo, hi, bound_s, lb_set, ratio, goal_s, incumbent_s, deadline = args
    local = replace(_SEARCH.ctx, stats=SolverStats())
    mine = SolvedUnit(bound_s, _unit(index, lo, hi), lb_set, ratio=ratio)
    lift_unit(mine, local, goal_s, deadline, incumbent_s)
    return mine.bound_s, _packed(mine.lb_set), mine.witness, local.stats.ilp_solves


def _tighten_task(args: tuple) -> tuple:
    """A lift (`_lift_task`) or a refinement (`_refine_task`), so both share one batch of tasks."""
    return _lift_task(args[1:]) if args[0] == "lift" else _refine_task(args[1:])


def _polish_task(args: tuple[int, int, int, float, PackedTemplates | list, float, float | None, float | None]
                 ) -> tuple[list, int, int, bool]:
    """Polish one solved unit's plan (`units.polish_unit`) against `incumbent_s`: its candidates,
    LP solves, templates pruned and whether the deadline cut it short."""
    assert _SEARCH is not None
    index, lo, hi, bound_s, lb_set, incumbent_s, deadline, whole_gap = args
    local = replace(_SEARCH.ctx, candidates=[], stats=SolverStats())
    u = _unit(index, lo, hi)
    pruned = u.provider.stats.pruned
    cut = polish_unit(SolvedUnit(bound_s, u, lb_set), local, incumbent_s, deadline, whole_gap)
    return local.candidates, local.stats.ilp_solves, u.provider.stats.pruned - pruned, cut


def _finish_task(args: tuple) -> tuple:
    """A polish (`_polish_task`), a refinement (`_refine_task`) or an engine candidate
    (`candidates.ENGINE_CANDIDATES`: its plan or None, and its seconds; "search" and "last_step":
    the two steps of one in `candidates.ENGINE_STEPS`, the whole of one that has none), so they
    share one batch of worker tasks."""
    assert _SEARCH is not None
    if args[0] == "polish":
        return _polish_task(args[1:])
    if args[0] == "refine":
        return _refine_task(args[1:])
    start = time.perf_counter()
    if args[0] == "last_step":  # of an engine started ahead (`UnitPool.start_engines_at_first_plan`)
        _, name, searched, cutoff_s = args
        return ENGINE_STEPS[name][1](_SEARCH.ctx, searched, cutoff_s), time.perf_counter() - start
    kind, name, sizes, cutoff_s, tail_share = args
    run = ENGINE_STEPS[name][0] if kind == "search" and name in ENGINE_STEPS else ENGINE_CANDIDATES[name]
    return run(_SEARCH.ctx, sizes, cutoff_s, tail_share), time.perf_counter() - start


def _packed(templates: list[Template] | PackedTemplates) -> PackedTemplates:
    """A solved unit's bound templates as they travel to and from workers and wait in the parent
    (which never reads them): columns, not objects."""
    return templates if isinstance(templates, PackedTemplates) else PackedTemplates.of(templates)


class UnitPool:
    """Runs the units of the best-first loop (cheap bounds, solves, refinements) in worker
    processes forked once, after the frontiers are in place, so every worker inherits them and
    keeps the caches it builds from one batch to the next; tasks carry unit indices and plain
    data. With one worker, without fork, or inside a daemon process, the same tasks run in turn."""

    def __init__(self, units: list[Unit], ctx: UnitContext, solver: str, start: float,
                 time_limit: float | None, workers: int) -> None:
        self.units, self.ctx, self.workers = units, ctx, workers
        self._search = _Search(units, ctx, solver, start, time_limit)
        self._index = {id(u): i for i, u in enumerate(units)}  # split parts map to their class's unit
        self._kept: list[Unit] = []
        self._outer: _Search | None = None  # the module's search before this pool forked
        self._pool = None
        self._ahead: dict[tuple, tuple] = {}  # polish (templates, outs) `speculate` ran, by task
        self._to_start: tuple[tuple[str, ...], list[int]] | None = None  # see `start_engines_at_first_plan`
        self._started: tuple[tuple[str, ...], object] | None = None  # (engines, their outs or pending result)
        self._early = EarlyTasks(_solve_task, _best_of)

    def __enter__(self) -> UnitPool:
        return self

    def __exit__(self, *exc: object) -> None:
        global _SEARCH
        if self._pool is not None:
            started = self._started[1] if self._started is not None else None
            if exc[0] is None and self._early.idle() and (started is None or isinstance(started, list)
                                                          or started.ready()):
                # nothing runs: the workers are told to stop and left to it (terminating them
                # waited 5-7 ms for them at the end of every search), the pool kept until the next
                self._pool.close()
                _RETIRED[:] = [self._pool]
            else:
                self._pool.terminate()
            self._pool = None
            _SEARCH = self._outer

    def _in_turn(self, fn: Callable, args: list) -> list:
        """`fn` on each of `args` in this process, in turn."""
        global _SEARCH
        outer, _SEARCH = _SEARCH, self._search
        try:
            return [fn(a) for a in args]
        finally:
            _SEARCH = outer

    def _map(self, fn: Callable, args: list) -> tuple[list, bool]:
        if self._pool is None and not can_fork(self.workers, len(args)):
            return self._in_turn(fn, args), False
        return self._forked().map(fn, args, chunksize=1), True

    def _forked(self):
        """The worker pool, forked at the first call."""
        global _SEARCH
        if self._pool is None:
            # kept set while the pool lives: a worker the pool replaces is forked from this state
            self._outer, _SEARCH = _SEARCH, self._search
            self._pool = mp.get_context("fork").Pool(self.workers)
        return self._pool

    def cheap_bounds(self) -> list[float | None]:
        """Every unit's cheap bound (`units.cheap_bound`), one task per microbatch size."""
        groups: dict[int, list[int]] = {}
        for i, u in enumerate(self.units):
            groups.setdefault(id(u.provider), []).append(i)
        tasks = list(groups.values())
        outs, _ = self._map(_cheap_task, tasks)
        found: list[float | None] = [None] * len(self.units)
        for members, (bounds, solves) in zip(tasks, outs):
            self.ctx.stats.ilp_solves += solves
            for i, b in zip(members, bounds):
                found[i] = b
        return found

    def start_engines_at_first_plan(self, engines: list[str], sizes: list[int]) -> None:
        """Start the engine candidates `engines` once the first batch of units with a plan is merged
        (`solve`), against that plan: in the worker processes, beside the units still to solve (so
        that the mesh chains, the longest task of the search's last phase, no longer run alone at its
        end), or, in one process, there and then. The first `finish`, `speculate` or
        `engines_beside_refinement` that asks for the same engines takes their outs, running then
        the last step of those that have one (`candidates.ENGINE_STEPS`) against the best plan of
        that moment. The cutoff is the plan of the same batch however many workers run, so the
        answer does not depend on it."""
        self._to_start = (tuple(engines), sizes)

    def _start_engines(self) -> None:
        """Start them (`start_engines_at_first_plan`), unless the time limit has passed: then
        `unit_loop.close_gap` leaves them out (but the floor ones), as it did before."""
        assert self._to_start is not None
        (names, sizes), self._to_start = self._to_start, None
        limit = self._search.time_limit
        if limit is not None and time.perf_counter() - self._search.start > limit:
            return
        top = min(self.ctx.candidates, key=lambda c: c.step_s)
        tasks = [("search", name, sizes, top.step_s, top.prediction.tail_s / top.step_s) for name in names]
        started = self._in_turn(_finish_task, tasks) if self._pool is None else self._pool.map_async(
            _finish_task, tasks, chunksize=1)
        self._started = (names, started)

    def _engine_tasks(self, engines: list[str], sizes: list[int], best: float,
                      share: float) -> tuple[list[tuple], Callable[[list], list]]:
        """The tasks that give the outs of the engine candidates `engines` against the best plan
        `best` (its tail `share` of its step): each one's whole run, or, where they were started at
        the first plan (`start_engines_at_first_plan`; taken once), the last steps of those that
        have one (`candidates.ENGINE_STEPS`). With a function from those tasks' outs to the
        engines' (plan or None, seconds)."""
        if self._started is None or self._started[0] != tuple(engines):
            return [("engine", name, sizes, best, share) for name in engines], list
        (_, got), self._started = self._started, None
        searched = got if isinstance(got, list) else got.get()
        tasks = [("last_step", name, out, best) for name, (out, _) in zip(engines, searched) if name in ENGINE_STEPS]

        def outs_of(last: list) -> list:
            steps, outs = iter(last), []
            for name, (out, spent) in zip(engines, searched):
                if name in ENGINE_STEPS:
                    out, more = next(steps)
                    spent += more
                outs.append((out, spent))
            return outs
        return tasks, outs_of

    def solve(self, batch: list[Unit], prune: float = 1e-3,
              ahead: Callable[[float | None], list[Unit]] | None = None) -> bool:
        """Solve a batch of units against the best plan known now (a unit whose bound is within
        `prune` of it gets no plan, `units.solve_unit`); True if any timed out. With `ahead` (the
        units the next batch would hold, given the best plan then), once a worker is left idle
        by the batch's faster units, they start against the best plan those leave
        (`early_tasks.EarlyTasks`): taken only if the next batch asks for them with the same
        arguments."""
        ctx = self.ctx
        incumbent = min((c.step_s for c in ctx.candidates), default=None)
        tasks = [(self._index[id(u)], u.lo, u.hi, incumbent, prune) for u in batch]

        def next_tasks(best: float | None) -> list[tuple]:
            return [(self._index[id(u)], u.lo, u.hi, best, prune) for u in (ahead(best) if ahead else [])]
        if self._pool is None and not can_fork(self.workers, len(tasks)):
            outs, forked = self._in_turn(_solve_task, tasks), False
        else:
            # none while the engine candidates wait for the first plan: the batch that finds it
            # changes the best plan (and they go first)
            outs = self._early.run(self._forked(), tasks, incumbent, None if self._to_start else next_tasks)
            forked = True
        timed_out = False
        for u, out in zip(batch, outs):
            ctx.candidates.extend(out.candidates)
            ctx.bounds.extend(out.bounds)
            ctx.solved.extend(SolvedUnit(b, u, lb_set) for b, lb_set in out.solved)
            ctx.unsolved_sizes.update(out.unsolved_sizes)
            ctx.stats.ilp_solves += out.stats.ilp_solves
            ctx.stats.feasibility_checks += out.stats.feasibility_checks
            ctx.explored["assignments"] += out.assignments
            ctx.explored["templates"] = ctx.explored.get("templates", 0) + out.templates
            if forked:  # in turn, the provider counted it already
                u.provider.stats.pruned += out.pruned
            timed_out = timed_out or out.timed_out
        if self._to_start is not None and ctx.candidates:
            self._start_engines()
        return timed_out

    def refine(self, sus: list[SolvedUnit], deadline: float | None, goal_s: float | None = None) -> None:
        """Tighten a batch of unit bounds (`units.refine_unit`, each at its next ratio) up to the
        best plan, or only up to `goal_s` when lower (a bound past what the gap target needs is
        work the answer does not use)."""
        self._tighten([], sus, deadline, goal_s)

    def lift(self, sus: list[SolvedUnit], goal_s: float, deadline: float | None,
             beside: list[SolvedUnit] | None = None) -> None:
        """Raise a batch of unit bounds to what whole pipelines allow (`lift.lift_unit`), each up
        to `goal_s`, against the best plan known now (each unit is marked lifted), and refine the
        units `beside` them (as `refine`) in the same batch of tasks."""
        self._tighten(sus, beside or [], deadline, goal_s)

    def _tighten(self, lifts: list[SolvedUnit], refines: list[SolvedUnit], deadline: float | None,
                 goal_s: float | None) -> None:
        """One batch of lift and refinement tasks, their results taken in batch order."""
        best = min(c.step_s for c in self.ctx.candidates)
        tasks = [("lift", self._index[id(su.unit)], su.unit.lo, su.unit.hi, su.bound_s, su.lb_set, su.ratio, goal_s,
                  best, deadline) for su in lifts]
        ratios = [su.next_ratio() for su in refines]
        tasks += self._refine_tasks(refines, ratios, deadline, goal_s)
        outs, _ = self._map(_tighten_task, tasks)
        for su, (bound, lb_set, witness, solves) in zip(lifts, outs):
            su.bound_s, su.lb_set, su.witness, su.lifted = bound, lb_set, witness, True
            self.ctx.stats.ilp_solves += solves
        self._take_refined(refines, ratios, outs[len(lifts):])

    def _refine_tasks(self, refines: list[SolvedUnit], ratios: list[float | None], deadline: float | None,
                      goal_s: float | None) -> list[tuple]:
        """Refinement tasks of `refines` at `ratios`, each up to the best plan or `goal_s`."""
        best = min(c.step_s for c in self.ctx.candidates)
        cap = best if goal_s is None else min(best, goal_s * (1 + CUT_SLACK))  # bounds end >= goal
        return [("refine", self._index[id(su.unit)], su.unit.lo, su.unit.hi, su.bound_s, su.lb_set, cap, deadline,
                 r) for su, r in zip(refines, ratios)]

    def _take_refined(self, refines: list[SolvedUnit], ratios: list[float | None], outs: list) -> None:
        for su, r, (bound, solves, lb_set) in zip(refines, ratios, outs):
            su.bound_s, su.ratio, su.lb_set = bound, r, lb_set
            self.ctx.stats.ilp_solves += solves

    def engines_beside_refinement(self, refines: list[SolvedUnit], engines: list[str], sizes: list[int],
                                  deadline: float | None, goal_s: float, polishes: list[SolvedUnit] | None = None,
                                  whole_gap: float | None = None) -> list[tuple[object, float]]:
        """Run the engine candidates and, in the same batch of tasks, refine `refines` (as `refine`
        does, up to `goal_s`, against the best plan known now); the engine candidates' outs, as
        `finish` returns them. A refined bound holds whatever plan the engines find, so unlike the
        polish beside them (`speculate`) nothing here is speculative, and one worker or many
        do the same. `polishes` (in worker processes only) are polished first in the same batch,
        speculatively, as `speculate` does: their outs wait for a later `finish` that asks for the
        same polish (same unit, bound, templates, best plan, deadline and `whole_gap`), and are
        dropped otherwise. On the 64-GPU ladder rung with `stop_gap` 0.02 the refinement left the
        gap at 2.0016 % and the polish that closed it ran alone after it (0.09 s, one worker idle)."""
        top = min(self.ctx.candidates, key=lambda c: c.step_s)
        ratios = [su.next_ratio() for su in refines]
        ahead = [self._polish_task(su, top.step_s, deadline, whole_gap) for su in (polishes or [])
                 if self.parallel]
        tasks, outs_of = self._engine_tasks(engines, sizes, top.step_s, top.prediction.tail_s / top.step_s)
        outs, forked = self._map(_finish_task, ahead + tasks + self._refine_tasks(refines, ratios, deadline, goal_s))
        self._ahead = {self._polish_key(su, top.step_s, deadline, whole_gap): (su.lb_set, (out, forked))
                       for su, out in zip(polishes or [], outs[:len(ahead)])}
        outs = outs[len(ahead):]
        self._take_refined(refines, ratios, outs[len(tasks):])
        return outs_of(outs[:len(tasks)])

    @property
    def parallel(self) -> bool:
        """Whether tasks run in worker processes (else in turn, in this process)."""
        return self._pool is not None or can_fork(self.workers, 2)

    def finish(self, sus: list[SolvedUnit], engines: list[str], sizes: list[int], deadline: float | None,
               whole_gap: float | None = None) -> tuple[list[tuple[object, float]], bool]:
        """Re-solve a batch of units' plans with tail-capped plan templates (`units.polish_unit`)
        and run the named engine candidates, all in one batch of tasks and each against the best
        plan known now (the engine candidates also get its tail's share of its step). Polished plans
        join the candidates in batch order; the engine candidates' (plan or None, seconds) are
        returned, in `engines` order, for the caller to take, with whether the deadline cut a
        polish short. A polish `speculate` already ran with the same arguments is not run again.
        `whole_gap`: the polishes also search whole copies where that gap is open (`units.polish_unit`)."""
        engine_outs, polish_outs = self._finish_outs(sus, engines, sizes, deadline, whole_gap)
        cut = False
        for su, ((found, solves, pruned, polish_cut), forked) in zip(sus, polish_outs):
            self.ctx.candidates.extend(found)
            self.ctx.stats.ilp_solves += solves
            if forked:  # in turn, the provider counted them already
                su.unit.provider.stats.pruned += pruned
            cut = cut or polish_cut
        return engine_outs, cut

    def speculate(self, sus: list[SolvedUnit], engines: list[str], sizes: list[int], deadline: float | None,
                  whole_gap: float | None = None) -> list[tuple[object, float]]:
        """Run the engine candidates (their outs returned, as `finish` does) and, beside them, the
        polish of `sus` against the best plan now, keeping its outs unmerged for a later `finish`
        that asks for the same polish (same unit, bound, templates, best plan and deadline: the
        same answer). The engine candidates are usually the longest tasks of their batch (the
        mesh chains: 1.1 s on the 64-GPU ladder rung, the Megatron grid beside them 0.2 s); run
        alone they leave a worker idle, and a polish run after them with the best plan they leave
        has the same arguments unless they found a faster plan. In worker processes only."""
        assert self.parallel
        best = min(c.step_s for c in self.ctx.candidates)
        engine_outs, polish_outs = self._finish_outs(sus, engines, sizes, deadline, whole_gap)
        self._ahead = {self._polish_key(su, best, deadline, whole_gap): (su.lb_set, out)
                       for su, out in zip(sus, polish_outs)}
        return engine_outs

    def _polish_task(self, su: SolvedUnit, best: float, deadline: float | None, whole_gap: float | None) -> tuple:
        """The `_finish_task` arguments of `su`'s polish against the best plan `best`."""
        return ("polish", self._index[id(su.unit)], su.unit.lo, su.unit.hi, su.bound_s, su.lb_set, best, deadline,
                whole_gap)

    def _polish_key(self, su: SolvedUnit, best: float, deadline: float | None, whole_gap: float | None) -> tuple:
        """A polish task's arguments but its templates (compared by identity, `_finish_outs`)."""
        return (self._index[id(su.unit)], su.unit.lo, su.unit.hi, su.bound_s, best, deadline, whole_gap)

    def _finish_outs(self, sus: list[SolvedUnit], engines: list[str], sizes: list[int], deadline: float | None,
                     whole_gap: float | None) -> tuple[list, list[tuple[tuple, bool]]]:
        """The engine candidates' task outs, and the polishes' with whether each ran in a worker
        process; the polishes `speculate` left are taken from there (each once)."""
        top = min(self.ctx.candidates, key=lambda c: c.step_s, default=None)  # none: no cutoff
        best, share = (top.step_s, top.prediction.tail_s / top.step_s) if top else (float("inf"), 0.0)
        left, self._ahead = self._ahead, {}  # used once: a polish left over is of a state gone by
        keys = [self._polish_key(su, best, deadline, whole_gap) for su in sus]
        ahead = {k: left[k][1] for k, su in zip(keys, sus) if k in left and left[k][0] is su.lb_set}
        todo = [su for k, su in zip(keys, sus) if k not in ahead]
        # the engine candidates first: each is usually longer than a polish, and one started last
        # leaves the other worker idle (1,024-GPU ladder rung: the Megatron grid's 0.75 s after
        # a 0.37 s polish, beside a 0.5 s one)
        tasks, outs_of = self._engine_tasks(engines, sizes, best, share) if engines else ([], list)
        n_engines = len(tasks)
        tasks += [self._polish_task(su, best, deadline, whole_gap) for su in todo]
        outs, forked = self._map(_finish_task, tasks) if tasks else ([], False)
        ran = iter((out, forked) for out in outs[n_engines:])
        polish = [ahead[k] if k in ahead else next(ran) for k in keys]
        return outs_of(outs[:n_engines]), polish

    def split(self, su: SolvedUnit) -> None:
        """Replace a solved unit of a wide replica class by its parts (`split_counts`), each solved
        as a unit. Each part's templates are costed for its own lowest count, so its own bound is
        at least the class's first one; the class's bound, refined since, holds for every plan of
        the class and so of each part, and each part starts from it where its own is lower (on
        `many_types.py --seed 17` pool 11 [14, 21] refined to 0.4164 s split into single counts
        bounded at 0.399-0.403 s, which eight rounds of refinement raised back to 0.416 s). The
        part holding the lowest count, and every part whose own bound came out at most the
        class's, goes on from the class's refined templates and ratio (`inherit_refinement`):
        refined again from the coarsest ratio, such parts mostly came back to the class's bound
        (`many_types.py --seed 14` pool 23: 49 s -> 39 s, the same plan and bound). The
        least of the parts' bounds bounds every plan of the class."""
        u = su.unit
        parts = [replace(u, lo=lo, hi=hi) for lo, hi in split_counts(u.lo, u.hi)]
        for part in parts:
            self._index[id(part)] = self._index[id(u)]
            self._kept.append(part)  # alive, so its id stays its own
        self.ctx.solved[:] = [s for s in self.ctx.solved if s is not su]
        self.solve(parts)
        best = min(c.step_s for c in self.ctx.candidates)
        mine = {id(part) for part in parts}
        for s in self.ctx.solved:
            if id(s.unit) in mine:
                if su.ratio is not None and (s.unit is parts[0] or s.bound_s <= su.bound_s):
                    inherit_refinement(s, su, self.ctx, best)
                s.bound_s = max(s.bound_s, su.bound_s)
