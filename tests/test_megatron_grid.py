"""The Megatron-restricted search (`planner.search.megatron_grid`): its pruning never changes the
answer, and each grid's bound is below what the evaluator gives that grid's plan."""

from __future__ import annotations

import importlib

import pytest

from planner.costmodel.analytic import AnalyticCostModel
from planner.search.api import micro_batch_sizes
from planner.specs import ClusterSpec, ModelSpec, NodeGroup, TrainingSpec

mg = importlib.import_module("planner.search.megatron_grid")  # `planner.search` is also a function
grid_listing = importlib.import_module("planner.search.grid_listing")
COST = AnalyticCostModel()
MODEL = ModelSpec(name="grid-6", num_layers=6, hidden=1024, ffn_hidden=4096, num_heads=8, num_kv_heads=8,
                  vocab=32000, activation="swiglu", norm="rmsnorm", learned_positions=False)
CASES = {
    "three-groups": (ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=4),
                                        NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=2),
                                        NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=2)]),
                     TrainingSpec(global_batch=16, seq_len=2048, recompute=("none", "full"))),
    "two-types": (ClusterSpec(nodes=[NodeGroup(gpu="H100-SXM5-80GB", nodes=1, gpus_per_node=4),
                                     NodeGroup(gpu="V100-SXM2-32GB", nodes=2, gpus_per_node=4)]),
                  TrainingSpec(global_batch=32, seq_len=4096, max_cp=2)),
    "groups-across-nodes": (ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=4, gpus_per_node=2)],
                                        allow_cross_node_tp=True),
                            TrainingSpec(global_batch=2, seq_len=32768, max_cp=8)),
    # slow GPUs last: the best grid leaves them out, so the whole pool's grids (the first cutoff
    # of a search without one) are not where the answer is
    "slow-tail": (ClusterSpec(nodes=[NodeGroup(gpu="H100-SXM5-80GB", nodes=1, gpus_per_node=4),
                                     NodeGroup(gpu="T4", nodes=1, gpus_per_node=4)]),
                  TrainingSpec(global_batch=16, seq_len=2048)),
}


def test_groups_span_whole_nodes_only_when_the_cluster_allows_it() -> None:
    """tp*cp groups larger than a node are grids only with `allow_cross_node_tp`, and then they take
    whole nodes; on this long-context pool the best grid uses one and beats every in-node grid."""
    cluster, training = CASES["groups-across-nodes"]
    within = cluster.model_copy(update={"allow_cross_node_tp": False})
    sizes = micro_batch_sizes(training)
    assert max(g[1] * g[2] for g in mg.every_grid(MODEL, within, training, sizes)) == 2
    assert max(g[1] * g[2] for g in mg.every_grid(MODEL, cluster, training, sizes)) == 8
    assert mg._stages_on_nodes(within, 4, 4, 1) is None and mg._stages_on_nodes(cluster, 4, 4, 1) is not None
    assert mg._stages_on_nodes(cluster, 3, 3, 1) is None  # 3 ranks of 2-GPU nodes: not whole nodes
    across = mg.best_megatron_plan(MODEL, cluster, training, COST, sizes)
    inside = mg.best_megatron_plan(MODEL, within, training, COST, sizes)
    assert across is not None and inside is not None
    assert any(s.tp * s.cp > 2 for p in across[0].pipelines for s in p.stages)
    assert across[1].step_s < inside[1].step_s


@pytest.mark.parametrize("case", sorted(CASES))
def test_pruned_search_equals_solving_every_grid(case: str) -> None:
    """Solve every grid's split (no bound, no pruning), keep the first fastest in enumeration order:
    `best_megatron_plan` must return exactly that plan. Also checks both bounds of every grid (the
    one without a DP and the layout's) against the evaluator's step of its grid's plan, and the
    split's step (what the search ranks grids by before building any plan) against it."""
    cluster, training = CASES[case]
    options: dict = {}
    placed: dict = {}
    work: dict = {}
    gpus_upto = mg.prefix_gpus(cluster)
    best = None
    solved = 0
    for grid in mg.every_grid(MODEL, cluster, training, micro_batch_sizes(training)):
        placement = mg._placement(training, cluster, grid, placed, gpus_upto)
        lay = None if placement is None else mg._layout(MODEL, training, cluster, COST, grid, placement, options)
        if lay is None:
            continue
        got = mg._grid_split(lay, COST.knobs.step_overhead_s)
        found = None if got is None else mg._grid_plan(MODEL, training, cluster, COST, lay, got[0])
        if found is None:
            continue
        solved += 1
        assert lay.bound_s <= found[1].step_s, grid
        # the search ranks grids by their split's step and scores only the least: it is the
        # evaluator's, far within `NOISE`
        assert got[1] == pytest.approx(found[1].step_s, rel=mg.NOISE / 1000), grid
        assert mg._work_bound(MODEL, training, COST, grid, placement, work) <= found[1].step_s, grid
        if best is None or found[1].step_s < best[1].step_s:
            best = found
    assert solved > 10 and best is not None
    fast = mg.best_megatron_plan(MODEL, cluster, training, COST, micro_batch_sizes(training))
    assert fast is not None
    assert fast[0].to_json() == best[0].to_json()
    assert fast[1].step_s == best[1].step_s


def test_the_answer_stands_when_the_validator_refuses_the_first_cutoffs_grids(monkeypatch) -> None:
    """Without a cutoff the search takes the whole pool's least split step as its first cutoff
    (no plan built); where the validator refuses every grid under it, it must fall back to every
    grid. Here plans on the whole pool (where the best grid is) are refused: the answer is then the
    best grid on a shorter prefix, as a plain scan of every grid under the same rule finds it."""
    cluster, training = CASES["groups-across-nodes"]
    sizes = micro_batch_sizes(training)
    whole = len(cluster.node_list)
    build, listed = mg._grid_plan, mg.every_grid
    full_scans = []

    def refuse_whole_pool(model, training_, cluster_, cost, lay, split):
        return None if lay.grid[0] == whole else build(model, training_, cluster_, cost, lay, split)

    def every_grid(*args, **kwargs):
        full_scans.append(len(args) < 5 and "prefixes" not in kwargs)
        return listed(*args, **kwargs)

    assert mg.best_megatron_plan(MODEL, cluster, training, COST, sizes)[0].num_gpus == 8  # the whole pool
    monkeypatch.setattr(mg, "_grid_plan", refuse_whole_pool)
    monkeypatch.setattr(mg, "every_grid", every_grid)
    placed: dict = {}
    options: dict = {}
    best = None
    for grid in mg.every_grid(MODEL, cluster, training, sizes):
        placement = mg._placement(training, cluster, grid, placed, mg.prefix_gpus(cluster))
        lay = None if placement is None else mg._layout(MODEL, training, cluster, COST, grid, placement, options)
        got = None if lay is None else mg._grid_split(lay, COST.knobs.step_overhead_s)
        found = None if got is None else refuse_whole_pool(MODEL, training, cluster, COST, lay, got[0])
        if found is not None and (best is None or found[1].step_s < best[1].step_s):
            best = found
    assert best is not None and best[0].num_gpus < sum(n.gpus for n in cluster.node_list)
    full_scans.clear()
    fast = mg.best_megatron_plan(MODEL, cluster, training, COST, sizes)
    assert full_scans == [False, True]  # the whole pool's grids, then (every one refused) every grid
    assert fast is not None and fast[0].to_json() == best[0].to_json()


def test_least_bottleneck_matches_brute_force() -> None:
    """`_least_bottleneck` is the least largest stage load over every way to deal the decoder
    layers to the stages (a stage of type t holding d layers loads d·cost[t])."""
    import itertools
    import random

    rng = random.Random(7)
    for _ in range(60):
        n_types = rng.randint(1, 3)
        costs = {f"t{k}": rng.choice([0.5, 1.0, 1.3, 2.0, 3.7]) for k in range(n_types)}
        per_type = tuple((k, rng.randint(1, 2)) for k in sorted(costs))
        decoders = rng.randint(1, 6)
        stages = [costs[k] for k, n in per_type for _ in range(n)]
        best = min(max(d * w for d, w in zip(deal, stages))
                   for deal in itertools.product(range(decoders + 1), repeat=len(stages)) if sum(deal) == decoders)
        assert mg._least_bottleneck(per_type, costs, decoders) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cutoff_keeps_only_grids_that_reach_it(case: str) -> None:
    """`cutoff_s` at or above the best grid's step gives the same plan (its grids pruned by the
    cutoff could not have won); strictly below it, None."""
    cluster, training = CASES[case]
    sizes = micro_batch_sizes(training)
    plan, pred = mg.best_megatron_plan(MODEL, cluster, training, COST, sizes)
    for cut in (pred.step_s, pred.step_s * 1.01):
        again = mg.best_megatron_plan(MODEL, cluster, training, COST, sizes, cutoff_s=cut)
        assert again is not None and again[0].to_json() == plan.to_json()
    assert mg.best_megatron_plan(MODEL, cluster, training, COST, sizes, cutoff_s=pred.step_s * 0.999) is None


def test_the_full_search_is_never_slower_than_the_best_grid() -> None:
    """A random pool (`benchmarks/grid_check.py --seed 6`) where the search's plan trailed the best
    Megatron grid by 0.048 %: the plan LP stops within 0.1 % of its bound, and the grid's split
    (fewer layers with the embedding, so a smaller optimizer tail) is dominated in (A, C). The
    search takes the best grid as a candidate (`planner.search.candidates.megatron_grid_candidate`); the
    polish with tail caps at option tails (`tail_plans._levels`) now finds as fast a plan itself,
    so the candidate is added only without the polish."""
    from benchmarks.baselines.megatron_uniform import best_uniform_plan
    from planner.search import search
    from planner.specs.models import get_model

    cluster = ClusterSpec(nodes=[NodeGroup(gpu="RTX-4090", nodes=2, gpus_per_node=4),
                                 NodeGroup(gpu="L4", nodes=2, gpus_per_node=2),
                                 NodeGroup(gpu="V100-SXM2-16GB", nodes=2, gpus_per_node=1)])
    model, training = get_model("gpt-neo-2.7b"), TrainingSpec(global_batch=8, seq_len=512)
    result = search(model, cluster, training, cost=COST)
    grid = mg.best_megatron_plan(model, cluster, training, COST, micro_batch_sizes(training))
    uniform = best_uniform_plan(model, cluster, training, COST)
    assert result.prediction.step_s <= grid[1].step_s <= uniform[1].step_s
    assert result.lower_bound_s <= result.prediction.step_s
    assert 0 < result.stats["megatron_grid_s"] < result.stats["search_s"]
    unpolished = search(model, cluster, training, cost=COST, polish="never")
    assert unpolished.stats["megatron_grid_added"] == 1
    assert unpolished.prediction.step_s <= grid[1].step_s


def _mixed_node_pool() -> tuple[ClusterSpec, TrainingSpec]:
    """Nodes of 8, 4 and 2 GPUs (the smallest node so far changes along the prefixes) and a global
    batch with odd divisors."""
    return (ClusterSpec(nodes=[NodeGroup(gpu="H100-SXM5-80GB", nodes=2, gpus_per_node=8),
                               NodeGroup(gpu="A100-SXM4-40GB", nodes=3, gpus_per_node=4),
                               NodeGroup(gpu="V100-SXM2-32GB", nodes=3, gpus_per_node=2)]),
            TrainingSpec(global_batch=96, seq_len=4096, max_cp=4))


@pytest.mark.parametrize("case", sorted(CASES) + ["mixed-nodes"])
def test_grids_within_a_cutoff_are_every_grid_the_pool_bound_keeps(case: str) -> None:
    """`grids_within` (by tp, cp, pp, b and dp, not by prefix) gives exactly `every_grid`'s grids
    whose `pool_bound` is at most the cutoff, in the same order, at cutoffs that keep none, some
    and all of them."""
    cluster, training = _mixed_node_pool() if case == "mixed-nodes" else CASES[case]
    sizes = micro_batch_sizes(training)
    gpus_upto = mg.prefix_gpus(cluster)
    devs = list({dev.key: dev for dev in map(mg.device_class_of, cluster.nodes)}.values())
    low: dict = {}
    grids = mg.every_grid(MODEL, cluster, training, sizes)
    bounds = [grid_listing.pool_bound(MODEL, training, COST, g, gpus_upto, devs, low) for g in grids]
    assert len(set(bounds)) > 5
    for cut in sorted(set(bounds))[::max(1, len(set(bounds)) // 7)] + [min(bounds) * 0.5, max(bounds) * 2]:
        kept = [g for g, b in zip(grids, bounds) if b <= cut]
        assert mg.grids_within(MODEL, cluster, training, COST, sizes, cut, devs, {}) == kept, cut
