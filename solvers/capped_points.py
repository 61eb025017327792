"""Tail-capped (A, C) points of every uniform-layer row in one batched sweep: the bound-only level
frontiers of refinement (`planner.search.tail_levels`) and the chain candidate's tail levels
(`planner.search.chain_bounds`).

The batched DP of `solvers.batched_runs`, with each row under its own cap on every stage's tail: a
stage's least F+B within a tail cap is reduced once per (kind, type, tail cap, flight)
(`_TailCappedLeast`), and a row's point is its least A under an F+B cap with the largest stage F+B
along that split (`_path_bottleneck`). Row by row the points equal
`uniform_layers.tail_capped_frontiers` and `two_runs.tail_capped_chain_frontiers`
(`tests/test_batched_runs.py`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np

from solvers.batched_runs import Row, RowCodes, _coded_min_max, _is_live, _min_plus
from solvers.horizon import Horizon, horizon_frontiers
from solvers.two_runs import Point
from solvers.uniform_layers import INF, Kind, UniformView, parametric_frontiers


class _TailCappedLeast:
    """Least F+B of one stage kind by (type, tail cap, decoders) over the options within the tail
    cap whose memory fits at a flight, +inf where none; one table per flight, built on first use
    and then gathered each round. Under an F+B cap the least option within the tail cap either
    fits the F+B cap or none does, so a round only compares this table with its caps: the option
    axis is reduced once per flight, not every round. A stage holds at most `max_flight`
    microbatches (a pipeline of m < S: the r-th stage from the end holds min(r, m))."""

    def __init__(self, kinds: list[Kind], capacities: list[float], levels: np.ndarray,
                 max_flight: int | None = None) -> None:
        self.kinds, self.capacities, self.levels, self.max_flight = kinds, capacities, levels, max_flight
        self.tables: dict[int, np.ndarray] = {}

    def at(self, flight: int) -> np.ndarray:
        """(T, E, D) least F+B at `flight` under each of the E tail caps `levels`."""
        if self.max_flight is not None:
            flight = min(flight, self.max_flight)
        if flight not in self.tables:
            e = self.levels[:, None, None]
            self.tables[flight] = np.stack([
                np.where((kind.mem_fixed + flight * kind.act <= cap)[None] & (kind.tail[None] <= e),
                         kind.fb[None], INF).min(axis=1)
                for kind, cap in zip(self.kinds, self.capacities)])
        return self.tables[flight]


def _capped(table: _TailCappedLeast, flight: int, types: np.ndarray, levels: np.ndarray,
            caps: np.ndarray) -> np.ndarray:
    """Least F+B per (row, d) over options within each row's tail cap (`levels`: indices into the
    table's caps) and F+B cap `caps`, at `flight`."""
    least = table.at(flight)[types, levels]
    return np.where(least <= caps[:, None], least, INF)


def batched_capped_points(views: dict[Hashable, UniformView], rows: list[Row],
                          ecaps: list[float], horizon: Horizon | None = None,
                          max_flight: int | None = None) -> dict[int, list[tuple[float, float]]]:
    """For each row i (as in `batched_frontiers`, `max_flight` too) and its tail cap `ecaps[i]`,
    every non-dominated (A, C) of the splits whose every stage tail is <= the cap, keyed by i (rows
    without such a split left out). Equals `uniform_layers.tail_capped_frontiers` and
    `two_runs.tail_capped_chain_frontiers` row by row; all rows advance in one parametric sweep.
    With a `horizon`, only the points it needs (each row under its own tail cap: its least C is a
    (min, max) DP over the capped tables, `_capped_least_c`)."""
    keys = list(views)
    n = views[keys[0]].n if keys else 0
    live = [i for i, r in enumerate(rows) if _is_live(r, n)]
    if not live:
        return {}
    codes = RowCodes.of(keys, [rows[i] for i in live], n)
    code_of = {r: b for b, r in enumerate(codes.live)}
    row_code = np.array([code_of.get(r, 0) for r in rows], dtype=np.int64)  # dead rows: never asked
    vs = [views[k] for k in keys]
    caps_mem = [v.capacity for v in vs]
    levels, e_code = np.unique(np.asarray(ecaps, dtype=float), return_inverse=True)
    e_code = e_code.reshape(-1)
    first, mid, last, whole = (_TailCappedLeast([getattr(v, kind) for v in vs], caps_mem, levels, max_flight)
                               for kind in ("first", "mid", "last", "whole"))
    big_n = vs[0].decoders
    rest = big_n - np.arange(big_n + 1)

    def solve(ids: list[int], caps: np.ndarray) -> list[Point | None]:
        out: list[Point | None] = [None] * len(ids)
        code = row_code[ids]
        total, rev, ecap = codes.total[code], codes.rev[code], e_code[ids]
        ones = np.flatnonzero(total == 1)
        if len(ones):
            fb = _capped(whole, 1, rev[ones, 1], ecap[ones], caps[ones])[:, big_n]
            for b, v in zip(ones.tolist(), fb.tolist()):
                if math.isfinite(v):
                    out[b] = Point(v, v)
        order = np.flatnonzero(total >= 2)
        if not len(order):
            return out
        order = order[np.argsort(-total[order], kind="stable")]
        rev, tot = rev[order], total[order]
        cap, e = caps[order], ecap[order]
        value = last_fb = _capped(last, 1, rev[:, 1], e, cap)
        trace: list[tuple[np.ndarray, np.ndarray]] = []  # per r >= 2: the stage costs and the table they met
        # per row: least A, the decoders of its first stage and that stage's F+B
        a, d0, c = (np.zeros(len(order)) for _ in range(3))
        for r in range(1, int(tot[0])):
            active = int(np.count_nonzero(tot > r))
            if r >= 2:
                stage = _capped(mid, r, rev[:active, r], e[:active], cap[:active])
                trace.append((stage, value[:active]))
                value = _min_plus(stage, value[:active])
            done = np.arange(int(np.count_nonzero(tot > r + 1)), active)
            if not len(done):
                continue
            fb_first = _capped(first, r + 1, rev[done, r + 1], e[done], cap[done])
            sums = fb_first + value[done][:, rest]
            first_d = np.argmin(sums, axis=1)
            rows_k = np.arange(len(done))
            a[done], d0[done], c[done] = sums[rows_k, first_d], first_d, fb_first[rows_k, first_d]
        c = _path_bottleneck(d0.astype(np.int64), c, trace, last_fb, big_n)
        for b, ai, ci in zip(range(len(order)), a.tolist(), c.tolist()):
            if math.isfinite(ai):
                out[int(order[b])] = Point(ai, ci)
        return out

    if horizon is None:
        found = parametric_frontiers(lambda ids, caps: solve(list(ids), caps), live)
    else:
        def least_c(ids: list[int]) -> np.ndarray:
            return _capped_least_c(codes, row_code[ids], e_code[ids], (first, mid, last, whole))

        found = horizon_frontiers(solve, least_c, live, horizon)
    return {i: [(p.a_s, p.c_s) for p in pts] for i, pts in found.items()}


def _path_bottleneck(d0: np.ndarray, c: np.ndarray, trace: list[tuple[np.ndarray, np.ndarray]],
                     last_fb: np.ndarray, big_n: int) -> np.ndarray:
    """The largest stage F+B along each row's least-A path (rows by stage count, most first, as the
    DP took them; `d0` decoders in the first stage, whose F+B is `c`), walked back through the DP's
    sums for all rows at once: at each stage the first least d, as the (min, +) convolution with
    its argmin takes it (`uniform_layers._conv`, which kept every row's choices at every round:
    on the refinement's level frontiers it and the bottleneck it carried were most of the sweep)."""
    k = big_n - d0
    for stage, rest in reversed(trace):  # stage r of the rows that have one: the first len(stage)
        rows = np.arange(len(stage))
        kr = k[rows]
        shift = kr[:, None] - np.arange(stage.shape[1])[None, :]
        cand = stage + np.take_along_axis(rest, np.maximum(shift, 0), axis=1)
        cand[shift < 0] = INF  # more decoders than are left
        d = cand.argmin(axis=1)
        c[rows] = np.maximum(c[rows], stage[rows, d])
        k[rows] = kr - d
    return np.maximum(c, last_fb[np.arange(len(k)), k])


def _capped_least_c(codes: RowCodes, code: np.ndarray, level: np.ndarray,
                    tables: tuple[_TailCappedLeast, ...]) -> np.ndarray:
    """Least largest stage F+B of each (row `code`, tail cap `level`) over its memory-feasible
    splits within the cap: the (min, max) DP of `_coded_min_max` over (tail cap, type) pairs."""
    n_types = len(tables[0].kinds)
    ext = RowCodes(list(range(len(code))), codes.total[code], codes.rev[code] + n_types * level[:, None])
    flights = int(ext.total.max())
    stacked: dict[str, np.ndarray] = {}

    def table(kind: str, f: int) -> np.ndarray:
        if kind not in stacked:
            t = tables[("first", "mid", "last", "whole").index(kind)]
            by_flight = np.stack([t.at(max(x, 1)) for x in range(f + 1)])  # (F + 1, T, E, D); flight 0 unused
            stacked[kind] = by_flight.transpose(0, 2, 1, 3).reshape(f + 1, -1, by_flight.shape[-1])
        return stacked[kind]

    return _coded_min_max(ext, table, flights)
