"""Pipelines of two runs of identical stage groups (k1 stages of group X, then k2 of group Y) over
identical decoder layers: every (k1, k2) of one (X, Y) pair in one batched dynamic program.

Same construction as `solvers.uniform_layers` (stage cost by kind and decoder count; the stage with r
stages left holds r microbatches), with the kind tables of Y for the k2 stages at the tail of the
pipeline and those of X above them; X's top stage holds the embedding, Y's bottom stage the head.
Results equal `partition.split_frontier(..., with_tail=False)` and `partition.min_max_tail` on
`[X] * k1 + [Y] * k2` (`tests/test_uniform_layers.py`).

The search runs every pair at once (`solvers.batched_runs`); these per-pair sweeps are the reference
that batched DP is checked against, row by row (`tests/test_batched_runs.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solvers.partition import Split
from solvers.uniform_layers import INF, Budget, Kind, UniformView, _best, _conv, _shift_index, parametric_frontiers


@dataclass(frozen=True, slots=True)
class Point:
    """A split's (A, C) without the split itself (enough for bound templates)."""

    a_s: float
    c_s: float


def _chain_splits(top: UniformView, bottom: UniformView, rows: list[tuple[int, int]],
                  caps: np.ndarray, ecaps: np.ndarray | None = None,
                  points_only: bool = False) -> list[Split | Point | None]:
    """Least-A split of each row (k1, k2) under its F+B cap (and tail cap); with `points_only`
    just its (A, C), tracked through the DP instead of recovered."""
    big_n = top.decoders
    k2s = np.array([k2 for _, k2 in rows])
    total = np.array([k1 + k2 for k1, k2 in rows])
    value, last_o = _best(bottom.last, 1, caps, bottom.capacity, ecaps)
    cmax = value.copy()  # the bottleneck along each best path (points_only)
    k_idx = np.arange(big_n + 1)[None, :]
    trace: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    out: list[Split | Point | None] = [None] * len(rows)
    for r in range(1, int(total.max())):
        if r >= 2:
            on_top = r > k2s
            fb_b, o_b = _best(bottom.mid, r, caps, bottom.capacity, ecaps)
            fb_t, o_t = _best(top.mid, r, caps, top.capacity, ecaps)
            stage = np.where(on_top[:, None], fb_t, fb_b)
            value, arg_d = _conv(stage, value)
            if points_only:
                cmax = np.maximum(np.take_along_axis(stage, arg_d, axis=1),
                                  np.take_along_axis(cmax, np.clip(k_idx - arg_d, 0, big_n), axis=1))
            else:
                trace.append((arg_d, np.where(on_top[:, None], o_t, o_b), on_top))
        done = np.flatnonzero(total == r + 1)
        if not len(done):
            continue
        first_fb, first_o = _best(top.first, r + 1, caps[done], top.capacity,
                                  None if ecaps is None else ecaps[done])
        rest = big_n - np.arange(big_n + 1)
        sums = first_fb + value[done][:, rest]
        for k, b in enumerate(done):
            d0 = int(np.argmin(sums[k]))
            if not math.isfinite(sums[k, d0]):
                continue
            if points_only:
                out[b] = Point(float(sums[k, d0]), float(max(first_fb[k, d0], cmax[b, rest[d0]])))
            else:
                out[b] = _recover(top, bottom, int(b), r + 1, d0, int(first_o[k, d0]), trace, last_o)
    return out


def _recover(top: UniformView, bottom: UniformView, b: int, s: int, d0: int, o0: int, trace: list,
             last_o: np.ndarray) -> Split:
    big_n, n = top.decoders, top.n
    ranges, options = [(0, d0)], [o0]
    fbs, tails = [float(top.first.fb[o0, d0])], [float(top.first.tail[o0, d0])]
    k, start = big_n - d0, 1 + d0
    for r in range(s - 1, 1, -1):
        arg_d, opt, on_top = trace[r - 2]
        d = int(arg_d[b, k])
        o = int(opt[b, d])
        kind = (top if on_top[b] else bottom).mid
        ranges.append((start, start + d - 1))
        options.append(o)
        fbs.append(float(kind.fb[o, d]))
        tails.append(float(kind.tail[o, d]))
        start += d
        k -= d
    o = int(last_o[b, k])
    ranges.append((start, n - 1))
    options.append(o)
    fbs.append(float(bottom.last.fb[o, k]))
    tails.append(float(bottom.last.tail[o, k]))
    return Split(tuple(ranges), tuple(options), tuple(fbs), tuple(tails))


def chain_frontiers(top: UniformView, bottom: UniformView, rows: list[tuple[int, int]],
                    budget: Budget | None = None) -> dict[tuple[int, int], list[Split]]:
    """Every non-dominated (A, C) split of `[X] * k1 + [Y] * k2` for each (k1, k2) in `rows`
    (k1, k2 >= 1); option indices refer to X's options for the first k1 stages, Y's after."""
    live = sorted(set(r for r in rows if r[0] >= 1 and r[1] >= 1 and sum(r) <= top.n))
    return parametric_frontiers(lambda rs, caps: _chain_splits(top, bottom, rs, caps), live, budget=budget)


def tail_capped_chain_frontiers(top: UniformView, bottom: UniformView, rows: list[tuple[int, int]],
                                e_levels: list[float]) -> dict[tuple[int, int, int], list[Point]]:
    """`chain_frontiers` under each tail cap `e_levels[j]` on every stage, keyed (k1, k2, j), as
    (A, C) points."""
    pairs = sorted(set(r for r in rows if r[0] >= 1 and r[1] >= 1 and sum(r) <= top.n))
    live = [(k1, k2, j) for k1, k2 in pairs for j in range(len(e_levels))]
    levels = np.asarray(e_levels, dtype=float)
    return parametric_frontiers(lambda rs, caps: _chain_splits(
        top, bottom, [(k1, k2) for k1, k2, _ in rs], caps, levels[[j for *_, j in rs]], True), live)


def chain_min_max_tails(top: UniformView, bottom: UniformView,
                        rows: list[tuple[int, int]]) -> dict[tuple[int, int], float | None]:
    """Least possible largest stage tail over every memory-feasible split of each (k1, k2)."""
    big_n = top.decoders
    index = _shift_index(big_n)
    rows = sorted(set(rows))
    out: dict[tuple[int, int], float | None] = {r: None for r in rows}
    if not rows:
        return out
    k2s = np.array([k2 for _, k2 in rows])
    total = np.array([k1 + k2 for k1, k2 in rows])

    def best_tail(kind: Kind, flight: int, capacity: float) -> np.ndarray:
        ok = (kind.mem_fixed + flight * kind.act <= capacity) & np.isfinite(kind.fb)
        return np.where(ok, kind.tail, INF).min(axis=0)

    value = np.tile(best_tail(bottom.last, 1, bottom.capacity), (len(rows), 1))
    for r in range(1, int(total.max())):
        if r >= 2:
            stage = np.where((r > k2s)[:, None], best_tail(top.mid, r, top.capacity)[None],
                             best_tail(bottom.mid, r, bottom.capacity)[None])
            shifted = np.concatenate([value, np.full((value.shape[0], 1), INF)], axis=1)[:, index]
            value = np.min(np.maximum(stage[:, None, :], shifted), axis=2)
        first = best_tail(top.first, r + 1, top.capacity)
        for b in np.flatnonzero(total == r + 1):
            t = float(np.min(np.maximum(first, value[b, big_n - np.arange(big_n + 1)])))
            out[rows[b]] = t if math.isfinite(t) else None
    return out
