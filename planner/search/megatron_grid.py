"""The search restricted to plans Megatron-LM can run (`hetplan plan --target megatron`).

Megatron runs one (tp, cp, pp, dp) grid: identical pipelines, the same tp/cp on every stage, no
intra-stage dp or head parallelism, one recompute mode and one microbatch count for all replicas,
ranks laid out tp fastest, then cp, dp and pp outermost over the nodes in file order. Stages may land
on different GPU types (a stage must not straddle two) and, with `--pipeline-model-parallel-layout`,
hold different numbers of layers. For every grid on every prefix of the node list (and, in
`best_single_type_plan`, on each GPU type's nodes alone), the layer split is solved exactly by the
same partition DP as the full search (memory per position), so the result is the best Megatron
plan under the cost model, in Megatron's rank order.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from planner.costmodel.base import CostModel, Shard, device_class_of
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.plan import Pipeline, Plan, Prediction, Stage, compress_devices, expand_devices
from planner.search.grid_listing import Grid, every_grid, grids_within, prefix_gpus, step_bound
from planner.search.options import OptionContext, build_options
from planner.search.space import ResourceClass, StageShape, costable_table
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.partition import Split, StageOptions, best_split, least_step_split, min_max_tail


@dataclass(frozen=True)
class _Layout:
    """A grid laid out on the nodes: each stage's ranks and node group, its stage options, the
    microbatches per pipeline, and a lower bound on its step."""

    grid: Grid
    stage_nodes: list
    positions: list[StageOptions]
    dp: int
    microbatches: int
    bound_s: float


def _stages_on_nodes(cluster: ClusterSpec, n_nodes: int, width: int, pp: int) -> list | None:
    """Megatron's rank order on the first `n_nodes` nodes: each of the pp stages' rank range
    [lo, hi) (tp*cp groups of `width` fastest, then dp) and its node group; None when a stage would
    mix GPU types or node shapes, or a tp*cp group would span nodes (unless it takes whole nodes and
    the cluster sets `allow_cross_node_tp`). Works on node boundaries, not ranks: a 16,384-GPU
    pool has thousands of placements."""
    nodes = cluster.node_list[:n_nodes]
    starts = list(itertools.accumulate((n.gpus for n in nodes), initial=0))
    per_stage = starts[-1] // pp
    keys = {g: device_class_of(group).key for g, group in enumerate(cluster.nodes)}
    stage_nodes = []
    for s in range(pp):
        lo, hi = s * per_stage, (s + 1) * per_stage
        first, last = bisect.bisect_right(starts, lo) - 1, bisect.bisect_left(starts, hi) - 1
        if len({keys[n.group] for n in nodes[first:last + 1]}) > 1:
            return None  # a stage may not mix GPU types or node shapes
        # groups start at multiples of `width`; one spans nodes only where a node boundary inside
        # the stage is not such a multiple: then it must take whole nodes
        if any(starts[k] % width for k in range(first + 1, last + 1)) and not _whole_node_groups(
                cluster, nodes, starts, lo, hi, width, first):
            return None
        stage_nodes.append(((lo, hi), cluster.nodes[nodes[first].group]))
    return stage_nodes


def _whole_node_groups(cluster: ClusterSpec, nodes: list, starts: list[int], lo: int, hi: int, width: int,
                       first: int) -> bool:
    """Whether every tp*cp group of ranks [lo, hi) lies in one node or, with
    `allow_cross_node_tp`, is whole nodes (nodes of the first one's size, `width` GPUs in all)."""
    at = first
    for k in range(lo, hi, width):
        while starts[at + 1] <= k:
            at += 1
        end = at
        while starts[end + 1] < k + width:
            end += 1
        if end > at and not (cluster.allow_cross_node_tp and (end - at + 1) * nodes[at].gpus == width):
            return False
    return True


def _ranks(cluster: ClusterSpec, n_nodes: int) -> list[tuple[str, int]]:
    """(node name, local rank) of every global rank on the first `n_nodes` nodes, in rank order."""
    return [(n.name, i) for n in cluster.node_list[:n_nodes] for i in range(n.gpus)]


def _placement(training: TrainingSpec, cluster: ClusterSpec, grid: Grid, placed: dict,
               gpus_upto: list[int]) -> tuple | None:
    """(stages on nodes, dp, microbatches per pipeline, the stages' distinct device classes, stages
    per device key, each stage's device class) of the grid, or None when the global batch or the
    GPU count does not divide, or Megatron's rank order cannot place it. `placed`:
    `_stages_on_nodes` and its device classes by (nodes, tp*cp, pp), shared across grids
    (microbatch sizes and recompute modes repeat a placement); `gpus_upto[k]`: GPUs of the first
    k nodes."""
    n_nodes, tp, cp, pp, b, _ = grid
    gpus = gpus_upto[n_nodes]
    width = tp * cp
    if gpus % (width * pp):
        return None
    dp = gpus // (width * pp)
    if training.global_batch % (b * dp):
        return None
    if (n_nodes, width, pp) not in placed:
        stage_nodes = _stages_on_nodes(cluster, n_nodes, width, pp)
        if stage_nodes is None:
            placed[(n_nodes, width, pp)] = None
        else:
            classes = [device_class_of(group) for _, group in stage_nodes]
            per_type: dict[str, int] = {}
            for dev in classes:
                per_type[dev.key] = per_type.get(dev.key, 0) + 1
            devs = list({dev.key: dev for dev in classes}.values())
            placed[(n_nodes, width, pp)] = (stage_nodes, devs, tuple(sorted(per_type.items())), classes)
    if placed[(n_nodes, width, pp)] is None:
        return None
    stage_nodes, devs, per_type, classes = placed[(n_nodes, width, pp)]
    return stage_nodes, dp, training.global_batch // (b * dp), devs, per_type, classes


def _least_bottleneck(per_type: tuple[tuple[str, int], ...], cost: dict[str, float], decoders: int) -> float:
    """Least C at which stages of these types (`per_type`: stages per device key) can hold every
    decoder layer, a stage of type t holding at most floor(C / cost[t]) of them (`cost[t]`: the
    least F+B of one decoder layer on t): the smallest k·cost[t] whose capacity reaches
    `decoders` (capacities rounded up by 1e-12 relative, so the result never overshoots).

    The stages hold at most C·sum_t n_t / cost[t] layers, so no C below `decoders` over that holds
    them all: the candidates are walked up from there (a handful, in plain floats; building and
    testing every k·cost[t] in arrays was a fifth of the grid search at 16,384 GPUs)."""
    w = [cost[k] for k, _ in per_type]
    n = [c for _, c in per_type]
    if decoders <= 0 or not all(math.isfinite(x) and x > 0 for x in w):
        return 0.0
    scale = 1 + 1e-12
    lowest = decoders / (sum(nt / wt for wt, nt in zip(w, n)) * scale)

    def multiples(wt: float) -> Iterator[float]:
        """k·wt from just below `lowest` (one more step down against rounding) up to decoders·wt."""
        return (k * wt for k in range(max(1, int(lowest / wt) - 1), decoders + 1))

    for c in heapq.merge(*map(multiples, w)):
        if sum(nt * math.floor(c / wt * scale) for wt, nt in zip(w, n)) >= decoders:
            return float(c)
    return 0.0


def _work_bound(model: ModelSpec, training: TrainingSpec, cost: CostModel, grid: Grid, placement: tuple,
                work: dict, cutoff_s: float = math.inf) -> float:
    """A step-time bound that needs no DP, from per-layer F+B by (device, shard) (`work`, shared
    across grids). A split's A is at least the sum over layers of the cheapest F+B any of the
    grid's GPU types has for that layer (receives only add). Its C, the largest stage F+B, is at
    least A / pp, and at least the least C at which the stages, holding whole decoder layers each
    costing at least its type's cheapest decoder layer, hold all of them (`_least_bottleneck`). A
    pipeline takes at least A + (m - 1)·C. When the A / pp term alone reaches `cutoff_s`, that
    weaker bound is returned (the grid is pruned either way); inf where some GPU type of the
    grid's cannot cost its shard (`costable_table`: the grid is not in the searched space)."""
    _, tp, cp, pp, b, recompute = grid
    _, _, m, devs, per_type, _ = placement
    key = (tuple(dev.key for dev in devs), tp, cp, b, recompute)
    if key not in work:
        shard = Shard(tp, cp, 1, b, recompute, training.seq_len)
        tables = [costable_table(cost, dev, shard, model, training) for dev in devs]
        if any(t is None for t in tables):
            work[key] = None
        else:
            per_dev = {dev.key: t.fwd_s + t.bwd_s for dev, t in zip(devs, tables)}
            a_low = float(np.minimum.reduce(list(per_dev.values())).sum())
            work[key] = (a_low, {k: float(np.min(w[1:-1])) if len(w) > 2 else 0.0 for k, w in per_dev.items()}, {})
    if work[key] is None:
        return math.inf
    a_low, per_decoder, c_of = work[key]
    weak = step_bound(a_low, a_low / pp, m, cost)
    if weak >= cutoff_s:
        return weak
    if per_type not in c_of:
        c_of[per_type] = _least_bottleneck(per_type, per_decoder, model.num_layer_slots - 2)
    c_low = max(a_low / pp, c_of[per_type])
    return step_bound(a_low, c_low, m, cost)


def _layout(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, cost: CostModel, grid: Grid,
            placement: tuple, options: dict, costs: dict | None = None) -> _Layout | None:
    """The grid's layout on its `placement`, or None when no split fits memory or some stage's
    shard cannot be costed (`space.costable_table`). Bound: A_min, C_min
    and E_min, the least A, least largest F+B and least largest tail over memory-feasible splits,
    each minimised on its own; every 1F1B or GPipe pipeline of the grid takes at least
    A_min + (m - 1)·C_min (and C >= A / pp), and the evaluator adds the largest tail and the step
    overhead. `options`: stage options by (device, shape, microbatch size, replicas), shared across
    grids."""
    _, tp, cp, pp, b, recompute = grid
    stage_nodes, dp, m = placement[:3]
    shape = StageShape(tp, cp, 1, 1, recompute)
    ctx = OptionContext(model, training, b, dp, dp, cluster.single_node)
    positions = []
    for (_, group), dev in zip(stage_nodes, placement[5]):
        key = (dev.key, shape, b, dp)
        if key not in options:
            shard = Shard(tp, cp, 1, b, recompute, training.seq_len)
            costable = costable_table(cost, dev, shard, model, training) is not None
            options[key] = (build_options(cost, ResourceClass(0, dev, group.nodes, ()), [shape], ctx)
                            if costable else None)
        if options[key] is None:
            return None
        positions.append(options[key])
    flight = min(m, pp)
    least = best_split(positions, max_in_flight=flight, memo=costs)
    if least is None:
        return None
    # the least largest F+B: the tail DP run on F+B in place of the tails
    c_min = min_max_tail([StageOptions(p.fb, p.fb, p.mem_fixed, p.act, p.capacity) for p in positions], flight)
    e_min = min_max_tail(positions, flight)
    bound = least.a_s + (m - 1) * max(c_min or 0.0, least.a_s / pp) + (e_min or 0.0)
    return _Layout(grid, stage_nodes, positions, dp, m, (bound + cost.knobs.step_overhead_s) * (1 - 1e-9))


@dataclass
class _Caches:
    """What the grid search computes once per pool, by content (a grid, or what its placement,
    bound or stage options depend on), so that passes over different grid lists share it."""

    placed: dict = field(default_factory=dict)  # `_placement`'s, by (nodes, tp*cp, pp)
    work: dict = field(default_factory=dict)  # `_work_bound`'s per-layer F+B, by devices and shard
    options: dict = field(default_factory=dict)  # stage options, by (device, shape, b, dp)
    costs: dict = field(default_factory=dict)  # their least F+B per flight (`partition.best_split`'s memo)
    layouts: dict = field(default_factory=dict)  # by grid
    splits: dict = field(default_factory=dict)  # by grid: its best split and step
    plans: dict = field(default_factory=dict)  # by grid: its scored plan, or None (refused)


NOISE = 1e-9  # relative: a split's step and the evaluator's for its plan agree far closer than this


def _grid_split(lay: _Layout, overhead_s: float) -> tuple[Split, float] | None:
    """The layout's best split, least in A + (m - 1)·C + E (`least_step_split`), and its step
    (that plus the step overhead: what the evaluator computes for its plan from the same stage
    options), or None."""
    m, pp = lay.microbatches, lay.grid[3]
    split = least_step_split(lay.positions, m, max_in_flight=min(m, pp))
    if split is None:
        return None
    return split, split.a_s + (m - 1) * split.c_s + split.e_s + overhead_s


def _grid_plan(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, cost: CostModel,
               lay: _Layout, split: Split) -> tuple[Plan, Prediction] | None:
    """The layout's plan with this split, scored by the evaluator; None where the validator
    refuses it."""
    _, tp, cp, _, b, recompute = lay.grid
    width = tp * cp
    pipelines = []
    ranks = _ranks(cluster, lay.grid[0])
    for d in range(lay.dp):
        stages = []
        for s, (((lo, _), group), (first, last)) in enumerate(zip(lay.stage_nodes, split.ranges)):
            devs = ranks[lo + d * width:lo + (d + 1) * width]
            stages.append(Stage(layers=(first, last), gpu=group.gpu, devices=compress_devices(devs), tp=tp,
                                cp=cp, recompute=recompute))
        pipelines.append(Pipeline(microbatches=lay.microbatches, stages=stages))
    plan = Plan(model=model, training=training, micro_batch=b, schedule=training.schedule, pipelines=pipelines)
    try:
        return plan, evaluate(plan, cluster, cost)
    except HetplanError:  # a rule the grid did not pre-check (the validator has the last word)
        return None


def best_megatron_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                       micro_batches: list[int], cutoff_s: float = math.inf) -> tuple[Plan, Prediction] | None:
    """The fastest Megatron-expressible plan (see module docstring), or None if none fits; of
    equally fast ones, the first grid in the order (nodes, tp, cp, pp, microbatch size, recompute).
    With `cutoff_s` (a step some other plan reaches), only a plan at least that fast, else None.

    Grids are taken in order of a bound that needs no DP (`_work_bound`); each is then bounded by
    its layout's DPs (`_layout`) and only then solved, its split's step standing for its plan's
    (`_least_grids`). A grid is skipped once a bound shows it cannot beat the best so far, so the
    answer is the one the full enumeration gives; only the plans of the least grids (ties within
    float noise) are built and scored, and a grid whose plan the validator refuses is left out of
    a second pass. Ladder pools without a cutoff (CPU, one process): 64 GPUs 0.4 s (111 s solving
    every grid's split), 1,024 GPUs 1.1-1.6 s, 16,384 GPUs 2.1-2.3 s (4.2-5.2 s when every
    improving grid's plan was built and scored). With a cutoff the grids come from `grids_within`,
    not from every prefix: at 16,384 GPUs with the best plan's step as the cutoff, 0.9-1.0 s
    against 1.5-1.8 s, the single-type grids (`best_single_type_plan`) included. Without one, a
    first pass over the whole pool's grids makes one (below): `--target megatron` at 16,384 GPUs
    1.2-1.5 s against 2.2-2.7 s."""
    caches = _Caches()
    devs = list({dev.key: dev for dev in map(device_class_of, cluster.nodes)}.values())
    if cutoff_s < math.inf:
        return _best_of(model, training, cluster, cost, caches, cutoff_s,
                        grids_within(model, cluster, training, cost, micro_batches, cutoff_s, devs, {}))
    # a first cutoff: the least step of the grids on the whole pool or, if none fits there (the
    # global batch, the GPU count or the rank order), on the longest prefix ending a node group
    # that has one, from their splits only, no plan; every grid under it then holds the answer,
    # unless the validator refuses all of them
    seed: list = []
    for n in sorted(set(itertools.accumulate(g.nodes for g in cluster.nodes)), reverse=True):
        ranked = _ranked(model, training, cluster, cost, caches, math.inf,
                         every_grid(model, cluster, training, micro_batches, [n]))
        if seed := _least_grids(model, training, cluster, cost, ranked, math.inf, caches, set()):
            break
    if seed:
        cutoff_s = seed[0][0] * (1 + NOISE)
        found = _best_of(model, training, cluster, cost, caches, cutoff_s,
                         grids_within(model, cluster, training, cost, micro_batches, cutoff_s, devs, {}))
        if found is not None:
            return found
    return _best_of(model, training, cluster, cost, caches, math.inf,
                    every_grid(model, cluster, training, micro_batches))


def _ranked(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, cost: CostModel, caches: _Caches,
            cutoff_s: float, grids: list[Grid]) -> list[tuple]:
    """(`_work_bound`, place, grid, placement) of each grid Megatron's rank order places, by bound
    then place (what `_least_grids` walks)."""
    gpus_upto = prefix_gpus(cluster)
    ranked = []
    for i, grid in enumerate(grids):
        placement = _placement(training, cluster, grid, caches.placed, gpus_upto)
        if placement is not None:
            ranked.append((_work_bound(model, training, cost, grid, placement, caches.work, cutoff_s), i, grid,
                           placement))
    return sorted(ranked, key=lambda x: (x[0], x[1]))


def _best_of(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, cost: CostModel, caches: _Caches,
             cutoff_s: float, grids: list[Grid]) -> tuple[Plan, Prediction] | None:
    """`best_megatron_plan` over these grids (in `every_grid`'s order): the least ones by
    `_least_grids`, their plans built and scored; `caches` (by content, not by place in `grids`)
    are shared by calls on one pool."""
    order = _ranked(model, training, cluster, cost, caches, cutoff_s, grids)
    refused: set[int] = set()  # grids whose plan the validator refused
    while True:
        least = _least_grids(model, training, cluster, cost, order, cutoff_s, caches, refused)
        scored = []
        for _, i, lay, split in least:
            if lay.grid not in caches.plans:
                caches.plans[lay.grid] = _grid_plan(model, training, cluster, cost, lay, split)
            found = caches.plans[lay.grid]
            if found is None:
                refused.add(i)
            elif found[1].step_s <= cutoff_s:
                scored.append((found[1].step_s, i, found))
        if scored:
            return min(scored, key=lambda x: (x[0], x[1]))[2]
        if not any(i in refused for _, i, _, _ in least):
            return None  # none refused, none within the cutoff
        # else the search again without the refused grids (their steps had pruned others)


def _least_grids(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, cost: CostModel,
                 order: list[tuple], cutoff_s: float, caches: _Caches, refused: set[int]
                 ) -> list[tuple[float, int, _Layout, Split]]:
    """The grids whose split's step is the least, to float noise (`NOISE`), and at most `cutoff_s`
    (to noise), each with its layout and split, by (step, place in the order); grids in `refused`
    left out. `order`: (bound, place, grid, placement) by bound; each grid's layout and split are
    computed once (`caches`, kept across calls). A grid is skipped once a bound shows it above the
    least step so far, so these are the grids the full enumeration finds least. Only their plans
    are built and scored (`best_megatron_plan`): each improving grid's plan, built and scored as
    it came, took 0.3-0.5 s at 16,384 GPUs."""
    overhead = cost.knobs.step_overhead_s
    best = cutoff_s
    found: list[tuple[float, int, _Layout, Split]] = []
    for cheap, i, grid, placement in order:
        limit = best * (1 + NOISE)
        if cheap > limit:
            break  # this and every later grid is slower than the best
        if i in refused:
            continue
        layouts, splits = caches.layouts, caches.splits
        if grid not in layouts:
            layouts[grid] = _layout(model, training, cluster, cost, grid, placement, caches.options, caches.costs)
        lay = layouts[grid]
        if lay is None or lay.bound_s > limit:
            continue
        if grid not in splits:
            splits[grid] = _grid_split(lay, overhead)
        if splits[grid] is None:
            continue
        split, value = splits[grid]
        if value <= limit:
            found.append((value, i, lay, split))
            best = min(best, value)
    return sorted((x for x in found if x[0] <= best * (1 + NOISE)), key=lambda x: (x[0], x[1]))


def best_single_type_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                          micro_batches: list[int], cutoff_s: float = math.inf) -> tuple[Plan, Prediction] | None:
    """The fastest Megatron grid on the nodes of one GPU type alone, if it beats `cutoff_s`.

    `best_megatron_plan` takes prefixes of the node list, so a type whose nodes do not open the
    file is never alone in its grids; yet the issue asks that the search be never slower than the
    best plan on any single type. Each such type's node groups (file order kept) form a pool of
    their own; its best grid's devices are renamed to the whole pool's nodes and the plan is scored
    there. On `benchmarks/grid_check.py --seed 21` a pool of 2x4 T4 + 2x1 RTX-3090 + 1x4 V100
    (OPT-350M, global batch 8) had the search 0.47 % slower than a grid on one type alone."""
    nodes = cluster.node_list
    best: tuple[Plan, Prediction] | None = None
    for gpu in sorted({n.gpu for n in nodes}):
        mine = [n for n in nodes if n.gpu == gpu]
        if mine == list(nodes[:len(mine)]):
            continue  # a prefix: `best_megatron_plan` has its grids already
        groups = [g for g in cluster.nodes if g.gpu == gpu]
        zones = {g.zone for g in groups}
        links = [link for link in cluster.zone_links if link.a in zones and link.b in zones]
        sub = ClusterSpec(nodes=groups, zone_links=links, allow_cross_node_tp=cluster.allow_cross_node_tp)
        found = best_megatron_plan(model, sub, training, cost, micro_batches, cutoff_s=cutoff_s)
        if found is None:
            continue
        names = {s.name: n.name for s, n in zip(sub.node_list, mine)}
        plan = found[0].model_copy(update={"pipelines": [
            p.model_copy(update={"stages": [s.model_copy(update={"devices": compress_devices(
                [(names[node], i) for node, i in expand_devices(s.devices)])}) for s in p.stages]})
            for p in found[0].pipelines]})
        try:
            pred = evaluate(plan, cluster, cost)
        except HetplanError:  # the validator has the last word
            continue
        if pred.step_s < cutoff_s:
            best, cutoff_s = (plan, pred), pred.step_s
    return best
