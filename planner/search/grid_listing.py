"""Which Megatron grids a pool has (`megatron_grid` searches them): every grid on every prefix of
the node list, or only those whose bound from the pool's fastest GPU type is under a cutoff.

A grid is (nodes, tp, cp, pp, microbatch size, recompute): the first `nodes` nodes of the file,
tp·cp-wide groups, pp stages and dp = GPUs / (tp·cp·pp) identical pipelines. Its pool bound needs
no placement: A at least the sum over layers of the cheapest F+B any GPU type of the pool has, C at
least A / pp, and a pipeline of m microbatches takes at least A + (m - 1)·C.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from planner.costmodel.base import CostModel, Shard
from planner.search.space import costable_table, powers_of_two_upto
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

Grid = tuple[int, int, int, int, int, str]  # (nodes, tp, cp, pp, microbatch size, recompute)


def prefix_gpus(cluster: ClusterSpec) -> list[int]:
    """GPUs of the first k nodes, for k = 0 .. number of nodes."""
    return list(itertools.accumulate((n.gpus for n in cluster.node_list), initial=0))


def step_bound(a_low: float, c_low: float, m: int, cost: CostModel) -> float:
    """Least step of a pipeline whose A and C are at least these, running m microbatches (tails
    left out), a hair below so float noise never lifts it above the plan it bounds."""
    return (a_low + (m - 1) * c_low + cost.knobs.step_overhead_s) * (1 - 1e-9)


def pool_low(model: ModelSpec, training: TrainingSpec, cost: CostModel, key: tuple, devs: list,
             low: dict) -> float:
    """A's least value for grids of this (tp, cp, microbatch size, recompute) `key` on any
    placement: the sum over layers of the cheapest F+B any GPU type of the pool has (`low`:
    shared across grids); inf where no type's cost model can cost the shard (`costable_table`)."""
    if key not in low:
        tp, cp, b, recompute = key
        shard = Shard(tp, cp, 1, b, recompute, training.seq_len)
        per_dev = [t for dev in devs if (t := costable_table(cost, dev, shard, model, training)) is not None]
        low[key] = float(np.minimum.reduce([t.fwd_s + t.bwd_s for t in per_dev]).sum()) if per_dev else math.inf
    return low[key]


def pool_bound(model: ModelSpec, training: TrainingSpec, cost: CostModel, grid: Grid, gpus_upto: list[int],
               devs: list, low: dict) -> float:
    """The weaker part of `megatron_grid._work_bound`, before any placement: A at least the sum
    over layers of the cheapest F+B any GPU type of the pool has, C at least A / pp (`low`: A by
    shard, shared)."""
    n_nodes, tp, cp, pp, b, recompute = grid
    a_low = pool_low(model, training, cost, (tp, cp, b, recompute), devs, low)
    m = training.global_batch // (b * (gpus_upto[n_nodes] // (tp * cp * pp)))
    return step_bound(a_low, a_low / pp, m, cost)


def group_shapes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, node_cap: int,
                  gpus: int) -> list[tuple[int, int]]:
    """The (tp, cp) of the grids on a prefix of `gpus` GPUs whose smallest node has `node_cap`:
    powers of two the model's heads and the sequence divide, whose tp*cp group fits a node (or,
    where allowed, takes a power of two of whole nodes), by tp, then cp."""
    span = node_cap  # largest tp*cp group: a node, or (allowed) a power of two of whole nodes
    if cluster.allow_cross_node_tp and not node_cap & (node_cap - 1):
        span = max(powers_of_two_upto(gpus))
    shapes = []
    for tp in powers_of_two_upto(min(training.max_tp, span)):
        if model.num_heads % tp or model.kv_heads % tp or model.ffn_hidden % tp:
            continue
        for cp in powers_of_two_upto(min(training.max_cp, span // tp)):
            width = tp * cp
            if training.seq_len % cp or (node_cap % width if width <= node_cap else width % node_cap):
                continue
            shapes.append((tp, cp))
    return shapes


def every_grid(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, micro_batches: list[int],
               prefixes: list[int] | None = None) -> list[Grid]:
    """Every grid on every prefix of the node list (or on the first n nodes for each n of
    `prefixes`, ascending) whose GPU count and global batch divide, in the order (nodes, tp, cp,
    pp, microbatch size, recompute); `megatron_grid._placement` rejects those Megatron's rank
    order cannot place."""
    grids: list[Grid] = []
    gpus_upto = prefix_gpus(cluster)
    node_caps = list(itertools.accumulate((n.gpus for n in cluster.node_list), min))
    for n_nodes in prefixes or range(1, len(cluster.node_list) + 1):
        gpus = gpus_upto[n_nodes]
        for tp, cp in group_shapes(model, cluster, training, node_caps[n_nodes - 1], gpus):
            width = tp * cp
            for pp in range(1, model.num_layer_slots + 1):
                if gpus % (width * pp):
                    continue
                dp = gpus // (width * pp)
                grids.extend((n_nodes, tp, cp, pp, b, rc) for b in micro_batches
                             if training.global_batch % (b * dp) == 0 for rc in training.recompute)
    return grids


def grids_within(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                 micro_batches: list[int], cutoff_s: float, devs: list, low: dict) -> list[Grid]:
    """`every_grid`'s grids whose `pool_bound` is at most `cutoff_s`, in its order, found
    without walking every prefix: a grid is fixed by (tp, cp, pp, b, dp) (its prefix is the one of
    dp·tp·cp·pp GPUs, if any), dp divides global_batch / b, and the bound only grows with the
    microbatches per pipeline, so for each (tp, cp, pp, b, recompute) the dps are taken from the
    largest down until the bound passes the cutoff. On the 16,384-GPU ladder pool (2,048 prefixes)
    walking them and bounding each grid was a third of the grid search."""
    gpus_upto = prefix_gpus(cluster)
    node_caps = list(itertools.accumulate((n.gpus for n in cluster.node_list), min))
    prefix_of = {g: n for n, g in enumerate(gpus_upto) if n > 0}
    shapes_of: dict[tuple[int, int], set[tuple[int, int]]] = {}

    def fits(n_nodes: int, tp: int, cp: int) -> bool:
        key = (node_caps[n_nodes - 1], gpus_upto[n_nodes])
        if key not in shapes_of:
            shapes_of[key] = set(group_shapes(model, cluster, training, *key))
        return (tp, cp) in shapes_of[key]

    every_shape = sorted({sc for n in range(1, len(gpus_upto))
                          for sc in group_shapes(model, cluster, training, node_caps[n - 1], gpus_upto[n])})
    found: list[tuple[tuple, Grid]] = []
    divisors: dict[int, list[int]] = {}  # of q, largest first
    for tp, cp in every_shape:
        for pp in range(1, model.num_layer_slots + 1):
            for bi, b in enumerate(micro_batches):
                if training.global_batch % b:
                    continue
                q = training.global_batch // b
                if q not in divisors:
                    small = [d for d in range(1, math.isqrt(q) + 1) if q % d == 0]
                    divisors[q] = sorted({x for d in small for x in (d, q // d)}, reverse=True)
                live = [(ri, rc, pool_low(model, training, cost, (tp, cp, b, rc), devs, low))
                        for ri, rc in enumerate(training.recompute)]
                for dp in divisors[q]:
                    live = [x for x in live if step_bound(x[2], x[2] / pp, q // dp, cost) <= cutoff_s]
                    if not live:
                        break  # fewer replicas, more microbatches each: every bound only grows
                    n_nodes = prefix_of.get(dp * tp * cp * pp)
                    if n_nodes is not None and fits(n_nodes, tp, cp):
                        found.extend(((n_nodes, tp, cp, pp, bi, ri), (n_nodes, tp, cp, pp, b, rc))
                                     for ri, rc, _ in live)
    return [grid for _, grid in sorted(found)]
