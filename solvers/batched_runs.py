"""Split frontiers of every uniform-layer skeleton of a pool in one batched dynamic program.

`solvers.uniform_layers` (one block type, every stage count) and `solvers.two_runs` (one pair of
block types, every (k1, k2)) each run their own sweep; a large pool has hundreds of pairs whose DPs
are small, so per-call overhead dominated the frontier time. Here every row -- runs of stages, e.g.
S stages of type x, or k1 stages of x then k2 of y, or k1 of x, k2 of y, then k3 of z -- is one row
of a single DP over (stages left r, decoders left k), and the parametric sweep lowers every row's
cap at once. Only the type of the r-th stage from the end differs between rows (`RowCodes.rev`).

Without tail caps, a stage's best option for d decoders at flight f is the cheapest one whose memory
fits: a cap on F+B either keeps that option or rules out every one. So each (kind, type, flight)
reduces to one vector over d, computed once, and a round costs one gather and one (min, +)
convolution per stage position for all rows together. The results (splits, options, ties) equal
`uniform_layers.frontiers` and `two_runs.chain_frontiers`; `tests/test_batched_runs.py` checks it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from solvers.partition import Split, pareto_ac
from solvers.uniform_layers import (INF, Budget, Kind, UniformView, _minmax_conv, _scan_width,
                                    parametric_frontiers)

Row = tuple  # (x1, k1, x2, k2, ...): k1 stages of type x1, then k2 of type x2, ... (counts may be 0)


@functools.lru_cache(maxsize=1 << 16)
def row_skeleton(row: Row) -> tuple:
    """The stage types of a row, first stage first (cached: the providers ask for each row's
    several times, 8,000 rows per search at 64 GPUs)."""
    return tuple(x for i in range(0, len(row), 2) for x in (row[i],) * row[i + 1])


def skeleton_row(skeleton: tuple) -> Row:
    """The row of a stage-type sequence: its runs as (type, count) pairs, flattened."""
    out: list = []
    for x in skeleton:
        if out and out[-2] == x:
            out[-1] += 1
        else:
            out += [x, 1]
    return tuple(out)


class SplitColumns(NamedTuple):
    """Splits of rows with the same stage count as (rows, stages) arrays (`_Batch.solve_columns`)."""

    at: np.ndarray  # (k,) each split's row, as a position in the ids solved
    starts: np.ndarray  # (k, s) first slot of each stage
    ends: np.ndarray  # (k, s) last slot of each stage
    options: np.ndarray  # (k, s) each stage's option in its own view
    fb: np.ndarray  # (k, s)
    tails: np.ndarray  # (k, s)


@dataclass(frozen=True)
class _Least:
    """Least F+B over options, and the option, by (flight, type, decoders) for one stage kind."""

    fb: np.ndarray  # (F + 1, T, D)
    option: np.ndarray  # (F + 1, T, D)
    tail: np.ndarray  # (F + 1, T, D): the tail of that option


def _flights(flights: int, max_flight: int | None) -> np.ndarray:
    """Microbatches held by the stage at flight 1..`flights` (r-th from the end holds r), as a
    (F, 1, 1) column: at most `max_flight` (a pipeline of m < S microbatches holds min(r, m))."""
    f = np.arange(1, flights + 1, dtype=float)
    return (f if max_flight is None else np.minimum(f, max_flight))[:, None, None]


def _least(kinds: list[Kind], capacities: list[float], flights: int, max_flight: int | None = None) -> _Least:
    f = _flights(flights, max_flight)
    fb, option, tail = [], [], []
    for kind, cap in zip(kinds, capacities):
        fits = np.where(kind.mem_fixed[None] + f * kind.act[None] <= cap, kind.fb[None], INF)  # (F, O, D)
        fits = np.concatenate([np.full_like(fits[:1], INF), fits])  # flight 0: unused
        arg = np.argmin(fits, axis=1)
        fb.append(np.take_along_axis(fits, arg[:, None, :], axis=1)[:, 0, :])
        option.append(arg)
        tail.append(np.take_along_axis(kind.tail, arg, axis=0))
    return _Least(np.stack(fb, axis=1), np.stack(option, axis=1), np.stack(tail, axis=1))


def _runs(row: Row) -> list[tuple[Hashable, int]]:
    return [(row[i], row[i + 1]) for i in range(0, len(row), 2)]


@dataclass(frozen=True)
class RowCodes:
    """Rows that fit in `n` slots (deduplicated, in first-seen order) coded against an order of view
    keys: each row's stage count and the type index of its r-th stage from the end. Built once,
    reused per call."""

    live: list[Row]
    total: np.ndarray  # (B,) stages per row
    rev: np.ndarray  # (B, L + 1): rev[b, r] = type index of row b's r-th stage from the end (r >= 1)
    steps: dict = field(default_factory=dict, compare=False, repr=False)  # see `_suffix_steps`

    @classmethod
    def of(cls, keys: list[Hashable], rows: list[Row], n: int) -> RowCodes:
        at = {key: i for i, key in enumerate(keys)}
        live = [r for r in dict.fromkeys(rows) if _is_live(r, n)]
        # run by run, then stage by stage with np.repeat (a loop over every stage of ~2,000 rows
        # per call took 10 ms, and every unit worker codes each microbatch size's rows again)
        runs = np.fromiter((len(r) // 2 for r in live), dtype=np.int64, count=len(live))
        kinds = np.fromiter((at[x] for r in live for x in r[0::2]), dtype=np.int64, count=int(runs.sum()))
        counts = np.fromiter((k for r in live for k in r[1::2]), dtype=np.int64, count=int(runs.sum()))
        stage_row = np.repeat(np.repeat(np.arange(len(live)), runs), counts)
        total = np.bincount(stage_row, minlength=len(live)).astype(np.int64)
        rev = np.zeros((len(live), int(total.max(initial=0)) + 1), dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(total)[:-1]]).astype(np.int64) if len(live) else total
        position = np.arange(len(stage_row)) - first[stage_row]  # 0: the row's first stage
        rev[stage_row, total[stage_row] - position] = np.repeat(kinds, counts)
        return cls(live, total, rev)


def _is_live(row: Row, n: int) -> bool:
    counts = row[1::2]
    return len(row) % 2 == 0 and all(k >= 0 for k in counts) and 1 <= sum(counts) <= n


class _Batch:
    """The per-type least-cost tables and a solver of every row under per-row F+B caps."""

    def __init__(self, views: list[UniformView], flights: int, max_flight: int | None = None) -> None:
        self.views = views
        caps = [v.capacity for v in views]
        self.first = _least([v.first for v in views], caps, flights, max_flight)
        self.mid = _least([v.mid for v in views], caps, flights, max_flight)
        self.last = _least([v.last for v in views], caps, 1)
        self.whole = _least([v.whole for v in views], caps, 1)
        self.big_n = views[0].decoders
        self.n = views[0].n
        # the first, middle and last tables stacked by flight, so a split's stages are read in one
        # gather per field (`_recover`): first at [0, F], middle at F + 1 + flight, last at 2F + 3
        self._stacked = {f: np.concatenate([getattr(self.first, f), getattr(self.mid, f), getattr(self.last, f)])
                         for f in ("option", "fb", "tail")}
        self._mid_at = flights + 1
        self._last_at = 2 * flights + 3

    def solve(self, codes: RowCodes, ids: list[int], caps: np.ndarray) -> list[Split | None]:
        """Least-A split of each row `codes.live[i]`, i in `ids`, under its cap (None where none fits)."""
        out: list[Split | None] = [None] * len(ids)
        for g in self.solve_columns(codes, ids, caps):
            for b, st, en, o, f, t in zip(g.at.tolist(), g.starts.tolist(), g.ends.tolist(), g.options.tolist(),
                                          g.fb.tolist(), g.tails.tolist()):
                out[b] = Split(tuple(zip(st, en)), tuple(o), tuple(f), tuple(t))
        return out

    def solve_columns(self, codes: RowCodes, ids: list[int] | np.ndarray, caps: np.ndarray) -> list[SplitColumns]:
        """`solve`'s splits as arrays, one group per stage count: the rows' positions in `ids`
        and their stages' first and last slots, options, F+B and tails (rows without a split left
        out). Building a tuple per split costs more than the DP when most are dropped later."""
        big_n = self.big_n
        groups: list[SplitColumns] = []
        idx = np.asarray(ids, dtype=np.int64)
        total, rev = codes.total[idx], codes.rev[idx]
        single = np.flatnonzero(total == 1)
        if len(single):
            x = rev[single, 1]
            fb = self.whole.fb[1, x, big_n]
            ok = np.isfinite(fb) & (fb <= caps[single])
            if ok.any():
                x, b = x[ok], single[ok]
                k = len(b)
                groups.append(SplitColumns(b, np.zeros((k, 1), dtype=np.int64), np.full((k, 1), self.n - 1),
                                           self.whole.option[1, x, big_n][:, None],
                                           self.whole.fb[1, x, big_n][:, None], self.whole.tail[1, x, big_n][:, None]))
        order = np.flatnonzero(total >= 2)
        if not len(order):
            return groups
        order = order[np.argsort(-total[order], kind="stable")]  # rows still in the DP: a prefix
        rev, tot = rev[order], total[order]
        cap = caps[order][:, None]
        value = self.last.fb[1, rev[:, 1]]
        value = np.where(value <= cap, value, INF)  # (B, D): r stages covering the last k decoders
        rest = big_n - np.arange(big_n + 1)
        trace: list[tuple[np.ndarray, np.ndarray]] = []  # per r >= 2: the stage costs and the table they met
        for r in range(1, int(tot[0])):
            active = int(np.count_nonzero(tot > r))
            if r >= 2:
                stage = self.mid.fb[r, rev[:active, r]]
                stage = np.where(stage <= cap[:active], stage, INF)
                trace.append((stage, value[:active]))
                value = _min_plus(stage, value[:active])
            done = np.arange(int(np.count_nonzero(tot > r + 1)), active)
            if not len(done):
                continue
            first = self.first.fb[r + 1, rev[done, r + 1]]
            first = np.where(first <= cap[done], first, INF)
            sums = first + value[done][:, rest]
            d0 = np.argmin(sums, axis=1)
            ok = np.isfinite(sums[np.arange(len(done)), d0])
            if ok.any():
                groups.append(self._recover(done[ok], r + 1, d0[ok], rev, trace)._replace(at=order[done[ok]]))
        return groups

    def _recover(self, rows: np.ndarray, s: int, d0: np.ndarray, rev: np.ndarray,
                 trace: list[tuple[np.ndarray, np.ndarray]]) -> SplitColumns:
        """The splits of `rows` (s stages each; `d0` decoders in the first), walked back through
        the DP for all rows at once: at each stage the first least d, as `_min_plus` took it."""
        big_n, n = self.big_n, self.n
        at = np.array([s] + [self._mid_at + f for f in range(s - 1, 1, -1)] + [self._last_at])
        ds = [d0]
        k = big_n - d0
        each_d = np.arange(trace[0][0].shape[1]) if s > 2 else None  # every stage's decoder axis
        for r in range(s - 1, 1, -1):
            stage, rest = trace[r - 2]
            shift = k[:, None] - each_d
            cand = stage[rows] + rest[rows[:, None], np.maximum(shift, 0)]
            cand[shift < 0] = INF  # more decoders than are left
            d = cand.argmin(axis=1)
            ds.append(d)
            k = k - d
        ds.append(k)
        d_all = np.stack(ds, axis=1)  # (rows, s): decoders per stage, first stage first
        types = rev[rows][:, s - np.arange(s)]
        opts, fbs, tails = (self._stacked[f][at, types, d_all] for f in ("option", "fb", "tail"))
        ends = np.cumsum(d_all, axis=1)
        ends[:, -1] += 1  # the last stage also holds the head
        starts = np.concatenate([np.zeros((len(rows), 1), dtype=np.int64), ends[:, :-1] + 1], axis=1)
        assert np.all(ends[:, -1] == n - 1)
        return SplitColumns(rows, starts, ends, opts, fbs, tails)


FEW_ROWS = 16  # `_min_plus` on at most this many rows gathers every (d, k) pair (a sweep's late
# rounds): against the decoders-major loop 1 row 6x faster, 5 rows 2.3x, 16 rows 1.2x; from about
# 20 rows the gathered array costs more


@functools.lru_cache(maxsize=64)
def _shifted(span: int, width: int) -> np.ndarray:
    """(span, width) index into a row padded with `width` +inf in front: entry (d, k) is k - d."""
    return width + np.arange(width)[None, :] - np.arange(span)[:, None]


def _min_plus(stage: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """(min, +) convolution per row, out[b, k] = min_d stage[b, d] + rest[b, k - d], without the
    argmin `uniform_layers._conv` keeps: only the rows a round finishes need their choices, and
    `_Batch._recover` recomputes them from the same sums (one pass per d, two array operations)."""
    rows, width = rest.shape
    span = _scan_width(stage, width)
    if 0 < span and rows <= FEW_ROWS:  # few rows: every (d, k) at once, not two array operations per d
        padded = np.concatenate([np.full((rows, width), INF), rest], axis=1)
        return (stage[:, :span, None] + padded[:, _shifted(span, width)]).min(axis=1)
    # decoders-major copies: each step then reads and writes whole contiguous rows of the
    # (decoders, rows) arrays, 2.4-3x faster on 100-5,000 rows than strided columns of (rows, decoders)
    stage_t = np.ascontiguousarray(stage[:, :span].T)
    rest_t = np.ascontiguousarray(rest.T)
    out = np.full((width, rows), INF)
    for d in range(span):
        np.minimum(out[d:], stage_t[d] + rest_t[:width - d], out=out[d:])
    return np.ascontiguousarray(out.T)


def sweep_order(codes: RowCodes) -> list[int]:
    """The live rows in the order the parametric sweeps take them: by stage types, first stage
    first (so the answer does not depend on the order rows were given in)."""
    return sorted(range(len(codes.live)), key=lambda i: codes.rev[i, codes.total[i]:0:-1].tolist())


def _batched(views: dict[Hashable, UniformView], rows: list[Row],
             max_flight: int | None) -> tuple[RowCodes, _Batch, dict[Row, int]] | None:
    """The rows coded against `views`, the batch that solves them, and each live row's index;
    None when there is nothing to solve."""
    keys = list(views)
    if not keys:
        return None
    codes = RowCodes.of(keys, rows, views[keys[0]].n)
    if not codes.live:
        return None
    batch = _Batch([views[k] for k in keys], int(codes.total.max()), max_flight)
    return codes, batch, {row: i for i, row in enumerate(codes.live)}


def batched_frontiers(views: dict[Hashable, UniformView], rows: list[Row],
                      budget: Budget | None = None, max_flight: int | None = None) -> dict[Row, list[Split]]:
    """Every non-dominated (A, C) split of each row (x1, k1, x2, k2, ...): k1 stages of `views[x1]`,
    then k2 of `views[x2]`, ... Option indices refer to each stage's own view. Rows with no stage,
    or more stages than layer slots, are left out. `max_flight`: the microbatches a stage holds at
    most (`partition.split_frontier`'s `max_in_flight`: a pipeline run with m < S microbatches)."""
    got = _batched(views, rows, max_flight)
    if got is None:
        return {}
    codes, batch, at = got
    order = sweep_order(codes)
    found = parametric_frontiers(lambda rs, caps: batch.solve(codes, [at[r] for r in rs], caps),
                                 [codes.live[i] for i in order], budget=budget)
    return found


def batched_step_frontiers(views: dict[Hashable, UniformView], rows: list[Row], microbatches: int,
                           max_flight: int | None = None,
                           least_e: dict[Row, float | None] | None = None) -> dict[Row, list[Split]]:
    """The part of each row's (A, C) frontier (`batched_frontiers`) that a pipeline running
    `microbatches` (m) can use: it holds the split of least A + (m - 1)·C and the split of least
    A + (m - 1)·C + E (ties: least ranges) of the whole frontier, so each equals that of the whole.

    The walk is `batched_frontiers`'; a row still walking after `_PLAIN_ROUNDS` rounds is then
    bounded. With A_0 its least A (its first split), C_min its least bottleneck and E_min its least
    largest tail, a split of bottleneck C costs at least A_0 + (m - 1)·C + E_min: none above the C
    where that reaches the least step so far (the split at C_min's included; just above, against
    rounding) can be either, so the walk jumps there. Going down, A only grows, so it stops once
    the split just reached has A + (m - 1)·C_min not below the least A + (m - 1)·C so far and that
    plus E_min above the least step so far (every later split costs at least as much). Rows whose
    frontiers end within the plain rounds (most, where few splits fit) pay nothing for the bounds.
    On `many_types.py --seed 1` pool 18 (the chain candidate's run orders, m = 64) this solved
    1,090 batched DPs where the whole frontiers took 2,452. `least_e`: `batched_min_max_tails` of the
    rows, if the caller has it."""
    got = _batched(views, rows, max_flight)
    if got is None:
        return {}
    codes, batch, at = got
    keys = list(views)
    order = [codes.live[i] for i in sweep_order(codes)]
    if least_e is None:
        least_e = batched_min_max_tails(views, order, max_flight)
    m1 = microbatches - 1
    found: dict[Row, list[Split]] = {r: [] for r in order}
    caps = {r: INF for r in order}
    low: dict[Row, tuple[float, float, float]] = {}  # bounded rows: C_min, least A + (m-1)C, least step

    def solve(rs: list[Row], cap: list[float]) -> list[Split | None]:
        return batch.solve(codes, [at[r] for r in rs], np.array(cap, dtype=float))

    def take(row: Row, sp: Split) -> bool:
        """Add a split the walk reached; whether the row walks on."""
        found[row].append(sp)
        if row not in low:
            return True
        c_min, best_ac, best_step = low[row]
        ac = sp.a_s + m1 * sp.c_s
        best_ac, best_step = min(best_ac, ac), min(best_step, ac + sp.e_s)
        low[row] = (c_min, best_ac, best_step)
        rest = sp.a_s + m1 * c_min
        return not (rest >= best_ac and rest + least_e[row] > best_step)

    live = list(order)
    for k in range(10_000):
        if not live:
            break
        if k == _PLAIN_ROUNDS and m1 > 0:
            _bound_rows(batch, keys, live, views[keys[0]].n, least_e, found, low, solve, m1, caps)
        nxt = []
        for row, sp in zip(live, solve(live, [caps[r] for r in live])):
            if sp is not None and take(row, sp):
                caps[row] = float(np.nextafter(sp.c_s, -INF))
                nxt.append(row)
        live = nxt
    return {r: pareto_ac(v) for r, v in found.items() if v}


_PLAIN_ROUNDS = 2  # rounds of the plain walk before a row's frontier is bounded


def _bound_rows(batch: _Batch, keys: list[Hashable], live: list[Row], n: int, least_e: dict, found: dict,
                low: dict, solve: Callable, m1: int, caps: dict) -> None:
    """`batched_step_frontiers`' bounds for the rows still walking: each row's least bottleneck
    (`_least_bottlenecks` on the batch's own tables) and its split there, its least
    A + (m - 1)·C and step so far (in `low`), and its cap lowered to where a split can still win."""
    sub = RowCodes.of(keys, live, n)
    least_c = _least_bottlenecks(sub, batch)
    c_of = {r: float(c) for r, c in zip(sub.live, least_c.tolist()) if math.isfinite(c)}
    rows = [r for r in live if r in c_of and least_e.get(r) is not None]
    for row, sp in zip(rows, solve(rows, [c_of[r] for r in rows])):
        if sp is not None:
            found[row].append(sp)
    for row in rows:
        points = found[row]
        best_ac = min(p.a_s + m1 * p.c_s for p in points)
        best_step = min(p.a_s + m1 * p.c_s + p.e_s for p in points)
        low[row] = (c_of[row], best_ac, best_step)
        top = (best_step - points[0].a_s - least_e[row]) / m1 * (1 + 1e-9)
        caps[row] = min(caps[row], top)


def _least_tail(kinds: list[Kind], capacities: list[float], flights: int,
                max_flight: int | None = None) -> np.ndarray:
    """Least stage tail over options whose memory fits, by (flight, type, decoders)."""
    f = _flights(flights, max_flight)
    out = []
    for kind, cap in zip(kinds, capacities):
        # which options fit does not depend on the tails: kept with the kind's memory (`Kind.fits`,
        # shared by the views whose tails `with_tail` swaps: every unit of a size asks again)
        key = ("tail_mask", flights, max_flight, cap)
        if key not in kind.fits:
            kind.fits[key] = (kind.mem_fixed[None] + f * kind.act[None] <= cap) & np.isfinite(kind.fb)[None]
        least = np.where(kind.fits[key], kind.tail[None], INF).min(axis=1)  # (F, D)
        out.append(np.concatenate([np.full_like(least[:1], INF), least]))
    return np.stack(out, axis=1)


def batched_min_max_tails(views: dict[Hashable, UniformView], rows: list[Row],
                          max_flight: int | None = None) -> dict[Row, float | None]:
    """Least possible largest stage tail over every memory-feasible split of each row (as in
    `batched_frontiers`, `max_flight` too); equals `uniform_layers.min_max_tails` and
    `two_runs.chain_min_max_tails` row by row, in one (min, max) DP for all rows."""
    keys = list(views)
    if not keys:
        return {}
    codes = RowCodes.of(keys, rows, views[keys[0]].n)
    tails = coded_min_max_tails([views[k] for k in keys], codes, max_flight)
    return {r: (t if math.isfinite(t) else None) for r, t in zip(codes.live, tails.tolist())}


def coded_min_max_tails(views: list[UniformView], codes: RowCodes, max_flight: int | None = None) -> np.ndarray:
    """`batched_min_max_tails` on rows coded against `views` (in order): the least largest tail
    of each live row, +inf where no split fits."""
    if not codes.live:
        return np.full(0, INF)
    caps = [v.capacity for v in views]
    flights = int(codes.total.max())
    return _coded_min_max(codes, lambda kind, f: _least_tail([getattr(v, kind) for v in views], caps, f, max_flight),
                          flights)


def batched_least_bottlenecks(views: dict[Hashable, UniformView], rows: list[Row],
                              max_flight: int | None = None) -> dict[Row, float | None]:
    """Least possible largest stage F+B (the bottleneck C) over every memory-feasible split of
    each row (as in `batched_frontiers`, `max_flight` too), in one (min, max) DP for all rows: a
    stage's F+B is at least its cheapest option that fits, so no split of the row has a smaller
    C. With a row's least A it bounds every split a cut-short frontier did not reach
    (`Budget.cut`)."""
    got = _batched(views, rows, max_flight)
    if got is None:
        return {}
    codes, batch, _ = got
    least = _least_bottlenecks(codes, batch)
    return {r: (c if math.isfinite(c) else None) for r, c in zip(codes.live, least.tolist())}


def _least_bottlenecks(codes: RowCodes, batch: _Batch) -> np.ndarray:
    """`batched_least_bottlenecks` of the rows `codes` holds, on the batch's least-F+B tables
    (built for at least as many stages as the longest row)."""
    return _coded_min_max(codes, lambda kind, f: getattr(batch, kind).fb, int(codes.total.max()))


def _coded_min_max(codes: RowCodes, table: Callable[[str, int], np.ndarray], flights: int) -> np.ndarray:
    """Least over splits of the largest per-stage value, for every live row: `table(kind, F)` is
    that value by (flight 0..F, type, decoders) for the stage kind ("first", "mid", "last",
    "whole"), +inf where no option fits.

    Without caps a row's table after r stages from the end depends only on the types of those r
    stages, so the DP runs once per distinct suffix, not once per row: on a 64-GPU ladder pool
    1,361 suffix steps instead of 8,297 row steps (homogeneous rows of every length share all of
    theirs), 1,560 instead of 16,684 at 1,024 GPUs."""
    out = np.full(len(codes.live), INF)
    total, rev = codes.total, codes.rev
    ones = np.flatnonzero(total == 1)
    whole = table("whole", 1)
    big_n = whole.shape[2] - 1
    out[ones] = whole[1, rev[ones, 1], big_n]
    if not (total >= 2).any():
        return out
    first, mid = table("first", flights), table("mid", flights)
    rest = big_n - np.arange(big_n + 1)
    value = np.zeros(0)
    for r, (suffix, prev, ended, at, first_type) in enumerate(_suffix_steps(codes, first.shape[1], flights), 1):
        value = table("last", 1)[1, suffix] if r == 1 else _minmax_conv(mid[r, suffix], value[prev])
        if len(ended):
            out[ended] = np.min(np.maximum(first[r + 1, first_type], value[at][:, rest]), axis=1)
    return out


def _suffix_steps(codes: RowCodes, types: int, flights: int) -> list[tuple[np.ndarray, ...]]:
    """What `_coded_min_max` walks for stage counts r = 1 .. flights - 1 from the end, which the rows
    alone decide (kept with them: every unit of a microbatch size asks again with its own tails):
    each distinct r-stage suffix's type of its r-th stage and its (r - 1)-stage suffix, and the rows
    of r + 1 stages, with their suffix and the type of their first stage."""
    key = (types, flights)
    if key not in codes.steps:
        total, rev = codes.total, codes.rev
        rows = np.flatnonzero(total >= 2)
        suffix, at = np.unique(rev[rows, 1], return_inverse=True)  # r = 1: the last stage's type
        steps = []
        prev = np.zeros(0, dtype=np.int64)
        for r in range(1, flights):
            if r >= 2:
                live = total[rows] > r
                rows, at = rows[live], at[live]
                coded, at = np.unique(at * types + rev[rows, r], return_inverse=True)
                suffix, prev = coded % types, coded // types
            done = total[rows] == r + 1
            ended = rows[done]
            steps.append((suffix, prev, ended, at[done], rev[ended, r + 1]))
        codes.steps[key] = steps
    return codes.steps[key]
