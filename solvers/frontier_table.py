"""The batched split frontiers (`batched_runs.batched_frontiers`) as a few flat arrays.

A 64-GPU pool has about 2,000 rows per microbatch size and their parametric sweep finds about
50,000 splits, four in five of them dominated later. Building a named tuple for each (ranges,
options, F+B, tails) and then a provider proto for each of the 11,000 kept took about a quarter
of a size's frontier time (0.37 of 1.5 s under cProfile), and sending those protos back from a
worker process as nested tuples about as long again to pickle and unpickle. Here the sweep keeps
each round's splits as the DP's arrays and only the kept ones are gathered, into one stage table:
the same points, stages and order as `batched_frontiers` (`tests/test_frontier_table.py`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from solvers.batched_runs import Row, RowCodes, SplitColumns, _Batch, _coded_min_max, sweep_order
from solvers.horizon import NOISE_A, Horizon
from solvers.uniform_layers import INF, Budget, UniformView

PARETO_REL = 1e-12  # A within this (relative) counts as equal, as in `partition.pareto_ac`


@dataclass(frozen=True)
class FrontierTable:
    """Every non-dominated (A, C) split of each row, rows in sweep order (as `batched_frontiers`'s
    keys), each row's splits in ascending C; split q's stages are `start[q]:start[q + 1]` of the
    stage arrays, first stage first."""

    keys: list[Hashable]  # the views' keys: `kind` indexes them
    rows: list[Row]  # rows with at least one split
    counts: np.ndarray  # (R,) splits per row
    a: np.ndarray  # (P,) sum of the stages' F+B (summed as `Split.a_s` sums it)
    c: np.ndarray  # (P,) the largest stage F+B
    e: np.ndarray  # (P,) the largest stage tail
    start: np.ndarray  # (P + 1,)
    kind: np.ndarray  # (N,) each stage's view, as an index into `keys`
    option: np.ndarray  # (N,) each stage's option in its own view
    first: np.ndarray  # (N,) first layer slot
    last: np.ndarray  # (N,) last layer slot

    @classmethod
    def empty(cls, keys: list[Hashable]) -> FrontierTable:
        none = np.zeros(0, dtype=np.int64)
        return cls(keys, [], none, np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(1, dtype=np.int64), none, none,
                   none, none)

    def row_starts(self) -> np.ndarray:
        """(R + 1,) each row's first split."""
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)


_Found = tuple[np.ndarray, int, np.ndarray, np.ndarray, SplitColumns]  # rows, round, A, C, splits


def batched_frontier_table(views: dict[Hashable, UniformView], rows: list[Row],
                           budget: Budget | None = None, horizon: Horizon | None = None) -> FrontierTable:
    """`batched_frontiers(views, rows, budget)` as a `FrontierTable` (the same rows, splits and
    stages; `budget.cut` gets the same rows); with a `horizon`, only the splits it needs (and, for
    rows the budget cuts, their least-A split, unless past its `a_max`)."""
    keys = list(views)
    if not keys:
        return FrontierTable.empty(keys)
    codes = RowCodes.of(keys, rows, views[keys[0]].n)
    if not codes.live:
        return FrontierTable.empty(keys)
    batch = _Batch([views[k] for k in keys], int(codes.total.max()))
    a_max = INF if horizon is None else horizon.a_max
    order = sweep_order(codes)
    live = np.array(order, dtype=np.int64)
    caps = np.full(len(codes.live), INF)
    floor = np.full(len(codes.live), -INF)  # a row is done once it reaches this C
    keep0 = np.ones(len(codes.live), dtype=bool)  # whether a row's least-A split (round 0) stays
    found: list[_Found] = []
    first: list[_Found] = []  # round 0 while a horizon may drop some of it
    for k in range(10_000):
        if not len(live):
            break
        if k > 0 and budget is not None and budget.stop(k):
            budget.cut.extend(codes.live[i] for i in live.tolist())
            keep0[live] = True  # a cut row's screen starts from its splits found (`protos.screens_of`)
            break
        solved = np.zeros(len(live), dtype=bool)
        for g in batch.solve_columns(codes, live, caps[live]):
            ids = live[g.at]
            c = g.fb.max(axis=1)
            caps[ids] = np.nextafter(c, -INF)
            a = np.array([float(sum(r)) for r in g.fb.tolist()])  # summed as `Split.a_s` sums it
            # past the horizon's a_max the split is left out and, past float noise, the row done
            # (equal A in exact arithmetic can differ by an ulp from split to split)
            solved[g.at] = (c > floor[ids]) & (a <= a_max * (1 + NOISE_A))
            if k == 0 and horizon is not None:
                first.append((ids, k, a, c, g))  # whole: the horizon's start reads every row's
                continue
            near = a <= a_max
            if not near.all():
                ids, a, c, g = ids[near], a[near], c[near], SplitColumns(*(x[near] for x in g))
            found.append((ids, k, a, c, g))
        live = live[solved]
        if k == 0 and horizon is not None and len(live) and not (budget is not None and budget.over()):
            live = _start_below(horizon, batch, codes, live, first, caps, floor, keep0)
    for ids, k, a, c, g in first:
        mine = keep0[ids] & (a <= a_max)
        found.append((ids[mine], k, a[mine], c[mine], SplitColumns(*(x[mine] for x in g))))
    if not found:
        return FrontierTable.empty(keys)
    return _gather(keys, codes, order, found)


def _start_below(horizon: Horizon, batch: _Batch, codes: RowCodes, live: np.ndarray, first: list[_Found],
                 caps: np.ndarray, floor: np.ndarray, keep0: np.ndarray) -> np.ndarray:
    """After round 0: each row's least C (`floor`, where its sweep ends), the cap its sweep goes
    on from (`caps`) and whether its least-A split stays (`keep0`), by `Horizon.sweep_start`. The
    rows whose sweep goes on."""
    a0, c0 = np.full(len(codes.live), INF), np.full(len(codes.live), INF)
    for ids, _, a, c, _ in first:
        a0[ids], c0[ids] = a, c
    c_min = _coded_min_max(codes, lambda kind, f: getattr(batch, kind).fb, int(codes.total.max()))
    a_min = np.full(len(codes.live), INF)
    for g in batch.solve_columns(codes, live, c_min[live]):
        a_min[live[g.at]] = g.fb.sum(axis=1)
    keep0[live], caps[live], floor[live] = horizon.sweep_start(a0[live], c0[live], c_min[live], a_min[live])
    return live[caps[live] >= floor[live]]


def _gather(keys: list[Hashable], codes: RowCodes, order: list[int], found: list[_Found]) -> FrontierTable:
    """The non-dominated splits of `found` (per round and stage count), row by row in sweep order.
    A row's C falls strictly from round to round, so ascending C is descending round, and a split
    is kept when its A is below the last kept one's (`partition.pareto_ac`)."""
    row = np.concatenate([ids for ids, *_ in found])
    rnd = np.concatenate([np.full(len(ids), k) for ids, k, *_ in found])
    a = np.concatenate([np.asarray(av, dtype=float) for _, _, av, _, _ in found])
    c = np.concatenate([cv for *_, cv, _ in found])
    e = np.concatenate([g.tails.max(axis=1) for *_, g in found])
    group = np.concatenate([np.full(len(ids), j) for j, (ids, *_) in enumerate(found)])
    pos = np.concatenate([np.arange(len(ids)) for ids, *_ in found])
    rank = np.empty(len(codes.live), dtype=np.int64)
    rank[np.asarray(order)] = np.arange(len(order))
    by = np.lexsort((-rnd, rank[row]))
    keep: list[int] = []
    prev, last_a = -1, 0.0
    for q, r, av in zip(by.tolist(), row[by].tolist(), a[by].tolist()):
        if r != prev or av < last_a * (1 - PARETO_REL):
            keep.append(q)
            prev, last_a = r, av
    kept = np.asarray(keep, dtype=np.int64)
    out_rows, counts = np.unique(rank[row[kept]], return_counts=True)
    stages = codes.total[row[kept]]
    start = np.concatenate([[0], np.cumsum(stages)]).astype(np.int64)
    n = int(start[-1])
    kind, option, first, last = (np.zeros(n, dtype=np.int64) for _ in range(4))
    for j, (_, _, _, _, g) in enumerate(found):
        mine = np.flatnonzero(group[kept] == j)
        if not len(mine):
            continue
        s = g.starts.shape[1]
        at = (start[mine][:, None] + np.arange(s)[None, :]).ravel()
        src = pos[kept[mine]]
        kind[at] = codes.rev[row[kept[mine]]][:, s - np.arange(s)].ravel()
        option[at] = g.options[src].ravel()
        first[at] = g.starts[src].ravel()
        last[at] = g.ends[src].ravel()
    return FrontierTable(keys, [codes.live[order[i]] for i in out_rows.tolist()], counts.astype(np.int64),
                         a[kept], c[kept], e[kept], start, kind, option, first, last)
