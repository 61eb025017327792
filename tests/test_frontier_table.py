"""The frontier table (`solvers.frontier_table`) against the batched sweep's splits."""

from __future__ import annotations

import math

import pytest

from solvers.batched_runs import batched_frontiers
from solvers.frontier_table import batched_frontier_table
from solvers.horizon import Horizon
from solvers.uniform_layers import Budget
from tests.test_batched_runs import _instance


def _as_splits(table) -> dict:
    """The table as {row: [(ranges, options, A, C, E), ...]}."""
    out: dict = {}
    q = 0
    for row, count in zip(table.rows, table.counts.tolist()):
        points = []
        for _ in range(count):
            lo, hi = int(table.start[q]), int(table.start[q + 1])
            ranges = tuple(zip(table.first[lo:hi].tolist(), table.last[lo:hi].tolist()))
            points.append((ranges, tuple(table.option[lo:hi].tolist()), float(table.a[q]), float(table.c[q]),
                           float(table.e[q])))
            kinds = [table.keys[k] for k in table.kind[lo:hi].tolist()]
            assert kinds == [x for i in range(0, len(row), 2) for x in (row[i],) * row[i + 1]]
            q += 1
        out[row] = points
    assert q == len(table.a) == len(table.c) == len(table.e) == len(table.start) - 1
    return out


def _rows_with_three_runs(views: dict, n: int) -> list[tuple]:
    return [(x, k1, y, k2, z, k3) for x in views for y in views for z in views if len({x, y, z}) == 3
            for k1 in range(1, n) for k2 in range(1, n) for k3 in range(1, n) if k1 + k2 + k3 <= n]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("cut", [False, True])
def test_the_table_holds_the_batched_sweeps_splits(seed: int, cut: bool) -> None:
    """Same rows in the same order, same splits (ranges, options, A, C and E bit for bit) in the same
    order, each stage of its row's type; cut after the first round, the same rows are cut."""
    n, _, views, rows = _instance(seed)
    rows = rows + _rows_with_three_runs(views, n)
    want_budget, got_budget = (Budget(0.0), Budget(0.0)) if cut else (None, None)
    want = batched_frontiers(views, rows, want_budget)
    table = batched_frontier_table(views, rows, got_budget)
    got = _as_splits(table)
    assert list(got) == list(want)
    for row, splits in want.items():
        assert got[row] == [(sp.ranges, sp.options, sp.a_s, sp.c_s, sp.e_s) for sp in splits], row
    if cut:
        assert got_budget.hit and got_budget.cut == want_budget.cut
        assert any(len(v) > 1 for v in batched_frontiers(views, rows).values())  # the cut dropped points


def test_an_empty_table() -> None:
    n, _, views, _ = _instance(0)
    table = batched_frontier_table(views, [("x", n + 1, "x", 0)])
    assert table.rows == [] and len(table.a) == 0 and table.start.tolist() == [0]
    assert batched_frontier_table({}, [("x", 1, "x", 0)]).rows == []


def _held(a: float, c: float, t: float, m: int) -> int:
    """Microbatches a copy of split (A, C) holds at pipeline time t (as `solvers.assign._caps`)."""
    return 0 if t + 1e-15 < a else min(m, math.floor((t - a) / c + 1e-12) + 1)


@pytest.mark.parametrize("seed", range(8))
def test_a_horizon_keeps_what_every_later_pipeline_time_needs(seed: int) -> None:
    """With a horizon (t_lo, M) the table lists some of the full table's splits (each as it is
    there, rows in the same order), each row's least-C split among them, and at t_lo and at every
    later time where some split's count steps up, each row's most microbatches held is what its
    full frontier holds; it lists fewer splits, and cut after the first round it keeps the same
    splits as without a horizon."""
    n, _, views, rows = _instance(seed)
    rows = rows + _rows_with_three_runs(views, n)
    full = _as_splits(batched_frontier_table(views, rows))
    a_all = sorted(p[2] for pts in full.values() for p in pts)
    dropped = 0
    for t_lo, m in ((a_all[len(a_all) // 2], 8), (2 * a_all[-1], 64), (a_all[0], 3), (1.5 * a_all[-1], 2)):
        got = _as_splits(batched_frontier_table(views, rows, horizon=Horizon(t_lo, m)))
        assert list(got) == [row for row in full if row in got]
        assert set(got) == set(full)  # every row keeps its least-C split
        for row, pts in full.items():
            assert all(p in pts for p in got[row])
            assert min(p[3] for p in got[row]) == min(p[3] for p in pts)
            steps = {t_lo} | {p[2] + k * p[3] for p in pts for k in range(m) if p[2] + k * p[3] >= t_lo}
            for t in steps:
                assert max(_held(p[2], p[3], t, m) for p in got[row]) == max(_held(p[2], p[3], t, m) for p in pts)
            dropped += len(pts) - len(got[row])
        cut = _as_splits(batched_frontier_table(views, rows, Budget(0.0), Horizon(t_lo, m)))
        assert cut == _as_splits(batched_frontier_table(views, rows, Budget(0.0)))
    assert dropped > 0


@pytest.mark.parametrize("seed", range(6))
def test_a_cap_on_a_keeps_exactly_the_splits_at_or_below_it(seed: int) -> None:
    """With a horizon's `a_max` (a plan's step less the overhead: `candidates.early_grid`) the table
    holds exactly the splits of the uncapped one (same horizon otherwise) whose A is at most it, in
    the same order, and no row whose least A is above it; a cap above every A changes nothing."""
    n, _, views, rows = _instance(seed)
    rows = rows + _rows_with_three_runs(views, n)
    full = _as_splits(batched_frontier_table(views, rows))
    a_all = sorted(p[2] for pts in full.values() for p in pts)
    for t_lo, m in ((0.0, 8), (a_all[len(a_all) // 2], 4)):
        whole = _as_splits(batched_frontier_table(views, rows, horizon=Horizon(t_lo, m)))
        for a_max in (a_all[len(a_all) // 4], a_all[len(a_all) // 2], a_all[-1]):
            got = _as_splits(batched_frontier_table(views, rows, horizon=Horizon(t_lo, m, a_max)))
            want = {row: [p for p in pts if p[2] <= a_max] for row, pts in whole.items()}
            assert got == {row: pts for row, pts in want.items() if pts}
            assert list(got) == [row for row in whole if row in got]
        assert sum(map(len, got.values())) == sum(map(len, whole.values()))  # the last cap: every A
