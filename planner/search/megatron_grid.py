"""The search restricted to plans Megatron-LM can run (`hetplan plan --target megatron`).

Megatron runs one (tp, cp, pp, dp) grid: identical pipelines, the same tp/cp on every stage, no
intra-stage dp or head parallelism, one recompute mode and one microbatch count for all replicas,
ranks laid out tp fastest, then cp, dp and pp outermost over the nodes in file order. Stages may land
on different GPU types (a stage must not straddle two) and, with `--pipeline-model-parallel-layout`,
hold different numbers of layers. For every grid on every prefix of the node list, the layer split
is solved exactly by the same partition DP as the full search (memory per position), so the result
is the best Megatron plan under the cost model, in Megatron's rank order.
"""

from __future__ import annotations

import math

from planner.costmodel.base import CostModel, device_class_of
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.plan import Pipeline, Plan, Prediction, Stage, compress_devices
from planner.search.options import OptionContext, build_options
from planner.search.space import ResourceClass, StageShape, powers_of_two_upto
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.partition import split_frontier


def _grid_plan(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, cost: CostModel, n_nodes: int,
               tp: int, cp: int, pp: int, b: int, recompute: str) -> tuple[Plan, Prediction] | None:
    nodes = cluster.node_list[:n_nodes]
    ranks = [(n, i) for n in nodes for i in range(n.gpus)]
    width = tp * cp
    if len(ranks) % (width * pp):
        return None
    dp = len(ranks) // (width * pp)
    if training.global_batch % (b * dp):
        return None
    m = training.global_batch // (b * dp)
    per_stage = dp * width
    stage_nodes = []
    for s in range(pp):
        block = ranks[s * per_stage:(s + 1) * per_stage]
        groups = {n.group for n, _ in block}
        devs = {device_class_of(cluster.nodes[g]).key for g in groups}
        if len(devs) > 1:  # a stage may not mix GPU types or node shapes
            return None
        for k in range(0, per_stage, width):  # each tp*cp group inside one node
            if len({n.name for n, _ in block[k:k + width]}) > 1:
                return None
        stage_nodes.append((block, cluster.nodes[block[0][0].group]))
    shape = StageShape(tp, cp, 1, 1, recompute)
    ctx = OptionContext(model, training, b, dp, dp, cluster.single_node)
    positions, classes = [], {}
    for _, group in stage_nodes:
        dev = device_class_of(group)
        if dev.key not in classes:
            classes[dev.key] = build_options(cost, ResourceClass(0, dev, group.nodes, ()), [shape], ctx)
        positions.append(classes[dev.key])
    splits = split_frontier(positions, max_in_flight=min(m, pp))
    if not splits:
        return None
    split = min(splits, key=lambda sp: (sp.a_s + (m - 1) * sp.c_s + sp.e_s, sp.ranges))
    pipelines = []
    for d in range(dp):
        stages = []
        for s, ((block, group), (first, last)) in enumerate(zip(stage_nodes, split.ranges)):
            devs = [(n.name, i) for n, i in block[d * width:(d + 1) * width]]
            stages.append(Stage(layers=(first, last), gpu=group.gpu, devices=compress_devices(devs), tp=tp,
                                cp=cp, recompute=recompute))
        pipelines.append(Pipeline(microbatches=m, stages=stages))
    plan = Plan(model=model, training=training, micro_batch=b, schedule=training.schedule, pipelines=pipelines)
    try:
        return plan, evaluate(plan, cluster, cost)
    except HetplanError:  # a rule the grid did not pre-check (the validator has the last word)
        return None


def best_megatron_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                       micro_batches: list[int]) -> tuple[Plan, Prediction] | None:
    """The fastest Megatron-expressible plan (see module docstring), or None if none fits."""
    best: tuple[Plan, Prediction] | None = None
    for n_nodes in range(1, len(cluster.node_list) + 1):
        node_cap = min(n.gpus for n in cluster.node_list[:n_nodes])
        for tp in powers_of_two_upto(min(training.max_tp, node_cap)):
            if model.num_heads % tp or model.kv_heads % tp or model.ffn_hidden % tp:
                continue
            for cp in powers_of_two_upto(min(training.max_cp, node_cap // tp)):
                if training.seq_len % cp or node_cap % (tp * cp):
                    continue
                for pp in range(1, model.num_layer_slots + 1):
                    for b in micro_batches:
                        for rc in training.recompute:
                            found = _grid_plan(model, training, cluster, cost, n_nodes, tp, cp, pp, b, rc)
                            if found is None or found[1].step_s >= (best[1].step_s if best else math.inf):
                                continue
                            best = found
    return best
