"""The FlashFlex baseline (Yan et al., 2024; HexiScale), written from its published description.

FlashFlex partitions the device graph into asymmetric pipelines: every pipeline gets a share of the
pool with about equal peak compute, its stages are tensor-parallel groups with their own degree, the
layers of a pipeline are split in proportion to each stage's peak TFLOP/s and then repaired for
memory, and each pipeline takes a share of the batch in proportion to its TFLOP/s. One global
recompute flag. Its own cost model is analytic peak FLOPs; here every candidate is validated and
scored by the one evaluator.

The partition here: a networkx graph of the cluster's nodes, edges weighted by the per-GPU bandwidth
between two nodes (NICs, capped by zone links). Nodes are laid out along the graph's Fiedler vector
(a spectral cut: tightly linked nodes end up next to each other; file order when the graph has no
preferred cut, e.g. identical links everywhere), each node's GPUs become tp groups, and the sequence
of groups is cut into `pipelines` contiguous pieces of about equal TFLOP/s, so a pipeline stays on
close nodes. The original refines with METIS and random restarts; this one is deterministic.

Space (bounded as the original's greedy is): one tp per GPU type (powers of two up to the node),
1, 2, 4, 8 or 16 pipelines, every allowed microbatch size; recompute is the first of none /
selective / full whose repaired plan fits in memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import networkx as nx
import numpy as np

from benchmarks.baselines.common import (
    RECOMPUTE_ORDER,
    micro_batch_sizes,
    pick_best,
    proportional_counts,
    proportional_layer_split,
    tp_degrees,
    type_node_gpus,
)
from planner.costmodel import stage as st
from planner.costmodel.base import CostModel, Shard, device_class_of
from planner.errors import InfeasibleError
from planner.plan import Pipeline, Plan, Stage, compress_devices
from planner.specs.cluster import ClusterSpec, Node
from planner.specs.gpus import get_gpu
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

PIPELINE_COUNTS = (1, 2, 4, 8, 16)

Group = tuple[Node, int, int]  # node, first GPU index, tp


def device_graph(cluster: ClusterSpec) -> nx.Graph:
    """Cluster nodes; edge weight `bw_gbs` = per-GPU GB/s between two nodes (slower NIC, zone cap)."""
    nic = {gi: g.nic_gbs for gi, g in enumerate(cluster.nodes)}
    graph = nx.Graph()
    for node in cluster.node_list:
        graph.add_node(node.name, gpu=node.gpu, gpus=node.gpus)
    for a, b in itertools.combinations(cluster.node_list, 2):
        bw = min(nic[a.group], nic[b.group])
        zone = cluster.zone_gbs(a.zone, b.zone)
        graph.add_edge(a.name, b.name, bw_gbs=min(bw, zone) if zone else bw)
    return graph


def spectral_node_order(cluster: ClusterSpec) -> list[Node]:
    """Nodes sorted by the Fiedler vector of the bandwidth graph (file order breaks ties, and is used
    outright when the second-smallest Laplacian eigenvalue is repeated: no preferred cut)."""
    nodes = list(cluster.node_list)
    if len(nodes) < 3:
        return nodes
    names = [n.name for n in nodes]
    adj = nx.to_numpy_array(device_graph(cluster), nodelist=names, weight="bw_gbs")
    lap = np.diag(adj.sum(axis=1)) - adj
    values, vectors = np.linalg.eigh(lap)
    if abs(values[2] - values[1]) <= 1e-9 * max(1.0, abs(values[-1])):
        return nodes
    fiedler = vectors[:, 1] * (1.0 if vectors[0, 1] <= 0 else -1.0)  # sign fixed: node0 first side
    return [nodes[i] for i in sorted(range(len(nodes)), key=lambda i: (round(float(fiedler[i]), 9), i))]


def cut_by_tflops(weights: Sequence[float], pieces: int, max_len: int) -> list[tuple[int, int]] | None:
    """Contiguous pieces [start, end) of a sequence, each boundary at the prefix sum closest to an equal
    share; None when a piece would be empty or longer than `max_len`."""
    n = len(weights)
    if pieces > n:
        return None
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    bounds = [0]
    for k in range(1, pieces):
        lo, hi = bounds[-1] + 1, n - (pieces - k)
        target = prefix[-1] * k / pieces
        bounds.append(min(range(lo, hi + 1), key=lambda b: (abs(prefix[b] - target), b)))
    bounds.append(n)
    out = list(itertools.pairwise(bounds))
    return None if any(e - s > max_len for s, e in out) else out


def group_tflops(training: TrainingSpec, group: Group) -> float:
    """Peak TFLOP/s of one tp group."""
    node, _, tp = group
    return get_gpu(node.gpu).peak_flops(training.dtype) * tp / 1e12


class _StageMemory:
    """Free bytes of a stage from the evaluator's own stage-memory terms, tables cached per (node
    group, tp) for one microbatch size, recompute mode and replica count."""

    def __init__(self, cluster: ClusterSpec, cost: CostModel, model: ModelSpec, training: TrainingSpec,
                 micro: int, recompute: str, replicas: int) -> None:
        self.cluster, self.cost, self.model, self.training = cluster, cost, model, training
        self.micro, self.recompute, self.copies = micro, recompute, st.weight_copies(replicas, 1, 1, 1)
        self._tables: dict[tuple[int, int], tuple] = {}

    def free_bytes(self, group: Group, layers: tuple[int, int], in_flight: int) -> float:
        node, _, tp = group
        key = (node.group, tp)
        if key not in self._tables:
            dev = device_class_of(self.cluster.nodes[node.group])
            table = self.cost.layer_table(dev, Shard(tp, 1, 1, self.micro, self.recompute, self.training.seq_len),
                                          self.model, self.training)
            self._tables[key] = (table, st.StageSums.of(table), st.memory_capacity_bytes(self.cost.knobs, dev))
        table, sums, cap = self._tables[key]
        return cap - st.stage_memory_bytes(table, sums, layers[0], layers[1], in_flight, self.training.zero,
                                           self.copies)


def _moved(split: list[tuple[int, int]], src: int, dst: int) -> list[tuple[int, int]] | None:
    """One boundary layer of stage src handed to its neighbour dst; None if src would be empty."""
    (a0, a1), (b0, b1) = split[src], split[dst]
    if a0 == a1:
        return None
    out = list(split)
    out[src], out[dst] = ((a0 + 1, a1), (b0, b1 + 1)) if dst == src - 1 else ((a0, a1 - 1), (b0 - 1, b1))
    return out


def repair_memory(split: list[tuple[int, int]], groups: Sequence[Group], microbatches: int,
                  memory: _StageMemory) -> list[tuple[int, int]] | None:
    """Move layers off stages that overflow memory, one at a time, to the neighbour with more free
    bytes that still fits afterwards. None when an overflowing stage has no such neighbour."""
    n = len(split)
    flight = [st.in_flight(memory.training.schedule, n, s, microbatches) for s in range(n)]
    for _ in range(memory.model.num_layer_slots * n):
        free = [memory.free_bytes(g, r, f) for g, r, f in zip(groups, split, flight)]
        src = next((s for s in range(n) if free[s] < 0), None)
        if src is None:
            return split
        for dst in sorted((s for s in (src - 1, src + 1) if 0 <= s < n), key=lambda s: (-free[s], s)):
            moved = _moved(split, src, dst)
            if moved is not None and memory.free_bytes(groups[dst], moved[dst], flight[dst]) >= 0:
                split = moved
                break
        else:
            return None
    return None


def flashflex_candidate(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                        tp_by_type: dict[str, int], pipelines: int, micro: int,
                        order: Sequence[Node] | None = None) -> Plan | None:
    """The FlashFlex plan for one tp per GPU type, pipeline count and microbatch size (`order`: the
    spectral node order, computed when not given); None when the cut or the memory repair fails at
    every recompute mode."""
    tps = tp_by_type
    groups = [(n, k * tps[n.gpu], tps[n.gpu]) for n in order or spectral_node_order(cluster)
              for k in range(n.gpus // tps[n.gpu])]
    tflops = [group_tflops(training, g) for g in groups]
    pieces = cut_by_tflops(tflops, pipelines, model.num_layers)
    shares = None if pieces is None else proportional_counts(
        training.global_batch // micro, [sum(tflops[s:e]) for s, e in pieces])
    if pieces is None or shares is None:
        return None
    for mode in (m for m in RECOMPUTE_ORDER if m in training.recompute):
        memory = _StageMemory(cluster, cost, model, training, micro, mode, len(pieces))
        out = []
        for (s, e), m in zip(pieces, shares):
            split = proportional_layer_split(model, tflops[s:e])
            split = None if split is None else repair_memory(split, groups[s:e], m, memory)
            if split is None:
                break
            stages = [Stage(layers=layers, gpu=node.gpu, tp=tp, recompute=mode,
                            devices=compress_devices([(node.name, i + k) for k in range(tp)]))
                      for (node, i, tp), layers in zip(groups[s:e], split)]
            out.append(Pipeline(microbatches=m, stages=stages))
        else:
            return Plan(model=model, training=training, micro_batch=micro, schedule=training.schedule,
                        pipelines=out)
    return None


def _candidates(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel):
    types = sorted(cluster.counts_by_type())
    order = spectral_node_order(cluster)
    for tps in itertools.product(*(tp_degrees(model, training, type_node_gpus(cluster, g)) for g in types)):
        for pipelines in PIPELINE_COUNTS:
            for micro in micro_batch_sizes(training):
                yield flashflex_candidate(model, cluster, training, cost, dict(zip(types, tps)), pipelines, micro,
                                          order)


def flashflex_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
    """Best FlashFlex plan by the shared evaluator (see the module docstring for the bounded space)."""
    if not cluster.counts_by_type():
        raise InfeasibleError("flashflex", "the cluster has no GPUs")
    return pick_best("flashflex", _candidates(model, cluster, training, cost), cluster, cost,
                     none_built="no cut of the pool into 1-16 pipelines fits in memory after moving layers "
                     "off full stages, at any allowed recompute mode")
