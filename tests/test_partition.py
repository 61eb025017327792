"""The exact partition DP against brute force over every split and option choice."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import solvers.partition as partition
from solvers.partition import (StageOptions, Split, _cost_matrix, _feasible_fb, best_split, least_step_split, pareto,
                               split_frontier, undominated_options)


def _random_options(rng: np.random.Generator, n: int, num_opts: int, capacity: float) -> StageOptions:
    per_layer = rng.uniform(1, 5, size=(num_opts, n))
    per_tail = rng.uniform(0.1, 2, size=(num_opts, n))
    per_mem = rng.uniform(1, 3, size=(num_opts, n))
    per_act = rng.uniform(0.5, 2, size=(num_opts, n))
    recv = rng.uniform(0, 0.5, size=num_opts)
    shape = (num_opts, n + 1, n + 1)
    fb, tail, mem, act = (np.full(shape, math.inf) for _ in range(4))
    for o in range(num_opts):
        for i in range(n):
            for j in range(i + 1, n + 1):
                fb[o, i, j] = per_layer[o, i:j].sum() + recv[o] * ((i > 0) + (j < n))
                tail[o, i, j] = per_tail[o, i:j].sum()
                mem[o, i, j] = per_mem[o, i:j].sum()
                act[o, i, j] = per_act[o, i:j].sum()
    return StageOptions(fb, tail, mem, act, capacity)


def _all_splits(positions: list[StageOptions], max_in_flight: int | None) -> list[Split]:
    n = positions[0].num_layers
    s = len(positions)
    out = []
    for cuts in itertools.combinations(range(1, n), s - 1):
        bounds = (0, *cuts, n)
        for opts in itertools.product(*(range(p.fb.shape[0]) for p in positions)):
            ok, fbs, tails = True, [], []
            for k, p in enumerate(positions):
                i, j, o = bounds[k], bounds[k + 1], opts[k]
                flight = s - k if max_in_flight is None else min(s - k, max_in_flight)
                if p.mem_fixed[o, i, j] + flight * p.act[o, i, j] > p.capacity:
                    ok = False
                    break
                fbs.append(float(p.fb[o, i, j]))
                tails.append(float(p.tail[o, i, j]))
            if ok:
                out.append(Split(tuple((bounds[k], bounds[k + 1] - 1) for k in range(s)), opts,
                                 tuple(fbs), tuple(tails)))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_split_frontier_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 7))
    stages = int(rng.integers(1, min(n, 4) + 1))
    kinds = [_random_options(rng, n, int(rng.integers(1, 3)), float(rng.uniform(8, 25))) for _ in range(2)]
    positions = [kinds[int(rng.integers(0, 2))] for _ in range(stages)]
    flight = None if seed % 3 else 1
    brute = pareto(_all_splits(positions, flight))
    ours = split_frontier(positions, flight)
    key = lambda p: (round(p.a_s, 9), round(p.c_s, 9), round(p.e_s, 9))
    assert sorted(map(key, ours)) == sorted(map(key, brute)), f"frontier differs for seed {seed}"
    # and every objective A + (m-1) C + E is minimised exactly
    for m in (1, 2, 5, 50):
        best_brute = min((p.a_s + (m - 1) * p.c_s + p.e_s for p in brute), default=None)
        best_ours = min((p.a_s + (m - 1) * p.c_s + p.e_s for p in ours), default=None)
        assert best_brute == pytest.approx(best_ours) if best_brute is not None else best_ours is None


@pytest.mark.parametrize("seed", range(160))
def test_least_step_split_is_the_best_of_every_split(seed: int) -> None:
    """`least_step_split` (the frontier walk cut short by bounds) gives the least A + (m - 1)·C + E
    of every split (brute force), and the split `split_frontier`'s frontier ranks first for that m
    by (value, C, E, ranges), on repeated stage kinds too, where ties abound."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 8))
    stages = int(rng.integers(1, min(n, 5) + 1))
    kinds = [_random_options(rng, n, int(rng.integers(1, 4)), float(rng.uniform(8, 30))) for _ in range(2)]
    positions = [kinds[int(rng.integers(0, 2))] for _ in range(stages)]
    flight = None if seed % 4 else int(rng.integers(1, 3))
    every = _all_splits(positions, flight)
    for m in (1, 2, 7, 64):
        def value(p: Split) -> float:
            return p.a_s + (m - 1) * p.c_s + p.e_s

        got = least_step_split(positions, m, flight)
        if not every:
            assert got is None
            continue
        assert got is not None and value(got) == pytest.approx(min(map(value, every)), rel=1e-12)
        assert got == min(split_frontier(positions, flight), key=lambda p: (value(p), p.c_s, p.e_s, p.ranges))
        # a cutoff: the same split where it is below, else None (nothing below the cutoff)
        values = sorted({value(p) for p in every})
        for cut in values[:3]:
            below = least_step_split(positions, m, flight, cutoff=cut)
            assert (below is None) == (cut <= value(got))
            assert below is None or below == got
        assert least_step_split(positions, m, flight, cutoff=value(got) * (1 + 1e-9)) == got


def test_best_split_respects_caps() -> None:
    rng = np.random.default_rng(7)
    opts = _random_options(rng, 6, 2, 100.0)
    free = best_split([opts] * 3)
    assert free is not None
    capped = best_split([opts] * 3, c=free.c_s * 0.999999)
    if capped is not None:
        assert capped.c_s < free.c_s and capped.a_s >= free.a_s - 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_bottleneck_cap_applies_after_the_least_option(seed: int) -> None:
    """The walks' cost matrices (one reduction over options per stage kind, flight and tail cap,
    kept in a memo, the bottleneck cap applied after it) equal the least F+B over the options
    that meet every cap, cell by cell, and the split found with a memo is the one found without."""
    rng = np.random.default_rng(40 + seed)
    opts = _random_options(rng, 6, 4, 14.0)
    memo: dict = {}
    for e in (math.inf, 4.0, 2.5):
        for c in (math.inf, 12.0, 7.0, 5.5, 3.0):
            for flight in (1, 2, 3):
                want = _feasible_fb(opts, flight, c, e).min(axis=0)
                assert np.array_equal(_cost_matrix(opts, flight, c, e, memo), want)
            assert best_split([opts] * 3, c, e, 2, memo) == best_split([opts] * 3, c, e, 2)
    assert len(memo) == 9  # three tail caps, three flights: the bottleneck caps share them


def test_a_full_memo_drops_its_oldest_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived memo (the Megatron grids' across layouts) keeps at most `MEMO_CELLS` cells:
    past it the oldest matrix goes, and the splits stay the ones found without a memo."""
    rng = np.random.default_rng(9)
    kinds = [_random_options(rng, 6, 3, 14.0) for _ in range(3)]
    monkeypatch.setattr(partition, "MEMO_CELLS", 2 * 7 * 7)  # two matrices of 7 x 7 cells
    memo: dict = {}
    for stages in itertools.permutations(kinds):
        for flight in (1, 2, 3):
            assert best_split(list(stages), max_in_flight=flight, memo=memo) == \
                best_split(list(stages), max_in_flight=flight)
            assert len(memo) <= 2


def _undominated_by_pairs(opts: StageOptions, use_tail: bool) -> list[int]:
    """Reference: every pair compared one at a time."""
    n = opts.fb.shape[0]
    arrays = [opts.fb, opts.mem_fixed, opts.act] + ([opts.tail] if use_tail else [])
    keep = []
    for i in range(n):
        beaten = any(j != i and all(np.all(a[j] <= a[i]) for a in arrays)
                     and (j < i or not all(np.array_equal(a[j], a[i]) for a in arrays)) for j in range(n))
        if not beaten:
            keep.append(i)
    return keep


@pytest.mark.parametrize("seed", range(40))
def test_undominated_options_matches_pairwise_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, layers = int(rng.integers(1, 9)), int(rng.integers(1, 4))

    def table() -> np.ndarray:
        a = rng.integers(0, 3, (n, layers + 1, layers + 1)).astype(float)
        a[rng.random(a.shape) < 0.2] = np.inf
        return a

    opts = StageOptions(table(), table(), table(), table(), 5.0)
    twin = int(rng.integers(0, n))  # an exact copy of option 0: ties keep the lower index
    for a in (opts.fb, opts.tail, opts.mem_fixed, opts.act):
        a[twin] = a[0]
    for use_tail in (True, False):
        assert undominated_options(opts, use_tail) == _undominated_by_pairs(opts, use_tail)
