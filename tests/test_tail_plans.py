"""Tail-capped plan templates (`planner.search.tail_plans`) and the polish step that uses them when
the gap target is missed (`unit_loop.polish`)."""

from __future__ import annotations

import pytest

from benchmarks.baselines.megatron_uniform import best_uniform_plan
from planner.costmodel.analytic import AnalyticCostModel
from planner.search import search
from planner.search.providers import BlocksProvider
from planner.search.space import block_types, resource_classes, stage_shapes
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model

COST = AnalyticCostModel()
# one sequence batch of 8 on 4 A10 + 2 T4: the least-F+B option for the 4-GPU A10 stage is tp 2 with
# stage dp 2, whose gradient sync (on PCIe) costs more than tp 4 saves
CLUSTER = ClusterSpec(nodes=[NodeGroup(gpu="A10", nodes=1, gpus_per_node=4), NodeGroup(gpu="T4", nodes=2, gpus_per_node=1)])
MODEL = get_model("opt-350m")
TRAINING = TrainingSpec(global_batch=8, seq_len=1024)


@pytest.fixture
def no_grid_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search without its Megatron-grid candidate (`api._add_megatron_grid`), which finds the
    plans of these pools on its own: what the polish does, alone."""
    import planner.search.api as api

    monkeypatch.setattr(api, "_add_megatron_grid", lambda ctx, sizes: None)


def test_polish_finds_the_plan_tail_blind_options_miss(no_grid_candidate: None) -> None:
    """Without the polish (no gap target) the plan is 5 % slower than the best Megatron grid; with
    it the search returns a plan as fast, and the gap meets the target."""
    grid = best_uniform_plan(MODEL, CLUSTER, TRAINING, COST)
    assert grid is not None
    blind = search(MODEL, CLUSTER, TRAINING, cost=COST, refine_gap=None)
    polished = search(MODEL, CLUSTER, TRAINING, cost=COST)
    assert blind.coverage == polished.coverage == "blocks<=2"
    assert blind.prediction.step_s > grid[1].step_s * 1.03
    assert polished.prediction.step_s <= grid[1].step_s * (1 + 1e-9)
    assert polished.gap <= 0.015
    assert polished.lower_bound_s <= polished.prediction.step_s


@pytest.mark.parametrize("replicas", [1, 2])
def test_tail_capped_templates_are_real_splits(replicas: int) -> None:
    """Every template covers the layers in order with the provider's own shapes, and some of them
    use an option (shape) that the tail-blind plan templates never pick for that stage."""
    classes = resource_classes(CLUSTER)
    avail = tuple(rc.gpus for rc in classes)
    shapes = {rc.index: stage_shapes(MODEL, TRAINING, rc, 8) for rc in classes}
    provider = BlocksProvider(COST, MODEL, TRAINING, classes, block_types(shapes), avail, 8, CLUSTER.single_node,
                              max_blocks=2)
    extra = provider.tail_plan_templates(replicas, set(provider.rows))
    assert extra
    n = MODEL.num_layer_slots
    for t in extra:
        assert t.stages[0].first == 0 and t.stages[-1].last == n - 1
        assert all(a.last + 1 == b.first for a, b in zip(t.stages, t.stages[1:]))
        assert all(any(s.shape in provider.shapes[bt] for bt in provider.shapes if bt.cls == s.cls) for s in t.stages)
        assert t.c_s <= t.a_s + 1e-12 and t.e_s >= 0
    blind = {(s.cls, s.first, s.last, s.shape) for t in provider.plan_templates(replicas)
             for s in provider.resolved(t).stages}
    assert any((s.cls, s.first, s.last, s.shape) not in blind for t in extra for s in t.stages)


def test_polish_reaches_groups_only_the_bound_leans_on(no_grid_candidate: None) -> None:
    """GPT-Neo 2.7B, global batch 8, on 2 RTX-3090 + 4 RTX-4090 + 4 A100-40: the best plan is one
    A100 stage at tp 4 with one microbatch of 8, which no tail-blind plan template of its unit can
    reach within the incumbent; the unit's bound leans on it, so the polish looks there (12.6 %
    slower before)."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="RTX-3090", nodes=2, gpus_per_node=1),
                                 NodeGroup(gpu="RTX-4090", nodes=2, gpus_per_node=2),
                                 NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=4)])
    model, training = get_model("gpt-neo-2.7b"), TrainingSpec(global_batch=8, seq_len=512)
    grid = best_uniform_plan(model, cluster, training, COST, single_type="each")
    assert grid is not None
    result = search(model, cluster, training, cost=COST)
    assert result.prediction.step_s <= grid[1].step_s * (1 + 1e-9)
    assert result.gap <= 0.015


def test_tail_caps_stop_where_no_plan_could_beat_the_incumbent() -> None:
    """With `e_cap`, no template's largest stage tail exceeds it, and a cap below every split's
    least largest tail leaves no template."""
    classes = resource_classes(CLUSTER)
    avail = tuple(rc.gpus for rc in classes)
    shapes = {rc.index: stage_shapes(MODEL, TRAINING, rc, 8) for rc in classes}
    provider = BlocksProvider(COST, MODEL, TRAINING, classes, block_types(shapes), avail, 8, CLUSTER.single_node,
                              max_blocks=2)
    every = provider.tail_plan_templates(1, set(provider.rows))
    tails = sorted(t.e_s for t in every)
    cap = tails[len(tails) // 2]
    capped = provider.tail_plan_templates(1, set(provider.rows), e_cap=cap)
    assert capped and all(t.e_s <= cap for t in capped)
    assert provider.tail_plan_templates(1, set(provider.rows), e_cap=tails[0] * 0.5) == []


def test_polish_always_never_slower_and_never_skips_it(no_grid_candidate: None) -> None:
    """`polish="always"` re-solves the best units even when the gap target is met and tails are
    small: on the 8-GPU ladder pool it finds a faster plan (51.226 s against 51.284 s, the bound
    unchanged). `polish="never"` skips it where "auto" would run it (the A10 / T4 pool above)."""
    from benchmarks.search_scale import ladder_cluster
    from planner.errors import HetplanError

    model = get_model("llama2-13b")
    training = TrainingSpec(global_batch=256, seq_len=model.seq_len)
    auto = search(model, ladder_cluster(8), training, cost=COST)
    always = search(model, ladder_cluster(8), training, cost=COST, polish="always")
    assert always.prediction.step_s < auto.prediction.step_s * (1 - 1e-4)
    assert always.lower_bound_s == pytest.approx(auto.lower_bound_s, rel=1e-12)
    assert auto.stats["units_polished"] == 0 < always.stats["units_polished"]
    never = search(MODEL, CLUSTER, TRAINING, cost=COST, polish="never")
    polished = search(MODEL, CLUSTER, TRAINING, cost=COST)
    assert never.prediction.step_s > polished.prediction.step_s * 1.03  # without the grid candidate
    with pytest.raises(HetplanError, match="polish"):
        search(MODEL, CLUSTER, TRAINING, cost=COST, polish="sometimes")
