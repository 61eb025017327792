"""The AMP baseline (Li et al., NeurIPS'22), written from its published description.

AMP plans one uniform (tp, pp, dp) grid and a microbatch size, with a non-uniform layer split found
by a dynamic program. On a mixed pool it costs every layer with the GPU types' profiles *averaged*
(weighted by GPU count), so the split cannot tell a fast stage from a slow one; the degrees must
multiply to the number of GPUs used, so a pool whose size the grid does not factor runs with whole
GPU types left idle. Ranks follow Megatron order (tp fastest, then dp, pp outermost) over the nodes;
AMP's rank-placement choice is the order of the GPU types along the node list. No recompute choice
(the first allowed mode of none / selective / full).

Space: every non-empty subset of GPU types, every (tp, pp, dp) that factors the subset's GPU count
with tp groups inside nodes, every allowed microbatch size, scored with the types in file order;
ranked by AMP's own estimate on the averaged costs (as AMP picks); the `AMP_SHORTLIST` best are
scored by the one evaluator, then every order of the types for the `ORDER_FINALISTS` best of those
(placement matters less than the grid). Each candidate is validated (memory included) and scored by
the one evaluator.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

from benchmarks.baselines.common import (
    first_recompute,
    micro_batch_sizes,
    pick_best,
    rank_valid,
    tp_degrees,
    type_device_class,
)
from benchmarks.baselines.megatron_uniform import Grid, _groups_fit, _ranks, grid_plan
from benchmarks.baselines.metis import ORDER_FINALISTS
from planner.costmodel.base import CostModel, Shard
from planner.errors import HetplanError, InfeasibleError
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec


def averaged_layer_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                     types: tuple[str, ...], tp: int, micro: int, recompute: str) -> list[float] | None:
    """Per-layer F+B averaged over the GPU types, weighted by how many GPUs each type has."""
    counts = cluster.counts_by_type()
    total = sum(counts[g] for g in types)
    out = [0.0] * model.num_layer_slots
    for g in types:
        try:
            table = cost.layer_table(type_device_class(cluster, g),
                                     Shard(tp, 1, 1, micro, recompute, training.seq_len), model, training)
        except HetplanError:
            return None
        for i in range(model.num_layer_slots):
            out[i] += counts[g] / total * float(table.fwd_s[i] + table.bwd_s[i])
    return out


def min_max_split(layer_s: list[float], stages: int) -> list[tuple[int, int]] | None:
    """Contiguous split of the layer list into `stages` non-empty stages minimising the slowest stage
    (with every stage on the same averaged cost, AMP's pipeline cost sum + (m-1)·max only varies in
    the max). Ties: the earliest cut. None when there are fewer layers than stages."""
    n = len(layer_s)
    if stages > n:
        return None
    prefix = [0.0]
    for x in layer_s:
        prefix.append(prefix[-1] + x)
    # best[s][j]: least bottleneck putting layers [0, j) on s stages; cut[s][j]: start of the last one
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n - (stages - s) + 1):
            for i in range(s - 1, j):
                value = max(best[s - 1][i], prefix[j] - prefix[i])
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    out, j = [], n
    for s in range(stages, 0, -1):
        i = cut[s][j]
        out.append((i, j - 1))
        j = i
    return out[::-1]


def _amp_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
              order: tuple[str, ...], grid: Grid) -> Plan | None:
    ranks = _ranks([n for g in order for n in cluster.node_list if n.gpu == g])
    layer_s = averaged_layer_s(model, cluster, training, cost, order, grid.tp, grid.micro_batch, grid.recompute)
    split = None if layer_s is None else min_max_split(layer_s, grid.pp)
    if split is None:
        return None
    plan = grid_plan(model, training, ranks, grid)
    pipelines = [p.model_copy(update={"stages": [s.model_copy(update={"layers": layers})
                                                 for s, layers in zip(p.stages, split)]})
                 for p in plan.pipelines]
    return plan.model_copy(update={"pipelines": pipelines})


def _grids(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
           order: tuple[str, ...]) -> Iterable[Grid]:
    """Every (tp, pp, dp, microbatch) that factors the GPUs of `order`'s types, tp groups inside nodes."""
    total = sum(cluster.counts_by_type()[g] for g in order)
    ranks = _ranks([n for g in order for n in cluster.node_list if n.gpu == g])
    recompute = first_recompute(training)
    for tp in tp_degrees(model, training, max(n.gpus for n, _ in ranks)):
        if total % tp or not _groups_fit(ranks, tp, total):
            continue
        for pp in range(1, min(total // tp, model.num_layers) + 1):
            if (total // tp) % pp:
                continue
            dp = total // (tp * pp)
            for micro in micro_batch_sizes(training):
                if training.global_batch % (micro * dp) == 0:
                    yield Grid(tp, pp, dp, micro, recompute)


AMP_SHORTLIST = 64  # grids kept by AMP's own estimate, then scored by the shared evaluator


def _amp_estimate_s(training: TrainingSpec, layer_s: list[float] | None, split: list[tuple[int, int]] | None,
                    grid: Grid) -> float | None:
    """AMP's own pipeline estimate on the averaged costs: sum of stages + (m - 1)·slowest stage."""
    if layer_s is None or split is None:
        return None
    stage_s = [sum(layer_s[i:j + 1]) for i, j in split]
    m = training.global_batch // (grid.micro_batch * grid.dp)
    return sum(stage_s) + (m - 1) * max(stage_s)


def amp_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
    """Best AMP plan: grids ranked by AMP's own estimate (averaged costs, as AMP does), the
    `AMP_SHORTLIST` best then scored and validated by the shared evaluator."""
    counts = cluster.counts_by_type()
    if not counts:
        raise InfeasibleError("amp", "the cluster has no GPUs")
    file_order = [g.gpu for g in cluster.nodes]
    subsets = [tuple(sorted(s, key=file_order.index)) for k in range(len(counts), 0, -1)
               for s in itertools.combinations(sorted(counts), k)]
    layers: dict[tuple, list[float] | None] = {}
    splits: dict[tuple, list[tuple[int, int]] | None] = {}
    ranked = []
    for subset in subsets:
        for grid in _grids(model, cluster, training, subset):
            key = (subset, grid.tp, grid.micro_batch, grid.recompute)
            if key not in layers:
                layers[key] = averaged_layer_s(model, cluster, training, cost, subset, grid.tp,
                                               grid.micro_batch, grid.recompute)
            if (key, grid.pp) not in splits:
                splits[(key, grid.pp)] = (None if layers[key] is None
                                          else min_max_split(layers[key], grid.pp))
            est = _amp_estimate_s(training, layers[key], splits[(key, grid.pp)], grid)
            if est is not None:
                ranked.append((est, len(ranked), subset, grid))
    ranked.sort(key=lambda r: r[:2])
    phase_one = (((subset, grid), _amp_plan(model, cluster, training, cost, subset, grid))
                 for _, _, subset, grid in ranked[:AMP_SHORTLIST])
    finalists, tried, sample = rank_valid(phase_one, cluster, cost, keep=ORDER_FINALISTS)
    if not finalists:
        why = f"; e.g. {sample}" if sample else ""
        raise InfeasibleError("amp", f"no valid plan among {tried} grids that factor a set of GPU types{why}")
    return pick_best("amp", (_amp_plan(model, cluster, training, cost, order, grid)
                             for _, _, (subset, grid), _ in finalists
                             for order in itertools.permutations(subset)), cluster, cost)
