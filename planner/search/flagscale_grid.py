"""The search restricted to plans FlagScale's hetero mode runs (`hetplan plan --target flagscale`).

FlagScale runs one logical pipeline whose consecutive stages form process meshes, each on one GPU
type with its own tensor parallel degree and data parallel degree (`planner.emit.flagscale`). In plan
terms: R identical replicas; every stage has a (gpu, tp, cp, stage dp) of its own; one cp and one
recompute mode for all; every stage holds a decoder layer; each stage dp divides the micro batch.
Batch rule: the plan's micro batch b is split over a stage's dp copies, so mesh i (dp_i = R·d_i) runs
micro batch b/d_i and dp_0·mbs = R·b; FlagScale's "dp_0·mbs divisible by every dp_i" is then exactly
"d_i divides b", and every replica runs m = global_batch / (b·R) microbatches.

Space searched, per microbatch size b, cp, recompute mode and replica count R: every device class
is unused or one run of p stages of one width w (GPUs per stage per replica; the partition DP picks
each stage's (tp, stage dp) among the shapes of that width, so one class may hold several meshes),
with R·w·p GPUs of the class at most; runs in every order of the classes used (at most
`_PERMUTE_UPTO` classes; beyond that file order and memory order, and with no cutoff each of
those with two neighbouring runs swapped). Each run sequence's layer split is
solved exactly (`solvers.partition.split_frontier`, memory per position). Run sequences are visited
best-first by lower bounds (fluid, then integral layers plus the least largest tail any split can
have, then the DP without tail caps), so the result
is the best plan of this space under the cost model unless a cap was hit.

Placement fills each class's GPUs in rank order (stage, replica, stage devices), so every tp·cp group
lies inside a node and each node's ranks are one consecutive block, as FlagScale's runner needs. The
Megatron grid (node order over the whole file) lies inside this space when each class's nodes are
consecutive in the file, no cap was hit and groups stay inside nodes; otherwise `best_megatron_plan`
is added as a candidate.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np

from planner.costmodel import stage as st
from planner.costmodel.base import CostModel, Shard
from planner.emit.flagscale import hetero_section
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.plan import Pipeline, Plan, Prediction, Stage, compress_devices
from planner.search.chain_bounds import (
    MeshWidth,
    fluid_bounds_below,
    group_fluid_bound,
    integral_bound,
    least_largest_tail,
    speed_bound,
    tail_levels_bound,
    tails_by_length,
)
from planner.search.megatron_grid import best_megatron_plan
from planner.search.options import OptionContext, OptionCosting
from planner.search.space import (
    ResourceClass,
    StageShape,
    resource_classes,
    stage_shapes,
)
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.batched_runs import batched_min_max_tails, batched_step_frontiers
from solvers.partition import Split, StageOptions, least_step_split, min_max_tail, split_frontier
from solvers.uniform_layers import KindCellOptions, UniformView, full_options, uniform_view

_PERMUTE_UPTO = 4  # classes in a plan up to which every run order is tried
_COMBO_LIMIT = 100_000  # most run combinations per (b, cp, recompute, R) before stage counts are thinned
_MAX_DP = 3000  # most partition-DP runs (a deterministic cap; hitting it adds the Megatron grid)
_KEEP = 8  # candidates kept for the final validation (and the chain candidate's re-splits)
# ... where there is no plan to beat: then the chains are the only plans, and which of them
# re-splits fastest (`chain_resplit`) their own steps do not tell. Llama-2 70B at 8,192 tokens on
# 206 GPUs of seven types (`many_types.py --seed 2` pool 17): 66.42 s with 24 kept, 67.82 s with
# 8 (and 16), in 7.6 s of search against 4.7 s
_KEEP_ALL = 24


@dataclass(frozen=True, slots=True)
class _Group:
    """Outer choices shared by all meshes of a plan."""

    b: int
    cp: int
    recompute: str
    replicas: int
    microbatches: int


def _widths(cost: CostModel, model: ModelSpec, training: TrainingSpec, rc: ResourceClass, g: _Group,
            single_node: bool, memo: dict | None = None) -> list[MeshWidth]:
    """This class's stage widths for the group, each with its costable shapes. `memo` keeps what
    does not depend on the replica count (shapes, layer tables, decoder and receive times) and each
    memory limit, across groups."""
    memo = {} if memo is None else memo
    n_dec = model.num_layers
    capacity = st.memory_capacity_bytes(cost.knobs, rc.dev)
    key = (rc.index, g.b, g.cp, g.recompute)
    rows = _shape_rows(cost, model, training, rc, g, single_node, memo)
    # without ZeRO the bytes per parameter, and so every width, do not depend on the replica count
    whole = ("widths", key) if training.zero == 0 else None
    if whole is not None and whole in memo:
        return memo[whole]
    by_width: dict[int, list[tuple[StageShape, float, float, int]]] = {}
    for shape, table, dec, recv in rows:
        bpp = st.bytes_per_param(training.zero, st.weight_copies(g.replicas, shape.dp, shape.cp, 1))
        fit = (key, shape, bpp)
        if fit not in memo:
            memo[fit] = st.most_decoders(table, n_dec, bpp, capacity)
        by_width.setdefault(shape.gpus, []).append((shape, dec, recv, memo[fit]))
    out = []
    for width, found in sorted(by_width.items()):
        if max(r[3] for r in found) == 0:
            continue
        out.append(MeshWidth(rc.index, width, tuple(r[0] for r in found), min(r[1] for r in found),
                              min(r[2] for r in found), max(r[3] for r in found)))
    if whole is not None:
        memo[whole] = out
    return out


def _shape_rows(cost: CostModel, model: ModelSpec, training: TrainingSpec, rc: ResourceClass, g: _Group,
                single_node: bool, memo: dict) -> list[tuple[StageShape, object, float, float]]:
    """The class's costable shapes for the group's microbatch size, cp and recompute mode, each
    with its layer table, least decoder F+B and receive time (kept in `memo`: no replica count
    changes them)."""
    key = (rc.index, g.b, g.cp, g.recompute)
    if key not in memo:
        if (rc.index, g.b) not in memo:  # every cp and recompute mode filters the same shapes
            memo[(rc.index, g.b)] = stage_shapes(model, training, rc, g.b)
        rows = []
        for shape in memo[(rc.index, g.b)]:
            if shape.hp != 1 or shape.cp != g.cp or shape.recompute != g.recompute:
                continue
            try:
                table = cost.layer_table(rc.dev, Shard(shape.tp, shape.cp, 1, g.b // shape.dp, shape.recompute,
                                                       training.seq_len), model, training)
            except HetplanError:  # a strict measured profile lacks this point: leave the shape out
                continue
            dec = float(np.min((table.fwd_s + table.bwd_s)[1:model.num_layers + 1]))
            rows.append((shape, table, dec, st.recv_s(cost.knobs, rc.dev, table, single_node)))
        memo[key] = rows
    return memo[key]


def _speed_ceiling(cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
                   g: _Group, single_node: bool, memo: dict) -> float:
    """At least the speed `group_fluid_bound` sums for the group (each class's most stages of a
    width over the width's least decoder time, best width), without the memory check that drops
    a width no shape of which holds a decoder layer: a group it bounds at the cutoff is dropped
    before its widths' memory limits are computed (the same decoder times and stage counts as
    `_widths` and `_choices` give, over a superset of the widths)."""
    speed = 0.0
    for rc in classes:
        key = ("dec", rc.index, g.b, g.cp, g.recompute)
        if key not in memo:
            dec: dict[int, float] = {}
            for shape, _, d, _ in _shape_rows(cost, model, training, rc, g, single_node, memo):
                dec[shape.gpus] = min(dec.get(shape.gpus, math.inf), d)
            memo[key] = sorted(dec.items())
        speed += max((min(rc.gpus // (g.replicas * w), model.num_layers) / d for w, d in memo[key]
                      if rc.gpus // (g.replicas * w) >= 1), default=0.0)
    return speed


def _stage_counts(most: int, whole_nodes: int, thin: int) -> list[int]:
    """Stage counts 1..most, thinned: (1) halvings of `most` and counts filling whole nodes (every
    count filling whole nodes keeps the Megatron grid inside the space), (2) whole nodes and `most`,
    (3) `most` alone. `whole_nodes` is the stage count that fills one node (0: none does)."""
    if thin == 0:
        return list(range(1, most + 1))
    out = {most}
    if thin <= 2 and whole_nodes:
        out |= set(range(whole_nodes, most + 1, whole_nodes))
    p = most
    while thin == 1 and p >= 1:
        out.add(p)
        p //= 2
    return sorted(out)


def _choices(widths: list[list[MeshWidth]], classes: list[ResourceClass], g: _Group,
             n_dec: int) -> tuple[list[list[tuple[MeshWidth | None, int]]], bool]:
    """Per class: unused, or (width, stage count); thinned until the product is at most _COMBO_LIMIT.
    The flag says whether the Megatron grid may have been thinned away."""
    for thin in range(4):
        out = []
        for ws, rc in zip(widths, classes):
            row: list[tuple[MeshWidth | None, int]] = [(None, 0)]
            for w in ws:
                most = min(rc.gpus // (g.replicas * w.width), n_dec)
                per_stage = g.replicas * w.width
                node = rc.dev.gpus_per_node
                whole = node // math.gcd(node, per_stage)  # stages filling whole nodes
                row += [(w, p) for p in _stage_counts(most, whole, thin)] if most >= 1 else []
            out.append(row)
        if math.prod(len(r) for r in out) <= _COMBO_LIMIT:
            return out, thin > 2
    # still too many: keep per class the two widths with the fastest decoder layer
    for i, row in enumerate(out):
        keep = sorted({id(w): w for w, _ in row if w is not None}.values(), key=lambda w: (w.dec_s, w.width))[:2]
        out[i] = [(w, p) for w, p in row if w is None or w in keep]
    return out, True


def _orders(meshes: list[tuple[MeshWidth, int]], classes: list[ResourceClass],
            capacity: dict[int, float], swaps: bool = False) -> list[tuple[tuple[MeshWidth, int], ...]]:
    """Run orders tried: all up to `_PERMUTE_UPTO` classes, else file order and largest / smallest
    memory first, and with `swaps` also each of those with two neighbouring runs swapped.

    `flagscale_plans` asks for the swaps where there is no plan to beat (no cutoff: every chain is
    searched, its DP cap the larger `_MAX_DP`). Llama-2 70B at 64k tokens on 86 GPUs of six types
    (`many_types.py --seed 22` pool 24), where no pipeline of two runs fits: its best chain of
    five runs, RTX-4090 -> T4 -> A100 -> H100 -> H200, is smallest memory first with the first
    two swapped. Every order of up to six classes finds the same chain, but its 720 orders a
    combination used up the DP cap on a seven-type pool before the first chain that fits
    (`tests/test_beyond_coverage.py`)."""
    base = tuple(sorted(meshes, key=lambda x: x[0].cls))
    if len(base) <= _PERMUTE_UPTO:
        return list(itertools.permutations(base))
    by_mem = tuple(sorted(base, key=lambda x: (-capacity[x[0].cls], x[0].cls)))
    out = [base, by_mem, tuple(reversed(by_mem))]
    if swaps:
        out += [o[:i] + (o[i + 1], o[i]) + o[i + 2:] for o in out[:3] for i in range(len(o) - 1)]
    return list(dict.fromkeys(out))


def _masked(opts: StageOptions) -> StageOptions:
    """A FlagScale stage must hold a decoder layer: no embedding-only or head-only stage."""
    fb = opts.fb.copy()
    n = opts.num_layers
    fb[:, 0, 1] = math.inf
    fb[:, n - 1, n] = math.inf
    return StageOptions(fb, opts.tail, opts.mem_fixed, opts.act, opts.capacity)


def _masked_kind(opts: KindCellOptions) -> KindCellOptions:
    """`_masked` on the kind cells: [0, 1) is the first, [n - 1, n) the (2n - 1)-th
    (`uniform_layers.kind_cells`); expanded, the full tables masked."""
    fb = opts.fb.copy()
    n = opts.num_layers
    fb[:, 0] = math.inf
    fb[:, 2 * n - 2] = math.inf
    return KindCellOptions(fb, opts.tail, opts.mem_fixed, opts.act, opts.capacity, n,
                           lambda: _masked(opts.expanded()))


def _value(sp: Split, m: int) -> float:
    return sp.a_s + (m - 1) * sp.c_s + sp.e_s


def _place(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, classes: list[ResourceClass],
           g: _Group, order: tuple[tuple[MeshWidth, int], ...], split: Split) -> Plan:
    """Fill each class's GPUs in global rank order (stage, replica, stage devices)."""
    pools = {rc.index: [(n.name, i) for n in cluster.node_list if n.group in rc.groups for i in range(n.gpus)]
             for rc in classes}
    used = {rc.index: 0 for rc in classes}
    widths = [w for w, p in order for _ in range(p)]
    rows: list[list[Stage]] = [[] for _ in range(g.replicas)]
    for w, (first, last), o in zip(widths, split.ranges, split.options):
        shape = w.shapes[o]
        for r in range(g.replicas):
            devs = pools[w.cls][used[w.cls]:used[w.cls] + w.width]
            used[w.cls] += w.width
            rows[r].append(Stage(layers=(first, last), gpu=classes[w.cls].name, devices=compress_devices(devs),
                                 tp=shape.tp, cp=shape.cp, dp=shape.dp, recompute=shape.recompute))
    return Plan(model=model, training=training, micro_batch=g.b, schedule=training.schedule,
                pipelines=[Pipeline(microbatches=g.microbatches, stages=s) for s in rows])


def _classes_contiguous(cluster: ClusterSpec, classes: list[ResourceClass]) -> bool:
    """Each class's node groups form one run in the file (then file order is one of our run orders)."""
    owner = {gi: rc.index for rc in classes for gi in rc.groups}
    runs = [owner[gi] for gi in range(len(cluster.nodes)) if gi in owner]
    collapsed = [c for i, c in enumerate(runs) if i == 0 or runs[i - 1] != c]
    return len(collapsed) == len(set(collapsed))


def _groups(model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
            sizes: list[int]) -> list[_Group]:
    total = sum(rc.gpus for rc in classes)
    cps = sorted({s.cp for rc in classes for b in sizes for s in stage_shapes(model, training, rc, b)})
    out = []
    for b in sorted(set(sizes)):
        if training.global_batch % b:
            continue
        for cp in cps:
            for mode in training.recompute:
                for r in range(1, min(training.global_batch // b, total // cp) + 1):
                    if training.global_batch % (b * r) == 0:
                        out.append(_Group(b, cp, mode, r, training.global_batch // (b * r)))
    return out


def best_flagscale_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                        sizes: list[int], cutoff_s: float = math.inf,
                        max_dp: int = _MAX_DP, grid: bool = True) -> tuple[Plan, Prediction] | None:
    """The fastest FlagScale-expressible plan found (see module docstring), or None if none fits.
    `cutoff_s`: chains whose bound reaches it are pruned as if a plan that fast were known;
    `max_dp`: the most partition-DP runs; `grid`: False leaves out the Megatron grid it otherwise
    adds where the chains may miss it (the full search's chain candidate,
    `candidates.chain_candidate`, takes the most promising chains only, after its own grid)."""
    classes = resource_classes(cluster)
    if not classes:
        return None
    if training.schedule != "1f1b":  # the run DP optimises 1F1B; other schedules get the Megatron grid
        return _checked([best_megatron_plan(model, cluster, training, cost, sizes, cutoff_s=cutoff_s)], cluster)
    found, inexact = flagscale_plans(model, cluster, training, cost, sizes, cutoff_s, max_dp)
    if grid and (inexact or not _classes_contiguous(cluster, classes) or cluster.allow_cross_node_tp):
        # groups across nodes are only in the Megatron grid: it stays a candidate
        found.append(best_megatron_plan(model, cluster, training, cost, sizes, cutoff_s=cutoff_s))
    return _checked(found, cluster)


def flagscale_plans(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                    sizes: list[int], cutoff_s: float = math.inf, max_dp: int = _MAX_DP
                    ) -> tuple[list[tuple[Plan, Prediction] | None], bool]:
    """The chains `best_flagscale_plan` keeps (the `_KEEP` fastest found, `_KEEP_ALL` without a
    cutoff, fastest first), each
    placed and evaluated (None where the validator refuses it), and whether a cap was hit (then
    the best chain of the space may be missing). 1F1B only; FlagScale's emitter is not asked."""
    classes = resource_classes(cluster)
    n_dec, single = model.num_layers, cluster.single_node
    overhead = cost.knobs.step_overhead_s
    capacity = {rc.index: float(st.memory_capacity_bytes(cost.knobs, rc.dev)) for rc in classes}
    swaps = not math.isfinite(cutoff_s)  # nothing to beat: more run orders (`_orders`), more chains kept
    most_kept = _KEEP_ALL if swaps else _KEEP
    groups = _groups(model, training, classes, sizes)
    width_memo: dict = {}
    grids: list[tuple[list[list[tuple[MeshWidth | None, int]]], tuple[int, ...]]] = []
    lbs, gids, flats = [np.zeros(0)], [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    inexact = False
    for gi, g in enumerate(groups):
        if math.isfinite(cutoff_s):
            ceiling = _speed_ceiling(cost, model, training, classes, g, single, width_memo)
            if speed_bound(ceiling, n_dec, g.microbatches, overhead) >= cutoff_s:
                # no chain of the group can beat the cutoff (so none it might thin away could either)
                grids.append(([], ()))
                continue
        widths = [_widths(cost, model, training, rc, g, single, width_memo) for rc in classes]
        choices, thinned = _choices(widths, classes, g, n_dec)
        inexact |= thinned
        grids.append((choices, tuple(len(c) for c in choices)))
        if group_fluid_bound(choices, n_dec, g.microbatches, overhead) >= cutoff_s:
            continue  # every combination's bound is at least this: none would be kept
        # a combination bounded at the cutoff or above is never taken (the queue stops before
        # it): left out before sorting (64-GPU ladder pool: 1,331 of 1.15 million left)
        keep, lb = fluid_bounds_below(choices, n_dec, g.microbatches, overhead, cutoff_s)
        lbs.append(lb)
        gids.append(np.full(len(keep), gi, dtype=np.int64))
        flats.append(keep.astype(np.int64))
    lb0, gid0, flat0 = np.concatenate(lbs), np.concatenate(gids), np.concatenate(flats)
    queue0 = np.lexsort((flat0, gid0, lb0))
    heap: list[tuple[float, tuple[int, int, int], int, object]] = []
    cands: list[tuple[float, tuple[int, int, int], tuple, Split]] = []
    opts_cache: dict[tuple[int, int], StageOptions | KindCellOptions] = {}
    costings: dict[tuple, OptionCosting] = {}
    views: dict[tuple[int, int], UniformView | None] = {}
    tails_by_len: dict[tuple[int, int], np.ndarray] = {}
    dp_runs, ptr = 0, 0

    def incumbent() -> float:
        return min(cands[0][0] if cands else math.inf, cutoff_s)

    def record(value: float, tie: tuple[int, int, int], order: tuple, split: Split) -> None:
        cands.append((value, tie, order, split))
        cands.sort(key=lambda c: (c[0], c[1]))
        del cands[most_kept:]

    def options_of(gi: int, w: MeshWidth) -> StageOptions | KindCellOptions:
        """The width's stage options in the group: on the kind cells where its layers are
        identical (`OptionCosting.kind_options`: what the batched sweeps, the views and the tail
        floor read; the general DP expands them), costed from one `OptionCosting` per class,
        microbatch size and shapes (replica counts change only the tails)."""
        key = (gi, id(w))
        if key not in opts_cache:
            g = groups[gi]
            costing_key = (w.cls, g.b, w.shapes)
            if costing_key not in costings:
                ctx = OptionContext(model, training, g.b, g.replicas, g.replicas, single)
                costings[costing_key] = OptionCosting(cost, classes[w.cls], list(w.shapes), ctx)
            costing = costings[costing_key]
            opts_cache[key] = (_masked_kind(costing.kind_options(g.replicas, g.replicas)) if costing.uniform
                               else _masked(costing.options(g.replicas, g.replicas)))
        return opts_cache[key]

    def tail_floor(gi: int, meshes: list[tuple[MeshWidth, int]]) -> float:
        """A lower bound on the largest tail of any split (`least_largest_tail`)."""
        for w, _ in meshes:
            if (gi, id(w)) not in tails_by_len:
                tails_by_len[(gi, id(w))] = tails_by_length(options_of(gi, w))
        return least_largest_tail([(tails_by_len[(gi, id(w))], p) for w, p in meshes])

    def positions(gi: int, order: tuple) -> list[StageOptions]:
        return [full_options(options_of(gi, w)) for w, p in order for _ in range(p)]

    def frontiers(gi: int, orders: list[tuple]) -> list[tuple[list[Split], float | None]]:
        """Per run order, its (A, C) split frontier and least largest tail: all orders in one batched
        sweep (`solvers.batched_runs`, each stage holding at most the pipeline's m microbatches)
        when every mesh's layers are identical, else one general DP per order."""
        m = groups[gi].microbatches
        meshes = orders[0]
        for w, _ in meshes:
            if (gi, id(w)) not in views:
                views[(gi, id(w))] = uniform_view(options_of(gi, w))
        mine = {id(w): views[(gi, id(w))] for w, _ in meshes}
        if all(v is not None for v in mine.values()):
            rows = [tuple(x for w, p in order for x in (id(w), p)) for order in orders]
            tails = batched_min_max_tails(mine, rows, max_flight=m)
            # a row with no least tail has no memory-feasible split: no frontier to sweep
            fits = [row for row in rows if tails.get(row) is not None]
            found = batched_step_frontiers(mine, fits, m, max_flight=m, least_e=tails) if fits else {}
            return [(found.get(row, []), tails.get(row)) for row in rows]
        out = []
        for order in orders:
            pos = positions(gi, order)
            flight = min(m, len(pos))
            out.append((split_frontier(pos, max_in_flight=flight, with_tail=False), min_max_tail(pos, flight)))
        return out

    while True:
        k0 = float(lb0[queue0[ptr]]) if ptr < len(queue0) else math.inf
        kh = heap[0][0] if heap else math.inf
        if min(k0, kh) >= incumbent():
            break
        if dp_runs >= max_dp:
            inexact = True
            break
        if k0 < kh:  # refine a fluid bound into the integral one
            gi, flat = int(gid0[queue0[ptr]]), int(flat0[queue0[ptr]])
            ptr += 1
            choices, shape = grids[gi]
            picks = np.unravel_index(flat, shape)
            meshes = [choices[c][int(i)] for c, i in enumerate(picks) if choices[c][int(i)][0] is not None]
            lb1 = integral_bound(meshes, n_dec, groups[gi].microbatches, overhead)
            if lb1 < incumbent():
                heapq.heappush(heap, (lb1, (gi, flat, -1), 0, meshes))
            continue
        key, (gi, flat, oi), level, payload = heapq.heappop(heap)
        m = groups[gi].microbatches
        if level == 0:  # add the tail every split pays (sync and optimizer): chains queue by their whole step
            lb1 = key + tail_floor(gi, payload)
            if lb1 < incumbent():
                heapq.heappush(heap, (lb1, (gi, flat, -1), 1, payload))
        elif level == 1:  # every run order: DP without tail caps gives a plan and a tighter bound
            orders = _orders(payload, classes, capacity, swaps)
            for oi, (order, (front, e_min)) in enumerate(zip(orders, frontiers(gi, orders))):
                dp_runs += 1
                if not front:
                    continue
                best = min(front, key=lambda sp: (_value(sp, m), sp.ranges))
                record(_value(best, m) + overhead, (gi, flat, oi), order, best)
                lb2 = min(sp.a_s + (m - 1) * sp.c_s for sp in front) + (e_min or 0.0) + overhead
                if lb2 < incumbent():
                    heapq.heappush(heap, (lb2, (gi, flat, oi), 2, (order, e_min or 0.0, max(sp.e_s for sp in front))))
        else:  # the full (A, C, E) frontier: exact for this run order
            order, e_lo, e_hi = payload
            mine = {id(w): views.get((gi, id(w))) for w, _ in order}
            if tail_levels_bound(mine, order, m, e_lo, e_hi) + overhead >= incumbent():
                continue
            pos = positions(gi, order)
            best = least_step_split(pos, m, max_in_flight=min(m, len(pos)))
            dp_runs += 1
            if best is not None:
                record(_value(best, m) + overhead, (gi, flat, oi), order, best)
    found = [_evaluated(_place(model, training, cluster, classes, groups[tie[0]], order, split), cluster, cost)
             for _, tie, order, split in cands]
    return found, inexact


def _evaluated(plan: Plan, cluster: ClusterSpec, cost: CostModel) -> tuple[Plan, Prediction] | None:
    try:
        return plan, evaluate(plan, cluster, cost)
    except HetplanError:  # a rule the search did not pre-check (the validator has the last word)
        return None


def _checked(found: list[tuple[Plan, Prediction] | None], cluster: ClusterSpec) -> tuple[Plan, Prediction] | None:
    """The fastest of `found` that FlagScale's emitter accepts (first of equals)."""
    best = None
    for item in found:
        if item is None or (best is not None and item[1].step_s >= best[1].step_s):
            continue
        try:
            hetero_section(item[0], cluster)
        except HetplanError:
            continue
        best = item
    return best
