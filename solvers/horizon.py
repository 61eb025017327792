"""The frontier horizon: which splits a parametric frontier sweep can leave out, given a lower
bound on every plan's pipeline time (`Horizon`, used by `frontier_table.batched_frontier_table`),
and the sweep of (A, C) points with one (`horizon_frontiers`, used by
`capped_points.batched_capped_points`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from solvers.partition import pareto_ac
from solvers.two_runs import Point
from solvers.uniform_layers import INF

NOISE_A = 1e-12  # a row's sweep goes on past `Horizon.a_max` by this much (relative): float noise


@dataclass(frozen=True)
class Horizon:
    """What the listed splits serve: plans whose pipeline time is at least `t_lo` (a bound every
    plan meets, such as the fluid one, `planner.search.bounds`), running `microbatches` in all.

    At pipeline time T a copy of split (A, C) holds min(M, floor((T - A) / C) + 1) microbatches, a
    function of (T - A) / C, and a split of the same row uses the same GPUs. A split j whose
    (T_lo - A_j) / C_j is at most that of a split k of lower C holds no more than k at T_lo, nor at
    any later T (k's count grows faster). So with the row's least A (A_0) and its least C (C_min,
    reached with least A A_min), no split with C above C_min·(T_lo - A_0) / (T_lo - A_min) (when
    T_lo > A_min) is needed: each is matched by the least-C one at every T >= T_lo, in every
    bound and plan the search takes from copy counts; and none but the least-C split where that
    one holds all M at T_lo. On the 64-GPU ladder pool the sweeps solve 49,100 rows instead of
    77,300 (round 0 and the round at C_min included). Tails are not compared: a skipped split may
    have a smaller largest tail (the bound uses each row's least tail anyway; the plan polish adds
    tail-capped splits, and plans move both ways: docs/search.md, "The frontier horizon").

    With `a_max` (a plan's step less the step overhead: `api.search` takes the best Megatron grid's,
    searched first) no split with A above it is needed either: a pipeline running one takes longer
    than A (it holds at least one microbatch), so every plan using it is slower than that plan.
    A row's sweep ends at its first split past it (A only grows as the caps on C fall; to float
    noise, `NOISE_A`: splits of equal A can differ by an ulp), and rows whose least A is past it
    have no split at all. The bounds from such frontiers hold for plans
    at most that fast, which is all the search then needs (`api.search` caps the coverage's bound
    at that plan's step)."""

    t_lo: float
    microbatches: int
    a_max: float = INF

    def top_caps(self, a0: np.ndarray, c_min: np.ndarray, a_min: np.ndarray) -> np.ndarray:
        """Per row, the largest C a needed split can have (+inf: no limit)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            held = (self.t_lo - a_min) / c_min + 1  # what the least-C split holds at T_lo
            top = c_min * (self.t_lo - a0) / (self.t_lo - a_min) * (1 + 1e-9)
        top = np.where(self.t_lo > a_min, top, INF)
        return np.where(held >= self.microbatches, c_min, top)

    def sweep_start(self, a0: np.ndarray, c0: np.ndarray, c_min: np.ndarray,
                    a_min: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """After round 0 (each row's least-A split (A_0, C_0)) and the round at the least C: per
        row, whether the least-A split stays (the top cap is not below it), the cap the sweep
        goes on from (just below C_0, or the top cap), and the C where it ends (-inf where the
        round at C_min found nothing: then no limit). A row whose cap is below its end is done."""
        top = self.top_caps(a0, c_min, a_min)
        floor = np.where(np.isfinite(a_min), c_min, -INF)
        return top >= c0, np.minimum(np.nextafter(c0, -INF), top), floor


def horizon_frontiers(solve: Callable[[list[int], np.ndarray], list[Point | None]],
                      least_c: Callable[[list[int]], np.ndarray], rows: list[int],
                      horizon: Horizon) -> dict[int, list[Point]]:
    """`uniform_layers.parametric_frontiers` with a horizon, for (A, C) points (as
    `frontier_table.batched_frontier_table` sweeps splits): round 0 (least A), each row's least C
    (`least_c`) and the least A there, then each row from the horizon's top cap (or just below its
    round-0 point, which stays when the cap is above it) down to its least C."""
    near = horizon.a_max * (1 + NOISE_A)  # past it a row is done (to float noise: see `a_max`)
    first = {r: p for r, p in zip(rows, solve(rows, np.full(len(rows), INF))) if p is not None and p.a_s <= near}
    live = list(first)
    found: dict[int, list[Point]] = {r: [p] if p.a_s <= horizon.a_max else [] for r, p in first.items()}
    if not live:
        return {}
    c_min = least_c(live)
    at_min = solve(live, c_min)
    a0 = np.array([first[r].a_s for r in live])
    c0 = np.array([first[r].c_s for r in live])
    a_min = np.array([INF if p is None else p.a_s for p in at_min])
    keep_first, caps, floor = horizon.sweep_start(a0, c0, c_min, a_min)
    for r, needed in zip(live, keep_first.tolist()):
        if not needed:
            found[r] = []  # the least-A point: above the top cap
    keep = caps >= floor
    live, caps, floor = [r for r, k in zip(live, keep) if k], caps[keep], floor[keep]
    while live:
        sols = solve(live, caps)
        nxt, nxt_caps, nxt_floor = [], [], []
        for row, sol, lo in zip(live, sols, floor.tolist()):
            if sol is None or sol.a_s > near:
                continue
            if sol.a_s <= horizon.a_max:
                found[row].append(sol)
            if sol.c_s > lo:
                nxt.append(row)
                nxt_caps.append(float(np.nextafter(sol.c_s, -INF)))
                nxt_floor.append(lo)
        live, caps, floor = nxt, np.array(nxt_caps), np.array(nxt_floor)
    return {r: pareto_ac(v) for r, v in found.items() if v}
