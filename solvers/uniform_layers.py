"""Homogeneous pipelines over identical decoder layers: every stage count's split frontier at once.

When all decoder layers cost the same (the usual transformer: slot 0 the embedding, slots 1..N
identical blocks, slot N+1 the head), a stage's cost depends only on how many decoder layers it
holds and whether it is the first and/or last stage, not on where its range starts. The split of a
pipeline of S identical stage groups is then a dynamic program over (stages remaining r, decoder
layers remaining k) whose table for r is shared by every S > r, so one sweep over r solves all stage
counts together (per-S caps on the bottleneck are carried as a batch dimension). Memory is checked
per position exactly as in `solvers.partition` (the stage with r stages left, itself included, holds
r microbatches under 1F1B). The results equal `partition.split_frontier(..., with_tail=False)` and
`partition.min_max_tail` on `[opts] * S`; `tests/test_uniform_layers.py` checks that.

`uniform_view` returns None when the layers are not identical; callers then use the general DP.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from solvers.partition import Split, StageOptions, pareto_ac

INF = math.inf
_FIELDS = ("fb", "tail", "mem_fixed", "act")


@dataclass(frozen=True, eq=False)
class Kind:
    """Costs of one stage kind (first, middle, last or whole) by option o and decoder count d."""

    fb: np.ndarray  # (O, N+1)
    tail: np.ndarray
    mem_fixed: np.ndarray
    act: np.ndarray


@dataclass(frozen=True, eq=False)
class UniformView:
    """`StageOptions` reduced to stage kinds; `n` layer slots, N = n - 2 decoder layers."""

    n: int
    first: Kind  # holds the embedding and d decoders: slots [0, 1 + d)
    mid: Kind  # d >= 1 decoders, neither end
    last: Kind  # d decoders and the head: slots [n - 1 - d, n)
    whole: Kind  # one stage, every slot (column N only)
    capacity: float

    @property
    def decoders(self) -> int:
        return self.n - 2


def uniform_view(opts: StageOptions, trusted: bool = False) -> UniformView | None:
    """The kind tables, or None when a middle stage's cost depends on its position. `trusted` skips
    that check (for arrays already checked at another replica count: tails change with replicas,
    their dependence on the layer range does not)."""
    n = opts.num_layers
    big_n = n - 2
    if big_n < 1:
        return None
    arrays = {f: getattr(opts, f) for f in _FIELDS}
    d_all = np.arange(big_n + 1)
    # every middle range [i, i + d) with 1 <= i and i + d <= N + 1, grouped by d
    d_idx = np.concatenate([np.full(big_n + 1 - d, d) for d in range(1, big_n + 1)])
    i_idx = np.concatenate([np.arange(1, big_n + 2 - d) for d in range(1, big_n + 1)])
    first_of_d = np.concatenate([[0], np.cumsum([big_n + 1 - d for d in range(1, big_n)])])
    ref_pos = first_of_d[d_idx - 1]  # position of the i = 1 entry of the same d
    valid = np.isfinite(opts.fb[:, i_idx, i_idx + d_idx])
    mid_cols: dict[str, np.ndarray] = {}
    for f, a in arrays.items():
        vals = np.where(valid, a[:, i_idx, i_idx + d_idx], INF)
        ref = vals[:, ref_pos]
        fin = np.isfinite(ref)
        if not trusted:
            if not np.array_equal(np.isfinite(vals), fin):
                return None
            diff = np.abs(np.where(fin, vals - np.where(fin, ref, 0.0), 0.0))
            if np.any(diff > 1e-9 * np.maximum(np.abs(np.where(fin, ref, 0.0)), 1e-300)):
                return None
        col = np.full((opts.fb.shape[0], big_n + 1), INF)
        col[:, 1:] = vals[:, first_of_d]
        mid_cols[f] = col
    first = Kind(*(a[:, 0, 1 + d_all] for a in arrays.values()))
    last = Kind(*(a[:, n - 1 - d_all, n] for a in arrays.values()))
    whole_cols = [np.full((opts.fb.shape[0], big_n + 1), INF) for _ in _FIELDS]
    for col, a in zip(whole_cols, arrays.values()):
        col[:, big_n] = a[:, 0, n]
    return UniformView(n, first, Kind(*mid_cols.values()), last, Kind(*whole_cols), opts.capacity)


def _best(kind: Kind, flight: int, caps: np.ndarray, capacity: float) -> tuple[np.ndarray, np.ndarray]:
    """Least F+B over options per (S, d) under each S's cap and memory at `flight`; and the option."""
    ok = (kind.mem_fixed + flight * kind.act <= capacity)[None] & (kind.fb[None] <= caps[:, None, None])
    cost = np.where(ok, kind.fb[None], INF)  # (B, O, D)
    arg = np.argmin(cost, axis=1)
    return np.take_along_axis(cost, arg[:, None, :], axis=1)[:, 0, :], arg


def _shift_index(big_n: int) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(big_n + 1)[:, None]
    d = np.arange(big_n + 1)[None, :]
    return np.clip(k - d, 0, big_n), (k - d) < 0


def _conv(stage: np.ndarray, rest: np.ndarray, index: np.ndarray, invalid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(min, +) convolution per batch row: out[b, k] = min_d stage[b, d] + rest[b, k - d]."""
    total = stage[:, None, :] + np.where(invalid[None], INF, rest[:, index])
    arg = np.argmin(total, axis=2)
    return np.take_along_axis(total, arg[:, :, None], axis=2)[:, :, 0], arg


def _splits_for_caps(view: UniformView, stage_counts: list[int], caps: np.ndarray) -> list[Split | None]:
    """Least-A split of each stage count in `stage_counts` (ascending) under its cap on F+B."""
    big_n, cap = view.decoders, view.capacity
    s_max = max(stage_counts)
    index, invalid = _shift_index(big_n)
    out: dict[int, Split | None] = {}
    col = {s: k for k, s in enumerate(stage_counts)}
    if 1 in col:
        fb, arg = _best(view.whole, 1, caps[[col[1]]], cap)
        out[1] = None if not math.isfinite(fb[0, big_n]) else _single(view, int(arg[0, big_n]))
    rows = [s for s in stage_counts if s >= 2]
    if not rows:
        return [out[s] for s in stage_counts]
    row_caps = caps[[col[s] for s in rows]]
    last_fb, last_o = _best(view.last, 1, row_caps, cap)
    value = last_fb  # (B, N+1): r stages covering the last k decoders and the head
    trace: list[tuple[np.ndarray, np.ndarray]] = []  # per r >= 2: (d choice per (b, k), option per (b, d))
    for r in range(1, s_max):
        if r >= 2:
            mid_fb, mid_o = _best(view.mid, r, row_caps, cap)
            value, arg_d = _conv(mid_fb, value, index, invalid)
            trace.append((arg_d, mid_o))
        for b, s in enumerate(rows):
            if s != r + 1:
                continue
            first_fb, first_o = _best(view.first, s, row_caps[[b]], cap)
            total = first_fb[0] + value[b, big_n - np.arange(big_n + 1)]
            d0 = int(np.argmin(total))
            if not math.isfinite(total[d0]):
                out[s] = None
                continue
            out[s] = _recover(view, b, s, d0, int(first_o[0, d0]), trace, last_o)
    return [out[s] for s in stage_counts]


def _single(view: UniformView, o: int) -> Split:
    k = view.whole
    big_n = view.decoders
    return Split(((0, view.n - 1),), (o,), (float(k.fb[o, big_n]),), (float(k.tail[o, big_n]),))


def _recover(view: UniformView, b: int, s: int, d0: int, o0: int, trace: list, last_o: np.ndarray) -> Split:
    big_n, n = view.decoders, view.n
    ranges, options, fbs, tails = [(0, d0)], [o0], [float(view.first.fb[o0, d0])], [float(view.first.tail[o0, d0])]
    k = big_n - d0
    start = 1 + d0
    for r in range(s - 1, 1, -1):
        arg_d, mid_o = trace[r - 2]
        d = int(arg_d[b, k])
        o = int(mid_o[b, d])
        ranges.append((start, start + d - 1))
        options.append(o)
        fbs.append(float(view.mid.fb[o, d]))
        tails.append(float(view.mid.tail[o, d]))
        start += d
        k -= d
    o = int(last_o[b, k])
    assert start == n - 1 - k
    ranges.append((start, n - 1))
    options.append(o)
    fbs.append(float(view.last.fb[o, k]))
    tails.append(float(view.last.tail[o, k]))
    return Split(tuple(ranges), tuple(options), tuple(fbs), tuple(tails))


def parametric_frontiers(solve: Callable[[list[Hashable], np.ndarray], list[Split | None]],
                         rows: list[Hashable], max_rounds: int = 10_000) -> dict[Hashable, list[Split]]:
    """Every non-dominated (A, C) split of each row: solve all live rows under their bottleneck caps,
    then lower each row's cap just below the bottleneck it reached, until none is feasible."""
    live = list(rows)
    found: dict[Hashable, list[Split]] = {r: [] for r in live}
    caps = {r: INF for r in live}
    for _ in range(max_rounds):
        if not live:
            break
        sols = solve(live, np.array([caps[r] for r in live]))
        nxt = []
        for row, sol in zip(live, sols):
            if sol is None:
                continue
            found[row].append(sol)
            caps[row] = float(np.nextafter(sol.c_s, -INF))
            nxt.append(row)
        live = nxt
    return {r: pareto_ac(v) for r, v in found.items() if v}


def frontiers(view: UniformView, stage_counts: list[int]) -> dict[int, list[Split]]:
    """Every non-dominated (A, C) split of `[opts] * S` for each S in `stage_counts` (all stage
    counts advance together)."""
    counts = sorted(set(s for s in stage_counts if 1 <= s <= view.n))
    return parametric_frontiers(lambda live, caps: _splits_for_caps(view, live, caps), counts)


def least_a(view: UniformView, stage_counts: list[int]) -> dict[int, float | None]:
    """Least A (sum of stage F+B) of any memory-feasible split, per stage count: one sweep."""
    counts = sorted(set(s for s in stage_counts if 1 <= s <= view.n))
    if not counts:
        return {}
    sols = _splits_for_caps(view, counts, np.full(len(counts), INF))
    return {s: (None if sol is None else sol.a_s) for s, sol in zip(counts, sols)}


def min_max_tails(view: UniformView, stage_counts: list[int]) -> dict[int, float | None]:
    """Least possible largest stage tail over every memory-feasible split, per stage count (the
    table for r stages left is shared by every S > r: one sweep)."""
    big_n = view.decoders
    index, invalid = _shift_index(big_n)
    out: dict[int, float | None] = {}

    def best_tail(kind: Kind, flight: int) -> np.ndarray:
        ok = (kind.mem_fixed + flight * kind.act <= view.capacity) & np.isfinite(kind.fb)
        return np.where(ok, kind.tail, INF).min(axis=0)

    counts = sorted(set(stage_counts))
    if not counts:
        return out
    if counts[0] == 1:
        t = float(best_tail(view.whole, 1)[big_n])
        out[1] = t if math.isfinite(t) else None
    value = best_tail(view.last, 1)
    for r in range(1, counts[-1]):
        if r >= 2:
            stage = best_tail(view.mid, r)
            value = np.min(np.maximum(stage[None, :], np.where(invalid, INF, value[index])), axis=1)
        if r + 1 in counts:
            t = float(np.min(np.maximum(best_tail(view.first, r + 1), value[big_n - np.arange(big_n + 1)])))
            out[r + 1] = t if math.isfinite(t) else None
    return {s: out.get(s) for s in counts}
