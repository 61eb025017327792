"""Baseline planners: every one returns a valid plan scored by the one evaluator, keeps the rule that
defines it, is deterministic, says why when nothing fits, and is never better than the search."""

from __future__ import annotations

import itertools
import math
from functools import cache
from pathlib import Path

import pytest

from benchmarks.baselines import BASELINES, largest_type
from benchmarks.baselines import megatron_uniform as mu
from benchmarks.baselines.common import (
    RECOMPUTE_ORDER,
    place_groups,
    proportional_counts,
)
from benchmarks.baselines.flashflex import (
    cut_by_tflops,
    flashflex_candidate,
    repair_memory,
)
from benchmarks.baselines.metis import stage_partitions
from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.knobs import default_knobs
from planner.errors import InfeasibleError
from planner.evaluate import evaluate, stage_costs
from planner.plan import Plan, compress_devices, expand_devices
from planner.search import search
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.cluster import load_cluster
from planner.specs.gpus import get_gpu
from planner.specs.models import get_model
from planner.uniform import even_layer_split
from planner.validate import violations

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
COST = AnalyticCostModel()
NAMES = ("megatron-uniform", "megatron-largest-type", "metis", "sailor", "amp", "flashflex")
THREE_TYPES = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", gpus_per_node=2),
                                 NodeGroup(gpu="V100-SXM2-32GB", gpus_per_node=4),
                                 NodeGroup(gpu="H100-SXM5-80GB", gpus_per_node=2)])
CASES = {
    "mixed-llama2-7b": (lambda: load_cluster(EXAMPLES / "mixed.yaml"), "llama2-7b", 256, 4096),
    "small-opt-350m": (lambda: load_cluster(EXAMPLES / "tiny_cluster.yaml"), "opt-350m", 64, 2048),
    "three-types-tiny": (lambda: THREE_TYPES, "tiny", 32, 128),
}


@cache
def case(key: str):
    make, model, batch, seq = CASES[key]
    return make(), get_model(model), TrainingSpec(global_batch=batch, seq_len=seq)


@cache
def planned(name: str, key: str) -> Plan:
    cluster, model, training = case(key)
    return BASELINES[name](model, cluster, training, COST)


def blocks(layers: tuple[int, int], model) -> int:
    """Decoder blocks in a stage's layer range (embedding and head excluded)."""
    first, last = layers
    return max(0, min(last, model.num_layers) - max(first, 1) + 1)


def test_registry_names_every_baseline():
    assert tuple(BASELINES) == NAMES


@pytest.mark.parametrize("key", sorted(CASES))
@pytest.mark.parametrize("name", NAMES)
def test_baseline_plan_is_valid_and_scored_by_the_evaluator(name, key):
    cluster, _model, _training = case(key)
    plan = planned(name, key)
    found = violations(plan, cluster, COST)
    assert not found, f"{name} on {key}: {[str(v) for v in found]}"
    assert plan.predicted == evaluate(plan, cluster, COST), f"{name} on {key}: stored prediction differs"
    for pipe in plan.pipelines:
        for stage in pipe.stages:
            devs = expand_devices(stage.devices)
            assert len(devs) == stage.num_gpus
            for node, _ in devs:
                assert cluster.node(node).gpu == stage.gpu, f"{name}: {node} is not a {stage.gpu}"
            for k in range(0, len(devs), stage.tp):
                assert len({n for n, _ in devs[k:k + stage.tp]}) == 1, f"{name}: tp group spans nodes"


@pytest.mark.parametrize("name", NAMES)
def test_baseline_is_deterministic(name):
    cluster, model, training = case("three-types-tiny")
    again = BASELINES[name](model, cluster, training, COST)
    assert again.to_json() == planned(name, "three-types-tiny").to_json()


@pytest.mark.parametrize("name", NAMES)
def test_baseline_says_why_when_nothing_fits(name):
    cluster = load_cluster(EXAMPLES / "tiny_cluster.yaml")
    training = TrainingSpec(global_batch=8, seq_len=4096, micro_batches=(1,))
    with pytest.raises(InfeasibleError) as err:
        BASELINES[name](get_model("llama2-70b"), cluster, training, COST)
    assert err.value.field == name and err.value.reason


@pytest.mark.parametrize("key", sorted(CASES))
def test_metis_one_pipeline_power_of_two_stages_speed_split(key):
    cluster, model, _training = case(key)
    plan = planned("metis", key)
    assert len(plan.pipelines) == 1, "Metis runs one pipeline: one microbatch count for every replica"
    stages = plan.pipelines[0].stages
    for stage in stages:
        assert stage.num_gpus & (stage.num_gpus - 1) == 0, f"stage size {stage.num_gpus} not a power of two"
    types = [s.gpu for s in stages]
    assert all(types.index(g) == i or types[i - 1] == g for i, g in enumerate(types)), \
        f"GPU types not contiguous along the pipeline: {types}"
    speeds = [1.0 / float(sc.table.fwd_s[1] + sc.table.bwd_s[1]) for sc in stage_costs(plan, cluster, COST)[0]]
    for stage, speed in zip(stages, speeds):
        share = model.num_layers * speed / sum(speeds)
        assert abs(blocks(stage.layers, model) - share) < 1 or blocks(stage.layers, model) == 1, \
            f"{stage.gpu} holds {blocks(stage.layers, model)} blocks, speed share is {share:.2f}"


@pytest.mark.parametrize("key", sorted(CASES))
def test_sailor_even_split_even_batch_per_type_pipelines(key):
    _cluster, model, _training = case(key)
    plan = planned("sailor", key)
    assert len({p.microbatches for p in plan.pipelines}) == 1, "batch not split evenly over replicas"
    for pipe in plan.pipelines:
        assert [s.layers for s in pipe.stages] == even_layer_split(model, len(pipe.stages))
        assert len({s.gpu for s in pipe.stages}) == 1 and len({s.tp for s in pipe.stages}) == 1
    assert len({len(p.stages) for p in plan.pipelines}) == 1, "one pipeline depth for the job"


def test_sailor_tp_is_the_smallest_that_fits_memory():
    cluster, _model, _training = case("mixed-llama2-7b")
    plan = planned("sailor", "mixed-llama2-7b")
    tps = {s.gpu: s.tp for p in plan.pipelines for s in p.stages}
    assert any(tp > 1 for tp in tps.values()), "this case should need tensor parallelism somewhere"
    for gpu, tp in tps.items():
        if tp == 1:
            continue
        half = [p.model_copy(update={"stages": [
            s.model_copy(update={"tp": tp // 2, "devices": compress_devices(expand_devices(s.devices)[:tp // 2])})
            if s.gpu == gpu else s for s in p.stages]}) for p in plan.pipelines]
        rules = {v.rule for v in violations(plan.model_copy(update={"pipelines": half}), cluster, COST)}
        assert rules == {"memory"}, f"{gpu} at tp {tp // 2} should overflow memory, got {rules}"


@pytest.mark.parametrize("key", sorted(CASES))
def test_amp_uniform_degrees_that_factor_the_gpus_used(key):
    cluster, _model, _training = case(key)
    plan = planned("amp", key)
    shapes = {(len(p.stages), p.microbatches, tuple(s.layers for s in p.stages)) for p in plan.pipelines}
    assert len(shapes) == 1, "AMP replicas must share pp, layer split and batch"
    assert {(s.tp, s.dp) for p in plan.pipelines for s in p.stages} == {(plan.pipelines[0].stages[0].tp, 1)}
    counts = cluster.counts_by_type()
    used = {s.gpu for p in plan.pipelines for s in p.stages}
    assert plan.num_gpus == sum(counts[g] for g in used), "degrees must factor all GPUs of the types used"


@pytest.mark.parametrize("key", ["small-opt-350m", "mixed-llama2-7b"])
def test_flashflex_splits_follow_tflops(key):
    _cluster, model, training = case(key)
    plan = planned("flashflex", key)
    peak = [[get_gpu(s.gpu).peak_flops(training.dtype) * s.tp for s in p.stages] for p in plan.pipelines]
    total_mb = training.global_batch // plan.micro_batch
    for pipe, flops in zip(plan.pipelines, peak):
        assert abs(pipe.microbatches - total_mb * sum(flops) / sum(map(sum, peak))) < 1
        shares = [model.num_layers * f / sum(flops) for f in flops]
        counts = [blocks(s.layers, model) for s in pipe.stages]
        # before any memory repair the split is within one block of the TFLOP/s share
        assert sum(counts) == model.num_layers
        assert all(abs(c - x) < 1 for c, x in zip(counts, shares)), f"blocks {counts} vs shares {shares}"


def test_flashflex_mixed_pipeline_splits_layers_by_tflops():
    cluster, model, training = case("small-opt-350m")
    plan = flashflex_candidate(model, cluster, training, COST, {"A100-SXM4-80GB": 1, "V100-SXM2-32GB": 1}, 2, 1)
    mixed = [p for p in plan.pipelines if len({s.gpu for s in p.stages}) > 1]
    assert mixed, "two pipelines over 4 A100 + 4 V100 of equal TFLOP/s must mix GPU types"
    for pipe in plan.pipelines:
        flops = [get_gpu(s.gpu).peak_flops(training.dtype) for s in pipe.stages]
        counts = [blocks(s.layers, model) for s in pipe.stages]
        shares = [model.num_layers * f / sum(flops) for f in flops]
        assert all(abs(c - x) < 1 for c, x in zip(counts, shares)), f"blocks {counts} vs shares {shares}"
    a, b = (sum(get_gpu(s.gpu).peak_flops(training.dtype) for s in p.stages) for p in plan.pipelines)
    assert abs(a - b) <= max(get_gpu(s.gpu).peak_flops(training.dtype) for p in plan.pipelines for s in p.stages)


def test_flashflex_repair_moves_layers_off_a_full_stage():
    model = get_model("tiny")

    class Memory:  # stage 0 holds at most 2 layer slots, the others 10
        training = TrainingSpec(global_batch=8, seq_len=128)

        def __init__(self) -> None:
            self.model = model

        def free_bytes(self, group, layers, in_flight):
            return (2 if group == "small" else 10) - (layers[1] - layers[0] + 1)

    split = [(0, 3), (4, 4), (5, 5)]
    fixed = repair_memory(split, ["small", "big", "big"], 4, Memory())
    assert fixed is not None and fixed[0][1] - fixed[0][0] + 1 <= 2
    assert fixed[0][0] == 0 and fixed[-1][1] == 5 and all(a[1] + 1 == b[0] for a, b in itertools.pairwise(fixed))


def test_megatron_largest_type_uses_only_that_type():
    cluster, _model, training = case("mixed-llama2-7b")
    gpu = largest_type(cluster, training)
    assert cluster.counts_by_type()[gpu] == max(cluster.counts_by_type().values())
    plan = planned("megatron-largest-type", "mixed-llama2-7b")
    assert {s.gpu for p in plan.pipelines for s in p.stages} == {gpu}


def test_proportional_counts_sum_and_stay_within_one():
    for total, weights in [(32, [3.0, 1.0, 1.0]), (7, [1.0] * 7), (33, [2.5, 1.0, 4.0, 0.5])]:
        counts = proportional_counts(total, weights)
        assert sum(counts) == total and min(counts) >= 1
        exact = [total * w / sum(weights) for w in weights]
        assert all(abs(c - x) < 1 for c, x in zip(counts, exact)), (counts, exact)
    # every stage keeps its minimum; what is left goes to the heavy one
    assert proportional_counts(10, [100.0, 1.0, 1.0]) == [8, 1, 1]
    assert proportional_counts(2, [1.0, 1.0, 1.0]) is None


def test_stage_partitions_are_powers_of_two_summing_to_count():
    for count in (1, 4, 12, 16, 28):
        parts = stage_partitions(count)
        assert parts and len(set(parts)) == len(parts)
        for p in parts:
            assert sum(p) == count and all(x & (x - 1) == 0 for x in p) and list(p) == sorted(p, reverse=True)


def test_cut_by_tflops_balances_contiguous_pieces():
    pieces = cut_by_tflops([4.0, 4.0, 1.0, 1.0, 1.0, 1.0, 4.0], 3, 10)
    assert pieces[0][0] == 0 and pieces[-1][1] == 7 and all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert cut_by_tflops([1.0, 1.0], 3, 10) is None


def test_place_groups_keeps_groups_in_one_node_and_never_reuses_a_gpu():
    cluster = load_cluster(EXAMPLES / "mixed.yaml")
    v100 = "V100-SXM2-32GB"
    placed = place_groups(cluster, [(v100, 4, 2), (v100, 2, 3), (v100, 1, 2)])
    flat = [d for devs in placed for d in devs]
    assert len(flat) == len(set(flat)) == 16
    for devs, size in zip(placed, (4, 2, 1)):
        for k in range(0, len(devs), size):
            assert len({n for n, _ in devs[k:k + size]}) == 1
    assert place_groups(cluster, [(v100, 8, 3)]) is None


@pytest.mark.parametrize("key", ["small-opt-350m", "three-types-tiny"])
def test_search_is_never_slower_than_any_baseline(key):
    cluster, model, training = case(key)
    ours = search(model, cluster, training, cost=COST, time_limit=20).prediction.step_s
    for name in NAMES:
        theirs = planned(name, key).predicted.step_s
        assert ours <= theirs * (1 + 1e-9) or math.isclose(ours, theirs, rel_tol=1e-9), \
            f"{name} found {theirs:.6f} s, search {ours:.6f} s on {key}"


# -- Megatron-uniform fast path -----------------------------------------------------------------------

ODD_NODES = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", gpus_per_node=4, nodes=2),
                               NodeGroup(gpu="V100-SXM2-32GB", gpus_per_node=6),
                               NodeGroup(gpu="A100-SXM4-80GB", gpus_per_node=2),
                               NodeGroup(gpu="T4", gpus_per_node=1, nodes=2)])
OVERLAP = AnalyticCostModel(default_knobs().model_copy(update={"dp_overlap": 0.7}))


def brute_uniform(model, cluster, training, cost, nodes, most_gpus):
    """Every grid built, validated and scored; the least (most GPUs if asked, step, GPUs, tp, pp,
    microbatch, recompute) wins."""
    ranks = mu._ranks(nodes)
    best = None
    for grid in mu.grids(model, training, ranks):
        plan = mu.grid_plan(model, training, ranks, grid)
        if violations(plan, cluster, cost):
            continue
        step = evaluate(plan, cluster, cost, check=False).step_s
        key = (-grid.gpus if most_gpus else 0, step, grid.gpus, grid.tp, grid.pp, grid.micro_batch,
               RECOMPUTE_ORDER.index(grid.recompute))
        if best is None or key < best[0]:
            best = (key, plan)
    return best and best[1]


@pytest.mark.parametrize("cost", [COST, OVERLAP], ids=["analytic", "dp-overlap"])
@pytest.mark.parametrize("most_gpus", [False, True])
@pytest.mark.parametrize("key", ["mixed-llama2-7b", "three-types-tiny"])
def test_megatron_uniform_returns_the_plan_brute_force_finds(key, most_gpus, cost):
    cluster, model, training = case(key)
    if key == "mixed-llama2-7b":  # ZeRO-1 and GPipe exercise the other memory and pipeline terms
        training = training.model_copy(update={"zero": 1, "schedule": "gpipe", "micro_batches": (1, 2)})
    fast = mu.best_uniform_plan(model, cluster, training, cost, most_gpus=most_gpus)
    slow = brute_uniform(model, cluster, training, cost, list(cluster.node_list), most_gpus)
    assert slow is not None and fast is not None
    assert fast[0].model_copy(update={"predicted": None}).to_json() == slow.to_json()
    assert fast[1] == evaluate(slow, cluster, cost)


@pytest.mark.parametrize("cost", [COST, OVERLAP], ids=["analytic", "dp-overlap"])
def test_megatron_grid_step_is_the_evaluators_step_and_memory_rule(cost):
    model, training = get_model("tiny"), TrainingSpec(global_batch=48, seq_len=1024, micro_batches=(1, 2, 8))
    cluster, memo = ODD_NODES, mu.Memo()
    nodes = list(cluster.node_list)
    ranks, runs = mu._ranks(nodes), mu._runs(cluster, nodes)
    fits = 0
    for grid in mu.grids(model, training, ranks):
        plan = mu.grid_plan(model, training, ranks, grid)
        step = mu.grid_step_s(model, cluster, training, cost, runs, grid, memo)
        found = violations(plan, cluster, cost)
        assert (step is None) == bool(found), f"{grid}: predicted {step}, validator {[str(v) for v in found]}"
        if step is not None:
            fits += 1
            assert step == pytest.approx(evaluate(plan, cluster, cost).step_s, rel=1e-12), grid
    assert fits, "some grid should fit"


def test_megatron_fit_limit_is_the_groups_in_nodes_rule():
    ranks = mu._ranks(list(ODD_NODES.node_list))
    for tp in (1, 2, 4, 8):
        limit = mu._fit_limit(ranks, tp)
        for used in range(tp, len(ranks) + 1, tp):
            assert mu._groups_fit(ranks, tp, used) == (used <= limit), (tp, used)


def test_megatron_single_type_matches_brute_force():
    cluster, model, training = case("mixed-llama2-7b")
    gpu = largest_type(cluster, training)
    fast = mu.best_uniform_plan(model, cluster, training, COST, single_type=gpu)
    slow = brute_uniform(model, cluster, training, COST, [n for n in cluster.node_list if n.gpu == gpu], False)
    assert fast[0].model_copy(update={"predicted": None}).to_json() == slow.to_json()
