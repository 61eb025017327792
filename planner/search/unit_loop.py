"""The large-pool phases of `search`, after the split frontiers: units solved best-first by their
cheap bounds (`best_first`), then (`close_gap`) the engine candidates, the best units' plans
re-solved with tail-capped stage options (the polish, `finish`) and the lowest bounds tightened
toward the gap target (`refine`), in the order that finds the best plan soonest. All of them take units from
one `UnitPool` and add to one `UnitContext`; none depends on how many workers the pool has."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from planner.search.candidates import FLOOR_ENGINES, add_if_faster, wants_chains
from planner.search.history import mark
from planner.search.parallel import UNIT_BATCH, UnitPool
from planner.search.replica_classes import narrow_class
from planner.search.lift import witness_plan
from planner.search.units import SolvedUnit, Unit, UnitContext, skip_units

Progress = Callable[[float, str], None]


def best_first(pool: UnitPool, ctx: UnitContext, start: float, time_limit: float | None,
               progress: Progress | None, stop_gap: float | None = None) -> bool:
    """Solve the pool's units best-first: each unit's least pipeline time with no tails (one LP per
    bisection step) bounds every plan in it, and units are solved in that order, `UNIT_BATCH` at a
    time, until none can beat the best plan found by more than `stop_gap` (None: by 0.1 %); units
    of cut-short sizes only after all others. True if the time limit cut it short."""
    cheap_of = pool.cheap_bounds()
    # units of microbatch sizes whose frontiers a deadline cut short go after all others: their
    # screens make their cheap bounds low, but their plans come from few splits
    tiers: dict[bool, list] = {}
    for i, u in enumerate(pool.units):
        tiers.setdefault(bool(getattr(u.provider, "cut_short", False)), []).append((cheap_of[i], i, u))
    timed_out = False
    done = 0
    for _, members in sorted(tiers.items()):  # past the time limit, a later tier is only bounded
        keyed = sorted(members, key=lambda x: (x[0] is None, x[0] or 0.0, x[1]))  # no bound (no template): last
        timed_out = _best_first_tier(pool, ctx, keyed, start, time_limit, progress, done, len(cheap_of),
                                     stop_gap) or timed_out
        done += len(keyed)
    ctx.timeline["bounded"] = time.perf_counter()  # every unit solved or bounded by its cheap bound
    mark(ctx, "units")
    return timed_out


def _best_first_tier(pool: UnitPool, ctx: UnitContext, keyed: list, start: float, time_limit: float | None,
                     progress: Progress | None, done: int, total: int, stop_gap: float | None = None) -> bool:
    """`best_first` on units sorted by cheap bound, `done` of `total` units taken before them;
    True if the time limit cut it short. A unit whose cheap bound is within `stop_gap` of the best
    plan is only bounded, as a branch-and-bound with a relative gap limit prunes: its cheap bound
    joins the bounds, so the gap reported stays honest; and a unit solved whose bound comes out
    within `stop_gap` of it gets no plan (`units.solve_unit`)."""
    overhead = ctx.cost.knobs.step_overhead_s
    slack = max(1e-3, stop_gap or 0.0)
    timed_out = False
    k = 0
    while k < len(keyed):
        incumbent = min((c.step_s for c in ctx.candidates), default=None)
        if time_limit is not None and time.perf_counter() - start > time_limit and ctx.candidates:
            skip_units(keyed[k:], overhead, ctx)
            return True
        batch: list[Unit] = []
        while k < len(keyed) and len(batch) < UNIT_BATCH:
            cheap, _, u = keyed[k]
            if cheap is not None and incumbent is not None and cheap + overhead >= incumbent / (1 + slack):
                break  # this and every later unit cannot beat the best plan (by the slack): only bounded
            k += 1
            if cheap is not None:
                batch.append(u)
        if not batch:
            skip_units(keyed[k:], overhead, ctx)
            break
        if progress:
            progress((done + k) / total, f"micro_batch {batch[0].b}, pipelines {batch[0].lo}-{batch[-1].hi}")

        def ahead(best: float | None, at: int = k) -> list[Unit]:
            """The units of the next batch if the best plan is then `best` (as the loop takes them)."""
            out: list[Unit] = []
            for cheap, _, u in keyed[at:]:
                if len(out) == UNIT_BATCH or (cheap is not None and best is not None
                                              and cheap + overhead >= best / (1 + slack)):
                    break
                if cheap is not None:
                    out.append(u)
            return out
        timed_out = pool.solve(batch, slack, ahead) or timed_out
        mark(ctx, "units")
    return timed_out


MAX_LIFTS = 48  # units `refine` lifts to whole pipelines' bounds (a cap on the refinement lifts expose)


def refine(ctx: UnitContext, target: float, deadline: float | None, pool: UnitPool,
           witness_plans: bool = True) -> bool:
    """Tighten the lowest unit bounds until the gap is within `target`, the lowest cannot be
    tightened further, or the deadline passes (then True: the time limit left the gap where it
    is). A unit is first refined with tail-capped frontiers (`units.refine_unit`, two units at a
    time); a wide replica class is then split (`UnitPool.split`: tails costed for more pipelines),
    a narrow one only once refined at every ratio (`_finer_first`); a single count is
    refined again with finer tail levels (`units.REFINE_RATIOS`); the lowest unit refined as far
    as that goes gets the bound of whole pipelines (`lift.lift_unit`), once, `MAX_LIFTS` units at
    most, beside the next lowest where that one would be lifted next (`_lift_batch`). A lift that
    leaves its unit short of the goal (best plan / (1 + `target`)) makes that unit's bound the
    floor under the gap (the least such): no refinement can raise the lowest bound past it, so
    the units below it are tightened up to it and no further. (Lifting on toward the goal past
    such a unit took `many_types.py --seed 1` pool 23 from 5.00 to 4.41 % with 182 units refined
    instead of 18; stopping there left units refinable below the floor.) With `witness_plans`
    (the plan polish is on) a lift left short also searches plans near the whole copies that held
    it (`lift.witness_plan`); a faster one lowers the goal."""
    best = min(c.step_s for c in ctx.candidates)
    floor: float | None = None  # the bound of a unit lifted as far as it goes, below the goal

    def reached(bound: float) -> bool:
        return best <= (1 + target) * bound or (floor is not None and bound >= floor)

    while ctx.solved:
        lowest = min(su.bound_s for su in ctx.solved)
        if reached(min(lowest, min(ctx.bounds, default=np.inf))):
            return False  # within the target, or at the floor
        if deadline is not None and time.perf_counter() > deadline:
            return True
        if min(ctx.bounds, default=np.inf) < lowest:
            return False  # a skipped unit's cheap bound is the lowest: refining solved units cannot help
        goal = best / (1 + target) if floor is None else floor  # a floor is set below that goal
        open_units = [su for su in sorted(ctx.solved, key=lambda x: x.bound_s) if not reached(su.bound_s)
                      and (su.next_ratio() is not None or su.unit.lo < su.unit.hi)]
        # units at the lowest bound that refinement cannot raise: only a lift can, and until it
        # does no other unit's refinement raises the lowest bound, so they go first (the parts of a
        # split class start from its bound together: `many_types.py --seed 17` pool 11 refined six
        # single counts at 0.4164 s, all of them as far as they go, before lifting the first)
        stuck = [su for su in ctx.solved if su.bound_s == lowest and not su.lifted and su not in open_units]
        lifted = ctx.explored.get("units_lifted", 0)
        if not open_units or open_units[0].bound_s > lowest or (stuck and lifted < MAX_LIFTS):
            if not stuck or lifted >= MAX_LIFTS:
                return False
            batch = _lift_batch(ctx, min(stuck, key=lambda su: (su.unit.b, su.unit.lo)), reached)[:MAX_LIFTS - lifted]
            # the refinements the loop takes next, were these lifts to reach the goal, run beside them
            beside = _refine_batch(open_units, UNIT_BATCH - len(batch))
            pool.lift(batch, goal, deadline, beside)
            ctx.explored["units_lifted"] = lifted + len(batch)
            ctx.explored["units_refined"] += len(beside)
            mark(ctx, "lift")
            for low in batch:
                if witness_plans and low.bound_s < goal * (1 - 1e-6) and witness_plan(low, ctx, best, deadline):
                    mark(ctx, "lift_witness")
                    # whole copies near the lift's witness beat the best plan: a lower goal
                    best = min(c.step_s for c in ctx.candidates)
                    goal = best / (1 + target) if floor is None else min(floor, best / (1 + target))
                if low.bound_s < goal * (1 - 1e-6):
                    floor = low.bound_s if floor is None else min(floor, low.bound_s)
            continue
        low = open_units[0]
        if _split_due(low):
            pool.split(low)
            ctx.explored["units_split"] += 1
            mark(ctx, "split")
            continue
        batch = _refine_batch(open_units, UNIT_BATCH)
        pool.refine(batch, deadline, goal_s=goal)
        ctx.explored["units_refined"] += len(batch)
        mark(ctx, "refinement")
    return False


def _split_due(su: SolvedUnit) -> bool:
    """Whether a refined replica class is split before it is refined again (`_finer_first`)."""
    return su.ratio is not None and su.unit.lo < su.unit.hi and not _finer_first(su)


def _refine_batch(open_units: list[SolvedUnit], room: int) -> list[SolvedUnit]:
    """Up to `room` of the open units (lowest bound first) to refine next: none where the lowest
    is due a split, which comes first."""
    if room <= 0 or not open_units or _split_due(open_units[0]):
        return []
    return [su for su in open_units if su.ratio is None or su.unit.lo == su.unit.hi or _finer_first(su)][:room]


def _lift_batch(ctx: UnitContext, first: SolvedUnit, reached: Callable[[float], bool]) -> list[SolvedUnit]:
    """`first` (the lowest unit, refined as far as it goes) and, up to `UNIT_BATCH`, the units
    the loop would lift right after it were its lift to reach the goal: each next lowest while it
    is not lifted, not within reach, refined as far as it goes and not above a skipped unit's
    cheap bound. Lifts are the longest single tasks of refinement (0.4-2.6 s each, 17 of them on
    `many_types.py --seed 14` pool 23), so they run in worker processes side by side; one that
    turns out not needed (the first lift stops short, and the floor it sets is below the next
    unit) only raised a valid bound."""
    batch = [first]
    cheapest = min(ctx.bounds, default=np.inf)
    for su in sorted((s for s in ctx.solved if s is not first), key=lambda s: (s.bound_s, s.unit.b, s.unit.lo)):
        if (len(batch) >= UNIT_BATCH or su.lifted or reached(su.bound_s) or su.bound_s > cheapest
                or su.next_ratio() is not None or su.unit.lo < su.unit.hi):
            break
        batch.append(su)
    return batch


def _finer_first(su: SolvedUnit) -> bool:
    """Whether a replica class already refined is refined again at its next ratio before it is
    split: a narrow one (`replica_classes.narrow_class`), at every ratio. Its tails are costed for its
    lowest count, and a split leaves that count's part with the class's bound while every other
    part starts again from the coarsest ratio (a class of more than `SPLIT_SINGLETONS` counts
    peels one count per split): on `chain_check.py --seed 40` pool 18 (OPT-350M on 56 GPUs) [9, 13]
    refined at 1.15 as a class reached the goal at once (18 units refined against 64, 17 s
    against 38 s); on `many_types.py --seed 2` pool 22 (OPT-350M, ZeRO-1, 96 GPUs) classes left
    1.05 to their parts were peeled count by count, 200 units refined, 114 s, against 25 units,
    21 s, the same plan and bound (docs/search.md, "Bound refinement", for the cost on small
    pools). A wide class is split after its first ratio."""
    return narrow_class(su.unit.lo, su.unit.hi) and su.next_ratio() is not None


def gap_missed(ctx: UnitContext, target: float) -> bool:
    """Whether the best plan is more than `target` above the lowest bound of the solved units and
    of the units only bounded (their cheap bounds)."""
    best = min(c.step_s for c in ctx.candidates)
    return best > (1 + target) * min([su.bound_s for su in ctx.solved] + ctx.bounds, default=best)


POLISH_UNITS = 4  # lowest-bound units whose plans `polish` re-solves when the gap target is missed
POLISH_TAIL_SHARE = 0.05  # ... or when the best plan's tail is at least this share of its step
POLISH_SOFT_UNITS = 2  # ... otherwise


def finish(ctx: UnitContext, target: float, deadline: float | None, pool: UnitPool, sizes: list[int],
           polish: str | None, engines: list[str], prune: float = 1e-3) -> tuple[bool, dict[str, float]]:
    """The last phase: the plan polish (`polish` "auto" or "always"; None: none) and the engine
    candidates (`candidates.ENGINE_CANDIDATES` in `engines`), which run alongside its first batch.

    Polish: re-solve the plans of the lowest-bound units that could still hold a faster plan with
    tail-capped plan templates (`units.polish_unit`), in bound order, `UNIT_BATCH` at a time, each
    batch against the best plan when it starts (so the answer does not depend on `workers`):
    `POLISH_UNITS` of them when refinement leaves the gap above `target` or the best plan's tail
    (exposed gradient sync and optimizer step) is a large share of its step, else
    `POLISH_SOFT_UNITS` ("always": `POLISH_UNITS` whatever the gap and tails), then the units the
    best plan came from, where a plan near it is (on `benchmarks/chain_check.py --seed 11` pool 8
    the four lowest bounds lay within 0.02 % of each other and did not include them; polishing
    one gave 0.62139 s against 0.62729 s).
    Tail-blind options cost most where tails weigh most: on 40 random small pools the plans left up
    to 0.7 % behind the best Megatron grid all had tails of 6-15 % of the step. Within the target
    the two lowest units still found 0.02-1.26 % faster plans on 4 of 20 pools (sailor-opt-350m
    1.26 %, its gap 1.50 %; `benchmarks/polish_check.py`), for 0-2 s more search (about a fifth
    more on those pools; 2 s on the 64-GPU ladder rung, for 0.02 %, when units were polished one
    after the other in the parent). A unit whose bound is within 0.1 % of the best plan is not
    polished, nor one polished before and not refined since (`SolvedUnit.polish_due`).

    Engine candidates (when `close_gap` did not run them before refinement) use the best step
    before the polish as their cutoff and are taken, in
    `engines` order, only when faster than the best plan after it: a looser cutoff changes what
    they may spend, not which plan faster than the final best they find (`candidates`).

    Where the best plan is more than `target` above a polished unit's bound the polish also
    searches whole copies (`units.polish_unit`), since rounding the LP's can miss them.

    A unit is polished only while its bound is more than `prune` below the best plan (with
    `stop_gap`, `close_gap` passes it here, as a branch-and-bound with a gap limit prunes nodes
    within it of the incumbent).

    Returns whether the deadline stopped the polish before every such unit was polished, and the
    seconds each engine candidate took."""
    todo = polish_order(ctx, target, polish)
    timed_out = False

    def next_batch() -> list[SolvedUnit]:
        """The next units to polish; none once one cannot beat the best plan (bound order: no
        later one can either) or the deadline has passed."""
        nonlocal todo, timed_out
        batch, todo = _next_polish(todo, min(c.step_s for c in ctx.candidates), prune)
        if batch and deadline is not None and time.perf_counter() > deadline:
            timed_out, batch, todo = True, [], []
        for su in batch:
            su.polished = (su.ratio,)
        return batch

    batch = next_batch()
    engine_found, cut = pool.finish(batch, engines, sizes, deadline, target) if batch or engines else ([], False)
    mark(ctx, "polish")
    while batch:
        ctx.explored["units_polished"] += len(batch)
        batch = next_batch()
        if batch:
            cut = pool.finish(batch, [], sizes, deadline, target)[1] or cut
            mark(ctx, "polish")
    return timed_out or cut, _take(ctx, engines, engine_found)


def polish_order(ctx: UnitContext, target: float, polish: str | None,
                 leave_out: list[SolvedUnit] | None = None) -> list[SolvedUnit]:
    """The units `finish` would polish now, in order: the lowest-bound ones (`POLISH_UNITS` or
    `POLISH_SOFT_UNITS`), then those the best plan came from, each only if due; of the solved
    units but `leave_out`."""
    if polish is None:
        return []
    top = min(ctx.candidates, key=lambda c: c.step_s)
    best = top.step_s
    strong = polish == "always" or gap_missed(ctx, target) or top.prediction.tail_s >= POLISH_TAIL_SHARE * best
    solved = [su for su in ctx.solved if not leave_out or su not in leave_out]
    todo = sorted(solved, key=lambda x: x.bound_s)[:POLISH_UNITS if strong else POLISH_SOFT_UNITS]
    # and the units the best plan came from: a plan near it is there
    origin = {c.unit for c in ctx.candidates if c.step_s == best}
    todo += sorted((su for su in solved if (su.unit.b, su.unit.lo, su.unit.hi) in origin and su not in todo),
                   key=lambda x: x.bound_s)
    return [su for su in todo if su.polish_due()]


def _next_polish(todo: list[SolvedUnit], best: float, prune: float = 1e-3) -> tuple[list[SolvedUnit],
                                                                                    list[SolvedUnit]]:
    """The next batch of `todo` and what is left after it: at most `UNIT_BATCH` units that could
    still beat `best` by `prune` (0.1 %), and nothing left once one cannot (bound order: no later
    one can)."""
    batch = [su for su in todo[:UNIT_BATCH] if su.bound_s < best / (1 + prune)]
    return batch, (todo[UNIT_BATCH:] if len(batch) == UNIT_BATCH else [])


def close_gap(ctx: UnitContext, pool: UnitPool, sizes: list[int], target: float | None, polish: str | None,
              early: list[str], late: Callable[[bool], list[str]], deadline: float | None,
              stop_gap: float | None = None) -> tuple[bool, dict[str, float]]:
    """After the best-first units: the engine candidates, the plan polish and refinement, ordered
    so that the best plan, which sets refinement's goal, is found before refinement rather than
    after it. `early` engines are taken first (`run_engines`; where they run whatever the plans,
    `api.search` started them at the first plan, beside the units, `UnitPool.start_engines_at_first_plan`;
    in worker processes with the polish batch `finish` would take next beside them, `UnitPool.speculate`,
    whose outs that `finish` takes if they find nothing faster: the same answer, and no worker idles
    while the other runs the mesh chains); then, where the gap is above `target`,
    the polish (`finish`, no engines); then refinement toward `target` (None: none); then `finish`
    with the `late(gap_open)` engines (none if the early ones ran), polishing only units refined
    since their last polish (`SolvedUnit.polish_due`). `polish` is `finish`'s mode. On
    `chain_check.py --seed 28` pool 9 (GPT-Neo 2.7B on 24 H100 + 24 A10) the polish found its
    0.76655 s plan before refinement instead of a 0.76728 s one after: 42 units refined instead of
    72, 45 s instead of 80 s. Past the deadline only the floor engine candidates run
    (`candidates.FLOOR_ENGINES`: the Megatron grid, so that a time-limited answer is not slower
    than the best grid either; with the best plan as its cutoff it costs 0.4, 1.3 and 2.0 s past
    a 1 s limit on the 64, 1,024 and 16,384-GPU ladder pools, `search_scale.py --time-limit 1`).

    With `stop_gap` the polish, refinement (toward the larger of `target` and `stop_gap`) and the late
    engine candidates but the floor ones are skipped once the best plan is within it of the lowest
    bound, as a branch-and-bound with a relative gap limit stops; `ctx.explored["stopped_at_gap"]` then
    says so. Before that, units whose bound is within it of the best plan are not polished (`finish`'s
    `prune`), as such a branch-and-bound prunes nodes, and the `early` engines run beside the first
    batch of refinement (`UnitPool.engines_beside_refinement`) rather than beside a speculated polish:
    the gap limit is met by raising the bound, and a refined bound holds whatever the engines find.
    The polish then runs only where the gap is still open, on the units lowest after that refinement
    (`ab_check.py --stop-gap 0.02` on 74 pools: no plan slower, four faster, 13 bounds higher, the
    time within 3 % either way; `many_types.py --seed 5` pool 17 took 8.2 s instead of 4.6 s for a
    plan 1.9 % faster, gap 0.8 % instead of 2.0 %). Without a gap limit the polish keeps its place
    beside the engines: polished after that refinement batch, the same pool missed its polish's
    201.74 s plan and ended at 2.3 %, above the 1.5 % target. The `early` engines still run: they
    are there for the pipelines the bound does not cover, which no gap speaks for (skipping them too
    gave plans 2.9-4.9 % slower than the full search's on 4 of 30 `chain_check.py --seed 31` pools).
    All of refinement before them and the polish, which raised the bound to 2 % on the 64-GPU ladder
    rung in 2.0 s instead of 3.1-3.5 s, refined 19 units instead of 8 on one of those pools, 20 s
    instead of 12 s: it chases the plan the polish and chains would have improved. Returns whether
    the deadline cut something short, and the seconds each engine candidate took."""
    def past() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    def met() -> bool:
        return stop_gap is not None and not gap_missed(ctx, stop_gap)

    goal_gap = target if target is None or stop_gap is None else max(target, stop_gap)
    # with `stop_gap` a unit whose bound is within it of the best plan is not polished: on the
    # 64-GPU ladder rung the two above the gap's goal took 0.4 s before the refinement that met it
    prune = max(1e-3, stop_gap or 0.0)
    # engine candidates the deadline leaves out count as work it cut short; the floor ones run
    # anyway, last
    skipped = bool(early) and past()
    timed_out = skipped
    seconds: dict[str, float] = {}
    if early and not skipped:
        first = _first_refinement(ctx, goal_gap) if stop_gap is not None and goal_gap is not None else []
        if first:
            # with a gap limit the bound is what ends the search: the refinement `refine` would
            # start with runs beside the engines instead of a speculated polish (the 64-GPU ladder
            # rung: the engines' batch 0.30 s against 0.39 s, and its polish found a faster plan)
            goal = min(c.step_s for c in ctx.candidates) / (1 + goal_gap)
            # beside them, speculatively, the polish `finish` would run next if the refinement left
            # the gap open and lifted the units it refines out of the polish's way (taken only if
            # asked for with the same arguments: the same answer)
            best = min(c.step_s for c in ctx.candidates)
            ahead = _next_polish(polish_order(ctx, goal_gap, polish, first), best, prune)[0]
            seconds = _take(ctx, early, pool.engines_beside_refinement(first, early, sizes, deadline, goal, ahead,
                                                                       goal_gap))
            ctx.explored["units_refined"] += len(first)
            mark(ctx, "refinement")
        elif pool.parallel and polish is not None:
            # beside them, the polish batch `finish` would take next if they find nothing faster
            # (then the polish below takes its outs instead of running it again; the same answer)
            # with the gap `finish` will be asked for (with `stop_gap` above `target`, speculating
            # at `target` gave keys no later polish matched: on the 64-GPU ladder rung two polishes
            # ran twice)
            first, _ = _next_polish(polish_order(ctx, goal_gap or 0.0, polish), min(c.step_s for c in ctx.candidates),
                                    prune)
            seconds = _take(ctx, early, pool.speculate(first, early, sizes, deadline, goal_gap or 0.0))
        else:
            seconds = run_engines(ctx, pool, early, sizes, deadline)
    if goal_gap is not None and not met():
        if polish is not None and gap_missed(ctx, goal_gap):
            timed_out = finish(ctx, goal_gap, deadline, pool, sizes, polish, [], prune)[0] or timed_out
        timed_out = refine(ctx, goal_gap, deadline, pool, witness_plans=polish is not None) or timed_out
    stopped = met()
    if early:
        engines = [e for e in early if e in FLOOR_ENGINES] if skipped else []
    else:
        engines = late(goal_gap is not None and gap_missed(ctx, goal_gap))
    if engines and (past() or stopped):
        timed_out = timed_out or (not stopped and any(e not in FLOOR_ENGINES for e in engines))
        engines = [e for e in engines if e in FLOOR_ENGINES]
    cut, more = finish(ctx, goal_gap or 0.0, deadline, pool, sizes, None if stopped else polish, engines, prune)
    seconds.update(more)
    ctx.explored["stopped_at_gap"] = int(stopped)
    return cut or timed_out, seconds


def _first_refinement(ctx: UnitContext, target: float) -> list[SolvedUnit]:
    """The batch of units `refine` would refine first toward `target` (none where it would first
    lift or split a unit, or stop: a skipped unit's cheap bound lowest, or the gap met)."""
    if not ctx.solved or not gap_missed(ctx, target):
        return []
    goal = min(c.step_s for c in ctx.candidates) / (1 + target)
    lowest = min(su.bound_s for su in ctx.solved)
    if min(ctx.bounds, default=np.inf) < lowest:
        return []
    open_units = [su for su in sorted(ctx.solved, key=lambda x: x.bound_s) if su.bound_s < goal
                  and (su.next_ratio() is not None or su.unit.lo < su.unit.hi)]
    if not open_units or open_units[0].bound_s > lowest:
        return []
    return _refine_batch(open_units, UNIT_BATCH)


def run_engines(ctx: UnitContext, pool: UnitPool, engines: list[str], sizes: list[int],
                deadline: float | None) -> dict[str, float]:
    """Run the engine candidates now (or take those started at the first plan), before refinement,
    and take each one faster than the best plan; the seconds each took. `close_gap` does this where
    the mesh-chain candidate runs whatever the gap (the coverage leaves pipelines out): a chain
    faster than the coverage's plans lowers refinement's goal before any unit is refined, not after
    (`chain_check.py --seed 31` pool 26: refinement took 53 of a 77 s search, toward a goal the
    chain then beat)."""
    return _take(ctx, engines, pool.finish([], engines, sizes, deadline)[0])


def _take(ctx: UnitContext, engines: list[str], found: list[tuple[object, float]]) -> dict[str, float]:
    """Add each engine candidate's plan when faster than the best (`add_if_faster`), in `engines`
    order; the seconds each took."""
    seconds: dict[str, float] = {}
    for name, (plan, spent) in zip(engines, found):
        add_if_faster(ctx, plan, f"{name}_added")
        mark(ctx, name)
        seconds[name] = spent
    return seconds


def beyond_coverage(ctx: UnitContext, pool: UnitPool, sizes: list[int], chains: str, coverages: set[str],
                     deadline: float | None, target: float | None = None, witness_plans: bool = True
                     ) -> tuple[float, float, bool]:
    """Where no plan of the coverage fits (pipelines of at most its runs), the engine candidates
    before `api.search` says the model fits nowhere: every mesh chain (pipelines of any number of
    runs; unless `chains` is "never"), then the Megatron grids under the chain's plan as cutoff.
    Llama-2 70B at 8,192 tokens on 206 GPUs of seven types: no two-run plan fits, a chain of
    89.3 s does; the grids then took 0.2 s, against 25-36 s without a cutoff. Where the coverage's
    units found no plan but bound theirs, those bounds are then refined toward the plan found
    (`refine`, `target` as `refine_gap`): left as they were, OPT-30B at 32k tokens on 46 GPUs of
    five types (`many_types.py --seed 3` pool 12) reported a gap of 5.8 % (1.2 % refined), Llama-2
    70B on 92 GPUs of six types (`--seed 11` pool 0) 18.6 % (1.3 %). Their seconds, and whether
    the deadline passed with no plan (the grids are left out then) or stopped refinement."""
    chain_s = grid_s = 0.0
    if wants_chains(chains, coverages, ctx.classes, idle_share=1.0):  # with no plan every GPU is idle
        chain_s = run_engines(ctx, pool, ["chain"], sizes, deadline)["chain"]
    if not ctx.candidates and deadline is not None and time.perf_counter() > deadline:
        return grid_s, chain_s, True
    grid_s = run_engines(ctx, pool, ["megatron_grid"], sizes, deadline)["megatron_grid"]
    timed_out = bool(ctx.candidates) and target is not None and refine(ctx, target, deadline, pool, witness_plans)
    return grid_s, chain_s, timed_out
