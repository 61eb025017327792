"""Helpers every baseline shares: the allowed microbatch sizes, tp degrees and recompute modes, node-local
group placement, the proportional layer split, and the pick-the-fastest-valid-plan loop (`rank_valid`,
`pick_best`), which validates a candidate only when its score would make the cut.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

from planner.costmodel.base import CostModel, DeviceClass, device_class_of
from planner.errors import HetplanError, InfeasibleError
from planner.evaluate import evaluate
from planner.plan import Plan
from planner.search.space import powers_of_two_upto
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from planner.validate import violations

DEFAULT_MICRO_BATCHES = (1, 2, 4, 8, 16)
RECOMPUTE_ORDER = ("none", "selective", "full")

Devices = list[tuple[str, int]]
T = TypeVar("T")


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
