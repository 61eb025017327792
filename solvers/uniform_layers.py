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
The search runs every skeleton at once with these kind tables (`solvers.batched_runs`); the
per-type sweeps here (`frontiers`, `tail_capped_frontiers`, `min_max_tails`) are the reference
it is checked against.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

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
    fits: dict = field(default_factory=dict, repr=False)  # flight -> fb, +inf where memory overflows

    def fb_fitting(self, flight: int, capacity: float) -> np.ndarray:
        """F+B where `flight` microbatches fit in memory, +inf elsewhere (cached per flight)."""
        key = (flight, capacity)
        if key not in self.fits:
            self.fits[key] = np.where(self.mem_fixed + flight * self.act <= capacity, self.fb, INF)
        return self.fits[key]


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


def _is_uniform(opts: StageOptions) -> bool:
    """Every middle range [i, i + d) costs what [1, 1 + d) costs, in every field (and is finite
    exactly where that one is)."""
    big_n = opts.num_layers - 2
    d_idx = np.concatenate([np.full(big_n + 1 - d, d) for d in range(1, big_n + 1)])
    i_idx = np.concatenate([np.arange(1, big_n + 2 - d) for d in range(1, big_n + 1)])
    valid = np.isfinite(opts.fb[:, i_idx, i_idx + d_idx])
    for f in _FIELDS:
        vals = np.where(valid, getattr(opts, f)[:, i_idx, i_idx + d_idx], INF)
        ref = vals[:, np.searchsorted(d_idx, d_idx)]  # the i = 1 entry of each d (d_idx ascends)
        fin = np.isfinite(ref)
        if not np.array_equal(np.isfinite(vals), fin):
            return False
        diff = np.abs(np.where(fin, vals - np.where(fin, ref, 0.0), 0.0))
        if np.any(diff > 1e-9 * np.maximum(np.abs(np.where(fin, ref, 0.0)), 1e-300)):
            return False
    return True


def _kind_columns(a: np.ndarray, mid_ok: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """One field's (first, mid, last, whole) tables by decoder count d = 0..N."""
    big_n = n - 2
    d_all = np.arange(big_n + 1)
    mid = np.full((a.shape[0], big_n + 1), INF)
    mid[:, 1:] = np.where(mid_ok, a[:, 1, 2:n], INF)  # the middle range [1, 1 + d)
    whole = np.full((a.shape[0], big_n + 1), INF)
    whole[:, big_n] = a[:, 0, n]
    return a[:, 0, 1 + d_all], mid, a[:, n - 1 - d_all, n], whole


def kind_cells(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The layer ranges [i, j) the stage kinds read: [0, j) (first, and whole at j = n), [i, n)
    (last) and [1, j) (middle). With identical layers every other range equals one of these in
    every field, so comparing options on them compares them everywhere."""
    i = np.concatenate([np.zeros(n, dtype=np.int64), np.arange(1, n), np.ones(max(n - 2, 0), dtype=np.int64)])
    j = np.concatenate([np.arange(1, n + 1), np.full(n - 1, n), np.arange(2, n)])
    return i, j


@dataclass(frozen=True, eq=False)
class KindCellOptions:
    """`StageOptions` of identical layers on the kind cells only (`kind_cells(n)`, in its order):
    each field (O, 3n - 3). `planner.search.options.OptionCosting.kind_options` costs them (the
    same values as its full tables there); `expand` gives the full tables, for the general DP."""

    fb: np.ndarray
    tail: np.ndarray
    mem_fixed: np.ndarray
    act: np.ndarray
    capacity: float
    num_layers: int
    expand: Callable[[], StageOptions] = field(repr=False)
    _expanded: list = field(default_factory=list, repr=False)  # `expanded`'s, once computed

    def expanded(self) -> StageOptions:
        """`expand()`, computed once (the general DP asks once per skeleton holding this type)."""
        if not self._expanded:
            self._expanded.append(self.expand())
        return self._expanded[0]

    def subset(self, keep: list[int]) -> KindCellOptions:
        return KindCellOptions(self.fb[keep], self.tail[keep], self.mem_fixed[keep], self.act[keep], self.capacity,
                               self.num_layers, functools.partial(_expanded_subset, self.expanded, keep))


def _expanded_subset(expand: Callable[[], StageOptions], keep: list[int]) -> StageOptions:
    full = expand()
    return StageOptions(full.fb[keep], full.tail[keep], full.mem_fixed[keep], full.act[keep], full.capacity)


def full_options(opts: StageOptions | KindCellOptions) -> StageOptions:
    """Options on every layer range: `opts` itself, or a `KindCellOptions`'s expanded."""
    return opts.expanded() if isinstance(opts, KindCellOptions) else opts


def _kind_cell_columns(a: np.ndarray, mid_ok: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """`_kind_columns` of a field on the kind cells (O, 3n - 3): [0, j) for j = 1..n, then
    [i, n) for i = 1..n-1, then [1, j) for j = 2..n-1."""
    big_n = n - 2
    d_all = np.arange(big_n + 1)
    mid = np.full((a.shape[0], big_n + 1), INF)
    mid[:, 1:] = np.where(mid_ok, a[:, 2 * n - 1:3 * n - 3], INF)
    whole = np.full((a.shape[0], big_n + 1), INF)
    whole[:, big_n] = a[:, n - 1]
    return a[:, d_all], mid, a[:, 2 * n - 2 - d_all], whole


def uniform_view(opts: StageOptions | KindCellOptions, trusted: bool = False) -> UniformView | None:
    """The kind tables, or None when a middle stage's cost depends on its position. `trusted` skips
    that check (for arrays already checked at another replica count: tails change with replicas,
    their dependence on the layer range does not); kind-cell options were costed only because
    their layers are identical."""
    n = opts.num_layers
    if isinstance(opts, KindCellOptions):
        if n - 2 < 1:
            return None
        mid_ok = np.isfinite(opts.fb[:, 2 * n - 1:3 * n - 3])
        cols = [_kind_cell_columns(getattr(opts, f), mid_ok, n) for f in _FIELDS]
        first, mid, last, whole = (Kind(*(c[k] for c in cols)) for k in range(4))
        return UniformView(n, first, mid, last, whole, opts.capacity)
    if n - 2 < 1 or not (trusted or _is_uniform(opts)):
        return None
    mid_ok = np.isfinite(opts.fb[:, 1, 2:n])
    cols = [_kind_columns(getattr(opts, f), mid_ok, n) for f in _FIELDS]
    first, mid, last, whole = (Kind(*(c[k] for c in cols)) for k in range(4))
    return UniformView(n, first, mid, last, whole, opts.capacity)


def with_tail(view: UniformView, tail: np.ndarray) -> UniformView:
    """The same view with the stage tails of `tail` (O, L+1, L+1), or on the kind cells (O,
    3n - 3, `KindCellOptions`), e.g. re-costed for another replica count; F+B, memory and their
    caches are shared."""
    n = view.n
    mid_ok = np.isfinite(view.mid.fb[:, 1:])
    cols = _kind_cell_columns(tail, mid_ok, n) if tail.ndim == 2 else _kind_columns(tail, mid_ok, n)
    old = (view.first, view.mid, view.last, view.whole)
    kinds = [Kind(k.fb, c, k.mem_fixed, k.act, k.fits) for k, c in zip(old, cols)]
    return UniformView(n, *kinds, view.capacity)


def _best(kind: Kind, flight: int, caps: np.ndarray, capacity: float,
          ecaps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Least F+B over options per (row, d) under each row's cap on F+B (and on the tail, when
    `ecaps` is given) and memory at `flight`; and the option."""
    fb = kind.fb_fitting(flight, capacity)[None]
    ok = fb <= caps[:, None, None]
    if ecaps is not None:
        ok = ok & (kind.tail[None] <= ecaps[:, None, None])
    cost = np.where(ok, fb, INF)  # (B, O, D)
    arg = np.argmin(cost, axis=1)
    return np.take_along_axis(cost, arg[:, None, :], axis=1)[:, 0, :], arg


@functools.lru_cache(maxsize=64)
def _shift_index(big_n: int) -> np.ndarray:
    """index[k, d] = k - d, or N + 1 (a padding column of +inf) where d > k."""
    k = np.arange(big_n + 1)[:, None]
    d = np.arange(big_n + 1)[None, :]
    return np.where(k < d, big_n + 1, k - d)


def _conv(stage: np.ndarray, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(min, +) convolution per batch row: out[b, k] = min_d stage[b, d] + rest[b, k - d], and its
    argmin (the first least d). Only d up to the last one any row can take is scanned (bottleneck
    caps keep stages short). One pass per d over shifted slices: 2-3x faster than gathering every
    (k, d) pair at once."""
    rows, width = rest.shape
    out = np.full((rows, width), INF)
    arg = np.zeros((rows, width), dtype=np.int64)
    for d in range(_scan_width(stage, width)):
        cand = stage[:, d:d + 1] + rest[:, :width - d]
        better = cand < out[:, d:]  # strict: ties keep the smaller d
        np.copyto(out[:, d:], cand, where=better)
        np.copyto(arg[:, d:], d, where=better)
    return out, arg


def _minmax_conv(stage: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """(min, max) convolution per batch row: out[b, k] = min_d max(stage[b, d], rest[b, k - d])."""
    rows, width = rest.shape
    span = _scan_width(stage, width)
    # decoders-major copies, so each step runs over contiguous rows (1.1-2.4x faster on 1-4,000
    # rows; `batched_runs._min_plus` does the same)
    stage_t = np.ascontiguousarray(stage[:, :span].T)
    rest_t = np.ascontiguousarray(rest.T)
    out = np.full((width, rows), INF)
    for d in range(span):
        np.minimum(out[d:], np.maximum(stage_t[d], rest_t[:width - d]), out=out[d:])
    return np.ascontiguousarray(out.T)


def _scan_width(stage: np.ndarray, width: int) -> int:
    """One past the largest d any row can take (a finite entry), at most `width`."""
    live = np.flatnonzero(np.isfinite(stage).any(axis=0))
    return min(int(live[-1]) + 1, width) if len(live) else 0


def _splits_for_caps(view: UniformView, stage_counts: list[int], caps: np.ndarray,
                     ecaps: np.ndarray | None = None) -> list[Split | None]:
    """Least-A split for each row: stage count `stage_counts[b]` (rows may repeat a count) under
    cap `caps[b]` on F+B and, when given, `ecaps[b]` on every stage's tail."""
    big_n, cap = view.decoders, view.capacity
    counts = np.asarray(stage_counts)
    out: list[Split | None] = [None] * len(stage_counts)
    row_e = None if ecaps is None else np.asarray(ecaps, dtype=float)
    ones = np.flatnonzero(counts == 1)
    if len(ones):
        fb, arg = _best(view.whole, 1, caps[ones], cap, None if row_e is None else row_e[ones])
        for k, b in enumerate(ones):
            if math.isfinite(fb[k, big_n]):
                out[b] = _single(view, int(arg[k, big_n]))
    rows = np.flatnonzero(counts >= 2)
    if not len(rows):
        return out
    row_caps = caps[rows]
    row_ecaps = None if row_e is None else row_e[rows]
    last_fb, last_o = _best(view.last, 1, row_caps, cap, row_ecaps)
    value = last_fb  # (B, N+1): r stages covering the last k decoders and the head
    trace: list[tuple[np.ndarray, np.ndarray]] = []  # per r >= 2: (d choice per (b, k), option per (b, d))
    row_s = counts[rows]
    for r in range(1, int(row_s.max())):
        if r >= 2:
            mid_fb, mid_o = _best(view.mid, r, row_caps, cap, row_ecaps)
            value, arg_d = _conv(mid_fb, value)
            trace.append((arg_d, mid_o))
        done = np.flatnonzero(row_s == r + 1)
        if not len(done):
            continue
        first_fb, first_o = _best(view.first, r + 1, row_caps[done], cap,
                                  None if row_ecaps is None else row_ecaps[done])
        totals = first_fb + value[done][:, big_n - np.arange(big_n + 1)]
        for k, b in enumerate(done):
            d0 = int(np.argmin(totals[k]))
            if math.isfinite(totals[k, d0]):
                out[rows[b]] = _recover(view, int(b), r + 1, d0, int(first_o[k, d0]), trace, last_o)
    return out


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


@dataclass
class Budget:
    """A wall-clock deadline (`time.perf_counter`) for the parametric sweeps; `hit` records that a
    sweep stopped early, `cut` the rows it stopped (their frontiers are incomplete: fine for plans;
    for a bound, a row's splits below its last point's C have A at least that point's, and C at
    least the row's least bottleneck, `batched_runs.batched_least_bottlenecks`)."""

    deadline: float | None = None
    hit: bool = False
    cut: list = field(default_factory=list)
    rounds: int | None = None  # rounds after which the rows still live are cut (a bound's sweep; not `hit`)

    def over(self) -> bool:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.hit = True
        return self.hit

    def stop(self, k: int) -> bool:
        """Whether the sweep stops before its round k: past the deadline, or `rounds` rounds done."""
        return self.over() or (self.rounds is not None and k >= self.rounds)


def parametric_frontiers(solve: Callable[[list[Hashable], np.ndarray], list[Split | None]],
                         rows: list[Hashable], max_rounds: int = 10_000,
                         budget: Budget | None = None) -> dict[Hashable, list[Split]]:
    """Every non-dominated (A, C) split of each row: solve all live rows under their bottleneck caps,
    then lower each row's cap just below the bottleneck it reached, until none is feasible. Past
    `budget`'s deadline it stops after the first round (each row's least-A split)."""
    live = list(rows)
    found: dict[Hashable, list[Split]] = {r: [] for r in live}
    caps = {r: INF for r in live}
    for k in range(max_rounds):
        if not live:
            break
        if k > 0 and budget is not None and budget.over():
            budget.cut.extend(live)
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


def frontiers(view: UniformView, stage_counts: list[int], budget: Budget | None = None) -> dict[int, list[Split]]:
    """Every non-dominated (A, C) split of `[opts] * S` for each S in `stage_counts` (all stage
    counts advance together)."""
    counts = sorted(set(s for s in stage_counts if 1 <= s <= view.n))
    return parametric_frontiers(lambda live, caps: _splits_for_caps(view, live, caps), counts, budget=budget)


def tail_capped_frontiers(view: UniformView, stage_counts: list[int],
                          e_levels: list[float]) -> dict[tuple[int, int], list[Split]]:
    """For each S and each tail cap `e_levels[j]`, every non-dominated (A, C) split of `[opts] * S`
    whose stages all have tails <= the cap, keyed (S, j); every pair advances in one sweep."""
    counts = sorted(set(s for s in stage_counts if 1 <= s <= view.n))
    rows = [(s, j) for s in counts for j in range(len(e_levels))]
    levels = np.asarray(e_levels, dtype=float)
    return parametric_frontiers(lambda live, caps: _splits_for_caps(
        view, [s for s, _ in live], caps, levels[[j for _, j in live]]), rows)


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
    index = _shift_index(big_n)
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
            value = np.min(np.maximum(stage[None, :], np.append(value, INF)[index]), axis=1)
        if r + 1 in counts:
            t = float(np.min(np.maximum(best_tail(view.first, r + 1), value[big_n - np.arange(big_n + 1)])))
            out[r + 1] = t if math.isfinite(t) else None
    return {s: out.get(s) for s in counts}
