"""The frontier horizon: which splits a parametric frontier sweep can leave out, given a lower
bound on every plan's pipeline time (`frontier_table.batched_frontier_table`,
`batched_runs.batched_capped_points`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.uniform_layers import INF


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
    tail-capped splits, and plans move both ways: docs/search.md, "The frontier horizon")."""

    t_lo: float
    microbatches: int

    def top_caps(self, a0: np.ndarray, c_min: np.ndarray, a_min: np.ndarray) -> np.ndarray:
        """Per row, the largest C a needed split can have (+inf: no limit)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            held = (self.t_lo - a_min) / c_min + 1  # what the least-C split holds at T_lo
            top = c_min * (self.t_lo - a0) / (self.t_lo - a_min) * (1 + 1e-9)
        top = np.where(self.t_lo > a_min, top, INF)
        return np.where(held >= self.microbatches, c_min, top)
