"""The all-stage-counts DP for identical decoder layers against the general partition DP."""

from __future__ import annotations

import math

import numpy as np
import pytest

from solvers.partition import StageOptions, min_max_tail, split_frontier
from solvers.uniform_layers import frontiers, min_max_tails, uniform_view


def _uniform_options(rng: np.random.Generator, n: int, num_opts: int, capacity: float) -> StageOptions:
    """Slot 0 and slot n-1 differ (embedding, head); slots 1..n-2 are identical per option."""
    shape = (num_opts, n + 1, n + 1)
    fb, tail, mem, act = (np.full(shape, math.inf) for _ in range(4))
    for o in range(num_opts):
        layer = rng.uniform(1, 5, size=4)  # fb, tail, mem, act of one decoder layer
        ends = rng.uniform(0.5, 3, size=(2, 4))
        recv = rng.uniform(0, 0.5)
        per_slot = np.vstack([ends[0], np.tile(layer, (n - 2, 1)), ends[1]])
        for i in range(n):
            for j in range(i + 1, n + 1):
                s = per_slot[i:j].sum(axis=0)
                fb[o, i, j] = s[0] + recv * ((i > 0) + (j < n))
                tail[o, i, j], mem[o, i, j], act[o, i, j] = s[1], s[2], s[3]
    return StageOptions(fb, tail, mem, act, capacity)


def _two_run_instance(rng: np.random.Generator, max_n: int) -> tuple[int, StageOptions, StageOptions, list]:
    """Two random stage groups over n < max_n slots, and every (k1, k2) with k1 + k2 <= n."""
    n = int(rng.integers(4, max_n))
    top = _uniform_options(rng, n, int(rng.integers(1, 4)), float(rng.uniform(10, 40)))
    bottom = _uniform_options(rng, n, int(rng.integers(1, 4)), float(rng.uniform(10, 40)))
    return n, top, bottom, [(k1, k2) for k1 in range(1, n) for k2 in range(1, n) if k1 + k2 <= n]


@pytest.mark.parametrize("seed", range(10))
def test_uniform_frontiers_match_general_dp(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    opts = _uniform_options(rng, n, int(rng.integers(1, 4)), float(rng.uniform(10, 40)))
    view = uniform_view(opts)
    assert view is not None
    counts = list(range(1, n + 1))
    fast = frontiers(view, counts)
    tails = min_max_tails(view, counts)
    for s in counts:
        ref = split_frontier([opts] * s, with_tail=False)
        got = fast.get(s, [])
        assert [(round(p.a_s, 9), round(p.c_s, 9)) for p in got] == [(round(p.a_s, 9), round(p.c_s, 9)) for p in ref]
        for p in got:  # the recovered split really has the reported costs
            assert p.ranges[0][0] == 0 and p.ranges[-1][1] == n - 1
            for (i, j), o, f in zip(p.ranges, p.options, p.fb):
                assert math.isclose(opts.fb[o, i, j + 1], f, rel_tol=1e-9)
        ref_tail = min_max_tail([opts] * s)
        assert (tails[s] is None) == (ref_tail is None)
        if ref_tail is not None:
            assert math.isclose(tails[s], ref_tail, rel_tol=1e-9)


def test_position_dependent_layers_are_refused() -> None:
    rng = np.random.default_rng(0)
    opts = _uniform_options(rng, 6, 2, 30.0)
    fb = opts.fb.copy()
    fb[:, 2, 3] += 1.0  # decoder slot 2 is slower than the others
    assert uniform_view(StageOptions(fb, opts.tail, opts.mem_fixed, opts.act, opts.capacity)) is None


@pytest.mark.parametrize("seed", range(8))
def test_two_run_frontiers_match_general_dp(seed: int) -> None:
    from solvers.two_runs import chain_frontiers, chain_min_max_tails

    n, top_opts, bottom_opts, rows = _two_run_instance(np.random.default_rng(100 + seed), 9)
    top, bottom = uniform_view(top_opts), uniform_view(bottom_opts)
    fast = chain_frontiers(top, bottom, rows)
    tails = chain_min_max_tails(top, bottom, rows)
    for k1, k2 in rows:
        positions = [top_opts] * k1 + [bottom_opts] * k2
        ref = split_frontier(positions, with_tail=False)
        got = fast.get((k1, k2), [])
        assert [(round(p.a_s, 9), round(p.c_s, 9)) for p in got] == [(round(p.a_s, 9), round(p.c_s, 9)) for p in ref]
        for p in got:
            for s, ((i, j), o, f) in enumerate(zip(p.ranges, p.options, p.fb)):
                opts = top_opts if s < k1 else bottom_opts
                assert math.isclose(opts.fb[o, i, j + 1], f, rel_tol=1e-9)
        ref_tail = min_max_tail(positions)
        assert (tails[(k1, k2)] is None) == (ref_tail is None)
        if ref_tail is not None:
            assert math.isclose(tails[(k1, k2)], ref_tail, rel_tol=1e-9)


def _capped_frontier(positions: list[StageOptions], e: float) -> list[tuple[float, float]]:
    """The general DP's (A, C) frontier among splits whose every stage tail is <= e."""
    from solvers.partition import best_split, pareto_ac

    found, c = [], math.inf
    while (sol := best_split(positions, c, e)) is not None:
        found.append(sol)
        c = float(np.nextafter(sol.c_s, -math.inf))
    return [(round(p.a_s, 9), round(p.c_s, 9)) for p in pareto_ac(found)]


def _levels(rng: np.random.Generator) -> list[float]:
    return sorted(float(x) for x in rng.uniform(2, 30, size=3)) + [math.inf]


@pytest.mark.parametrize("seed", range(6))
def test_tail_capped_frontiers_match_general_dp(seed: int) -> None:
    from solvers.uniform_layers import tail_capped_frontiers

    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(3, 8))
    opts = _uniform_options(rng, n, int(rng.integers(1, 4)), float(rng.uniform(10, 40)))
    levels = _levels(rng)
    counts = list(range(1, n + 1))
    fast = tail_capped_frontiers(uniform_view(opts), counts, levels)
    for s in counts:
        for j, e in enumerate(levels):
            got = [(round(p.a_s, 9), round(p.c_s, 9)) for p in fast.get((s, j), [])]
            assert got == _capped_frontier([opts] * s, e)
            for p in fast.get((s, j), []):  # the split keeps the cap
                assert p.e_s <= e


@pytest.mark.parametrize("seed", range(6))
def test_tail_capped_chain_points_match_general_dp(seed: int) -> None:
    from solvers.two_runs import tail_capped_chain_frontiers

    rng = np.random.default_rng(300 + seed)
    n, top_opts, bottom_opts, rows = _two_run_instance(rng, 8)
    levels = _levels(rng)
    fast = tail_capped_chain_frontiers(uniform_view(top_opts), uniform_view(bottom_opts), rows, levels)
    for k1, k2 in rows:
        for j, e in enumerate(levels):
            got = [(round(p.a_s, 9), round(p.c_s, 9)) for p in fast.get((k1, k2, j), [])]
            assert got == _capped_frontier([top_opts] * k1 + [bottom_opts] * k2, e)


def test_an_expired_budget_keeps_each_rows_least_a_split() -> None:
    from solvers.uniform_layers import Budget

    rng = np.random.default_rng(7)
    opts = _uniform_options(rng, 7, 3, 40.0)
    view = uniform_view(opts)
    counts = list(range(1, 8))
    full = frontiers(view, counts)
    budget = Budget(deadline=0.0)
    cut = frontiers(view, counts, budget)
    assert budget.hit
    assert any(len(v) > 1 for v in full.values())  # the full frontiers have more than one point
    for s, points in cut.items():
        assert len(points) == 1
        assert points[0].a_s == pytest.approx(min(p.a_s for p in full[s]), rel=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_convolutions_match_a_direct_scan(seed: int) -> None:
    """(min, +) with its first argmin, and (min, max), against the definition, +inf entries included."""
    from solvers.uniform_layers import INF, _conv, _minmax_conv

    rng = np.random.default_rng(seed)
    rows, width = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    stage = rng.integers(0, 4, (rows, width)).astype(float)
    rest = rng.integers(0, 4, (rows, width)).astype(float)
    stage[rng.random(stage.shape) < 0.3] = INF
    rest[rng.random(rest.shape) < 0.3] = INF
    if seed % 2:  # stages longer than some d never fit: the scan stops there
        stage[:, int(rng.integers(0, width)):] = INF
    out, arg = _conv(stage, rest)
    least = _minmax_conv(stage, rest)
    for b in range(rows):
        for k in range(width):
            sums = [stage[b, d] + rest[b, k - d] for d in range(k + 1)]
            assert out[b, k] == min(sums)
            if min(sums) < INF:
                assert arg[b, k] == sums.index(min(sums))
            assert least[b, k] == min(max(stage[b, d], rest[b, k - d]) for d in range(k + 1))


@pytest.mark.parametrize("seed", range(10))
def test_option_pruning_on_kind_cells_equals_pruning_everywhere(seed: int) -> None:
    """With identical layers, comparing options on the ranges the stage kinds read
    (`kind_cells`) drops exactly the options a comparison on every range drops, ties included."""
    from solvers.partition import subset_options, undominated_options
    from solvers.uniform_layers import kind_cells

    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    base = _uniform_options(rng, n, 4, 50.0)
    worse = StageOptions(base.fb * 1.5, base.tail * 1.5, base.mem_fixed * 1.5, base.act * 1.5, 50.0)
    mixed = StageOptions(base.fb * 0.5, base.tail * 2.0, base.mem_fixed, base.act, 50.0)  # faster, larger tail
    better_ends = []  # equal to an option except on the ranges holding the head (or the embedding)
    for k, end in ((0, (slice(None), n)), (2, (0, slice(None)))):
        fb = base.fb[[k]].copy()
        fb[(0, *end)] -= 0.1
        better_ends.append(StageOptions(fb, base.tail[[k]], base.mem_fixed[[k]], base.act[[k]], 50.0))
    # dominated, tied, incomparable, and better only where the first or last stage kind reads
    parts = [base, worse, subset_options(base, [1, 1]), mixed, *better_ends]
    opts = StageOptions(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("fb", "tail", "mem_fixed", "act")),
                        50.0)
    assert uniform_view(opts) is not None
    for use_tail in (False, True):
        everywhere = undominated_options(opts, use_tail)
        assert len(everywhere) < opts.fb.shape[0] and 0 not in everywhere and 2 not in everywhere
        assert undominated_options(opts, use_tail, kind_cells(n)) == everywhere
