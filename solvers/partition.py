"""Exact contiguous layer -> stage partition for a fixed sequence of stage device groups.

Input is plain arrays: for every stage position a `StageOptions` table over (option, first layer i,
end layer j) — option = one way to run that group (tp/cp/hp/dp/recompute) — holding the stage's
per-microbatch F+B, its tail (exposed gradient sync + optimizer), and its memory split into a fixed
part and a part per in-flight microbatch.

For caps (c on F+B, e on tail) a dynamic program over (position, first layer) finds the split with
the least sum of F+B (= A, the pipeline's fill-and-drain time) among those meeting both caps and
memory at every position (1F1B holds min(S - s, q) microbatches at stage s). Enumerating caps
parametrically (tighten c just below the achieved bottleneck until infeasible, then tighten e the
same way) yields every non-dominated (A, C, E) triple, so for any microbatch count m the pipeline
time A + (m - 1)·C and its tail E are minimised exactly over all splits and options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

INF = math.inf


@dataclass(frozen=True, eq=False)
class StageOptions:
    """Costs of one stage device group over options o and layer ranges [i, j), shape (O, L+1, L+1).

    Entries with j <= i are +inf in `fb`. `mem_fixed` + f·`act` must stay <= `capacity` bytes when the
    stage holds f microbatches."""

    fb: np.ndarray
    tail: np.ndarray
    mem_fixed: np.ndarray
    act: np.ndarray
    capacity: float

    @property
    def num_layers(self) -> int:
        return self.fb.shape[1] - 1


class Split(NamedTuple):
    """One partition: stage s covers layers ranges[s] = (first, last) and runs option options[s].
    A named tuple: the frontier sweeps build them by the hundred thousand, and a tuple builds
    several times faster than a frozen dataclass."""

    ranges: tuple[tuple[int, int], ...]
    options: tuple[int, ...]
    fb: tuple[float, ...]
    tails: tuple[float, ...]

    @property
    def a_s(self) -> float:
        return float(sum(self.fb))

    @property
    def c_s(self) -> float:
        return float(max(self.fb))

    @property
    def e_s(self) -> float:
        return float(max(self.tails))


def _feasible_fb(opts: StageOptions, in_flight: int, c: float, e: float,
                 cell: tuple = (slice(None), slice(None))) -> np.ndarray:
    """F+B per option over the layer ranges `cell` selects (every (i, j) by default), +inf where an
    option exceeds the bottleneck cap c, the tail cap e or memory with `in_flight` microbatches."""
    at = (slice(None), *cell)
    fb = opts.fb[at]
    ok = (fb <= c) & (opts.tail[at] <= e) & (opts.mem_fixed[at] + in_flight * opts.act[at] <= opts.capacity)
    return np.where(ok, fb, INF)


MEMO_CELLS = 4_000_000  # cells a `_cost_matrix` memo keeps at most (32 MB of float64)


def _cost_matrix(opts: StageOptions, in_flight: int, c: float, e: float,
                 memo: dict[tuple[int, int, float], np.ndarray] | None = None) -> np.ndarray:
    """Least F+B over feasible options for each (i, j). Which option gives it is asked only for
    the split's own cells (`_least_option`): an argmin over every cell, and the gather by it, had
    cost 4-7x the minimum alone.

    The cap c applies after the minimum: where the least F+B within memory and the tail cap is at
    most c, the option giving it meets c, and where it is above c every option is. So the walks
    that lower c under one tail cap (`memo`, keyed by the options' id, flight and e: one per walk,
    whose options stay alive) reduce over the options once per stage kind, not once per c."""
    key = (id(opts), in_flight, e)
    least = None if memo is None else memo.get(key)
    if least is None:
        least = _feasible_fb(opts, in_flight, INF, e).min(axis=0)
        if memo is not None:
            if len(memo) * least.size >= MEMO_CELLS:  # a long-lived memo (the Megatron grids'):
                del memo[next(iter(memo))]  # the oldest goes
            memo[key] = least
    return np.where(least <= c, least, INF)


def _least_option(opts: StageOptions, in_flight: int, c: float, e: float, i: int, j: int) -> int:
    """The first option of least feasible F+B for layers [i, j): `_cost_matrix`'s rule on one cell."""
    return int(np.argmin(_feasible_fb(opts, in_flight, c, e, (i, j))))


def best_split(positions: list[StageOptions], c: float = INF, e: float = INF,
               max_in_flight: int | None = None,
               memo: dict[tuple[int, int, float], np.ndarray] | None = None) -> Split | None:
    """The split with least A under caps c (F+B) and e (tail); None when none meets them.

    `max_in_flight` caps the microbatches a stage holds (a pipeline run with m < S microbatches);
    `memo` keeps each stage kind's least F+B across calls on the same positions (`_cost_matrix`)."""
    num_stages = len(positions)
    n = positions[0].num_layers
    if num_stages > n:
        return None
    value = np.full(n + 1, INF)
    value[n] = 0.0
    choice: list[tuple[np.ndarray, int]] = []
    for s in range(num_stages - 1, -1, -1):
        flight = num_stages - s if max_in_flight is None else min(num_stages - s, max_in_flight)
        total = _cost_matrix(positions[s], flight, c, e, memo) + value[None, :]
        nxt = np.argmin(total, axis=1)
        value = total[np.arange(n + 1), nxt]
        if value.min() == INF:
            return None  # no start holds stages s.. (memory or caps): the earlier stages cannot help
        choice.append((nxt, flight))
    if not math.isfinite(value[0]):
        return None
    choice.reverse()
    ranges, options, fbs, tails = [], [], [], []
    i = 0
    for s, (nxt, flight) in enumerate(choice):
        j = int(nxt[i])
        o = _least_option(positions[s], flight, c, e, i, j)
        ranges.append((i, j - 1))
        options.append(o)
        fbs.append(float(positions[s].fb[o, i, j]))
        tails.append(float(positions[s].tail[o, i, j]))
        i = j
    return Split(tuple(ranges), tuple(options), tuple(fbs), tuple(tails))


def _below(x: float) -> float:
    return float(np.nextafter(x, -INF))


def split_frontier(positions: list[StageOptions], max_in_flight: int | None = None,
                   max_points: int = 10_000, with_tail: bool = True) -> list[Split]:
    """Every non-dominated (A, C, E) split, sorted by (C, E, A); with `with_tail=False` every
    non-dominated (A, C) split (E is then whatever those splits have).

    Proof sketch: at tail cap e the inner loop lists, for each bottleneck cap, the least A with
    C <= cap and E <= e (each DP is exact). Caps of e are the maxima of the previous level minus one
    ulp, so for every non-dominated p the last level with e >= E_p holds only points with E <= E_p,
    and p (or a point dominating it) appears there."""
    found: list[Split] = []
    e = INF
    memo: dict[tuple[int, int, float], np.ndarray] = {}
    while len(found) < max_points:
        level: list[Split] = []
        c = INF
        while True:
            sol = best_split(positions, c, e, max_in_flight, memo)
            if sol is None:
                break
            level.append(sol)
            c = _below(sol.c_s)
        if not level:
            break
        found.extend(level)
        if not with_tail:
            return pareto_ac(found)
        e = _below(max(p.e_s for p in level))
    return pareto(found)


def least_step_split(positions: list[StageOptions], m: int, max_in_flight: int | None = None,
                     max_points: int = 10_000, cutoff: float = INF) -> Split | None:
    """The split of least A + (m - 1)·C + E (ties: least C, then E, then ranges) among those
    `split_frontier`'s walk lists, without walking all of it; None when none fits, or none is
    below `cutoff` (a value known to be reached, e.g. by a split in hand: the walk then stops as
    soon as its bounds reach the cutoff instead of the best split listed).

    The walk is `split_frontier`'s (tail caps e from above; at each, bottleneck caps c from above),
    cut short by bounds. Every split has C >= c_lo (the least largest F+B) and E >= e_lo (the least
    largest tail). Within a level, A only grows as c falls, so once A + (m - 1)·c_lo + e_lo is above
    the best value the level stops; across levels, every split of a later (lower) tail cap is
    dominated in (A, C) by a point of this level, listed or not (the unlisted ones cost at least A
    of the last listed plus (m - 1)·c_lo), so once that least A + (m - 1)·C plus e_lo is above the
    best value the walk stops. An optimal split s stays reachable: the last point listed at a cap
    c >= C_s dominates it in (A, C); if its E is not above E_s it is as good, else the next tail cap
    (just below the level's largest E) still admits s. On the chain candidate's run orders
    (`flagscale_grid`) this lists a fifth of the frontier."""
    n = positions[0].num_layers
    if len(positions) > n:
        return None
    e_lo = min_max_tail(positions, max_in_flight)
    c_lo = min_max_tail([StageOptions(p.fb, p.fb, p.mem_fixed, p.act, p.capacity) for p in positions],
                        max_in_flight)
    if e_lo is None or c_lo is None:
        return None
    best: tuple[tuple, Split] | None = None  # (value, C, E, ranges), split
    bar = cutoff  # the value a split must beat: the cutoff, then the best split's
    e, listed = INF, 0
    memo: dict[tuple[int, int, float], np.ndarray] = {}
    while listed < max_points:
        level_low = INF  # least A + (m - 1)·C of every split this tail cap admits
        largest_e = -INF
        c = INF
        while (sol := best_split(positions, c, e, max_in_flight, memo)) is not None:
            listed += 1
            value = sol.a_s + (m - 1) * sol.c_s + sol.e_s
            key = (value, sol.c_s, sol.e_s, sol.ranges)
            if value < cutoff and (best is None or key < best[0]):
                best = (key, sol)
                bar = value
            level_low = min(level_low, sol.a_s + (m - 1) * sol.c_s)
            largest_e = max(largest_e, sol.e_s)
            c = _below(sol.c_s)
            rest = sol.a_s + (m - 1) * c_lo  # what any split below this c costs at least
            if rest + e_lo > bar:
                level_low = min(level_low, rest)
                break
        if largest_e == -INF or level_low + e_lo > bar:
            break
        e = _below(largest_e)
    return None if best is None else best[1]


def tail_capped_frontier(positions: list[StageOptions], e: float, max_in_flight: int | None = None) -> list[Split]:
    """Every non-dominated (A, C) split whose stages all have tails <= e (the general DP under a
    tail cap, bottleneck cap lowered below each answer in turn; `max_in_flight` as `best_split`)."""
    found: list[Split] = []
    c = INF
    memo: dict[tuple[int, int, float], np.ndarray] = {}
    while (sol := best_split(positions, c, e, max_in_flight, memo)) is not None:
        found.append(sol)
        c = _below(sol.c_s)
    return pareto_ac(found)


def pareto_ac(points: list[Split]) -> list[Split]:
    """Drop splits dominated in (A, C); keep the first of equal pairs. A within 1e-12 relative
    counts as equal (sums of the same stage costs in another order differ in the last bits)."""
    keep: list[Split] = []
    for p in sorted(points, key=lambda p: (p.c_s, p.a_s)):
        if not keep or p.a_s < keep[-1].a_s * (1 - 1e-12):
            keep.append(p)
    return keep


def pareto(points: list[Split]) -> list[Split]:
    """Drop splits dominated in (A, C, E); keep one of equal triples; deterministic order."""
    uniq: dict[tuple[float, float, float], Split] = {}
    for p in points:
        uniq.setdefault((p.a_s, p.c_s, p.e_s), p)
    keys = sorted(uniq)
    keep = []
    for k in keys:
        dominated = any(o[0] <= k[0] and o[1] <= k[1] and o[2] <= k[2] and o != k for o in keys)
        if not dominated:
            keep.append(uniq[k])
    keep.sort(key=lambda p: (p.c_s, p.e_s, p.a_s))
    return keep


def undominated_options(opts: StageOptions, use_tail: bool = True,
                        cells: tuple[np.ndarray, np.ndarray] | None = None) -> list[int]:
    """Options not dominated by another everywhere (F+B, memory, activations and, if `use_tail`,
    tail all <=). A dominated option is never needed: swapping in its dominator keeps every cap and
    memory limit and does not raise A, C or E. Ties keep the lower index. `cells`: only these layer
    ranges (i, j) decide, e.g. the ranges the stage kinds of identical layers read
    (`uniform_layers.kind_cells`), which stand for every other range.

    All pairs at once: each option's arrays flattened into one row, compared row against row."""
    n = opts.fb.shape[0]
    arrays = [opts.fb, opts.mem_fixed, opts.act] + ([opts.tail] if use_tail else [])
    if cells is None:
        rows = np.concatenate([a.reshape(n, -1) for a in arrays], axis=1)
    else:
        rows = np.concatenate([a[:, cells[0], cells[1]] for a in arrays], axis=1)
    le = np.ones((n, n), dtype=bool)  # le[j, i]: option j <= option i everywhere
    eq = np.ones((n, n), dtype=bool)
    for start in range(0, rows.shape[1], 4096):  # chunks keep the (n, n, chunk) temporaries small
        block = rows[:, start:start + 4096]
        le &= np.all(block[:, None, :] <= block[None, :, :], axis=2)
        eq &= np.all(block[:, None, :] == block[None, :, :], axis=2)
    earlier = np.tri(n, k=-1, dtype=bool).T  # earlier[j, i]: j < i
    beats = le & (earlier | ~eq)
    np.fill_diagonal(beats, False)
    return np.flatnonzero(~beats.any(axis=0)).tolist()


def subset_options(opts: StageOptions, keep: list[int]) -> StageOptions:
    """Options `keep` only (of any options type with these fields and a `subset` method)."""
    if not isinstance(opts, StageOptions):
        return opts.subset(keep)
    return StageOptions(opts.fb[keep], opts.tail[keep], opts.mem_fixed[keep], opts.act[keep], opts.capacity)


def min_max_tail(positions: list[StageOptions], max_in_flight: int | None = None) -> float | None:
    """Least possible largest stage tail over all memory-feasible splits (a min-max DP), or None."""
    num_stages = len(positions)
    n = positions[0].num_layers
    if num_stages > n:
        return None
    value = np.full(n + 1, INF)
    value[n] = -INF
    for s in range(num_stages - 1, -1, -1):
        flight = num_stages - s if max_in_flight is None else min(num_stages - s, max_in_flight)
        p = positions[s]
        ok = (p.mem_fixed + flight * p.act <= p.capacity) & np.isfinite(p.fb)
        tail = np.where(ok, p.tail, INF).min(axis=0)
        value = np.maximum(tail, value[None, :]).min(axis=1)
    return float(value[0]) if math.isfinite(value[0]) else None
