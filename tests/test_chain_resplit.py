"""The mesh chain's re-split (`planner.search.chain_resplit`): exact against brute force over every
layer split and stage shape of the chain's device groups, and never slower than the chain."""

from __future__ import annotations

import itertools

import pytest

from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.plan import Plan
from planner.search.chain_resplit import best_resplit, resplit
from planner.search.flagscale_grid import best_flagscale_plan, flagscale_plans
from planner.search.space import BlockType, block_types, costable_shapes, resource_classes
from planner.search.units import UnitContext
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import ModelSpec
from solvers.assign import SolverStats

COST = AnalyticCostModel()


def _model(layers: int) -> ModelSpec:
    return ModelSpec(name=f"tiny-{layers}", num_layers=layers, hidden=8192, ffn_hidden=4 * 8192, num_heads=32,
                     num_kv_heads=8, vocab=32000, seq_len=8192)


# (decoder layers, pool, training): chains whose one recompute mode costs 0.1-3 % (pools drawn
# at random where the re-split gained)
CASES = [
    (3, [("RTX-4090", 2, 1), ("T4", 2, 2)],
     TrainingSpec(global_batch=32, seq_len=8192, micro_batches=(2,), recompute=("none", "selective", "full"))),
    (3, [("A10", 2, 1), ("T4", 2, 1)],
     TrainingSpec(global_batch=8, seq_len=4096, micro_batches=(2,), recompute=("none", "selective", "full"),
                  zero=1)),
    (3, [("T4", 1, 2), ("RTX-3090", 2, 2)],
     TrainingSpec(global_batch=8, seq_len=4096, micro_batches=(1,), recompute=("none", "selective", "full"),
                  zero=1)),
]


def _brute_force(plan: Plan, cluster: ClusterSpec, training: TrainingSpec, model: ModelSpec) -> float:
    """Least step over every layer split of the plan's stage device groups and every shape of each
    stage's GPU count (the same shapes and devices in every pipeline)."""
    classes = resource_classes(cluster)
    types = block_types({rc.index: costable_shapes(COST, model, training, rc, plan.micro_batch) for rc in classes})
    by_name = {rc.name: rc.index for rc in classes}
    stages = plan.pipelines[0].stages
    choices = [types[BlockType(by_name[s.gpu], s.num_gpus)] for s in stages]
    n = model.num_layer_slots
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), len(stages) - 1):
        bounds = (0, *cuts, n)
        for shapes in itertools.product(*choices):
            pipes = [p.model_copy(update={"stages": [
                s.model_copy(update={"layers": (bounds[k], bounds[k + 1] - 1), "tp": sh.tp, "cp": sh.cp,
                                     "hp": sh.hp, "dp": sh.dp, "recompute": sh.recompute})
                for k, (s, sh) in enumerate(zip(p.stages, shapes))]}) for p in plan.pipelines]
            try:
                step = evaluate(plan.model_copy(update={"pipelines": pipes}), cluster, COST).step_s
            except HetplanError:  # memory, or a group the devices cannot hold
                continue
            best = min(best, step)
    return best


@pytest.mark.parametrize("case", range(len(CASES)))
def test_resplit_is_the_best_split_of_the_chains_device_groups(case: int) -> None:
    layers, pool, training = CASES[case]
    model = _model(layers)
    cluster = ClusterSpec(nodes=[NodeGroup(gpu=g, nodes=k, gpus_per_node=w) for g, k, w in pool])
    found = best_flagscale_plan(model, cluster, training, COST, list(training.micro_batches), grid=False)
    assert found is not None
    classes = resource_classes(cluster)
    ctx = UnitContext(model, training, cluster, classes, COST, tuple(rc.gpus for rc in classes), [], [], set(),
                      SolverStats(), {})
    plan, pred = resplit(ctx, found)
    assert evaluate(plan, cluster, COST).step_s == pytest.approx(pred.step_s, rel=1e-12)
    assert pred.step_s < found[1].step_s
    assert pred.step_s == pytest.approx(min(found[1].step_s, _brute_force(found[0], cluster, training, model)),
                                        rel=1e-9)
    assert [len(p.stages) for p in plan.pipelines] == [len(p.stages) for p in found[0].pipelines]


def test_resplit_keeps_nothing_as_nothing() -> None:
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="T4", nodes=1, gpus_per_node=1)])
    classes = resource_classes(cluster)
    ctx = UnitContext(_model(2), TrainingSpec(global_batch=8, seq_len=4096), cluster, classes, COST, (1,), [], [], set(),
                      SolverStats(), {})
    assert resplit(ctx, None) is None


@pytest.mark.parametrize("case", range(len(CASES)))
def test_best_resplit_is_the_fastest_of_every_kept_chain_re_split(case: int) -> None:
    """Every chain the search keeps is re-split where the chains compete (no cutoff here): the
    answer is the fastest of all their re-splits, each pruned only by the fastest so far. Under a
    cutoff no chain reaches, only the fastest chain is tried, and it comes back as it was."""
    layers, pool, training = CASES[case]
    model = _model(layers)
    cluster = ClusterSpec(nodes=[NodeGroup(gpu=g, nodes=k, gpus_per_node=w) for g, k, w in pool])
    found, _ = flagscale_plans(model, cluster, training, COST, list(training.micro_batches))
    chains = [f for f in found if f is not None]
    assert len(chains) >= 2
    classes = resource_classes(cluster)
    ctx = UnitContext(model, training, cluster, classes, COST, tuple(rc.gpus for rc in classes), [], [], set(),
                      SolverStats(), {})
    each = min(resplit(ctx, f)[1].step_s for f in chains)
    assert best_resplit(ctx, found)[1].step_s == pytest.approx(each, rel=1e-12)
    fastest = min(chains, key=lambda f: f[1].step_s)
    assert best_resplit(ctx, found, cutoff_s=0.5 * each) is fastest
    assert best_resplit(ctx, [None]) is None
