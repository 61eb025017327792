"""The Sailor baseline (SOSP'25), written from its published description.

Sailor decides how many GPUs of each type to use, one pipeline depth and one microbatch size for the
whole job, and the number of data-parallel replicas. Its rules, kept here: layers are split evenly
over the stages; the batch is split evenly over the replicas, so the slowest replica sets the pace;
each GPU type runs the smallest tensor-parallel degree whose stages fit in its memory; no recompute
choice (the first allowed mode of none / selective / full) and no context parallelism. Pipelines are
per type (every stage of a replica on one GPU type), placed stage-major so the copies of a stage sit
next to each other.

Bounds on the space (Sailor prunes its allocation search as well): every pipeline depth up to the
layer count, every allowed microbatch size, and per GPU type a replica count of 0, the most that
fit, or the largest power of two below that. Memory for the tp rule is checked with the evaluator's
own stage-memory terms; every candidate is then validated and scored by the one evaluator.
"""

from __future__ import annotations

import itertools

from benchmarks.baselines.common import (
    first_recompute,
    micro_batch_sizes,
    pick_best,
    place_groups,
    tp_degrees,
    type_device_class,
    type_node_gpus,
)
from planner.costmodel import stage as st
from planner.costmodel.base import CostModel, Shard
from planner.errors import HetplanError, InfeasibleError
from planner.plan import Pipeline, Plan, Stage, compress_devices
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from planner.uniform import even_layer_split


def _fits(cluster: ClusterSpec, cost: CostModel, model: ModelSpec, training: TrainingSpec, gpu: str,
          split: list[tuple[int, int]], tp: int, micro: int, recompute: str, microbatches: int,
          replicas: int) -> bool:
    """Every stage of a `gpu` pipeline fits in memory (the evaluator's stage-memory formula)."""
    dev = type_device_class(cluster, gpu)
    try:
        table = cost.layer_table(dev, Shard(tp, 1, 1, micro, recompute, training.seq_len), model, training)
    except HetplanError:
        return False
    sums = st.StageSums.of(table)
    cap = st.memory_capacity_bytes(cost.knobs, dev)
    pp = len(split)
    for s, (first, last) in enumerate(split):
        flight = st.in_flight(training.schedule, pp, s, microbatches)
        need = st.stage_memory_bytes(table, sums, first, last, flight, training.zero,
                                     st.weight_copies(replicas, 1, 1, 1))
        if need > cap:
            return False
    return True


def _replica_choices(cap: int) -> list[int]:
    """0, the largest power of two <= cap, and cap."""
    if cap <= 0:
        return [0]
    return sorted({0, 1 << (cap.bit_length() - 1), cap})


def _sailor_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 replicas: dict[str, tuple[int, int]], pp: int, micro: int, recompute: str) -> Plan | None:
    """Plan for replicas[gpu] = (pipelines, tp): stage-major placement per type, even split, even batch."""
    split = even_layer_split(model, pp)
    total = sum(r for r, _ in replicas.values())
    types = [g for g in sorted(replicas) if replicas[g][0]]
    placed = place_groups(cluster, [(g, replicas[g][1], replicas[g][0] * pp) for g in types])
    if placed is None:
        return None
    pipelines = []
    for g, devs in zip(types, placed):
        r, tp = replicas[g]
        for k in range(r):
            stages = []
            for s, layers in enumerate(split):
                first = (s * r + k) * tp
                stages.append(Stage(layers=layers, gpu=g, devices=compress_devices(devs[first:first + tp]),
                                    tp=tp, recompute=recompute))
            pipelines.append(Pipeline(microbatches=training.global_batch // (micro * total), stages=stages))
    return Plan(model=model, training=training, micro_batch=micro, schedule=training.schedule,
                pipelines=pipelines)


def _candidates(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel):
    counts = cluster.counts_by_type()
    types = sorted(counts)
    recompute = first_recompute(training)
    tps = {g: tp_degrees(model, training, type_node_gpus(cluster, g)) for g in types}
    node_sizes = {g: [n.gpus for n in cluster.node_list if n.gpu == g] for g in types}
    for micro in micro_batch_sizes(training):
        batches = training.global_batch // micro
        for pp in range(1, model.num_layers + 1):
            split = even_layer_split(model, pp)
            # replica caps at the smallest tp that fits with the most microbatches in flight
            caps = {}
            for g in types:
                tp0 = next((tp for tp in tps[g] if _fits(cluster, cost, model, training, g, split, tp, micro,
                                                         recompute, batches, 1)), None)
                caps[g] = 0 if tp0 is None else sum(n // tp0 for n in node_sizes[g]) // pp
            if not any(caps.values()):
                continue
            for alloc in itertools.product(*(_replica_choices(caps[g]) for g in types)):
                total = sum(alloc)
                if total == 0 or batches % total:
                    continue
                m = batches // total
                chosen: dict[str, tuple[int, int]] = {}
                for g, r in zip(types, alloc):
                    if r:
                        tp = next(tp for tp in tps[g] if _fits(cluster, cost, model, training, g, split, tp,
                                                               micro, recompute, m, total))
                        chosen[g] = (r, tp)
                yield _sailor_plan(model, cluster, training, chosen, pp, micro, recompute)


def sailor_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
    """Best Sailor plan by the shared evaluator (see the module docstring for the bounded space)."""
    if not cluster.counts_by_type():
        raise InfeasibleError("sailor", "the cluster has no GPUs")
    return pick_best("sailor", _candidates(model, cluster, training, cost), cluster, cost,
                     none_built=f"no GPU type holds an evenly split pipeline stage in memory at any tp up to "
                     f"{training.max_tp} (recompute '{first_recompute(training)}'), or no replica count "
                     "divides the batch")
