"""The memory bounds (`solvers.memory_bound`, `planner.search.bounds.memory_bound_s`): never above
any plan, against brute force on the solver's own terms and against the oracle's plans."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.optimize import linprog

from benchmarks.brute_force import brute_force
from planner import get_model
from planner.costmodel.analytic import AnalyticCostModel
from planner.search import search
from planner.search.api import _fluid, micro_batch_sizes
from planner.search.bounds import (fluid_bound_s, fluid_work, flight_limits, memory_bound_s, plan_positions,
                                   shape_limits)
from planner.search.space import costable_shapes, resource_classes
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from solvers.memory_bound import ShapeLimits, _least_fill, capped_fluid_s, most_copies, one_pipeline_s
from tests.test_search_bruteforce import MODEL

COST = AnalyticCostModel()


def _random_limits(rng: np.random.Generator) -> tuple[ShapeLimits, np.ndarray]:
    classes = int(rng.integers(1, 3))
    gpus = rng.integers(1, 4, classes).astype(float)
    rows = [(int(k), int(rng.choice([1, 2])), float(rng.uniform(0.5, 3.0)), int(rng.integers(1, 4)))
            for k in range(classes) for _ in range(int(rng.integers(1, 3)))]
    return ShapeLimits.of(*(np.array(c) for c in zip(*rows))), gpus


def _pipelines(lim: ShapeLimits, budget: list[int], n_dec: int):
    """Every pipeline of the solver's terms: a multiset of groups within `budget` GPUs per class,
    each holding x decoders (0 <= x <= d), all of them held; as (GPUs used per class, stage F+Bs)."""
    shapes = range(len(lim.t))
    for count in range(1, n_dec + 1):
        for groups in itertools.combinations_with_replacement(shapes, count):
            used = [0] * len(budget)
            for s in groups:
                used[lim.cls[s]] += int(lim.size[s])
            if any(u > b for u, b in zip(used, budget)):
                continue
            for xs in itertools.product(*(range(int(lim.d[s]) + 1) for s in groups)):
                if sum(xs) == n_dec:
                    yield used, [x * lim.t[s] for x, s in zip(xs, groups)]


def _step(fbs: list[float], m: int) -> float:
    return sum(fbs) + (m - 1) * max(fbs)


@pytest.mark.parametrize("seed", range(40))
def test_no_plan_of_one_or_two_pipelines_beats_the_bounds(seed: int) -> None:
    """Brute force on the bounds' own terms (a stage of shape s holding x decoders runs x·t_s and
    holds at most d_s): every one-pipeline plan takes at least both bounds, every two-pipeline plan
    at least the capped fluid one, and the one-pipeline bound claims one pipeline only where two
    cannot hold the decoders."""
    rng = np.random.default_rng(seed)
    lim, gpus = _random_limits(rng)
    n_dec, m = int(rng.integers(1, 5)), int(rng.integers(1, 7))
    budget = [int(g) for g in gpus]
    capped = capped_fluid_s(lim, gpus, n_dec, m)
    single = one_pipeline_s(lim, gpus, n_dec, m)
    pipes = list(_pipelines(lim, budget, n_dec))
    best_one = min((_step(fbs, m) for _, fbs in pipes), default=math.inf)
    assert capped <= best_one * (1 + 1e-9)
    if single is not None:
        assert single <= best_one * (1 + 1e-9)
    two = math.inf
    for (u1, f1), (u2, f2) in itertools.combinations_with_replacement(pipes, 2):
        if all(a + b <= c for a, b, c in zip(u1, u2, budget)):
            two = min(two, min(max(_step(f1, m1), _step(f2, m - m1)) for m1 in range(1, m)) if m > 1 else math.inf)
    assert capped <= two * (1 + 1e-9)
    if most_copies(lim, gpus, n_dec) < 2:
        assert two == math.inf
    if single is None:
        assert most_copies(lim, gpus, n_dec) >= 2


def test_a_stage_holding_exactly_its_most_decoders_counts() -> None:
    """One GPU holding all of the model's d decoders: its one plan runs them in one stage, d·t
    per microbatch, d·t·m in all. At C = d·t, C / t can round below d; taken as "does not fit",
    that plan's bound was inf (an `oracle_fuzz.py --seed 61` draw: one RTX-3090, three layers)."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        t, d, m = float(rng.uniform(0.01, 5.0)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
        lim = ShapeLimits.of(np.array([0]), np.array([1.0]), np.array([t]), np.array([float(d)]))
        for bound in (one_pipeline_s(lim, np.array([1.0]), d, m), capped_fluid_s(lim, np.array([1.0]), d, m)):
            assert bound <= d * t * m * (1 + 1e-9)
            assert bound >= d * t * m * (1 - 0.011)  # the C grid's ratio, 1.01


@pytest.mark.parametrize("seed", range(20))
def test_the_least_fill_is_the_lp_optimum(seed: int) -> None:
    """`_least_fill` (the dual, searched) against HiGHS on the primal LP A*(C): never above it and
    equal to 1e-6."""
    rng = np.random.default_rng(100 + seed)
    lim, gpus = _random_limits(rng)
    n_dec = int(rng.integers(1, 8))
    grid = np.sort(rng.uniform(0.3, 10.0, 6))
    got = _least_fill(lim, gpus, n_dec, grid)
    for c, value in zip(grid, got):
        r = np.minimum(lim.d, c / lim.t) / lim.size
        rows = [-r] + [np.where(lim.cls == k, 1.0, 0.0) for k in range(len(gpus))]
        res = linprog(lim.t * r, A_ub=np.array(rows), b_ub=np.array([-n_dec, *gpus]), bounds=(0, None),
                      method="highs")
        if res.status == 2:  # infeasible: the stages cannot hold every decoder under c
            assert value == math.inf
            continue
        assert value <= res.fun * (1 + 1e-9) + 1e-12
        assert value == pytest.approx(res.fun, rel=1e-6, abs=1e-9)


BIG = MODEL.model_copy(update={"hidden": 4096, "ffn_hidden": 11008, "num_heads": 32, "num_kv_heads": 32,
                               "vocab": 32000})
SMALL_GPUS = {
    "t4-2080ti": ClusterSpec(nodes=[NodeGroup(gpu="T4", nodes=2, gpus_per_node=1),
                                    NodeGroup(gpu="RTX-2080Ti", nodes=2, gpus_per_node=1)]),
    "v100-t4": ClusterSpec(nodes=[NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=2),
                                  NodeGroup(gpu="T4", nodes=2, gpus_per_node=1)]),
}


@pytest.mark.parametrize("pool,layers,global_batch", [("t4-2080ti", 6, 8), ("t4-2080ti", 8, 4), ("v100-t4", 8, 4),
                                                      ("v100-t4", 6, 8)])
def test_the_memory_bound_is_below_every_plan_of_the_oracle(pool: str, layers: int, global_batch: int) -> None:
    """A 4,096-wide model on four 11-16 GB GPUs, each holding one to three layers: at each
    microbatch size the memory bound is below the fastest plan of every plan the oracle lists, and
    on the T4 + RTX-2080Ti pool (fewer than two copies fit: one pipeline) above the fluid bound."""
    model = BIG.model_copy(update={"num_layers": layers})
    cluster = SMALL_GPUS[pool]
    training = TrainingSpec(global_batch=global_batch, seq_len=1024, micro_batches=(1, 2), max_stage_dp=1, max_cp=1,
                            max_hp=1, recompute=("none", "full"))
    classes = resource_classes(cluster)
    gpus = np.array([rc.gpus for rc in classes], dtype=float)
    for b in (1, 2):
        found = brute_force(model, cluster, training.model_copy(update={"micro_batches": (b,)}), COST)
        assert found is not None
        shapes = [(rc.index, s) for rc in classes for s in costable_shapes(COST, model, training, rc, b)]
        memory = memory_bound_s(shape_limits(COST, model, training, classes, shapes, b), gpus, layers,
                                global_batch // b)
        overhead = COST.knobs.step_overhead_s
        assert memory + overhead <= found.step_s * (1 + 1e-9)
        assert _fluid(COST, model, training, classes, b) <= found.step_s * (1 + 1e-9)
        flights = memory_bound_s(shape_limits(COST, model, training, classes, shapes, b), gpus, layers,
                                 global_batch // b, lambda: flight_limits(COST, model, training, classes, shapes, b),
                                 plan_positions(model, classes))
        assert memory <= flights and flights + overhead <= found.step_s * (1 + 1e-9)
        if pool == "t4-2080ti":
            fluid = fluid_bound_s(fluid_work(COST, model, training, classes, shapes, b), gpus, global_batch // b)
            assert memory > 1.1 * fluid


def test_a_pool_only_long_chains_fit_gets_the_memory_bound() -> None:
    """Llama-2 70B at 64k tokens on 86 GPUs of six types (`many_types.py --seed 22` pool 24): no
    pipeline of the coverage fits, so the reported bound is the fluid one, now with memory: one
    pipeline only (fewer than two copies of the decoders fit), 226 s against 82.9 s, and 294 s
    with each stage's microbatches in flight (`solvers.flight_bound`), under the 316.4 s chain
    found."""
    from tests.test_flagscale_search import SIX_TYPE
    import yaml

    cluster = ClusterSpec.model_validate(yaml.safe_load(SIX_TYPE))
    model = get_model("llama2-70b")
    training = TrainingSpec(global_batch=16, seq_len=65536)
    result = search(model, cluster, training, cost=COST, workers=2)
    classes = resource_classes(cluster)
    assert result.coverage_bound_s is None  # no plan of the coverage: the bound holds for every plan
    assert result.lower_bound_s == pytest.approx(min(_fluid(COST, model, training, classes, b)
                                                     for b in micro_batch_sizes(training)), rel=1e-12)
    assert 290 < result.lower_bound_s <= result.prediction.step_s
    idle = [line for line in result.explanation if line.startswith("idle:")]
    assert idle and all("no mesh chain or Megatron grid searched that also uses them" in line for line in idle)
