"""The Megatron-uniform baseline: how people plan a mixed pool by hand.

One (tp, pp, dp, microbatch) grid laid over the pool's GPUs in Megatron rank order (tp fastest, then
dp, pp outermost; ranks walk the node list in file order), an even layer split, the same microbatch
count for every replica and one recompute mode for every stage. On a mixed pool stage p of a replica
lands on whatever GPU type its ranks fall on, so a pipeline may change type from stage to stage; a
grid whose tp group would straddle two nodes (hence possibly two types) is skipped. Grids may use a
prefix of the ranks (the rest stays idle), which is how a pool whose size the grid does not divide is
run in practice. Every candidate is checked with the plan validator (memory included) and scored by
the one evaluator, so baseline and search are compared under the same cost model.

The baseline honours the TrainingSpec's limits (max_tp, allowed microbatch sizes and recompute modes)
so that it never leaves the space the search is asked to cover.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from planner.costmodel.base import CostModel
from planner.evaluate import evaluate
from planner.plan import Pipeline, Plan, Prediction, Stage, compress_devices
from planner.search.space import powers_of_two_upto
from planner.specs.cluster import ClusterSpec, Node
from planner.specs.gpus import resolve_gpu_name
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from planner.uniform import even_layer_split
from planner.validate import violations

DEFAULT_MICRO_BATCHES = (1, 2, 4, 8, 16)
RECOMPUTE_ORDER = ("none", "selective", "full")


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


def grids(model: ModelSpec, training: TrainingSpec, ranks: list[tuple[Node, int]]) -> Iterator[Grid]:
    """Every grid whose tp groups fit in nodes and whose batch divides evenly, in a fixed order."""
    total = len(ranks)
    node_max = max((node.gpus for node, _ in ranks), default=0)
    micro = sorted(set(training.micro_batches or DEFAULT_MICRO_BATCHES))
    modes = [m for m in RECOMPUTE_ORDER if m in training.recompute]
    for tp in powers_of_two_upto(min(training.max_tp, node_max)):
        if model.num_heads % tp or model.kv_heads % tp or model.ffn_hidden % tp:
            continue
        for pp in range(1, model.num_layers + 1):
            for dp in range(1, total // (tp * pp) + 1):
                if not _groups_fit(ranks, tp, tp * pp * dp):
                    continue
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


def _best_on(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel,
             nodes: list[Node], most_gpus: bool) -> tuple[Plan, Prediction] | None:
    ranks = _ranks(nodes)
    best: tuple[tuple, Plan, Prediction] | None = None
    for grid in grids(model, training, ranks):
        plan = grid_plan(model, training, ranks, grid)
        if violations(plan, cluster, cost):
            continue
        pred = evaluate(plan, cluster, cost, check=False)
        key = (-grid.gpus if most_gpus else 0, pred.step_s, grid.gpus, grid.tp, grid.pp, grid.micro_batch,
               RECOMPUTE_ORDER.index(grid.recompute))
        if best is None or key < best[0]:
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
