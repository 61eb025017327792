"""The Metis baseline (Um et al., ATC'24), written from its published description.

Metis plans one pipeline over the whole pool. It decides the order of GPU types along the pipeline,
splits each type's GPUs into stages whose sizes are powers of two, gives every stage its own
(dp, tp) (data parallelism *inside* the stage splits each microbatch), splits the layers in
proportion to each stage's speed, and runs one microbatch count for the whole batch. It has no
recompute, no context / head parallelism and no ZeRO choice. Metis ranks its space with its own
estimator; here every candidate is checked by the plan validator (memory included, which Metis
skips) and scored by the one evaluator, so the comparison is on plan quality.

Bounds on the space (the original prunes too, and still takes minutes on 32+ GPUs):
  * each type's GPUs split into at most `MAX_PARTS_PER_TYPE` power-of-two stages (more only when
    the type's count needs more powers of two), stage sizes non-increasing along the pipeline;
  * stages of one GPU type share one tp (their dp = size / tp differs with the size);
  * phase 1 scores every (stage sizes, tp per type, microbatch) in one type order (most memory per
    GPU first: the first stages stash the most activations under 1F1B); phase 2 tries every other
    type order for the `ORDER_FINALISTS` best of phase 1;
  * at most `MAX_CANDIDATES` plans are scored in phase 1, in a fixed order.
Recompute is the first allowed mode of none / selective / full (Metis has no recompute choice).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from benchmarks.baselines.common import (
    DEFAULT_MICRO_BATCHES,
    first_recompute,
    pick_best,
    place_groups,
    proportional_layer_split,
    rank_valid,
    tp_degrees,
    type_device_class,
    type_node_gpus,
)
from planner.costmodel.base import CostModel, Shard
from planner.errors import HetplanError, InfeasibleError
from planner.plan import Pipeline, Plan, Stage, compress_devices
from planner.search.space import powers_of_two_upto
from planner.specs.cluster import ClusterSpec
from planner.specs.gpus import get_gpu
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

MAX_PARTS_PER_TYPE = 3
ORDER_FINALISTS = 8
MAX_CANDIDATES = 3000


def stage_partitions(count: int) -> list[tuple[int, ...]]:
    """Non-increasing power-of-two parts summing to `count`, at most MAX_PARTS_PER_TYPE of them (or
    as many as the binary digits of `count` need)."""
    limit = max(MAX_PARTS_PER_TYPE, count.bit_count())
    out: list[tuple[int, ...]] = []

    def grow(left: int, cap: int, parts: tuple[int, ...]) -> None:
        if left == 0:
            out.append(parts)
            return
        if len(parts) == limit:
            return
        for p in reversed(powers_of_two_upto(min(left, cap))):
            grow(left - p, p, (*parts, p))

    grow(count, count, ())
    return out


def _stage_speed(cluster: ClusterSpec, cost: CostModel, model: ModelSpec, training: TrainingSpec,
                 gpu: str, tp: int, shard_batch: int, recompute: str) -> float:
    """Decoder layers per second one stage pushes a microbatch through (its own profile)."""
    table = cost.layer_table(type_device_class(cluster, gpu),
                             Shard(tp, 1, 1, shard_batch, recompute, training.seq_len), model, training)
    return 1.0 / float(table.fwd_s[1] + table.bwd_s[1])


def _metis_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                order: Sequence[str], sizes: dict[str, tuple[int, ...]], tps: dict[str, int],
                micro: int, recompute: str) -> Plan | None:
    """One Metis candidate: stages of each type in `order`, sizes[type], (dp = size / tp, tp)."""
    stages = [(gpu, size, tps[gpu]) for gpu in order for size in sizes[gpu]]
    try:
        speeds = [_stage_speed(cluster, cost, model, training, g, tp, micro // (size // tp), recompute)
                  for g, size, tp in stages]
    except HetplanError:
        return None
    split = proportional_layer_split(model, speeds)
    placed = place_groups(cluster, [(g, tp, size // tp) for g, size, tp in stages])
    if split is None or placed is None:
        return None
    out = [Stage(layers=layers, gpu=g, devices=compress_devices(devs), tp=tp, dp=size // tp, recompute=recompute)
           for (g, size, tp), layers, devs in zip(stages, split, placed)]
    return Plan(model=model, training=training, micro_batch=micro, schedule=training.schedule,
                pipelines=[Pipeline(microbatches=training.global_batch // micro, stages=out)])


def _micro_candidates(training: TrainingSpec, max_dp: int) -> list[int]:
    """Plan microbatch sizes every stage's dp divides: the allowed list when given, else Metis's rule
    (a per-GPU microbatch of 1..16 on the widest stage)."""
    base = training.micro_batches or tuple(b * max_dp for b in DEFAULT_MICRO_BATCHES)
    return sorted(b for b in set(base) if b % max_dp == 0 and training.global_batch % b == 0)


def _layouts(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
             types: list[str]) -> Iterable[tuple[dict[str, tuple[int, ...]], dict[str, int]]]:
    """(stage sizes per type, tp per type) in a fixed order, stage count within the layer count."""
    counts = cluster.counts_by_type()
    per_type_sizes = [stage_partitions(counts[g]) for g in types]
    per_type_tps = [tp_degrees(model, training, type_node_gpus(cluster, g)) for g in types]
    for parts in itertools.product(*per_type_sizes):
        if sum(len(p) for p in parts) > model.num_layers:
            continue
        options = [[tp for tp in tps if p[-1] % tp == 0] for p, tps in zip(parts, per_type_tps)]
        for tps in itertools.product(*options):
            yield dict(zip(types, parts)), dict(zip(types, tps))


def metis_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
    """Best Metis plan by the shared evaluator (see the module docstring for the bounded space)."""
    types = sorted(cluster.counts_by_type(), key=lambda g: (-get_gpu(g).mem_bytes, g))
    if not types:
        raise InfeasibleError("metis", "the cluster has no GPUs")
    recompute = first_recompute(training)

    def phase_one() -> Iterable[tuple[tuple, Plan | None]]:
        n = 0
        for sizes, tps in _layouts(model, cluster, training, types):
            max_dp = max(size // tps[g] for g in types for size in sizes[g])
            for micro in _micro_candidates(training, max_dp):
                if n == MAX_CANDIDATES:
                    return
                n += 1
                yield (sizes, tps, micro), _metis_plan(model, cluster, training, cost, types, sizes, tps,
                                                       micro, recompute)

    finalists, tried, sample = rank_valid(phase_one(), cluster, cost, keep=ORDER_FINALISTS)
    if not finalists:
        why = f"; e.g. {sample}" if sample else ""
        raise InfeasibleError("metis", f"no valid plan among {tried} power-of-two stage layouts with "
                              f"recompute '{recompute}'{why}")
    orders = sorted(itertools.permutations(types))
    return pick_best("metis", (_metis_plan(model, cluster, training, cost, order, sizes, tps, micro, recompute)
                               for _, _, (sizes, tps, micro), _ in finalists for order in orders), cluster, cost)
