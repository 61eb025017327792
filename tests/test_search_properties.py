"""Properties of `search` on random small instances, and of the Megatron-uniform baseline.

Random clusters (1-3 node groups of different GPU types, at most 8 GPUs) and random small models;
every answer must be a valid plan whose stored prediction is what the evaluator says, never beaten
by a hand-made Megatron grid, bounded from below by its own lower bound, and reproducible.
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.baselines.megatron_uniform import best_uniform_plan
from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError, InfeasibleError
from planner.evaluate import evaluate
from planner.plan import expand_devices
from planner.search import search
from planner.search.units import coverage_rank
from planner.specs import ClusterSpec, ModelSpec, NodeGroup, TrainingSpec
from planner.specs.gpus import get_gpu
from planner.specs.models import get_model
from planner.validate import violations

GPU_TYPES = ("A100-SXM4-40GB", "V100-SXM2-16GB", "H100-SXM5-80GB", "T4", "RTX-3090")
COST = AnalyticCostModel()
REL = 1e-9
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw: st.DrawFn, max_gpus: int = 8, max_groups: int = 3) -> ClusterSpec:
    types = draw(st.lists(st.sampled_from(GPU_TYPES), min_size=1, max_size=max_groups, unique=True))
    groups, left = [], max_gpus
    for k, gpu in enumerate(types):
        reserve = len(types) - k - 1  # at least one GPU for each later group
        per_node = draw(st.integers(1, min(4, left - reserve)))
        nodes = draw(st.integers(1, max(1, min(2, (left - reserve) // per_node))))
        groups.append(NodeGroup(gpu=gpu, nodes=nodes, gpus_per_node=per_node))
        left -= nodes * per_node
    return ClusterSpec(nodes=groups)


@st.composite
def models(draw: st.DrawFn, max_layers: int = 4) -> ModelSpec:
    heads = draw(st.sampled_from((4, 8)))
    hidden = draw(st.sampled_from((256, 512, 768, 1024)))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8) if heads % d == 0]))
    swiglu = draw(st.booleans())
    return ModelSpec(name="prop-model", num_layers=draw(st.integers(1, max_layers)), hidden=hidden,
                     ffn_hidden=4 * hidden, num_heads=heads, num_kv_heads=kv, vocab=draw(st.sampled_from((4096, 32000))),
                     activation="swiglu" if swiglu else "gelu", norm="rmsnorm" if swiglu else "layernorm",
                     learned_positions=not swiglu)


@st.composite
def trainings(draw: st.DrawFn) -> TrainingSpec:
    return TrainingSpec(global_batch=draw(st.integers(1, 16)), seq_len=draw(st.sampled_from((128, 256, 512, 1024))),
                        max_cp=1, max_hp=1, max_stage_dp=draw(st.integers(1, 2)), recompute=("none", "full"),
                        micro_batches=(1, 2))


def _assert_sound(result, cluster: ClusterSpec) -> None:
    """The plan is valid, its prediction is the evaluator's, and the bound is below it."""
    found = violations(result.plan, cluster, COST)
    assert not found, f"search returned an invalid plan: {[str(v) for v in found]}"
    again = evaluate(result.plan, cluster, COST).step_s
    assert again == pytest.approx(result.prediction.step_s, rel=REL), \
        f"evaluator says {again}, search says {result.prediction.step_s}"
    assert result.lower_bound_s <= result.prediction.step_s, \
        f"lower bound {result.lower_bound_s} above the plan's step time {result.prediction.step_s}"
    assert math.isfinite(result.gap) and result.gap >= 0, f"gap {result.gap}"
    # the alternatives are other plans: none repeats the answer (found twice, by two routes) or
    # another alternative, and each is valid and no faster than the answer
    shapes = [p.model_copy(update={"predicted": None}).model_dump_json() for p in [result.plan, *result.alternatives]]
    assert len(set(shapes)) == len(shapes), "an alternative repeats the answer or another alternative"
    for alt in result.alternatives:
        assert not violations(alt, cluster, COST)
        assert alt.predicted.step_s >= result.prediction.step_s


def test_alternatives_never_repeat_the_answer() -> None:
    """On this pool (1x2 A100-40GB + 1x4 A10 + 1x1 L4, OPT-350M) the best plan was found twice and
    came back as its own first alternative."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=2),
                                 NodeGroup(gpu="A10", nodes=1, gpus_per_node=4),
                                 NodeGroup(gpu="L4", nodes=1, gpus_per_node=1)])
    result = search(get_model("opt-350m"), cluster, TrainingSpec(global_batch=32, seq_len=1024), cost=COST)
    assert result.alternatives
    _assert_sound(result, cluster)


def _in_searched_space(result, plan, cluster: ClusterSpec) -> bool:
    """Whether the search's coverage includes `plan`: always for "exact"; for "blocks<=k" only pipelines
    of at most k runs of identical stage groups on pairwise different GPU classes (two-run ones
    of at most `mixed<=K` stages), each running at least as many microbatches as it has stages (the
    blocks provider's memory assumption)."""
    if result.coverage == "exact":
        return True
    max_blocks, mixed = coverage_rank(result.coverage)
    for pipe in plan.pipelines:
        groups = []
        for s in pipe.stages:
            node = cluster.node(expand_devices(s.devices)[0][0])
            groups.append((node.gpu, node.gpus, s.num_gpus))
        runs = [g for k, g in enumerate(groups) if k == 0 or g != groups[k - 1]]
        if len(runs) > max_blocks or len({r[:2] for r in runs}) < len(runs) or pipe.microbatches < len(groups):
            return False
        if len(runs) == 2 and len(groups) > mixed:
            return False
    return True


def _assert_beats_baselines(result, model, cluster, training) -> None:
    """Never slower than the best Megatron grid over the whole pool or one GPU type, whether or not
    the grid lies in the searched space: the search takes the best grid on prefixes of the node
    list and on each type alone as a candidate (`candidates.megatron_grid_candidate`). And a grid
    inside the searched space is never faster than that space's own bound."""
    step = result.prediction.step_s
    covered = result.coverage_bound_s if result.coverage_bound_s is not None else result.lower_bound_s
    for which in (None, "each"):
        base = best_uniform_plan(model, cluster, training, COST, single_type=which)
        if base is None:
            continue
        if _in_searched_space(result, base[0], cluster):
            assert covered <= base[1].step_s * (1 + REL), \
                f"bound {covered:.6f} s ({result.coverage}) above a grid inside it ({which or 'whole pool'}) " \
                f"{base[1].step_s:.6f} s"
        assert step <= base[1].step_s * (1 + REL), \
            f"search {step:.6f} s ({result.coverage}) slower than Megatron grid ({which or 'whole pool'}) " \
            f"{base[1].step_s:.6f} s"


def _assert_no_grid_exists(model, cluster, training) -> None:
    for which in (None, "each"):
        assert best_uniform_plan(model, cluster, training, COST, single_type=which) is None, \
            f"search says infeasible but a Megatron grid ({which or 'whole pool'}) fits"


@settings(max_examples=100, **SETTINGS)
@given(model=models(), cluster=clusters(), training=trainings())
def test_search_plan_is_valid_bounded_and_beats_megatron_grids(model, cluster, training):
    try:
        result = search(model, cluster, training, cost=COST)
    except InfeasibleError:
        _assert_no_grid_exists(model, cluster, training)
        return
    _assert_sound(result, cluster)
    _assert_beats_baselines(result, model, cluster, training)


@settings(max_examples=40, **SETTINGS)
@given(model=models(max_layers=3), cluster=clusters(max_gpus=5), training=trainings())
def test_exact_search_never_slower_than_any_megatron_grid(model, cluster, training):
    """With the exact provider forced on, every Megatron grid is in the searched space."""
    try:
        result = search(model, cluster, training, cost=COST, exact_limit=10**6)
    except InfeasibleError:
        _assert_no_grid_exists(model, cluster, training)
        return
    assert result.coverage == "exact"
    _assert_sound(result, cluster)
    _assert_beats_baselines(result, model, cluster, training)


@settings(max_examples=40, **SETTINGS)
@given(model=models(), cluster=clusters(), training=trainings())
def test_a_stop_gap_search_is_sound_within_its_gap_and_beats_megatron_grids(model, cluster, training):
    """With the blocks coverage forced and a 5 % stop gap (`search(stop_gap=...)`), which skips
    refinement and the polish and only bounds units near the best plan: still a valid plan, its
    bound below it, within the gap where it says it stopped, and never slower than a grid."""
    try:
        result = search(model, cluster, training, cost=COST, exact_limit=0, stop_gap=0.05)
    except InfeasibleError:
        _assert_no_grid_exists(model, cluster, training)
        return
    assert result.coverage != "exact"
    _assert_sound(result, cluster)
    _assert_beats_baselines(result, model, cluster, training)
    if result.stats["stopped_at_gap"]:
        assert result.gap <= 0.05 * (1 + REL)


@settings(max_examples=8, **SETTINGS)
@given(model=models(max_layers=3), cluster=clusters(max_gpus=6), training=trainings())
def test_search_is_deterministic(model, cluster, training):
    try:
        first = search(model, cluster, training, cost=COST)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            search(model, cluster, training, cost=COST)
        return
    second = search(model, cluster, training, cost=COST)
    assert first.plan.to_json() == second.plan.to_json(), "two runs of the same search gave different plans"


@settings(max_examples=10, **SETTINGS)
@given(model=models(), gpu=st.sampled_from(GPU_TYPES), training=trainings())
def test_one_gpu_cluster_gives_a_single_stage_plan(model, gpu, training):
    cluster = ClusterSpec(nodes=[NodeGroup(gpu=gpu, nodes=1, gpus_per_node=1)])
    try:
        result = search(model, cluster, training, cost=COST)
    except InfeasibleError:
        return
    _assert_sound(result, cluster)
    (pipe,) = result.plan.pipelines
    (stage,) = pipe.stages
    assert stage.layers == (0, model.num_layer_slots - 1)
    assert expand_devices(stage.devices) == [("node0", 0)]
    assert pipe.microbatches * result.plan.micro_batch == training.global_batch


# --- the baseline itself ------------------------------------------------------------------------

@settings(max_examples=40, **SETTINGS)
@given(model=models(), cluster=clusters(), training=trainings())
def test_uniform_baseline_is_a_megatron_grid(model, cluster, training):
    """Valid, even split, one shape for all stages, equal microbatches, stages never mix GPU types."""
    for which in (None, "each"):
        found = best_uniform_plan(model, cluster, training, COST, single_type=which)
        if found is None:
            continue
        plan, pred = found
        assert not violations(plan, cluster, COST)
        assert evaluate(plan, cluster, COST).step_s == pytest.approx(pred.step_s, rel=REL)
        stages = [s for p in plan.pipelines for s in p.stages]
        assert len({(s.tp, s.cp, s.hp, s.dp, s.recompute) for s in stages}) == 1
        assert {(s.cp, s.hp, s.dp) for s in stages} == {(1, 1, 1)}
        assert len({p.microbatches for p in plan.pipelines}) == 1
        assert len({tuple(s.layers for s in p.stages) for p in plan.pipelines}) == 1
        sizes = [s.layers[1] - s.layers[0] + 1 for s in plan.pipelines[0].stages]
        sizes[0] -= 1  # embedding
        sizes[-1] -= 1  # head
        assert max(sizes) - min(sizes) <= 1, f"uneven split {sizes}"
        assert plan.micro_batch in training.micro_batches
        assert stages[0].recompute in training.recompute
        types = {cluster.node(n).gpu for s in stages for n, _ in expand_devices(s.devices)}
        if which == "each":
            assert len(types) == 1, f"single-type baseline used {types}"
        for s in stages:
            assert {cluster.node(n).gpu for n, _ in expand_devices(s.devices)} == {get_gpu(s.gpu).name}


@settings(max_examples=15, **SETTINGS)
@given(model=models(), cluster=clusters(), training=trainings())
def test_uniform_baseline_on_most_gpus_is_never_faster_but_never_smaller(model, cluster, training):
    best = best_uniform_plan(model, cluster, training, COST)
    spread = best_uniform_plan(model, cluster, training, COST, most_gpus=True)
    assert (best is None) == (spread is None)
    if best is not None:
        assert spread[0].num_gpus >= best[0].num_gpus
        assert best[1].step_s <= spread[1].step_s


def test_uniform_baseline_leaves_indivisible_gpus_idle():
    model = ModelSpec(name="m", num_layers=2, hidden=512, ffn_hidden=2048, num_heads=8, vocab=4096)
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=3)])
    training = TrainingSpec(global_batch=8, seq_len=256, micro_batches=(1, 2))
    plan, _ = best_uniform_plan(model, cluster, training, COST)
    assert plan.num_gpus in (1, 2), "no grid can use 3 GPUs (dp 3 does not divide the batch, pp 3 exceeds the layers)"
    assert best_uniform_plan(model, cluster, training, COST, single_type="H100") is None


# --- plain tests ------------------------------------------------------------------------------------

TINY = ModelSpec(name="tiny", num_layers=2, hidden=512, ffn_hidden=2048, num_heads=8, num_kv_heads=4, vocab=4096)
TINY_TRAINING = TrainingSpec(global_batch=8, seq_len=256, max_cp=1, max_hp=1, max_stage_dp=1,
                             recompute=("none", "full"), micro_batches=(1, 2))
TINY_CLUSTER = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=2),
                                  NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=2)])


def test_empty_cluster_raises_hetplan_error():
    with pytest.raises(HetplanError):
        search(TINY, ClusterSpec(nodes=[]), TINY_TRAINING, cost=COST)


def test_model_that_fits_nowhere_names_memory_needed_and_largest_gpu():
    model = get_model("llama3-70b")
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="T4", nodes=1, gpus_per_node=1)])
    training = TrainingSpec(global_batch=8, seq_len=1024, micro_batches=(1,))
    with pytest.raises(InfeasibleError) as info:
        search(model, cluster, training, cost=COST)
    text = str(info.value)
    gib = [float(x) for x in re.findall(r"([0-9]+(?:\.[0-9]+)?) GiB", text)]
    per_gpu = re.search(r"([0-9]+(?:\.[0-9]+)?) GiB per GPU", text)
    assert per_gpu, f"message does not give the largest per-GPU memory: {text}"
    largest = float(per_gpu.group(1))
    t4_gib = get_gpu("T4").mem_bytes / 2**30
    assert 0 < largest <= t4_gib + 0.05, f"largest per-GPU memory {largest} GiB, a T4 has {t4_gib:.1f}"
    weights_gib = model.params_count() * 2 / 2**30  # bf16 weights alone
    assert any(g >= weights_gib for g in gib), f"no figure for the memory needed in: {text}"


def test_global_batch_not_divisible_names_field_with_suggestions():
    training = TrainingSpec(global_batch=7, seq_len=256, micro_batches=(2, 4))
    with pytest.raises(HetplanError) as info:
        search(TINY, TINY_CLUSTER, training, cost=COST)
    assert info.value.field == "global_batch"
    suggested = [int(x) for x in re.findall(r"\d+", info.value.reason.split("nearest", 1)[-1])]
    assert suggested, f"no suggestions in: {info.value.reason}"
    assert all(n > 0 and any(n % b == 0 for b in (2, 4)) for n in suggested), suggested


@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_pulp_solvers_match_cpsat(solver):
    model = ModelSpec(name="m", num_layers=1, hidden=512, ffn_hidden=2048, num_heads=8, vocab=4096)
    training = TINY_TRAINING.model_copy(update={"global_batch": 4})
    ref = search(model, TINY_CLUSTER, training, cost=COST)
    other = search(model, TINY_CLUSTER, training, cost=COST, solver=solver)
    _assert_sound(other, TINY_CLUSTER)
    assert other.prediction.step_s == pytest.approx(ref.prediction.step_s, rel=REL)


@pytest.mark.parametrize("limit_s", [1e-6, 0.05, 0.5])
def test_time_limit_gives_a_real_plan_or_names_time_limit(limit_s):
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=2, gpus_per_node=2),
                                 NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=4)])
    model = ModelSpec(name="m", num_layers=4, hidden=512, ffn_hidden=2048, num_heads=8, num_kv_heads=4,
                      vocab=8192)
    training = TrainingSpec(global_batch=16, seq_len=512, max_cp=1, max_hp=1, recompute=("none", "full"),
                            micro_batches=(1, 2))
    try:
        result = search(model, cluster, training, cost=COST, time_limit=limit_s)
    except HetplanError as exc:
        assert exc.field == "time_limit", f"unexpected error {exc}"
        return
    _assert_sound(result, cluster)
    if limit_s < 1e-3:
        assert result.timed_out, "a 1 us limit cannot have finished the search"
