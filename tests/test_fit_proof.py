"""The proof that no plan fits (`planner.search.fit_proof`): its dynamic program against brute
force, and the error it gives a pool whose searched space holds no plan."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import InfeasibleError
from planner.search import search
from planner.search import api
from planner.search.fit_proof import (EXACT_COUNTS, count_ranges, fold_fits, merged_classes, pipeline_usages,
                                      pooled_limits)
from planner.search.space import BlockType
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model


def _usages_brute(limits: dict[BlockType, np.ndarray], avail: tuple[int, ...], micro: int) -> set[tuple[int, ...]]:
    """Every usage of a stage sequence covering all slots, by enumerating cut points and types."""
    n = next(iter(limits.values())).shape[0] - 1
    out: set[tuple[int, ...]] = set()
    types = list(limits)
    for stages in range(1, n + 1):
        for cuts in itertools.combinations(range(1, n), stages - 1):
            bounds = (0, *cuts, n)
            for seq in itertools.product(types, repeat=stages):
                used = [0] * len(avail)
                ok = True
                for s, bt in enumerate(seq):
                    used[bt.cls] += bt.gpus
                    flight = min(stages - s, micro)
                    if limits[bt][bounds[s], bounds[s + 1]] < flight:
                        ok = False
                        break
                if ok and all(u <= a for u, a in zip(used, avail)):
                    out.add(tuple(used))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_pipeline_usages_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    avail = (rng.randint(1, 4), rng.randint(0, 3))
    types = [BlockType(0, 1), BlockType(0, 2), BlockType(1, 1)]
    limits = {}
    for bt in types:
        lim = np.zeros((n + 1, n + 1))
        for i in range(n):
            for j in range(i + 1, n + 1):
                lim[i, j] = max(0, rng.randint(-1, 4) - (j - i) + 1)  # longer ranges hold fewer
        limits[bt] = lim
    micro = rng.randint(1, 4)
    grid = pipeline_usages(limits, avail, micro)
    assert {tuple(int(x) for x in u) for u in np.argwhere(grid)} == _usages_brute(limits, avail, micro)


@pytest.mark.parametrize("seed", range(12))
def test_fold_fits_matches_brute_force(seed: int) -> None:
    """`count` usages (repeats allowed) fit the pool together exactly when some choice of them does."""
    rng = np.random.default_rng(seed)
    avail = (3, 2, 2) if seed % 2 else (4, 3)
    usages = rng.random(tuple(a + 1 for a in avail)) < (0.08 if seed % 2 else 0.15)
    points = [tuple(int(x) for x in p) for p in np.argwhere(usages)]
    for count in (2, 3):
        expect = any(all(sum(p[k] for p in combo) <= a for k, a in enumerate(avail))
                     for combo in itertools.combinations_with_replacement(points, count))
        assert fold_fits(usages, avail, count) == expect


@pytest.mark.parametrize("seed", range(8))
def test_fold_fits_with_a_first_usage_matches_brute_force(seed: int) -> None:
    """One usage from `first` and `count` - 1 from the grid fit the pool together exactly when some
    such choice of them does."""
    rng = np.random.default_rng(100 + seed)
    avail = (3, 2, 2) if seed % 2 else (4, 3)
    usages = rng.random(tuple(a + 1 for a in avail)) < (0.08 if seed % 2 else 0.15)
    first = usages & (rng.random(usages.shape) < 0.5)  # more flights in flight: fewer usages
    points = [tuple(int(x) for x in p) for p in np.argwhere(usages)]
    firsts = [tuple(int(x) for x in p) for p in np.argwhere(first)]
    for count in (1, 2, 3):
        expect = any(all(f[k] + sum(p[k] for p in combo) <= a for k, a in enumerate(avail))
                     for f in firsts for combo in itertools.combinations_with_replacement(points, count - 1))
        assert fold_fits(usages, avail, count, first=first) == expect


@pytest.mark.parametrize("micro, gpus", [(1, 8), (2, 8), (16, 6), (64, 40), (1000, 300), (40, 1000)])
def test_count_ranges_cover_every_pipeline_count_once(micro: int, gpus: int) -> None:
    ranges = count_ranges(micro, gpus)
    covered = [r for lo, hi in ranges for r in range(lo, hi + 1)]
    assert covered == list(range(2, min(micro, gpus) + 1))
    assert all(lo == hi for lo, hi in ranges if lo <= EXACT_COUNTS)
    assert all(hi <= 2 * lo - 1 for lo, hi in ranges)


@pytest.mark.parametrize("draw_index", [87, 344, 730])
def test_fuzz_draws_without_a_plan_are_shown_to_fit_nowhere(draw_index: int) -> None:
    """`oracle_fuzz.py --seed 42` draws the oracle finds no plan for, which the proof left open when
    it took pipeline counts in ranges [lo, 2 lo - 1] with the states sharded over 2 lo - 1 even
    past the pool's GPUs: 87 (ZeRO-3, 4 GPUs of three types) and 344 (ZeRO-1, 6 GPUs of two
    types) are shown by counts taken one by one, 730 (ZeRO-1, 2 GPUs) by the range's cap at the
    pool's GPU count."""
    from benchmarks.brute_force import brute_force
    from benchmarks.oracle_fuzz import COST as FUZZ_COST
    from benchmarks.oracle_fuzz import draw, proves_nothing_fits

    rng = random.Random(42)
    for _ in range(draw_index + 1):
        inst = draw(rng)
    assert brute_force(inst.model, inst.cluster, inst.training, FUZZ_COST) is None
    assert proves_nothing_fits(inst)


def test_no_plan_anywhere_is_said_to_fit_nowhere() -> None:
    """OPT-30B at 8k tokens on 29 GPUs of four types (`many_types.py --seed 4` pool 9): the model
    states fit the pool's memory, no plan of the searched space fits, and the proof shows that no
    pipeline of any order does (the error said before that pipelines outside the space were not
    searched)."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=2, gpus_per_node=1),
                                 NodeGroup(gpu="T4", nodes=2, gpus_per_node=8),
                                 NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=8),
                                 NodeGroup(gpu="A100-SXM4-40GB", nodes=3, gpus_per_node=1)])
    training = TrainingSpec(global_batch=16, seq_len=8192)
    with pytest.raises(InfeasibleError, match="fits nowhere.*50 layer slots") as err:
        search(get_model("opt-30b"), cluster, training, cost=AnalyticCostModel(), workers=1)
    assert "not searched" not in str(err.value)


def test_zero_sharding_is_taken_per_pipeline_count() -> None:
    """Llama-2 70B at 64k tokens, ZeRO-1, global batch 16 on 4 L4 + 64 RTX-3090 + 8 V100-16GB
    (`many_types.py --seed 20` pool 20): no plan fits. With optimizer states sharded over the most
    pipelines (76) for every pipeline count, two pipelines fit and the error said only that no plan
    of the searched space fits; sharded over at most 2 * lo - 1 pipelines when testing lo of
    them, none fits at any count."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="L4", nodes=1, gpus_per_node=4),
                                 NodeGroup(gpu="RTX-3090", nodes=16, gpus_per_node=4),
                                 NodeGroup(gpu="V100-SXM2-16GB", nodes=2, gpus_per_node=4)])
    training = TrainingSpec(global_batch=16, seq_len=65536, zero=1)
    with pytest.raises(InfeasibleError, match="fits nowhere") as err:
        search(get_model("llama2-70b"), cluster, training, cost=AnalyticCostModel(), workers=2)
    assert "not searched" not in str(err.value)


def test_classes_pool_until_the_usage_grid_is_small_enough() -> None:
    """Pools within `MAX_CELLS` keep every class alone; larger ones pool the classes whose memory
    per GPU is closest first (24 GB with 24 GB, not with 16 GB), and a pool no grouping brings
    under the limit gets None."""
    assert merged_classes([16.0, 24.0, 32.0], [8, 8, 8]) == [[0], [1], [2]]
    capacity = [32.0, 24.0, 16.0, 24.0]  # V100-32, RTX-3090, V100-16, A10: 127,413 cells
    assert merged_classes(capacity, [32, 12, 32, 8]) == [[0], [1, 3], [2]]
    assert merged_classes(capacity, [32, 12, 32, 8], max_cells=2_000) == [[0, 1, 3], [2]]  # 53 * 33 cells
    assert merged_classes(capacity, [32, 12, 32, 8], max_cells=100) == [[0, 1, 2, 3]]
    assert merged_classes(capacity, [32, 12, 32, 8], max_cells=50) is None


@pytest.mark.parametrize("seed", range(10))
def test_pooled_classes_keep_every_usage_of_the_pool(seed: int) -> None:
    """The relaxation the large pools' proof rests on: every GPU usage with which some pipeline
    covers the layers in the pool, summed over each group's classes, is one the pooled grid holds
    (so where the pooled grid holds none, the pool holds none)."""
    rng = random.Random(300 + seed)
    n = rng.randint(2, 5)
    avail = (rng.randint(1, 3), rng.randint(1, 3), rng.randint(0, 2))
    types = [BlockType(0, 1), BlockType(0, 2), BlockType(1, 1), BlockType(1, 2), BlockType(2, 1)]
    limits = {}
    for bt in types:
        lim = np.zeros((n + 1, n + 1))
        for i in range(n):
            for j in range(i + 1, n + 1):
                lim[i, j] = max(0, rng.randint(-1, 4) - (j - i) + 1)
        limits[bt] = lim
    micro = rng.randint(1, 4)
    group_of = [0, 0, 1] if seed % 2 else [0, 1, 0]
    pooled_avail = tuple(sum(a for a, g in zip(avail, group_of) if g == k) for k in range(2))
    pooled = pipeline_usages(pooled_limits(limits, group_of), pooled_avail, micro)
    found = _usages_brute(limits, avail, micro)
    assert found  # every draw has pipelines that fit, so the check bites
    for used in found:
        summed = [0, 0]
        for cls, u in enumerate(used):
            summed[group_of[cls]] += u
        assert pooled[tuple(summed)]


def test_a_pool_too_large_for_the_grid_is_shown_to_fit_nowhere_on_pooled_classes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-2 70B at 32k tokens, global batch 32, on 84 GPUs of four types (`many_types.py
    --seed 23` pool 17): 127,413 usages, over the grid's limit, so the error said only that no
    plan of the searched space fits. With the two 24 GB classes pooled the proof holds, and it
    is taken before the engine candidates, which then do not run (nothing could fit)."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="V100-SXM2-32GB", nodes=16, gpus_per_node=2),
                                 NodeGroup(gpu="RTX-3090", nodes=3, gpus_per_node=4),
                                 NodeGroup(gpu="V100-SXM2-16GB", nodes=4, gpus_per_node=8),
                                 NodeGroup(gpu="A10", nodes=1, gpus_per_node=8)])

    def engines_run(*args, **kwargs):
        raise AssertionError("the engine candidates ran where no plan fits")

    monkeypatch.setattr(api, "beyond_coverage", engines_run)
    with pytest.raises(InfeasibleError, match="fits nowhere.*82 layer slots") as err:
        search(get_model("llama2-70b"), cluster, TrainingSpec(global_batch=32, seq_len=32768),
               cost=AnalyticCostModel(), workers=1)
    assert "not searched" not in str(err.value)
