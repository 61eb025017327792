"""A dense revised simplex for the assignment LPs: max c·x s.t. A x <= b, x >= 0, where A >= 0 and
b >= 0 have a handful of rows (one per GPU class and one for the pipeline count).

Why not a general LP solver: the search solves these LPs thousands of times with only c changing
(the copies each template can hold at a trial pipeline time). The last optimal basis stays feasible
when only c changes, so a few pivots finish each solve; through a solver's Python binding the
per-call overhead was most of the time (HiGHS: ~0.3 ms a solve, against ~0.05 ms here).

One row of the other sense, d·x >= least (a unit's fewest pipelines, `solvers.count_floor`), is
priced instead of added (`solve_priced`, a parametric walk from the optimum without it), so x = 0
stays the start. Pivoting is Dantzig's rule, switching to Bland's rule (which cannot cycle) after
`DANTZIG_PIVOTS` pivots of one solve. The basis inverse is recomputed at each pivot (at most a 6x6 matrix), so
rounding does not accumulate. `tests/test_small_lp.py` checks optimal values against HiGHS.
"""

from __future__ import annotations

import math

import numpy as np

DANTZIG_PIVOTS = 50
MAX_PIVOTS = 2000


class SmallLP:
    """One LP's constraints; `solve(c)` for any number of objectives, each warm-started from the
    previous optimal basis."""

    def __init__(self, a: np.ndarray, b: np.ndarray) -> None:
        if np.any(a < 0) or np.any(b < 0):
            raise ValueError("SmallLP needs A >= 0 and b >= 0 (x = 0 must be feasible)")
        self.m, self.n = a.shape
        self.full = np.hstack([a.astype(float), np.eye(self.m)])  # structural columns, then slacks
        self.b = b.astype(float)
        self.basis = np.arange(self.n, self.n + self.m)  # all slacks: x = 0
        self.inverse = np.eye(self.m)

    def solve(self, c: np.ndarray) -> tuple[float, np.ndarray]:
        """Optimal value and an optimal x (>= 0) for max c·x."""
        cost = np.concatenate([np.asarray(c, dtype=float), np.zeros(self.m)])
        tol = 1e-10 * max(1.0, float(np.max(np.abs(cost))))
        for pivot in range(MAX_PIVOTS):
            dual = cost[self.basis] @ self.inverse
            reduced = cost - dual @ self.full
            if pivot < DANTZIG_PIVOTS:
                enter = int(np.argmax(reduced))
                if reduced[enter] <= tol:
                    break
            else:
                candidates = np.flatnonzero(reduced > tol)
                if not len(candidates):
                    break
                enter = int(candidates[0])
            self._pivot(enter)
        else:
            raise RuntimeError(f"simplex did not finish in {MAX_PIVOTS} pivots")
        x = np.zeros(self.n + self.m)
        x[self.basis] = np.maximum(self.inverse @ self.b, 0.0)
        return float(cost[:self.n] @ x[:self.n]), x[:self.n]

    def _pivot(self, enter: int) -> None:
        """Column `enter` into the basis by the ratio test (ties: Bland, the lowest variable index).
        The test runs on the handful of rows as plain floats: the same IEEE operations as on
        arrays without a numpy call per step (200 random four-row LPs, 10 objectives each: 0.18 ->
        0.12 s)."""
        direction = (self.inverse @ self.full[:, enter]).tolist()
        values = (self.inverse @ self.b).tolist()
        tol = 1e-12 * max(1.0, max(abs(d) for d in direction))
        if not any(d > tol for d in direction):
            raise RuntimeError("LP unbounded: a column with positive gain uses no constrained resource")
        ratios = [max(v, 0.0) / d if d > tol else math.inf for d, v in zip(direction, values)]
        limit = min(ratios) * (1 + 1e-12) + 1e-300
        basis = self.basis.tolist()
        leave = min((i for i, r in enumerate(ratios) if r <= limit), key=lambda i: basis[i])
        self.basis[leave] = enter
        self.inverse = np.linalg.inv(self.full[:, self.basis])

    def solve_priced(self, c: np.ndarray, d: np.ndarray, least: float,
                     need: float | None = None) -> tuple[float, np.ndarray] | None:
        """max c·x under the constraints and d·x >= `least` (d >= 0), by pricing that row:
        g(lam) = max (c + lam·d)·x - lam·least bounds the optimum for every lam >= 0 and meets it
        at its least (strong duality). From the optimal basis for c, lam rises to the next point
        where a column's reduced cost turns positive, which enters (one pivot: the parametric
        simplex), until d·x reaches `least`. Returns (g there, a point of the constrained
        optimum), None when d·x cannot reach `least`, or with `need` the first g below it (then
        the point means nothing). Any g passed on the way is a valid bound, so a walk cut short
        by `MAX_PIVOTS` returns the last one."""
        value, x = self.solve(c)
        d = np.asarray(d, dtype=float)
        slope = float(d @ x) - least
        if slope >= -1e-9 * max(1.0, least) or (need is not None and value < need):
            return value, x
        saved = self.basis.copy(), self.inverse  # the next objective is likelier near c: start it there
        try:
            return self._walk(c, d, least, need, value, x, slope)
        finally:
            self.basis, self.inverse = saved

    def _walk(self, c: np.ndarray, d: np.ndarray, least: float, need: float | None, value: float,
              x: np.ndarray, slope: float) -> tuple[float, np.ndarray] | None:
        """`solve_priced`'s parametric walk from the optimal basis for c (lam = 0)."""
        cost0 = np.concatenate([np.asarray(c, dtype=float), np.zeros(self.m)])
        cost1 = np.concatenate([d, np.zeros(self.m)])
        lam, g = 0.0, value
        previous = x
        for _ in range(MAX_PIVOTS):
            reduced0 = cost0 - (cost0[self.basis] @ self.inverse) @ self.full
            reduced1 = cost1 - (cost1[self.basis] @ self.inverse) @ self.full
            rising = np.flatnonzero(reduced1 > 1e-12)
            if not len(rising):  # optimal for every larger lam, and d·x still short: infeasible,
                if self.solve(d)[0] < least * (1 - 1e-9):  # which the most d·x confirms
                    return None
                return self._bound_at(c, d, least, lam), previous
            at = np.maximum(lam, -reduced0[rising] / reduced1[rising])
            k = int(np.argmin(at))
            lam, enter = float(at[k]), int(rising[k])
            self._pivot(enter)
            point = np.zeros(self.n + self.m)
            point[self.basis] = np.maximum(self.inverse @ self.b, 0.0)
            now = point[:self.n]
            g = float((cost0[:self.n] + lam * d) @ now) - lam * least
            if need is not None and g < need:
                return self._bound_at(c, d, least, lam), now
            new_slope = float(d @ now) - least
            if new_slope >= -1e-9 * max(1.0, least):
                theta = new_slope / (new_slope - slope) if new_slope - slope > 1e-12 else 0.0
                return self._bound_at(c, d, least, lam), theta * previous + (1 - theta) * now
            previous, slope = now, new_slope  # this basis is optimal from lam to the next breakpoint
        return self._bound_at(c, d, least, lam), previous

    def _bound_at(self, c: np.ndarray, d: np.ndarray, least: float, lam: float) -> float:
        """g(lam) from a full solve, not the walk's basis: a bound that holds whatever rounding
        did to the walk (from its basis, optimal there, the solve is one pricing pass)."""
        return self.solve(np.asarray(c, dtype=float) + lam * d)[0] - lam * least
