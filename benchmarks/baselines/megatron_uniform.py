"""The Megatron-uniform baseline: how people plan a mixed pool by hand.

One (tp, pp, dp, microbatch) grid laid over the pool's GPUs in Megatron rank order (tp fastest, then
dp, pp outermost; ranks walk the node list in file order), an even layer split, the same microbatch
count for every replica and one recompute mode for every stage. On a mixed pool stage p of a replica
lands on whatever GPU type its ranks fall on, so a pipeline may change type from stage to stage; a
grid whose tp group would straddle two nodes (hence possibly two types) is skipped. Grids may use a
prefix of the ranks (the rest stays idle), which is how a pool whose size the grid does not divide is
run in practice. A candidate that could win is scored by the one evaluator and checked with the plan
validator (memory included), so baseline and search are compared under the same cost model.

The baseline honours the TrainingSpec's limits (max_tp, allowed microbatch sizes and recompute modes)
so that it never leaves the space the search is asked to cover.

Speed, without leaving the space or changing the answer (the result is the grid with the least key
(step, GPUs, tp, pp, microbatch, recompute); no two grids share a key, so the order grids are looked
at in cannot change it):
  * memory first: every grid's stage memory is computed from the cost model's layer tables with the
    `costmodel.stage` terms the validator's memory rule uses, once per (stage, device class) instead
    of once per replica, so a grid that overflows anywhere is dropped before its plan is built;
  * a predicted step per surviving grid, from the same stage terms the evaluator sums, over distinct
    pipelines only (replicas whose stages fall on the same node groups have the same times);
  * best first: grids are taken in order of that prediction less a 1e-9 relative slack (a lower bound
    on the evaluator's step even if summation order differed); each is built, scored with
    `evaluate(check=False)` and validated only if it would beat the best so far, and the loop stops
    at the first grid whose bound cannot beat the best (as `common.rank_valid` does per candidate);
  * the tp-groups-inside-nodes rule is one comparison per grid (`_fit_limit`).

Recompute (read from planner/costmodel): under one grid the analytic model gives every recompute mode
the same forward times, parameters and stage-boundary bytes, and a backward that only grows (selective
adds a quarter of the element-wise time, plus the attention core without flash; full adds the whole
forward). So every stage's F and B are no smaller than with "none", and with the packaged
dp_overlap = 0 its gradient sync and optimizer tail are unchanged: when "none" fits in memory,
selective and full cannot beat it (equal steps go to "none" by the key). That is not a rule for every
cost model: with dp_overlap > 0 a longer backward hides more of the gradient sync (`stage_tail_s`), so
the tail shrinks, by at most dp_overlap x that stage's extra backward, which its own pipeline's time
more than pays; but on a mixed pool the pipeline that sets the tail need not be the one that sets the
pipeline time, so "none" is no longer provably best. Measured profiles need not order the modes at
all. So no mode is skipped by rule: each mode's predicted step places it in the best-first order, and
a mode slower than the winner is never built.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

from benchmarks.baselines.common import DEFAULT_MICRO_BATCHES, RECOMPUTE_ORDER
from planner.costmodel import stage as st
from planner.costmodel.base import (
    CostModel,
    DeviceClass,
    LayerTable,
    Shard,
    device_class_of,
)
from planner.evaluate import evaluate
from planner.plan import Pipeline, Plan, Prediction, Stage, compress_devices
from planner.search.space import powers_of_two_upto
from planner.specs.cluster import ClusterSpec, Node
from planner.specs.gpus import resolve_gpu_name
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from planner.uniform import even_layer_split
from planner.validate import violations

__all__ = ["DEFAULT_MICRO_BATCHES", "RECOMPUTE_ORDER", "Grid", "best_uniform_plan", "grid_plan",
           "grid_step_s", "grids"]

BOUND_SLACK = 1e-9  # relative: the predicted step less this is a lower bound on the evaluator's step


@dataclass(frozen=True, slots=True)
class Memo:
    """Terms shared by many grids of one search: layer tables with their prefix sums by (device class,
    shard), and (gradient sync, optimizer) by (device class, parameters per GPU, tp, weight copies),
    which do not depend on the microbatch or recompute mode. Same arguments, same floats."""

    tables: dict[tuple[DeviceClass, Shard], tuple[LayerTable, st.StageSums]] = field(default_factory=dict)
    tails: dict[tuple[DeviceClass, float, int, int], tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Grid:
    """One Megatron grid: the knobs a user would pass on the command line."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    recompute: str

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True, slots=True)
class _Run:
    """Ranks [start, end) on consecutive nodes of one device class (what the evaluator costs by)."""

    start: int
    end: int
    dev: DeviceClass


def _ranks(nodes: list[Node]) -> list[tuple[Node, int]]:
    """Global rank -> (node, local GPU index), walking nodes in file order."""
    return [(node, i) for node in nodes for i in range(node.gpus)]


def _groups_fit(ranks: list[tuple[Node, int]], tp: int, used: int) -> bool:
    """Every tp group of the first `used` ranks sits inside one node and tp divides that node's size."""
    for start in range(0, used, tp):
        node = ranks[start][0]
        if node.gpus % tp or any(ranks[r][0] is not node for r in range(start, start + tp)):
            return False
    return True


def _fit_limit(ranks: list[tuple[Node, int]], tp: int) -> int:
    """Ranks before the first node whose size tp does not divide. For `used` a multiple of tp,
    `_groups_fit(ranks, tp, used)` holds exactly when used <= this: nodes up to there start at
    multiples of tp, so no group straddles one, and a group that reaches a node tp does not divide
    either starts in it (its size fails) or straddles into it."""
    r = 0
    while r < len(ranks):
        node = ranks[r][0]
        if node.gpus % tp:
            break
        r += node.gpus
    return r


def grids(model: ModelSpec, training: TrainingSpec, ranks: list[tuple[Node, int]]) -> Iterator[Grid]:
    """Every grid whose tp groups fit in nodes and whose batch divides evenly, in a fixed order."""
    total = len(ranks)
    node_max = max((node.gpus for node, _ in ranks), default=0)
    micro = sorted(set(training.micro_batches or DEFAULT_MICRO_BATCHES))
    modes = [m for m in RECOMPUTE_ORDER if m in training.recompute]
    for tp in powers_of_two_upto(min(training.max_tp, node_max)):
        if model.num_heads % tp or model.kv_heads % tp or model.ffn_hidden % tp:
            continue
        limit = _fit_limit(ranks, tp)
        for pp in range(1, model.num_layers + 1):
            for dp in range(1, min(total, limit) // (tp * pp) + 1):
                for mb in micro:
                    if training.global_batch % (mb * dp):
                        continue
                    for mode in modes:
                        yield Grid(tp, pp, dp, mb, mode)


def grid_plan(model: ModelSpec, training: TrainingSpec, ranks: list[tuple[Node, int]], grid: Grid) -> Plan:
    """The plan of one grid: rank of (stage p, replica d, tp slot t) = p·dp·tp + d·tp + t."""
    split = even_layer_split(model, grid.pp)
    per_replica = training.global_batch // (grid.micro_batch * grid.dp)
    pipelines = []
    for d in range(grid.dp):
        stages = []
        for p, layers in enumerate(split):
            first = p * grid.dp * grid.tp + d * grid.tp
            members = ranks[first:first + grid.tp]
            devs = [(node.name, i) for node, i in members]
            stages.append(Stage(layers=layers, gpu=members[0][0].gpu, devices=compress_devices(devs),
                                tp=grid.tp, recompute=grid.recompute))
        pipelines.append(Pipeline(microbatches=per_replica, stages=stages))
    return Plan(model=model, training=training, micro_batch=grid.micro_batch, schedule=training.schedule,
                pipelines=pipelines)


def _runs(cluster: ClusterSpec, nodes: list[Node]) -> list[_Run]:
    """The rank line cut where the device class changes (a stage is costed by its first GPU's group)."""
    out: list[_Run] = []
    rank = 0
    for node in nodes:
        dev = device_class_of(cluster.nodes[node.group])
        if out and out[-1].dev == dev:
            out[-1] = _Run(out[-1].start, rank + node.gpus, dev)
        else:
            out.append(_Run(rank, rank + node.gpus, dev))
        rank += node.gpus
    return out


def _table(memo: Memo, cost: CostModel, dev: DeviceClass, shard: Shard, model: ModelSpec,
           training: TrainingSpec) -> tuple[LayerTable, st.StageSums]:
    key = (dev, shard)
    if key not in memo.tables:
        table = cost.layer_table(dev, shard, model, training)
        memo.tables[key] = (table, st.StageSums.of(table))
    return memo.tables[key]


def grid_step_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
                runs: list[_Run], grid: Grid, memo: Memo) -> float | None:
    """The evaluator's step time for `grid_plan`'s plan, computed per (stage, device class) and per
    distinct pipeline without building the plan; None when a stage overflows memory (the validator's
    memory rule, same terms). Every term is the `costmodel.stage` call `evaluate` makes."""
    knobs, single, zero = cost.knobs, cluster.single_node, training.zero
    split = even_layer_split(model, grid.pp)
    m = training.global_batch // (grid.micro_batch * grid.dp)
    copies = st.weight_copies(grid.dp, 1, 1, 1)
    shard = Shard(grid.tp, 1, 1, grid.micro_batch, grid.recompute, training.seq_len)
    width = grid.dp * grid.tp  # ranks of one stage over all replicas
    starts = [run.start for run in runs]
    # the runs each stage's ranks touch: every one holds some replica's stage start (runs are cut at
    # node boundaries, which are multiples of tp wherever a grid fits)
    cells = [(p, k) for p in range(grid.pp)
             for k in range(bisect_right(starts, p * width) - 1, bisect_right(starts, (p + 1) * width - 1))]
    per_run = {k: _table(memo, cost, runs[k].dev, shard, model, training) for k in {k for _, k in cells}}
    for p, k in cells:  # memory first: most grids that fail, fail here
        (table, sums), (first, last) = per_run[k], split[p]
        flight = st.in_flight(training.schedule, grid.pp, p, m)
        if st.stage_memory_bytes(table, sums, first, last, flight, zero, copies) > \
                st.memory_capacity_bytes(knobs, runs[k].dev):
            return None
    recv = {k: st.recv_s(knobs, runs[k].dev, table, single) for k, (table, _) in per_run.items()}
    per_stage: list[dict[int, tuple[float, float, float]]] = [{} for _ in range(grid.pp)]
    for p, k in cells:  # (F, B, tail) as evaluate sums them
        (_, sums), (first, last), dev = per_run[k], split[p], runs[k].dev
        f, b = sums.fwd_s(first, last), sums.bwd_s(first, last)
        if p > 0:
            f += recv[k]
        if p < grid.pp - 1:
            b += recv[k]
        params = sums.params(first, last)
        key = (dev, params, grid.tp, copies)
        if key not in memo.tails:
            memo.tails[key] = (st.grad_sync_s(knobs, dev, params, grid.tp, copies, zero, single),
                               st.optimizer_s(knobs, dev, params, zero, copies))
        sync, opt = memo.tails[key]
        per_stage[p][k] = (f, b, st.stage_tail_s(knobs, b, sync, opt))
    # replicas change pipeline only where some stage's start rank crosses into another run
    breaks = {0}
    for p in range(grid.pp):
        for s in starts:
            if p * width < s < (p + 1) * width:
                breaks.add(-(-(s - p * width) // grid.tp))
    signatures = {tuple(bisect_right(starts, p * width + d * grid.tp) - 1 for p in range(grid.pp))
                  for d in breaks}
    pipe_s, tail_s = [], []
    for sig in sorted(signatures):
        rows = [per_stage[p][k] for p, k in enumerate(sig)]
        pipe_s.append(st.pipeline_time_s(training.schedule, [r[0] for r in rows], [r[1] for r in rows], m))
        tail_s.append(max(r[2] for r in rows))
    return max(pipe_s) + max(tail_s) + knobs.step_overhead_s


def _key(grid: Grid, step_s: float, most_gpus: bool) -> tuple:
    """What the baseline minimises: (most GPUs first if asked), step, then fewer GPUs, tp, pp, micro, mode."""
    return (-grid.gpus if most_gpus else 0, step_s, grid.gpus, grid.tp, grid.pp, grid.micro_batch,
            RECOMPUTE_ORDER.index(grid.recompute))


def _best_on(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
             nodes: list[Node], most_gpus: bool) -> tuple[Plan, Prediction] | None:
    ranks, runs = _ranks(nodes), _runs(cluster, nodes)
    memo = Memo()
    bounds = []
    for grid in grids(model, training, ranks):
        step = grid_step_s(model, cluster, training, cost, runs, grid, memo)
        if step is not None:
            bounds.append((_key(grid, step * (1 - BOUND_SLACK), most_gpus), grid))
    bounds.sort(key=lambda b: b[0])
    best: tuple[tuple, Plan, Prediction] | None = None
    for bound, grid in bounds:
        if best is not None and bound > best[0]:
            break  # every later grid's key is at least its bound, hence worse than the best
        plan = grid_plan(model, training, ranks, grid)
        pred = evaluate(plan, cluster, cost, check=False)
        key = _key(grid, pred.step_s, most_gpus)
        if (best is None or key < best[0]) and not violations(plan, cluster, cost):
            best = (key, plan, pred)
    if best is None:
        return None
    return best[1].model_copy(update={"predicted": best[2]}), best[2]


def best_uniform_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel, *,
                      single_type: str | None = None, most_gpus: bool = False) -> tuple[Plan, Prediction] | None:
    """Fastest valid Megatron-uniform plan, or None when no grid fits.

    single_type None: one grid over the whole pool; a GPU name: only that type's nodes (None if the
    pool has none); "each": the best over every single type of the pool. By default a grid may use any
    prefix of the ranks (the strongest baseline); `most_gpus` keeps only the valid grids that use the
    most GPUs, as someone who insists on running the whole pool would."""
    if single_type == "each":
        found = [best_uniform_plan(model, cluster, training, cost, single_type=gpu, most_gpus=most_gpus)
                 for gpu in sorted(cluster.counts_by_type())]
        found = [f for f in found if f is not None]
        return min(found, key=lambda f: (f[1].step_s, f[0].num_gpus)) if found else None
    nodes = list(cluster.node_list)
    if single_type is not None:
        gpu = resolve_gpu_name(single_type, "single_type")
        nodes = [n for n in nodes if n.gpu == gpu]
    if not nodes:
        return None
    return _best_on(model, cluster, training, cost, nodes, most_gpus)
