"""The one-pipeline step bound with in-flight memory: where a plan has one pipeline, its stage k
from the end holds min(k, M) microbatches' activations (1F1B), so the early stages of a long
pipeline hold far fewer decoders than one microbatch in flight would let them
(`solvers.memory_bound.one_pipeline_s`, which counts one): on Llama-2 70B at 64k tokens over 86
GPUs of six types that lifts the bound from 226.1 to 294.2 s (`many_types.py --seed 22` pool 24).

Inputs are plain arrays (`FlightLimits`): per stage-group shape its GPU class, GPUs, `t` the least
F+B of one decoder per microbatch, and `d[s, f - 1]` the most decoders it holds with f microbatches
in flight (non-increasing in f); `class_gpus` (N_c); `n_dec`; `m` microbatches (M); `positions`,
the most stages a plan can have (K).

At a bottleneck C, stage position k (from the end) with shape s holds at most
cap_ks = min(d[s, min(k, M) - 1], C / t_s) decoders. A one-pipeline plan whose largest stage F+B is
at most C gives, with y_ks = x_k / cap_ks for its stage at position k, a point of the LP

    A*(C) = min sum t_s·cap_ks·y_ks  s.t.  sum cap_ks·y_ks >= n_dec,  sum_s y_ks <= 1 per position,
            sum over class c of size_s·y_ks <= N_c,  y >= 0,

whose objective is at most its A (the sum of its stages' F+B). A*(C) does not grow with C, so a
plan with C in [C_i, C_j] takes at least A*(C_j) + (M - 1)·C_i: the bound is the least of these
over intervals of C, split best-first (one LP, HiGHS, per split) until the lowest interval spans
at most `RATIO`. Positions with the same limits (every one past the last flight count that changes
a shape's limit) share one row, with their count as its bound. Embedding, head, receives, tails
and overhead are left out (all >= 0).
`tests/test_flight_bound.py` checks it against every one-pipeline plan of small pools.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import highspy
import numpy as np

from solvers.distinct import distinct
from solvers.quiet import quiet_stdout

RATIO = 1.01  # the lowest interval of C is split until its ends are within this factor
MARGIN = 1e-6  # LP optima are taken this much (relative) lower, against solver tolerances
ROOM = 1 + 1e-9  # capacities under a bottleneck are taken this much larger (C / t rounding at C = d·t)
MAX_LPS = 200


@dataclass(frozen=True)
class FlightLimits:
    """Per stage-group shape: GPU class, GPUs, least decoder F+B per microbatch and the most
    decoders held with 1, 2, ... microbatches in flight (columns); shapes another one of their
    class beats (no slower, no larger, holding at least as many at every flight count) left out."""

    cls: np.ndarray
    size: np.ndarray
    t: np.ndarray
    d: np.ndarray  # (shapes, flights)

    @classmethod
    def of(cls, classes: np.ndarray, size: np.ndarray, t: np.ndarray, d: np.ndarray) -> FlightLimits:
        classes, size = np.asarray(classes, dtype=np.int64), np.asarray(size, dtype=float)
        t, d = np.asarray(t, dtype=float), np.asarray(d, dtype=float).reshape(len(classes), -1)
        live = np.flatnonzero((d[:, 0] > 0) & np.isfinite(t) & (t > 0)) if d.size else np.zeros(0, dtype=np.int64)
        order = live[np.lexsort((size[live], t[live], classes[live]))]
        keep: list[int] = []
        for i in order.tolist():
            if not any(classes[j] == classes[i] and t[j] <= t[i] and size[j] <= size[i] and np.all(d[j] >= d[i])
                       for j in keep):
                keep.append(i)
        at = np.asarray(keep, dtype=np.int64)
        return cls(classes[at], size[at], t[at], d[at])


def one_pipeline_flights_s(lim: FlightLimits, class_gpus: np.ndarray, n_dec: int, m: int,
                           positions: int) -> float:
    """A bound on the pipeline time of every one-pipeline plan (module doc); inf where no such
    plan holds the decoders. Valid only for plans of one pipeline: the caller decides that no
    other plan exists (`memory_bound.most_copies` below 2)."""
    if n_dec <= 0:
        return 0.0
    if not len(lim.t) or positions <= 0:
        return math.inf
    # each position's flight count, as a column of `d`; past its last column the last one stands
    # for it (d does not grow with flights: a larger capacity, so still a bound)
    flights = np.minimum(np.minimum(np.arange(1, positions + 1), m), lim.d.shape[1]) - 1
    held = lim.d[:, flights].T  # (positions, shapes)
    # positions with the same limits (those past every shape's last change) are one row of the
    # LP with their count as its right-hand side: the same optimum, a smaller LP
    rows, first, count = np.unique(held, axis=0, return_index=True, return_counts=True)
    order = np.argsort(first)
    lp = _FillLP(lim, rows[order], count[order].astype(float), np.asarray(class_gpus, dtype=float), n_dec)
    top = float(np.max(lim.d[:, 0] * lim.t))  # past this C no stage holds more
    lo = lp.least_feasible_c(top)
    if lo is None:
        return math.inf
    a_top = lp.least_a(top)
    if m == 1 or lo >= top:
        return (a_top + (m - 1) * lo) * (1 - MARGIN)
    # a plan's C lies in [lo, top] or at or above top; intervals are split best-first by their key
    heap = [(a_top + (m - 1) * lo, lo, top, a_top), (a_top + (m - 1) * top, top, top, a_top)]
    solved = 1
    while True:
        key, c_lo, c_hi, a_hi = heapq.heappop(heap)
        if not math.isfinite(key) or c_hi <= c_lo * RATIO or solved >= MAX_LPS:
            return key * (1 - MARGIN) if math.isfinite(key) else math.inf
        mid = math.sqrt(c_lo * c_hi)
        a_mid = lp.least_a(mid)
        solved += 1
        heapq.heappush(heap, (a_mid + (m - 1) * c_lo, c_lo, mid, a_mid))
        heapq.heappush(heap, (a_hi + (m - 1) * mid, mid, c_hi, a_hi))


class _FillLP:
    """A*(C) of the module doc for one pool, its matrix built once (only the caps change with C)."""

    def __init__(self, lim: FlightLimits, held: np.ndarray, count: np.ndarray, class_gpus: np.ndarray,
                 n_dec: int) -> None:
        self.lim, self.held, self.count, self.class_gpus, self.n_dec = lim, held, count, class_gpus, n_dec
        k, s = held.shape
        self.pos = np.repeat(np.arange(k), s)  # column j: position pos[j], shape shp[j]
        self.shp = np.tile(np.arange(s), k)
        with quiet_stdout():
            self.highs = highspy.Highs()
        self.highs.setOptionValue("output_flag", False)

    def caps(self, c: float) -> np.ndarray:
        """cap_ks per LP column at bottleneck c."""
        per = np.minimum(self.held, c * ROOM / self.lim.t[None, :])
        return per.reshape(-1)

    def least_feasible_c(self, top: float) -> float | None:
        """A bottleneck below which no one-pipeline plan holds the decoders (bisection on the
        greedy capacity of positions and GPUs relaxed as the LP relaxes them); None if even `top`
        cannot. Only a lower end for the intervals: an LP found infeasible there gives inf."""
        if self.capacity(top) < self.n_dec:
            return None
        lo, hi = 0.0, top
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                break
            lo, hi = (lo, mid) if self.capacity(mid) >= self.n_dec else (mid, hi)
        return lo

    def capacity(self, c: float) -> float:
        """At least the most decoders the LP's positions hold at bottleneck c: each position at
        most its best shape's cap, and no more (fractional) stages in all than the GPUs of each
        class allow with its smallest shape."""
        per = self.caps(c).reshape(self.held.shape)  # (position rows, shapes)
        best = np.sort(np.repeat(per.max(axis=1), self.count.astype(np.int64)))[::-1]
        stages = sum(float(self.class_gpus[k]) / float(self.lim.size[self.lim.cls == k].min())
                     for k in distinct(self.lim.cls).tolist())
        whole = min(int(stages), len(best))
        part = best[whole] * (stages - whole) if whole < len(best) else 0.0
        return float(best[:whole].sum() + part)

    def least_a(self, c: float) -> float:
        """A*(c) (inf where the LP is infeasible)."""
        cap = self.caps(c)
        live = np.flatnonzero(cap > 0)
        if not len(live) or np.dot(cap, np.repeat(self.count, self.held.shape[1])) < self.n_dec * (1 - 1e-12):
            return math.inf
        lim, k_pos = self.lim, self.held.shape[0]
        n_cls = len(self.class_gpus)
        shp, pos = self.shp[live], self.pos[live]
        # rows: decoders held, one row per position, one per class
        rows = np.stack([np.zeros(len(live), dtype=np.int64), 1 + pos, 1 + k_pos + lim.cls[shp]])
        vals = np.stack([cap[live], np.ones(len(live)), lim.size[shp]])
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(live), 1 + k_pos + n_cls
        lp.col_cost_ = lim.t[shp] * cap[live]
        lp.col_lower_, lp.col_upper_ = np.zeros(len(live)), np.full(len(live), highspy.kHighsInf)
        lp.row_lower_ = np.concatenate([[float(self.n_dec)], np.full(k_pos + n_cls, -highspy.kHighsInf)])
        lp.row_upper_ = np.concatenate([[highspy.kHighsInf], self.count, self.class_gpus])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.arange(0, 3 * len(live) + 1, 3)
        lp.a_matrix_.index_ = rows.T.reshape(-1).astype(np.int32)
        lp.a_matrix_.value_ = vals.T.reshape(-1)
        self.highs.clearModel()
        self.highs.passModel(lp)
        self.highs.run()
        status = self.highs.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            return math.inf
        if status != highspy.HighsModelStatus.kOptimal:
            return 0.0  # no answer: 0 still bounds A
        return float(self.highs.getInfo().objective_function_value)
