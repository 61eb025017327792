"""The frontier table (`solvers.frontier_table`) against the batched sweep's splits."""

from __future__ import annotations

import pytest

from solvers.batched_runs import batched_frontiers
from solvers.frontier_table import batched_frontier_table
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
