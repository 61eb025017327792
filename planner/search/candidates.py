"""Plans from engine-restricted searches, added to the full search's candidates when faster.

They run with the best step so far as a cutoff and are taken only when faster than the best plan:
before refinement where the chains run whatever the gap (so that their plan sets refinement's
goal), else after it alongside the plan polish (`unit_loop.close_gap`):
the best Megatron grid (the issue's "never slower than the best uniform Megatron plan", by
construction) and the most promising FlagScale mesh chains (pipelines of any number of runs, which
the blocks coverage caps). Their plans may lie outside the bound's coverage;
`explain.outside_coverage` says so.
"""

from __future__ import annotations

import math
import time

from planner.plan import Plan, Prediction
from planner.search.chain_resplit import best_resplit
from planner.search.flagscale_grid import flagscale_plans
from planner.search.megatron_grid import best_megatron_plan, best_single_type_plan
from planner.search.space import ResourceClass
from planner.search.units import Candidate, UnitContext, coverage_rank


def megatron_grid_candidate(ctx: UnitContext, sizes: list[int], cutoff_s: float,
                            tail_share: float = 0.0) -> tuple[Plan, Prediction] | None:
    """The best Megatron grid if it beats `cutoff_s` (`megatron_grid.best_megatron_plan`), taken
    when it beats the best plan (`add_if_faster`), so the answer is never slower than any grid: the
    grids' space is not inside the blocks coverage's (their pipelines may run through several GPU
    types in file order), and the plan LP stops within 0.1 % of its bound, which let plans trail a
    grid by up to 0.05 % on random small pools (`benchmarks/grid_check.py --seed 6`). With a
    cutoff every grid is pruned by bounds alone unless it can win: 0.04-0.12 s up to 64 GPUs,
    0.3-0.6 s from 128 to 16,384 on the ladder pools (stat `megatron_grid_s`). It can only
    replace the answer of refinement and the polish. Grids on one GPU type alone whose nodes do not
    open the file (no prefix holds them) are searched too (`best_single_type_plan`), so the answer
    is never slower than those either (the issue's "nor than the best plan on any single GPU type
    alone")."""
    if ctx.early_grid is not None:  # searched without a cutoff already (`early_grid`)
        found = ctx.early_grid[0]
        found = found if found is not None and found[1].step_s <= cutoff_s else None
    else:
        found = best_megatron_plan(ctx.model, ctx.cluster, ctx.training, ctx.cost, sizes, cutoff_s=cutoff_s)
    cutoff_s = found[1].step_s if found is not None else cutoff_s
    alone = best_single_type_plan(ctx.model, ctx.cluster, ctx.training, ctx.cost, sizes, cutoff_s=cutoff_s)
    return alone if alone is not None and (found is None or alone[1].step_s < found[1].step_s) else found


EARLY_GRID_MAX_GPUS = 64  # pools up to this size search the Megatron grid before the frontiers,
EARLY_GRID_MIN_ROWS = 6_000  # ... where the frontiers sweep at least this many skeleton rows in all,
EARLY_GRID_MIN_LIMIT_S = 10.0  # ... and no time limit under this is set


def wants_early_grid(gpus: int, rows: int, time_limit: float | None = None) -> bool:
    """Whether `api.search` runs `early_grid` before the frontiers: on pools of at most
    `EARLY_GRID_MAX_GPUS` GPUs whose frontiers sweep at least `EARLY_GRID_MIN_ROWS` rows (summed
    over the microbatch sizes). The grid takes a worker for 0.1 s without a cutoff; the 32- and
    64-GPU ladder rungs (10,400-10,600 rows) gain 0.05-0.1 s, the 16-GPU rung (3,700 rows, frontiers
    of 0.05-0.07 s per size) lost 0.05 s (fresh processes, alternating, with `stop_gap` 0.02). On
    random pools it took up to 1.06 s (`chain_check.py --seed 40` pool 23, 52 GPUs; that search
    still gained): not under a short `time_limit` (below `EARLY_GRID_MIN_LIMIT_S`), whose frontier
    deadline (80 % of it) it would eat into; there the grid runs as before, after the units."""
    return (gpus <= EARLY_GRID_MAX_GPUS and rows >= EARLY_GRID_MIN_ROWS
            and (time_limit is None or time_limit >= EARLY_GRID_MIN_LIMIT_S))


def early_grid(ctx: UnitContext, sizes: list[int]) -> tuple[tuple[tuple[Plan, Prediction] | None, float], float]:
    """The best Megatron grid without a cutoff, and the cap it puts on every split frontier's A
    (`BlocksProvider.cap_pipeline_time`): its step less the step overhead (a pipeline holds at
    least one microbatch, so a plan with a split of larger A is slower than the grid's plan; +inf
    without a grid). `api.search` runs it first where `wants_early_grid`, beside the smallest
    microbatch sizes' frontiers (`frontier_workers.prefetch_frontiers`), and keeps it as
    `ctx.early_grid`, which later runs of `megatron_grid_candidate` take instead of searching those
    grids again; the grids on one GPU type alone are left to them, under the best plan's cutoff
    (0.02-0.03 s of the 0.12-0.15 s the early grid took on the 64-GPU ladder rung)."""
    start = time.perf_counter()
    found = best_megatron_plan(ctx.model, ctx.cluster, ctx.training, ctx.cost, sizes)
    cap = math.inf if found is None else (found[1].step_s - ctx.cost.knobs.step_overhead_s) * (1 + 1e-9)
    return (found, time.perf_counter() - start), cap


def add_if_faster(ctx: UnitContext, found: tuple[Plan, Prediction] | None, stat: str) -> None:
    """Add `found` as a candidate when strictly faster than the best plan (a tie adds nothing),
    counted in `stat`."""
    best = min((c.step_s for c in ctx.candidates), default=float("inf"))
    if found is not None and found[1].step_s < best:
        plan, pred = found
        ctx.candidates.append(Candidate(pred.step_s, plan, pred, plan.micro_batch))
        ctx.explored[stat] = 1


CHAIN_MAX_DP = 128  # partition DPs of the chain candidate: its most promising chains only
CHAIN_DEEP_DP = 512  # ... where the best plan's tail is at least CHAIN_TAIL_SHARE of its step
CHAIN_TAIL_SHARE = 0.05
CHAIN_MAX_GPUS = 64  # "auto" pools: above, many pipelines mix GPU types in the LP instead
CHAIN_IDLE_SHARE = 0.1  # ... or pools of any size whose best plan leaves this share of GPUs idle


def wants_chains(chains: str, coverages: set[str], classes: list[ResourceClass], gap_open: bool = False,
                 idle_share: float = 0.0) -> bool:
    """Whether the mesh-chain candidate runs: "auto" on pools of at most `CHAIN_MAX_GPUS` GPUs
    where the blocks coverage leaves out some pipelines (more GPU classes than its runs, or mixed
    pipelines capped in length), or where refinement left the gap above its target (`gap_open`:
    the chains are costed with their real tails, which the split frontiers leave out). On the
    ladder pools of 128-16,384 GPUs it took 1.0-2.8 s and never won (`benchmarks/search_scale.py
    --chains always`); on random pools of 4-36 GPUs it won up to 5.5 % (`benchmarks/chain_check.py`).
    On pools of any size also where the best plan leaves at least `CHAIN_IDLE_SHARE` of the GPUs
    idle (`idle_share`): pipelines of at most two runs cannot put them to work, chains of more runs
    may. Llama-2 70B at 4,096 tokens on 206 GPUs of seven types (`tests/test_beyond_coverage.py`): the
    coverage's best plan ran 64 GPUs at 85.5 s per step, a chain runs 184 at 30.5 s."""
    if chains == "never" or not coverages or "exact" in coverages:
        return False
    if chains == "always" or idle_share >= CHAIN_IDLE_SHARE:
        return True
    narrowest = min(coverages, key=coverage_rank)
    left_out = coverage_rank(narrowest)[0] < len(classes) or "mixed<=" in narrowest
    return sum(rc.gpus for rc in classes) <= CHAIN_MAX_GPUS and (left_out or gap_open)


def chain_candidate(ctx: UnitContext, sizes: list[int], cutoff_s: float,
                    tail_share: float = 0.0) -> tuple[Plan, Prediction] | None:
    """The best of the most promising FlagScale mesh chains (`flagscale_grid`, best-first by
    bound, `CHAIN_MAX_DP` partition DPs, pruned by `cutoff_s`), to take when it beats the best plan
    (`add_if_faster`). A chain is one pipeline template, replicated, of meshes each on one GPU
    type with its own tp and stage dp: any number of runs, which the blocks coverage caps. On 40
    random pools of two or three types (`benchmarks/chain_check.py`) it found plans up to 5.5 %
    faster, where three-run pipelines of eight stages use every GPU. Its queue is taken in order
    of bounds that every chain behind an entry costs at least, so under a looser cutoff the chains
    that beat a tighter one come from the same DPs in the same order, before any extra work
    (`unit_loop.close_gap` runs it against the best plan before refinement or before the
    polish after it).

    Where the best plan's tail (exposed gradient sync and optimizer step) is at least
    `CHAIN_TAIL_SHARE` of its step (`tail_share`), `CHAIN_DEEP_DP` DPs: fewer, longer pipelines
    sync over fewer replicas, and the bounds that order the queue count only the least tail any
    split of a chain can have, so such chains may come late. On `chain_check.py --seed 23` two
    pools with tails of 7-16 % of the step got chains 1.3 and 2.3 % faster than with 128 DPs; the
    candidate took 0.7-2.4 s there instead of 0.2-0.5 s (one run each, beside another search).

    With no plan to beat (`cutoff_s` infinite: no plan of the coverage fits) every chain is
    searched, so that "fits nowhere" holds for them too: Llama-2 70B at 8,192 tokens on 206 GPUs of
    seven types has no plan of two-run pipelines, and its first chain that fits lies past the 128
    most promising DPs (a 89.3 s step on 184 GPUs, 21 s of chain search).

    The chains kept (the `flagscale_grid._KEEP` fastest found) are then re-split with every stage's
    shape free (`chain_resplit.best_resplit`: the same stage device groups, FlagScale's one
    recompute mode and cp no longer imposed, each against the best plan and the fastest so far):
    that pool's chains run 67.4 s so (the fastest chain re-split: 69.6 s)."""
    return best_resplit(ctx, chain_search(ctx, sizes, cutoff_s, tail_share), cutoff_s)


def chain_search(ctx: UnitContext, sizes: list[int], cutoff_s: float,
                 tail_share: float = 0.0) -> list[tuple[Plan, Prediction] | None]:
    """The chains `chain_candidate` re-splits: the `flagscale_grid._KEEP` fastest that beat
    `cutoff_s` (every chain where it is infinite), fastest first."""
    if math.isinf(cutoff_s):  # no plan yet (`api.search`): every chain, as `--target flagscale`
        found, _ = flagscale_plans(ctx.model, ctx.cluster, ctx.training, ctx.cost, sizes)
    else:
        budget = CHAIN_DEEP_DP if tail_share >= CHAIN_TAIL_SHARE else CHAIN_MAX_DP
        found, _ = flagscale_plans(ctx.model, ctx.cluster, ctx.training, ctx.cost, sizes, cutoff_s=cutoff_s,
                                   max_dp=budget)
    return found


def resplit_chains(ctx: UnitContext, found: list[tuple[Plan, Prediction] | None],
                   cutoff_s: float) -> tuple[Plan, Prediction] | None:
    """`chain_candidate`'s last step on the chains `chain_search` kept (`chain_resplit.best_resplit`)."""
    return best_resplit(ctx, found, cutoff_s)


ENGINE_CANDIDATES = {"megatron_grid": megatron_grid_candidate, "chain": chain_candidate}
# engine candidates in two steps, (search, last step): started at the first plan
# (`parallel.UnitPool.start_engines_at_first_plan`) only the search runs then; the last step runs
# when their outs are taken, against the best plan then. The re-split of the chains kept re-splits
# all of them where the fastest one's re-split beats its cutoff: against the first plan (64-GPU
# ladder rung, 7.080 s) all eight were re-split, 0.34 s; against the best plan when taken
# (6.995 s) one was.
ENGINE_STEPS = {"chain": (chain_search, resplit_chains)}
# engine candidates that run even past a time limit: a time-limited answer is never slower than
# the best Megatron grid (on the 64, 1,024 and 16,384-GPU ladder pools with a 1 s limit the answer
# had trailed it by 0.2-10.6, 4.5 and 6.7 %), for the grid's time under the best plan's cutoff
FLOOR_ENGINES = ("megatron_grid",)
