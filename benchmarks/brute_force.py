"""Every plan of a small instance, enumerated: the oracle the search is checked against.

It knows nothing of templates, frontiers or LPs. It lists every pipeline (every contiguous split of
the layer slots, every stage's node group and shape), every multiset of pipelines that fits the GPU
counts and every deal of the microbatches, and scores each with the evaluator's own stage formulas
(`planner.costmodel.stage`). Node sizes must be powers of two: stage groups are powers of two too,
so a multiset whose GPU counts fit each node group also fits its nodes (largest groups first), and
`as_plan` places it that way.

One shortcut, exact: for a fixed number of pipelines R, a pipeline that is no faster than another
of the same GPU usage at every microbatch count and has no smaller tail is dropped (swapping it for
that one keeps every plan valid and never makes it slower). Stage terms are computed once per
(shape, layer range, neighbours, R). `tests/test_search_bruteforce.py` runs it against the search;
`benchmarks/oracle_fuzz.py` on random instances.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from planner.costmodel import stage as st
from planner.costmodel.base import CostModel, Shard, device_class_of
from planner.plan import Pipeline, Plan, Stage
from planner.search.space import StageShape
from planner.specs import ClusterSpec, ModelSpec, TrainingSpec

SHAPE_DEGREES = (1, 2, 4)  # tp, cp, hp and stage dp each take these (up to the training limits)
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8, 16)  # the search's sizes when the training spec names none


@dataclass(frozen=True)
class StageChoice(StageShape):
    """A stage's shape on one node group (index into `cluster.nodes`)."""

    group: int


@dataclass(frozen=True)
class Found:
    """The best plan: its step (from the stage formulas) and, per pipeline, its stages
    ((choice, first slot, last slot), first stage first) and microbatches."""

    step_s: float
    micro_batch: int
    pipelines: tuple[tuple[tuple[tuple[StageChoice, int, int], ...], int], ...]


def stage_choices(cluster: ClusterSpec, training: TrainingSpec, micro_batch: int,
                  model: ModelSpec) -> list[StageChoice]:
    """Every legal stage shape on every node group: tp/cp/hp groups inside a node, or (when the
    cluster allows it) over a power of two of whole nodes; heads, kv heads and the sequence split
    evenly; stage dp divides the microbatch."""
    out = []
    for gi, g in enumerate(cluster.nodes):
        if g.node_gpus & (g.node_gpus - 1):
            raise ValueError(f"node group {gi}: {g.node_gpus} GPUs per node is not a power of two")
        for tp, cp, hp, dp in itertools.product(SHAPE_DEGREES, repeat=4):
            if tp > training.max_tp or cp > training.max_cp or hp > training.max_hp or dp > training.max_stage_dp:
                continue
            group = tp * cp * hp
            spans = cluster.allow_cross_node_tp and group > g.node_gpus and group % g.node_gpus == 0 \
                and (group // g.node_gpus) & (group // g.node_gpus - 1) == 0
            if (group > g.node_gpus and not spans) or micro_batch % dp or group * dp > g.nodes * g.node_gpus:
                continue
            if model.num_heads % (tp * hp) or model.kv_heads % tp or training.seq_len % (cp * hp):
                continue
            out.extend(StageChoice(tp, cp, hp, dp, rc, gi) for rc in training.recompute)
    return out


class _Costs:
    """Stage terms of one microbatch size, each computed once."""

    def __init__(self, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel, model: ModelSpec,
                 micro_batch: int) -> None:
        self.cluster, self.training, self.knobs = cluster, training, cost.knobs
        self.cost, self.model, self.b = cost, model, micro_batch
        self._tables: dict[StageChoice, tuple] = {}
        self._stages: dict[tuple, tuple[float, float, float]] = {}
        self._fits: dict[tuple, int] = {}

    def _table(self, c: StageChoice) -> tuple:
        if c not in self._tables:
            dev = device_class_of(self.cluster.nodes[c.group])
            shard = Shard(c.tp, c.cp, c.hp, self.b // c.dp, c.recompute, self.training.seq_len)
            table = self.cost.layer_table(dev, shard, self.model, self.training)
            self._tables[c] = (dev, table, st.StageSums.of(table),
                               st.recv_s(self.knobs, dev, table, self.cluster.single_node),
                               st.memory_capacity_bytes(self.knobs, dev))
        return self._tables[c]

    def stage(self, c: StageChoice, first: int, last: int, prev: bool, nxt: bool,
              replicas: int) -> tuple[float, float, float]:
        """(F, B, tail) of a stage with (`prev`) and (`nxt`) a stage before and after it."""
        key = (c, first, last, prev, nxt, replicas)
        if key not in self._stages:
            dev, table, sums, recv, _ = self._table(c)
            f = sums.fwd_s(first, last) + (recv if prev else 0.0)
            b = sums.bwd_s(first, last) + (recv if nxt else 0.0)
            copies = st.weight_copies(replicas, c.dp, c.cp, c.hp)
            params = sums.params(first, last)
            zero, single = self.training.zero, self.cluster.single_node
            sync = st.grad_sync_s(self.knobs, dev, params, c.tp, copies, zero, single)
            opt = st.optimizer_s(self.knobs, dev, params, zero, copies)
            self._stages[key] = (f, b, st.stage_tail_s(self.knobs, b, sync, opt))
        return self._stages[key]

    def fits(self, c: StageChoice, first: int, last: int, replicas: int, stages: int, k: int, most: int) -> int:
        """The most microbatches, up to `most`, at which stage `k` of `stages` fits in memory
        (the validator's `stage_memory_bytes`; activations in flight only grow with the count)."""
        key = (c, first, last, replicas, stages, k, most)
        if key not in self._fits:
            _, table, sums, _, cap = self._table(c)
            copies = st.weight_copies(replicas, c.dp, c.cp, c.hp)
            m, schedule, zero = most, self.training.schedule, self.training.zero
            while m and st.stage_memory_bytes(table, sums, first, last, st.in_flight(schedule, stages, k, m),
                                              zero, copies) > cap:
                m -= 1
            self._fits[key] = m
        return self._fits[key]


def _pipelines(choices: list[StageChoice], slots: int, avail: list[int]
               ) -> Iterator[tuple[tuple[int, ...], tuple[tuple[StageChoice, int, int], ...]]]:
    """Every pipeline that fits the GPU counts alone: (GPUs per node group, stages)."""
    for s in range(1, min(slots, sum(avail)) + 1):  # a stage holds a slot and a GPU at least
        combos = list(_sequences(choices, s, avail))
        for cuts in itertools.combinations(range(1, slots), s - 1):
            ends = (0, *cuts, slots)
            for usage, combo in combos:
                yield usage, tuple((c, ends[k], ends[k + 1] - 1) for k, c in enumerate(combo))


def _sequences(choices: list[StageChoice], length: int, left: list[int]
               ) -> Iterator[tuple[tuple[int, ...], tuple[StageChoice, ...]]]:
    """Every sequence of `length` stage choices within `left` GPUs per node group, with its usage."""
    if length == 0:
        yield (0,) * len(left), ()
        return
    for c in choices:
        if c.gpus <= left[c.group]:
            rest = list(left)
            rest[c.group] -= c.gpus
            for usage, tail in _sequences(choices, length - 1, rest):
                yield tuple(u + (c.gpus if g == c.group else 0) for g, u in enumerate(usage)), (c, *tail)


def _scored(costs: _Costs, stages: tuple[tuple[StageChoice, int, int], ...], replicas: int,
            microbatches: int) -> tuple[tuple[float, ...], float] | None:
    """A pipeline's time at 1..`microbatches` microbatches (inf where a stage overflows memory)
    and its largest stage tail, with `replicas` pipelines in the plan; None if it fits at no count."""
    n = len(stages)
    fwd, bwd, tails, fits = [], [], [], microbatches
    for k, (c, first, last) in enumerate(stages):
        f, b, tail = costs.stage(c, first, last, k > 0, k < n - 1, replicas)
        fits = min(fits, costs.fits(c, first, last, replicas, n, k, microbatches))
        fwd.append(f)
        bwd.append(b)
        tails.append(tail)
    if not fits:
        return None
    times = tuple(st.pipeline_time_s(costs.training.schedule, fwd, bwd, m) if m <= fits else math.inf
                  for m in range(1, microbatches + 1))
    return times, max(tails)


def _undominated(scored: dict[int, tuple[tuple[float, ...], float]], ids: list[int]) -> list[int]:
    """`ids` less those no better than another in every time and the tail (ties: the first kept)."""
    kept: list[int] = []
    for i in sorted(ids, key=lambda i: (scored[i][1], scored[i][0], i)):
        times, tail = scored[i]
        if not any(scored[q][1] <= tail and all(a <= b for a, b in zip(scored[q][0], times)) for q in kept):
            kept.append(i)
    return kept


def _usage_multisets(usages: list[tuple[int, ...]], count: int, left: list[int],
                     start: int = 0) -> Iterator[tuple[int, ...]]:
    """Every multiset (as ascending indices into `usages`) of `count` usages within `left` GPUs."""
    if count == 0:
        yield ()
        return
    for u in range(start, len(usages)):
        if all(x <= y for x, y in zip(usages[u], left)):
            rest = [y - x for x, y in zip(usages[u], left)]
            for tail in _usage_multisets(usages, count - 1, rest, u):
                yield (u, *tail)


def brute_force(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                prune: bool = True) -> Found | None:
    """The fastest plan of every plan the instance has (None: none fits); ties go to the first
    found (microbatch sizes ascending, then fewer pipelines). `prune`: drop dominated pipelines
    (off: every multiset of every pipeline, for checking that the shortcut changes nothing)."""
    slots = model.num_layer_slots
    avail = [g.nodes * g.node_gpus for g in cluster.nodes]
    overhead = cost.knobs.step_overhead_s
    best: Found | None = None
    for b in training.micro_batches or DEFAULT_MICRO_BATCHES:
        if training.global_batch % b:
            continue
        big_m = training.global_batch // b
        costs = _Costs(cluster, training, cost, model, b)
        pipes = list(_pipelines(stage_choices(cluster, training, b, model), slots, avail))
        for r in range(1, min(big_m, sum(avail)) + 1):
            scored = {}
            for i, (usage, stages) in enumerate(pipes):
                if sum(usage) + r - 1 <= sum(avail):  # room for r - 1 more pipelines of a GPU each
                    got = _scored(costs, stages, r, big_m - r + 1)
                    if got is not None:
                        scored[i] = got
            by_usage: dict[tuple[int, ...], list[int]] = {}
            for i in scored:
                by_usage.setdefault(pipes[i][0], []).append(i)
            usages = sorted(by_usage)
            kept = {u: _undominated(scored, by_usage[u]) if prune else by_usage[u] for u in usages}
            for multiset in _usage_multisets(usages, r, avail):
                groups = [(usages[u], multiset.count(u)) for u in sorted(set(multiset))]
                picks = (itertools.combinations_with_replacement(kept[u], k) for u, k in groups)
                for pick in itertools.product(*picks):
                    combo = [i for part in pick for i in part]
                    tail = max(scored[i][1] for i in combo)
                    for cuts in itertools.combinations(range(1, big_m), r - 1):
                        dealt = [hi - lo for lo, hi in zip((0, *cuts), (*cuts, big_m))]
                        step = max(scored[i][0][m - 1] for i, m in zip(combo, dealt)) + tail + overhead
                        if step < (math.inf if best is None else best.step_s - 1e-15):  # inf: some overflow
                            best = Found(step, b, tuple((pipes[i][1], m) for i, m in zip(combo, dealt)))
    return best


def as_plan(found: Found, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> Plan:
    """The plan `found` describes, its stages' GPUs taken largest group first from each node group
    in node order (aligned: every size is a power of two), tp fastest within a stage."""
    free: dict[int, list[tuple[str, int]]] = {}
    for node in cluster.node_list:
        free.setdefault(node.group, []).extend((node.name, i) for i in range(node.gpus))
    stages = [(p, k, c) for p, (pipe, _) in enumerate(found.pipelines) for k, (c, _, _) in enumerate(pipe)]
    devices: dict[tuple[int, int], list[str]] = {}
    for p, k, c in sorted(stages, key=lambda x: (-x[2].group_size, x[0], x[1])):
        taken = free[c.group][:c.gpus]
        del free[c.group][:c.gpus]
        devices[(p, k)] = [f"{name}:{i}" for name, i in taken]
    pipelines = [Pipeline(microbatches=m, stages=[
        Stage(layers=(first, last), gpu=cluster.nodes[c.group].gpu, devices=devices[(p, k)], tp=c.tp, cp=c.cp,
              hp=c.hp, dp=c.dp, recompute=c.recompute) for k, (c, first, last) in enumerate(pipe)])
        for p, (pipe, m) in enumerate(found.pipelines)]
    return Plan(model=model, training=training, micro_batch=found.micro_batch, schedule=training.schedule,
                pipelines=pipelines)
