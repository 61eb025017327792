"""The least pipeline time at which given copies of pipeline templates hold M microbatches.

By pipeline time T a copy of a template (fill-and-drain A, bottleneck C) holds
k(T) = min(cap, floor((T - A)/C) + 1) microbatches, none before A. The total sum n·k(T) over the
copies steps up only at the breakpoints A + j·C (j = 0 .. cap - 1), so the least T reaching M is
one of them: merged and sorted, the first whose running weight reaches M. Scoring a rounded plan
and the LP's Newton steps (`solvers.assign_lp`) ask this thousands of times per search; bisection
on T took ~45 evaluations each. Where the breakpoints are very many (a huge M), bisection stays.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

MERGE_LIMIT = 16_384  # most breakpoints merged; beyond, bisection


def least_true(holds: Callable[[float], bool], lo: float, hi: float, rel: float) -> float:
    """Bisection for a monotone predicate false at lo and true at hi: hi within `rel` of the switch."""
    for _ in range(200):
        if hi - lo <= rel * hi:
            break
        mid = (lo + hi) / 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi


def held_by(a: np.ndarray, c: np.ndarray, cap: np.ndarray, n: np.ndarray, t: float) -> float:
    """Microbatches the copies (n of each template) hold by pipeline time t."""
    with np.errstate(invalid="ignore", divide="ignore"):
        k = np.floor((t - a) / c + 1e-12) + 1
    return float(n @ np.where(t + 1e-15 >= a, np.minimum(k, cap), 0.0))


def least_time(a: np.ndarray, c: np.ndarray, cap: np.ndarray, n: np.ndarray, need: float,
               lo: float, hi: float) -> float:
    """Least T in [lo, hi] by which the copies hold `need` microbatches (`hi` must reach it): a
    breakpoint exactly, or within 1e-13 relative by bisection where they are too many."""
    counts = cap.astype(np.int64)
    if int(counts.sum()) > MERGE_LIMIT:
        return least_true(lambda t: held_by(a, c, cap, n, t) >= need, lo, hi, 1e-13)
    which = np.repeat(np.arange(len(a)), counts)
    step = np.arange(len(which)) - np.repeat(np.cumsum(counts) - counts, counts)
    points = a[which] + step * c[which]
    order = np.argsort(points, kind="stable")
    reached = np.searchsorted(np.cumsum(n[which][order]), need)
    if reached >= len(order):
        return hi
    return min(max(lo, float(points[order[reached]])), hi)
