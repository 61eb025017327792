"""One batched DP over every skeleton row against the per-group sweeps and the general DP."""

from __future__ import annotations

import math

import numpy as np
import pytest

from solvers.batched_runs import batched_frontiers
from solvers.partition import split_frontier
from solvers.two_runs import chain_frontiers
from solvers.uniform_layers import frontiers, uniform_view
from tests.test_uniform_layers import _uniform_options


@pytest.mark.parametrize("seed", range(3))
def test_min_max_tails_keep_the_fit_masks_across_swapped_tails(seed: int) -> None:
    """Which options fit memory does not depend on the tails: views whose tails are swapped
    (`uniform_layers.with_tail`, as each unit of a size swaps in its own) compute the masks once
    and give the same least largest tails as views built afresh with those tails."""
    from solvers.batched_runs import batched_min_max_tails
    from solvers.partition import StageOptions
    from solvers.uniform_layers import with_tail

    n, opts, views, rows = _instance(seed)
    rng = np.random.default_rng(seed)
    first = batched_min_max_tails(views, rows)
    masks = {name: {k: v for k, v in views[name].mid.fits.items() if k[0] == "tail_mask"} for name in views}
    assert all(masks.values())
    for _ in range(2):
        tails = {name: o.tail * rng.uniform(0.5, 2.0) for name, o in opts.items()}
        swapped = {name: with_tail(views[name], tails[name]) for name in views}
        fresh = {name: uniform_view(StageOptions(o.fb, tails[name], o.mem_fixed, o.act, o.capacity))
                 for name, o in opts.items()}
        assert batched_min_max_tails(swapped, rows) == batched_min_max_tails(fresh, rows)
        for name in views:  # the same mask objects, not recomputed
            assert all(swapped[name].mid.fits[k] is m for k, m in masks[name].items())
    assert batched_min_max_tails(views, rows) == first


@pytest.mark.parametrize("seed", range(3))
def test_coded_rows_keep_their_suffix_walk_across_tails(seed: int) -> None:
    """`_coded_min_max` walks the rows' distinct suffixes, which the rows alone decide: coded rows
    keep that walk (`RowCodes.steps`), and later calls with other tails give what freshly coded
    rows give."""
    from solvers.batched_runs import RowCodes, coded_min_max_tails
    from solvers.partition import StageOptions

    n, opts, views, rows = _instance(seed)
    keys = list(views)
    codes = RowCodes.of(keys, rows, n)
    coded_min_max_tails([views[k] for k in keys], codes)
    walk = dict(codes.steps)
    assert walk
    rng = np.random.default_rng(seed)
    for _ in range(2):
        fresh = [uniform_view(StageOptions(o.fb, o.tail * rng.uniform(0.5, 2.0), o.mem_fixed, o.act, o.capacity))
                 for o in (opts[k] for k in keys)]
        got = coded_min_max_tails(fresh, codes)
        want = coded_min_max_tails(fresh, RowCodes.of(keys, rows, n))
        assert got.tolist() == want.tolist()
        assert all(codes.steps[k] is v for k, v in walk.items())


def _instance(seed: int, base: int = 500, slots: tuple[int, int] = (4, 9),
              options: tuple[int, int] = (1, 4)) -> tuple[int, dict, dict, list]:
    """Three random stage groups over n slots (some options overflow memory at deep flights),
    every homogeneous stage count and every two-run (k1, k2) of every ordered pair."""
    rng = np.random.default_rng(base + seed)
    n = int(rng.integers(*slots))
    opts = {name: _uniform_options(rng, n, int(rng.integers(*options)), float(rng.uniform(8, 40))) for name in "xyz"}
    views = {name: uniform_view(o) for name, o in opts.items()}
    rows = [(x, s, x, 0) for x in views for s in range(1, n + 1)]
    rows += [(x, k1, y, k2) for x in views for y in views if x != y
             for k1 in range(1, n) for k2 in range(1, n) if k1 + k2 <= n]
    return n, opts, views, rows


def _per_group(views: dict, rows: list, n: int, homogeneous, pairwise) -> dict:
    """The per-group sweeps' answers keyed like the batched rows: `homogeneous(view, counts)` per
    type, `pairwise(top, bottom, pairs)` per ordered pair of types."""
    want: dict = {}
    for x, view in views.items():
        want.update({(x, s, x, 0): v for s, v in homogeneous(view, list(range(1, n + 1))).items()})
    for x in views:
        for y in views:
            if x != y:
                pairs = [(k1, k2) for (a, k1, b, k2) in rows if (a, b) == (x, y)]
                want.update({(x, k1, y, k2): v for (k1, k2), v in pairwise(views[x], views[y], pairs).items()})
    return want


@pytest.mark.parametrize("seed", range(8))
def test_batched_equals_per_group_sweeps(seed: int) -> None:
    """Same splits (ranges, options, costs) as the homogeneous and two-run sweeps, row by row."""
    n, _, views, rows = _instance(seed)
    got = batched_frontiers(views, rows)
    want = _per_group(views, rows, n, frontiers, chain_frontiers)
    assert got.keys() == want.keys()
    for row, splits in want.items():
        assert got[row] == splits, row


@pytest.mark.parametrize("seed", range(4))
def test_batched_matches_general_dp(seed: int) -> None:
    """Every row's (A, C) frontier is the general partition DP's, and each split has its costs."""
    _, opts, views, rows = _instance(seed)
    got = batched_frontiers(views, rows)
    for x, k1, y, k2 in rows:
        positions = [opts[x]] * k1 + [opts[y]] * k2
        ref = split_frontier(positions, with_tail=False)
        mine = got.get((x, k1, y, k2), [])
        assert [(round(p.a_s, 9), round(p.c_s, 9)) for p in mine] == [(round(p.a_s, 9), round(p.c_s, 9)) for p in ref]
        for p in mine:
            for s, ((i, j), o, f) in enumerate(zip(p.ranges, p.options, p.fb)):
                assert math.isclose(positions[s].fb[o, i, j + 1], f, rel_tol=1e-9)


@pytest.mark.parametrize("seed, max_flight", [(0, 1), (1, 2), (2, 3), (3, 2)])
def test_a_flight_cap_matches_the_general_dp(seed: int, max_flight: int) -> None:
    """A pipeline of m < S microbatches: each stage holds min(r, m), r its place from the end.
    The (A, C) frontier (with each split's options), the least largest tail and the tail-capped
    points of every row equal the general DP's with `max_in_flight=m`; the instances have options that fit only so (else the
    cap would change nothing)."""
    from solvers.batched_runs import batched_min_max_tails
    from solvers.capped_points import batched_capped_points
    from solvers.partition import min_max_tail, tail_capped_frontier

    _, opts, views, rows = _instance(seed)
    got = batched_frontiers(views, rows, max_flight=max_flight)
    tails = batched_min_max_tails(views, rows, max_flight=max_flight)
    level = float(np.median([t for o in opts.values() for t in o.tail[np.isfinite(o.fb)]]))
    capped = batched_capped_points(views, rows, [level] * len(rows), max_flight=max_flight)
    changed = 0
    for i, (x, k1, y, k2) in enumerate(rows):
        positions = [opts[x]] * k1 + [opts[y]] * k2
        ref = split_frontier(positions, max_in_flight=max_flight, with_tail=False)
        mine = got.get((x, k1, y, k2), [])
        assert [(round(p.a_s, 9), round(p.c_s, 9)) for p in mine] == [(round(p.a_s, 9), round(p.c_s, 9)) for p in ref]
        assert [p.options for p in mine] == [p.options for p in ref]
        least = min_max_tail(positions, max_in_flight=max_flight)
        assert (tails[(x, k1, y, k2)] is None) == (least is None)
        assert least is None or math.isclose(tails[(x, k1, y, k2)], least)
        want = [(round(p.a_s, 9), round(p.c_s, 9)) for p in tail_capped_frontier(positions, level, max_flight)]
        assert [(round(a, 9), round(c, 9)) for a, c in capped.get(i, [])] == want
        changed += [(p.a_s, p.c_s) for p in ref] != [(p.a_s, p.c_s) for p in split_frontier(positions, with_tail=False)]
    assert changed  # the cap lets some rows fit options they could not hold uncapped


def test_rows_out_of_range_are_left_out() -> None:
    n, _, views, _ = _instance(0)
    assert batched_frontiers(views, [("x", 0, "x", 0), ("x", n + 1, "x", 0), ("x", n, "y", 1)]) == {}
    assert batched_frontiers({}, [("x", 1, "x", 0)]) == {}


@pytest.mark.parametrize("seed", range(6))
def test_batched_min_max_tails_equal_per_group(seed: int) -> None:
    from solvers.batched_runs import batched_min_max_tails
    from solvers.two_runs import chain_min_max_tails
    from solvers.uniform_layers import min_max_tails

    n, _, views, rows = _instance(seed)
    got = batched_min_max_tails(views, rows)
    want = _per_group(views, rows, n, min_max_tails, chain_min_max_tails)
    assert got.keys() == want.keys()
    assert all(got[r] == want[r] for r in want), [r for r in want if got[r] != want[r]][:3]


def _capped_rows(seed: int, opts: dict, rows: list) -> tuple[list[float], list, list[float]]:
    """Three tail caps drawn from the options' tails (and none), and every row under each."""
    rng = np.random.default_rng(seed)
    tails = sorted({float(t) for o in opts.values() for t in o.tail[np.isfinite(o.fb)]})
    levels = sorted(float(x) for x in rng.choice(tails, size=3)) + [math.inf]
    return levels, [r for r in rows for _ in levels], [e for _ in rows for e in levels]


@pytest.mark.parametrize("seed", range(6))
def test_batched_capped_points_equal_per_group(seed: int) -> None:
    """Under tail caps: the same (A, C) points as the per-group tail-capped sweeps."""
    from solvers.capped_points import batched_capped_points
    from solvers.two_runs import tail_capped_chain_frontiers
    from solvers.uniform_layers import tail_capped_frontiers

    n, opts, views, rows = _instance(seed)
    levels, capped_rows, ecaps = _capped_rows(seed, opts, rows)
    got = batched_capped_points(views, capped_rows, ecaps)
    want: dict = {}
    for x, view in views.items():
        for (s, j), v in tail_capped_frontiers(view, list(range(1, n + 1)), levels).items():
            want[capped_rows.index((x, s, x, 0)) + j] = [(p.a_s, p.c_s) for p in v]
    for x in views:
        for y in views:
            if x != y:
                pairs = [(k1, k2) for (a, k1, b, k2) in rows if (a, b) == (x, y)]
                for (k1, k2, j), v in tail_capped_chain_frontiers(views[x], views[y], pairs, levels).items():
                    want[capped_rows.index((x, k1, y, k2)) + j] = [(p.a_s, p.c_s) for p in v]
    assert got.keys() == want.keys()
    for i, pts in want.items():  # sums of the same stage costs, possibly in another order
        assert len(got[i]) == len(pts)
        assert all(math.isclose(a, b, rel_tol=1e-12) for p, q in zip(got[i], pts) for a, b in zip(p, q))
    assert any(len(v) > 1 for v in got.values())  # the instances have real frontiers


def _three_run_rows(views: dict, n: int) -> list:
    return [(x, k1, y, k2, z, k3) for x in views for y in views for z in views if x != y and y != z
            for k1 in range(1, n) for k2 in range(1, n) for k3 in range(1, n) if k1 + k2 + k3 <= n]


@pytest.mark.parametrize("seed", range(4))
def test_three_run_rows_match_the_general_dp(seed: int) -> None:
    """Rows of three runs (x, k1, y, k2, z, k3): the (A, C) frontier, least largest tail and
    tail-capped points of the general partition DP on the same stage sequence."""
    from solvers.batched_runs import batched_min_max_tails, row_skeleton
    from solvers.capped_points import batched_capped_points
    from solvers.partition import min_max_tail, tail_capped_frontier

    n, opts, views, _ = _instance(seed)
    rows = _three_run_rows(views, n)
    assert rows
    got = batched_frontiers(views, rows)
    tails = batched_min_max_tails(views, rows)
    level = float(np.median([t for o in opts.values() for t in o.tail[np.isfinite(o.fb)]]))
    capped = batched_capped_points(views, rows, [level] * len(rows))
    for i, row in enumerate(rows):
        positions = [opts[x] for x in row_skeleton(row)]
        ref = split_frontier(positions, with_tail=False)
        mine = got.get(row, [])
        assert [(round(p.a_s, 9), round(p.c_s, 9)) for p in mine] == [(round(p.a_s, 9), round(p.c_s, 9)) for p in ref]
        least = min_max_tail(positions)
        assert (tails[row] is None) == (least is None) and (least is None or math.isclose(tails[row], least))
        want = [(round(p.a_s, 9), round(p.c_s, 9)) for p in tail_capped_frontier(positions, level)]
        assert [(round(a, 9), round(c, 9)) for a, c in capped.get(i, [])] == want


@pytest.mark.parametrize("seed", range(3))
def test_row_codes_list_each_rows_stage_types_from_its_end(seed: int) -> None:
    """`RowCodes.of` (built run by run with `np.repeat`): rows deduplicated in first-seen order,
    rows with no stage or more stages than slots left out, and rev[b, r] the type index of row b's
    r-th stage from the end, as spelled out stage by stage."""
    import random

    from solvers.batched_runs import RowCodes, row_skeleton

    rng = random.Random(seed)
    keys = ["x", "y", "z", "w"]
    rows = [tuple(v for _ in range(rng.randint(1, 3)) for v in (rng.choice(keys), rng.randint(0, 5)))
            for _ in range(300)]
    rows += [(), ("x", 0), ("y", 20), rows[0]]
    codes = RowCodes.of(keys, rows, 12)
    live = [r for r in dict.fromkeys(rows) if 1 <= sum(r[1::2]) <= 12]
    assert codes.live == live
    for b, row in enumerate(live):
        stages = [keys.index(x) for x in row_skeleton(row)]
        assert codes.total[b] == len(stages)
        assert codes.rev[b, 1:len(stages) + 1].tolist() == stages[::-1]
        assert not codes.rev[b, len(stages) + 1:].any()


def test_rows_and_skeletons_convert_both_ways() -> None:
    from solvers.batched_runs import row_skeleton, skeleton_row

    assert skeleton_row(("x", "x", "y", "z", "z")) == ("x", 2, "y", 1, "z", 2)
    assert row_skeleton(("x", 2, "y", 1, "z", 2)) == ("x", "x", "y", "z", "z")
    assert row_skeleton(("x", 3, "x", 0)) == ("x", "x", "x")


@pytest.mark.parametrize("seed", range(6))
def test_least_bottleneck_is_the_least_c_of_every_split(seed: int) -> None:
    """`batched_least_bottlenecks` is the smallest C of the row's frontier (the general DP's, on
    two- and three-run rows), and None exactly where no split fits."""
    from solvers.batched_runs import batched_least_bottlenecks, row_skeleton

    n, opts, views, rows = _instance(seed)
    rows = rows + _three_run_rows(views, n)[::7]
    got = batched_least_bottlenecks(views, rows)
    for row in rows:
        ref = split_frontier([opts[x] for x in row_skeleton(row)], with_tail=False)
        want = min((p.c_s for p in ref), default=None)
        if want is None:
            assert got[row] is None, row
        else:
            assert got[row] == pytest.approx(want, rel=1e-12), row


@pytest.mark.parametrize("seed", range(6))
def test_a_cut_frontier_and_its_screen_bound_every_split(seed: int) -> None:
    """Stopped after the first round (`Budget` past its deadline), a row keeps its least-A split;
    with the screen (that split's A, the row's least bottleneck) every point of the full frontier
    is dominated by a kept point or the screen, so bound templates built from them stay valid."""
    from solvers.batched_runs import batched_least_bottlenecks
    from solvers.uniform_layers import Budget

    _, _, views, rows = _instance(seed)
    full = batched_frontiers(views, rows)
    budget = Budget(deadline=0.0)
    cut = batched_frontiers(views, rows, budget)
    assert budget.hit and set(budget.cut) == set(full)  # every row with a split was still live
    least = batched_least_bottlenecks(views, budget.cut)
    for row, points in full.items():
        kept = [(p.a_s, p.c_s) for p in cut[row]]
        if row in budget.cut:
            kept.append((max(a for a, _ in kept), least[row]))
        for p in points:
            assert any(a <= p.a_s * (1 + 1e-12) and c <= p.c_s * (1 + 1e-12) for a, c in kept), (row, p)
    assert any(len(full[r]) > 1 for r in budget.cut)  # the screen stands for points really left out


@pytest.mark.parametrize("seed", range(6))
def test_capped_points_with_a_horizon_hold_what_every_later_pipeline_time_needs(seed: int) -> None:
    """Under tail caps with a horizon (t_lo, M): each (row, cap) keeps some of its points, its
    least-C one among them, and at t_lo and at every later time where some point's count of
    microbatches steps up it holds what all its points hold; fewer points in all."""
    from solvers.capped_points import batched_capped_points
    from solvers.horizon import Horizon

    n, opts, views, rows = _instance(seed)
    _, capped_rows, ecaps = _capped_rows(seed, opts, rows + _three_run_rows(views, n))
    full = batched_capped_points(views, capped_rows, ecaps)
    a_all = sorted(a for pts in full.values() for a, _ in pts)
    dropped = 0
    for t_lo, m in ((a_all[len(a_all) // 2], 8), (2 * a_all[-1], 64), (a_all[0], 3), (1.5 * a_all[-1], 2)):
        got = batched_capped_points(views, capped_rows, ecaps, Horizon(t_lo, m))
        assert got.keys() == full.keys()
        for i, pts in full.items():
            assert set(got[i]) <= set(pts) and min(c for _, c in got[i]) == min(c for _, c in pts)
            steps = {t_lo} | {a + k * c for a, c in pts for k in range(m) if a + k * c >= t_lo}
            for t in steps:
                held = [0 if t + 1e-15 < a else min(m, math.floor((t - a) / c + 1e-12) + 1) for a, c in got[i]]
                want = [0 if t + 1e-15 < a else min(m, math.floor((t - a) / c + 1e-12) + 1) for a, c in pts]
                assert max(held) == max(want), (i, t)
            dropped += len(pts) - len(got[i])
    assert dropped > 0


@pytest.mark.parametrize("seed", range(4))
def test_capped_points_with_a_cap_on_a_keep_exactly_those_at_or_below_it(seed: int) -> None:
    """Under tail caps with a horizon's `a_max`, each (row, cap) keeps exactly its points of the
    uncapped horizon whose A is at most it (none left: the key is absent)."""
    from solvers.capped_points import batched_capped_points
    from solvers.horizon import Horizon

    n, opts, views, rows = _instance(seed)
    _, capped_rows, ecaps = _capped_rows(seed, opts, rows + _three_run_rows(views, n))
    a_all = sorted(a for pts in batched_capped_points(views, capped_rows, ecaps).values() for a, _ in pts)
    t_lo, m = a_all[len(a_all) // 3], 6
    whole = batched_capped_points(views, capped_rows, ecaps, Horizon(t_lo, m))
    for a_max in (a_all[len(a_all) // 4], a_all[2 * len(a_all) // 3]):
        got = batched_capped_points(views, capped_rows, ecaps, Horizon(t_lo, m, a_max))
        want = {i: [p for p in pts if p[0] <= a_max] for i, pts in whole.items()}
        assert {i: sorted(pts) for i, pts in got.items()} == {i: sorted(pts) for i, pts in want.items() if pts}
        assert 0 < sum(map(len, got.values())) < sum(map(len, whole.values()))


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
def test_min_plus_is_the_least_sum_over_every_split_of_k(rows: int) -> None:
    """`_min_plus` (a gather of every (d, k) pair for few rows, two array operations per d above
    that) against the definition: out[b, k] = min over d <= k of stage[b, d] + rest[b, k - d]."""
    from solvers.batched_runs import FEW_ROWS, _min_plus

    rng = np.random.default_rng(rows)
    width = 41
    stage = np.where(rng.random((rows, width)) < 0.2, np.inf, rng.random((rows, width)))
    stage[:, 30:] = np.inf  # stages hold at most 30 decoders here
    rest = np.where(rng.random((rows, width)) < 0.2, np.inf, rng.random((rows, width)))
    want = np.array([[min(stage[b, d] + rest[b, k - d] for d in range(k + 1)) for k in range(width)]
                     for b in range(rows)])
    assert np.array_equal(_min_plus(stage, rest), want)
    assert (rows <= FEW_ROWS) == (rows in (1, 5, 16))  # both paths are exercised


@pytest.mark.parametrize("rows", [1, 7, 40, 300])
def test_min_max_conv_is_the_least_bottleneck_over_every_split_of_k(rows: int) -> None:
    """`uniform_layers._minmax_conv` (stepped over decoders-major copies) against the definition:
    out[b, k] = min over d <= k of max(stage[b, d], rest[b, k - d]); a stage no row can hold
    leaves every entry +inf."""
    from solvers.uniform_layers import _minmax_conv

    rng = np.random.default_rng(100 + rows)
    width = 41
    stage = np.where(rng.random((rows, width)) < 0.2, np.inf, rng.random((rows, width)))
    stage[:, 25:] = np.inf
    rest = np.where(rng.random((rows, width)) < 0.2, np.inf, rng.random((rows, width)))
    want = np.array([[min(max(stage[b, d], rest[b, k - d]) for d in range(k + 1)) for k in range(width)]
                     for b in range(rows)])
    assert np.array_equal(_minmax_conv(stage, rest), want)
    assert np.all(np.isinf(_minmax_conv(np.full((rows, width), np.inf), rest)))


@pytest.mark.parametrize("seed", range(8))
def test_step_frontiers_hold_what_a_pipeline_of_m_microbatches_takes(seed: int) -> None:
    """`batched_step_frontiers` keeps, of each row's whole (A, C) frontier, its least A + (m - 1)·C
    and its split of least A + (m - 1)·C + E (ties: least ranges), for several m and flight caps,
    on two- and three-run rows; and lists fewer splits in all. `batched_least_bottlenecks` with a
    flight cap is the least C of the general DP's frontier with that cap."""
    from solvers.batched_runs import batched_least_bottlenecks, batched_step_frontiers, row_skeleton

    n, opts, views, rows = _instance(seed, 900, (8, 16), (2, 5))  # longer rows: long frontiers near C_min
    rows += _three_run_rows(views, n)[::25]
    listed = whole_listed = 0
    for m in (1, 2, 3, 8, 40):
        flight = None if m == 40 and seed % 2 else m
        whole = batched_frontiers(views, rows, max_flight=flight)
        mine = batched_step_frontiers(views, rows, m, max_flight=flight)
        assert mine.keys() == whole.keys()
        for row, front in whole.items():
            def step(p):
                return p.a_s + (m - 1) * p.c_s + p.e_s

            assert min(p.a_s + (m - 1) * p.c_s for p in mine[row]) == min(p.a_s + (m - 1) * p.c_s for p in front)
            assert min(mine[row], key=lambda p: (step(p), p.ranges)) == min(front, key=lambda p: (step(p), p.ranges))
            listed += len(mine[row])
            whole_listed += len(front)
        least_c = batched_least_bottlenecks(views, rows, max_flight=flight)
        for row in rows[::11]:
            ref = split_frontier([opts[x] for x in row_skeleton(row)], max_in_flight=flight, with_tail=False)
            want = min((p.c_s for p in ref), default=None)
            assert (least_c[row] is None) if want is None else least_c[row] == pytest.approx(want, rel=1e-12)
    assert listed <= whole_listed
    assert listed < whole_listed or seed == 6  # seed 6: every frontier ends within the plain rounds
