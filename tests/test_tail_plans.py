"""Tail-capped plan templates (`planner.search.tail_plans`) and the polish step that uses them when
the gap target is missed (`unit_loop.finish`)."""

from __future__ import annotations

import pytest

from benchmarks.baselines.megatron_uniform import best_uniform_plan
from planner.costmodel.analytic import AnalyticCostModel
from planner.search import search
from planner.search.providers import BlocksProvider
from planner.search.space import BlockType, block_types, resource_classes, stage_shapes
from planner.search.tail_plans import nearby_rows
from planner.search.templates import Template
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model
from solvers.batched_runs import skeleton_row

COST = AnalyticCostModel()
# one sequence batch of 8 on 4 A10 + 2 T4: the least-F+B option for the 4-GPU A10 stage is tp 2 with
# stage dp 2, whose gradient sync (on PCIe) costs more than tp 4 saves
CLUSTER = ClusterSpec(nodes=[NodeGroup(gpu="A10", nodes=1, gpus_per_node=4), NodeGroup(gpu="T4", nodes=2, gpus_per_node=1)])
MODEL = get_model("opt-350m")
TRAINING = TrainingSpec(global_batch=8, seq_len=1024)


@pytest.fixture
def no_grid_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search without its Megatron-grid and mesh-chain candidates (`planner.search.candidates`),
    which find the plans of these pools on their own: what the polish does, alone."""
    from planner.search.candidates import ENGINE_CANDIDATES

    for name in ("megatron_grid", "chain"):
        monkeypatch.setitem(ENGINE_CANDIDATES, name, lambda ctx, sizes, cutoff_s, tail_share=0.0: None)


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
    provider = _provider()
    extra = provider.tail_plan_templates(replicas, _all_rows(provider))
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
    provider = _provider()
    every = provider.tail_plan_templates(1, _all_rows(provider))
    tails = sorted(t.e_s for t in every)
    cap = tails[len(tails) // 2]
    capped = provider.tail_plan_templates(1, _all_rows(provider), e_cap=cap)
    assert capped and all(t.e_s <= cap for t in capped)
    assert provider.tail_plan_templates(1, _all_rows(provider), e_cap=tails[0] * 0.5) == []


def test_polish_runs_within_the_gap_target_and_never_skips_it(no_grid_candidate: None) -> None:
    """Within the gap target and with small tails, "auto" still re-solves the two lowest-bound
    units: on the 8-GPU ladder pool it finds the plan "always" finds (51.226 s against 51.284 s
    without the polish, the bound unchanged; a trigger on the gap alone left it unpolished).
    `polish="never"` skips it (also on the A10 / T4 pool above, where it matters most)."""
    from benchmarks.search_scale import ladder_cluster
    from planner.errors import HetplanError

    model = get_model("llama2-13b")
    training = TrainingSpec(global_batch=256, seq_len=model.seq_len)
    never8 = search(model, ladder_cluster(8), training, cost=COST, polish="never")
    auto = search(model, ladder_cluster(8), training, cost=COST)
    always = search(model, ladder_cluster(8), training, cost=COST, polish="always")
    assert never8.gap <= 0.015 and never8.stats["units_polished"] == 0  # the target was met unpolished
    assert auto.prediction.step_s < never8.prediction.step_s * (1 - 1e-4)
    assert auto.prediction.step_s == pytest.approx(always.prediction.step_s, rel=1e-12)
    assert auto.lower_bound_s == pytest.approx(never8.lower_bound_s, rel=1e-12)
    assert 0 < auto.stats["units_polished"] <= 2
    never = search(MODEL, CLUSTER, TRAINING, cost=COST, polish="never")
    polished = search(MODEL, CLUSTER, TRAINING, cost=COST)
    assert never.prediction.step_s > polished.prediction.step_s * 1.03  # without the grid candidate
    with pytest.raises(HetplanError, match="polish"):
        search(MODEL, CLUSTER, TRAINING, cost=COST, polish="sometimes")


def test_tail_caps_cover_every_option_tail_within_the_ratio() -> None:
    """`_levels`: ascending, the top cap is `hi`, every lower cap is the tail of a usable option,
    and every usable option tail v in [lo, hi] has a cap in [v, ratio·v] (so a split whose largest
    tail is v is dominated in (A, C) by one under a cap at most ratio·v)."""
    from types import SimpleNamespace

    import numpy as np

    from planner.search.tail_plans import _levels

    rng = np.random.default_rng(5)
    for _ in range(50):
        kinds = {}
        for name in ("first", "mid", "last", "whole"):
            tail = rng.uniform(0.001, 0.2, size=(6, 9)) ** rng.uniform(0.5, 2.0)
            fb = np.where(rng.random((6, 9)) < 0.2, np.inf, 1.0)
            kinds[name] = SimpleNamespace(tail=tail, fb=fb)
        view = SimpleNamespace(**kinds)
        usable = np.concatenate([k.tail[np.isfinite(k.fb)] for k in kinds.values()])
        ratio = float(rng.choice([1.05, 1.15, 1.5]))
        lo = float(np.quantile(usable, rng.uniform(0.0, 0.5)))
        hi = float(np.quantile(usable, rng.uniform(0.6, 1.0)))
        caps = _levels([view], ratio, lo=lo, hi=hi)
        assert caps == sorted(caps) and caps[-1] == hi
        assert all(np.any(usable == c) for c in caps[:-1])
        for v in usable[(usable >= lo) & (usable <= hi)]:
            assert any(v <= c <= ratio * v for c in caps)


def test_polish_finds_tail_caps_between_geometric_levels(no_grid_candidate: None) -> None:
    """Llama-2 7B, global batch 8, 4 L4 + 24 V100-16 + 8 A100-40: with caps 1.5 apart the polish
    kept V100 stages at tp 2, cp 4 (largest tail 61.4 ms, step 0.9759 s); the plan with tp 4, cp 2
    everywhere has a 44.4 ms tail (the A100 stage's) and runs 0.9615 s (`--target flagscale`
    finds it too), but the cap under 61.4 ms was 40.9 ms, which rules the A100 stage's option out.
    Caps at option tails at most 15 % apart find it."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="L4", nodes=1, gpus_per_node=4),
                                 NodeGroup(gpu="V100-SXM2-16GB", nodes=3, gpus_per_node=8),
                                 NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=8)])
    model = get_model("llama2-7b")
    training = TrainingSpec(global_batch=8, seq_len=4096, micro_batches=(1,))
    res = search(model, cluster, training, cost=COST)
    chain = search(model, cluster, training, cost=COST, target="flagscale")
    assert res.prediction.step_s <= chain.prediction.step_s * (1 + 1e-9)
    assert res.prediction.step_s < 0.97
    assert {(s.tp, s.cp) for p in res.plan.pipelines for s in p.stages} == {(4, 2)}


def test_polish_takes_the_groups_of_the_bound_pruned_across_groups(no_grid_candidate: None) -> None:
    """OPT-350M at 4,096 tokens, global batch 16, on 8 RTX-4090 + 16 L4 + 8 A100-80 (`chain_check.py
    --seed 23`, pool 9). Bound templates are pruned within their skeleton group (refinement
    replaces groups whole), so the bound LP may lean on one of two equally good groups; the polish
    also takes the groups it leans on once pruned across groups, as before that change, and the
    plan that runs an A100 (cp 2, dp 2) -> RTX-4090 (tp 8) pipeline beside A100 -> L4 ones comes
    back (0.29569 s; 0.29763 s with the RTX-4090s idle without it)."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="RTX-4090", nodes=1, gpus_per_node=8),
                                 NodeGroup(gpu="L4", nodes=2, gpus_per_node=8),
                                 NodeGroup(gpu="A100-SXM4-80GB", nodes=1, gpus_per_node=8)])
    training = TrainingSpec(global_batch=16, seq_len=4096)
    res = search(get_model("opt-350m"), cluster, training, cost=COST)
    assert res.idle_gpus == {}
    assert res.lower_bound_s <= res.prediction.step_s < 0.2960


def test_polish_takes_the_units_the_best_plan_came_from(no_grid_candidate: None) -> None:
    """OPT-350M at 4,096 tokens, global batch 32, on 8 L4 + 2x2 A100-80 (`chain_check.py --seed 11`,
    pool 8): the four lowest refined bounds lie within 0.02 % of each other and the units that
    found the best plan (0.62729 s) were not among them; polished too, one of them gives four
    L4 (tp 2) -> A100 pipelines at 0.62139 s."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="L4", nodes=1, gpus_per_node=8),
                                 NodeGroup(gpu="A100-SXM4-80GB", nodes=2, gpus_per_node=2)])
    training = TrainingSpec(global_batch=32, seq_len=4096)
    res = search(get_model("opt-350m"), cluster, training, cost=COST)
    assert res.lower_bound_s <= res.prediction.step_s < 0.6220
    assert res.stats["units_polished"] > 4


def test_polish_shards_optimizer_states_over_the_units_pipelines() -> None:
    """Llama-2 7B with ZeRO-1, global batch 64, on 3x2 RTX-4090 + 3x4 V100-16 (`chain_check.py
    --seed 28`, pool 14): plan templates are memory-checked as for one pipeline, where four or five
    single RTX-4090 stages cannot hold their share of Llama-2 7B's optimizer states; with two
    pipelines sharding them they can. The search returned one pipeline of six stages at 6.1409 s
    (gap 2.8 %); the polish's templates are now checked for the unit's fewest pipelines (every plan
    of the unit shards over at least that many) and find two pipelines at 6.0247 s."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="RTX-4090", nodes=3, gpus_per_node=2),
                                 NodeGroup(gpu="V100-SXM2-16GB", nodes=3, gpus_per_node=4)])
    training = TrainingSpec(global_batch=64, seq_len=2048, zero=1)
    res = search(get_model("llama2-7b"), cluster, training, cost=COST)
    assert res.lower_bound_s <= res.prediction.step_s < 6.10
    assert len(res.plan.pipelines) >= 2 and res.gap <= 0.02
    assert any(sum(s.gpu == "RTX-4090" for s in p.stages) >= 4 for p in res.plan.pipelines)


def test_polish_caps_tails_by_what_the_bound_templates_allow(no_grid_candidate: None) -> None:
    """OPT-30B at 65,536 tokens with ZeRO-1 on 2x2 A100-80 + 3x8 A10 + 4 H200 (`many_types.py
    --seed 7`, pool 14). Its plan templates (memory as for one pipeline) hold no plan of two
    pipelines, and one pipeline of A10 and H200 stages runs 2,214 s. The polish keeps only extra
    templates whose tail fits under the incumbent less a pipeline time no plan of the unit can
    beat; that time came from the plan templates, i.e. from the one-pipeline plan (2,213.8 s), which
    capped the extras' tails at 0.41 s and left out the A100 -> H200 pipeline (tail 0.78 s) that,
    beside H200 -> A10, runs 1,707.5 s. From the bound templates, which hold every plan of the
    unit, the cap lets it in."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=2, gpus_per_node=2),
                                 NodeGroup(gpu="A10", nodes=3, gpus_per_node=8),
                                 NodeGroup(gpu="H200-SXM-141GB", nodes=4, gpus_per_node=1)])
    training = TrainingSpec(global_batch=256, seq_len=65536, zero=1)
    res = search(get_model("opt-30b"), cluster, training, cost=COST)
    assert len(res.plan.pipelines) == 2
    assert res.lower_bound_s <= res.prediction.step_s < 1750.0
    assert res.gap <= 0.015
    assert {s.gpu for p in res.plan.pipelines for s in p.stages} == {"A100-SXM4-80GB", "A10", "H200-SXM-141GB"}


def _provider() -> BlocksProvider:
    """The blocks provider of CLUSTER's microbatch size 8, pipelines of up to two runs."""
    classes = resource_classes(CLUSTER)
    avail = tuple(rc.gpus for rc in classes)
    shapes = {rc.index: stage_shapes(MODEL, TRAINING, rc, 8) for rc in classes}
    return BlocksProvider(COST, MODEL, TRAINING, classes, block_types(shapes), avail, 8, CLUSTER.single_node,
                          max_blocks=2)


def _all_rows(provider: BlocksProvider) -> set[tuple]:
    return {row for rows in provider.rows.values() for row in rows}


def test_nearby_rows_takes_every_order_and_one_stage_more_or_fewer() -> None:
    near = nearby_rows({("a", "a", "b")})
    assert near == {("a", 2, "b", 1), ("b", 1, "a", 2),  # the row and its other order
                    ("a", 1, "b", 1), ("a", 3, "b", 1), ("a", 2, "b", 2),
                    ("b", 2, "a", 2), ("b", 1, "a", 1), ("b", 1, "a", 3)}
    assert nearby_rows({("a",)}) == {("a", 1), ("a", 2)}
    assert len(nearby_rows({("a", "b", "c")})) == 6 * (1 + 3)  # 3! orders, each with one run one longer


def test_tail_plan_templates_cover_only_the_rows_asked_for() -> None:
    """Templates come from the rows asked for that lie in the coverage; a row outside it adds
    nothing."""
    provider = _provider()
    every = provider.tail_plan_templates(1, _all_rows(provider))
    assert every
    mixed = sorted(row for row in _all_rows(provider) if len(row) == 4)
    wanted = set(mixed[: max(1, len(mixed) // 3)])
    some = provider.tail_plan_templates(1, wanted)
    assert some and len(some) < len(every)
    assert {_row_of(t) for t in some} <= wanted
    far = (mixed[0][0], 99, mixed[0][2], 99)  # more stages than the pool has
    assert provider.tail_plan_templates(1, wanted | {far}) == some


def _row_of(t: Template) -> tuple:
    """The row of a plan template from its stages' block types (class and GPUs per stage)."""
    return skeleton_row(tuple(BlockType(s.cls, s.shape.gpus) for s in t.stages))
