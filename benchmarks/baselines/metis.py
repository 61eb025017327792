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

The module also holds the helpers the other baselines share: node-local group placement, the
proportional layer split and the pick-the-best-valid-plan loop.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

from benchmarks.baselines.megatron_uniform import DEFAULT_MICRO_BATCHES, RECOMPUTE_ORDER
from planner.costmodel.base import CostModel, DeviceClass, Shard, device_class_of
from planner.errors import HetplanError, InfeasibleError
from planner.evaluate import evaluate
from planner.plan import Pipeline, Plan, Stage, compress_devices
from planner.search.space import powers_of_two_upto
from planner.specs.cluster import ClusterSpec
from planner.specs.gpus import get_gpu
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from planner.validate import violations

MAX_PARTS_PER_TYPE = 3
ORDER_FINALISTS = 8
MAX_CANDIDATES = 3000

Devices = list[tuple[str, int]]
T = TypeVar("T")


# -- helpers shared by the baselines ----------------------------------------------------------------

def first_recompute(training: TrainingSpec) -> str:
    """The cheapest allowed recompute mode: what a planner without a recompute choice runs."""
    return next(m for m in RECOMPUTE_ORDER if m in training.recompute)


def micro_batch_sizes(training: TrainingSpec) -> list[int]:
    """Microbatch sizes the training spec allows (default 1..16) that divide the global batch."""
    sizes = sorted(set(training.micro_batches or DEFAULT_MICRO_BATCHES))
    return [b for b in sizes if training.global_batch % b == 0]


def tp_degrees(model: ModelSpec, training: TrainingSpec, node_gpus: int) -> list[int]:
    """Powers of two up to max_tp and the node size that divide heads, kv heads and the MLP width."""
    return [tp for tp in powers_of_two_upto(min(training.max_tp, node_gpus))
            if not (model.num_heads % tp or model.kv_heads % tp or model.ffn_hidden % tp)]


def type_device_class(cluster: ClusterSpec, gpu: str) -> DeviceClass:
    """Device class of the first node group of a GPU type (the one a planner profiles)."""
    return device_class_of(next(g for g in cluster.nodes if g.gpu == gpu))


def type_node_gpus(cluster: ClusterSpec, gpu: str) -> int:
    """Smallest node size of a GPU type: a tp group must fit in any of its nodes."""
    return min(n.gpus for n in cluster.node_list if n.gpu == gpu)


def place_groups(cluster: ClusterSpec, requests: Sequence[tuple[str, int, int]]) -> list[Devices] | None:
    """Concrete GPUs for requests (gpu type, group size, groups): every group inside one node, groups of
    a request back to back. Largest groups first, then request order, each type filling its nodes in
    file order (a bump allocator: power-of-two groups that divide the node never fragment it).
    None when the type has too few GPUs."""
    cursors: dict[str, tuple[int, int]] = {}
    nodes = {gpu: [n for n in cluster.node_list if n.gpu == gpu] for gpu in {r[0] for r in requests}}
    out: list[Devices] = [[] for _ in requests]
    for k in sorted(range(len(requests)), key=lambda k: (-requests[k][1], k)):
        gpu, size, groups = requests[k]
        ni, off = cursors.get(gpu, (0, 0))
        for _ in range(groups):
            off = -(-off // size) * size
            while ni < len(nodes[gpu]) and off + size > nodes[gpu][ni].gpus:
                ni, off = ni + 1, 0
            if ni == len(nodes[gpu]):
                return None
            out[k].extend((nodes[gpu][ni].name, i) for i in range(off, off + size))
            off += size
        cursors[gpu] = (ni, off)
    return out


def counts_to_layers(model: ModelSpec, blocks: Sequence[int]) -> list[tuple[int, int]]:
    """Decoder blocks per stage -> inclusive layer ranges; embedding joins the first stage, head the last."""
    out, start = [], 1
    for s, count in enumerate(blocks):
        first, last = (0 if s == 0 else start), start + count - 1
        out.append((first, model.num_layers + 1 if s == len(blocks) - 1 else last))
        start += count
    return out


def proportional_counts(total: int, weights: Sequence[float], minimum: int = 1) -> list[int] | None:
    """`total` split in proportion to `weights` (largest remainder, ties to the earlier index), every
    share at least `minimum`; None when that is impossible."""
    n = len(weights)
    if n == 0 or total < minimum * n or sum(weights) <= 0:
        return None
    exact = [total * w / sum(weights) for w in weights]
    counts = [max(minimum, int(x)) for x in exact]
    while sum(counts) > total:
        k = max((i for i in range(n) if counts[i] > minimum), key=lambda i: (counts[i] - exact[i], -i))
        counts[k] -= 1
    while sum(counts) < total:
        k = max(range(n), key=lambda i: (exact[i] - counts[i], -i))
        counts[k] += 1
    return counts


def proportional_layer_split(model: ModelSpec, weights: Sequence[float]) -> list[tuple[int, int]] | None:
    """Decoder blocks in proportion to stage weights (speed, TFLOP/s), at least one block a stage."""
    counts = proportional_counts(model.num_layers, weights)
    return None if counts is None else counts_to_layers(model, counts)


def rank_valid(candidates: Iterable[tuple[T, Plan | None]], cluster: ClusterSpec, cost: CostModel,
               keep: int) -> tuple[list[tuple[float, int, T, Plan]], int, str]:
    """The `keep` fastest valid candidates as (step_s, generation index, tag, plan), fastest first (ties:
    fewer GPUs, then generation order), plus how many were tried and a sample violation. A candidate
    is validated (memory included) only when its score would make the list, which keeps large pools
    fast; the ranking is the same as validating every one."""
    kept: list[tuple[float, int, int, T, Plan]] = []
    tried, sample = 0, ""
    for index, (tag, plan) in enumerate(candidates):
        if plan is None:
            continue
        tried += 1
        try:
            step = evaluate(plan, cluster, cost, check=False).step_s
        except HetplanError:
            step = math.inf
        if len(kept) == keep and (step, plan.num_gpus) >= kept[-1][:2]:
            continue
        found = violations(plan, cluster, cost)
        if found:
            sample = sample or str(found[0])
            continue
        kept.append((step, plan.num_gpus, index, tag, plan))
        kept.sort(key=lambda k: k[:3])
        del kept[keep:]
    return [(step, index, tag, plan) for step, _, index, tag, plan in kept], tried, sample


def pick_best(name: str, plans: Iterable[Plan | None], cluster: ClusterSpec, cost: CostModel,
              none_built: str = "no candidate plan could be built") -> Plan:
    """The fastest valid plan by the one evaluator (ties: fewer GPUs, then the first generated), with its
    prediction attached; InfeasibleError naming the baseline and a sample violation when none is valid
    (`none_built` when the baseline's own rules left no candidate at all)."""
    ranked, tried, sample = rank_valid(((None, p) for p in plans), cluster, cost, keep=1)
    if not ranked:
        why = f"; e.g. {sample}" if sample else ""
        raise InfeasibleError(name, f"no valid plan among {tried} candidates{why}" if tried else none_built)
    plan = ranked[0][3]
    return plan.model_copy(update={"predicted": evaluate(plan, cluster, cost, check=False)})


# -- Metis ------------------------------------------------------------------------------------------

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
