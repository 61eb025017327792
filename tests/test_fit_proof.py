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
from planner.search.fit_proof import EXACT_COUNTS, count_ranges, fold_fits, pipeline_usages
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
