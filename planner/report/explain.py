"""Why a plan is what it is: its bottleneck, memory headroom per stage, idle GPUs, and what-ifs.

The what-ifs answer "what would change the answer": the search is re-run on the same inputs, with one
more node of each GPU type, and with twice the global batch. Every what-if keeps the plan's microbatch
size (so it isolates the one change and stays fast) and gets the same short time limit; a what-if that
finishes inside its limit is deterministic, one that does not says `timed_out` (its numbers are the best
found so far and may vary between runs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import CostModel
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.plan import Plan, Prediction, compress_devices, expand_devices
from planner.specs.cluster import ClusterSpec
from planner.specs.training import TrainingSpec

WHAT_IF_TIME_LIMIT_S = 10.0


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """What bounds the step: the slowest pipeline's slowest stage, or the gradient-sync/optimizer tail.
    step = pipeline_s + tail_s + overhead_s (the fixed overhead is the same for every plan)."""

    kind: str  # "stage" or "tail"
    pipeline: int
    stage: int
    gpu: str
    layers: tuple[int, int]
    stage_fb_s: float  # F + B per microbatch of that stage
    pipeline_s: float
    steady_share: float  # m * (F + B) of that stage / its pipeline time: 1 = no fill/drain cost
    tail_s: float
    overhead_s: float
    text: str


@dataclass(frozen=True, slots=True)
class PipelineUse:
    pipeline: int
    stages: int
    microbatches: int
    time_s: float
    bubble_fraction: float  # idle share of the pipeline's stage-time (closed form)


@dataclass(frozen=True, slots=True)
class StageMemory:
    pipeline: int
    stage: int
    gpu: str
    used_bytes: int
    capacity_bytes: int
    headroom_bytes: int
    headroom_fraction: float


@dataclass(frozen=True, slots=True)
class WhatIf:
    name: str
    change: str
    step_s: float | None
    tokens_per_s: float | None
    step_change: float | None  # step_s / plan step - 1
    tokens_per_s_change: float | None  # tokens_per_s / plan tokens_per_s - 1
    num_gpus: int | None
    pipelines: int | None
    timed_out: bool
    error: str | None


@dataclass(frozen=True, slots=True)
class Explanation:
    prediction: Prediction
    num_gpus: int
    bottleneck: Bottleneck
    pipelines: tuple[PipelineUse, ...]
    memory: tuple[StageMemory, ...]
    idle_by_type: dict[str, int]
    idle_devices: tuple[str, ...]
    what_if: tuple[WhatIf, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["prediction"] = self.prediction.model_dump(mode="json")
        return out


def _bottleneck(plan: Plan, pred: Prediction) -> Bottleneck:
    pi = max(range(len(plan.pipelines)), key=lambda i: (pred.pipeline_s[i], -i))
    rows = [p for p in pred.per_stage if p.pipeline == pi]
    sp = max(rows, key=lambda p: (p.fwd_s + p.bwd_s, -p.stage))
    stage = plan.pipelines[pi].stages[sp.stage]
    fb = sp.fwd_s + sp.bwd_s
    t = pred.pipeline_s[pi]
    share = plan.pipelines[pi].microbatches * fb / t if t > 0 else 0.0
    kind = "stage" if t >= pred.tail_s else "tail"
    return Bottleneck(kind, pi, sp.stage, stage.gpu, (stage.layers[0], stage.layers[1]), fb, t, share,
                      pred.tail_s, pred.overhead_s, pred.bottleneck)


def _pipeline_use(plan: Plan, pred: Prediction) -> tuple[PipelineUse, ...]:
    out = []
    for pi, pipe in enumerate(plan.pipelines):
        rows = [p for p in pred.per_stage if p.pipeline == pi]
        busy = pipe.microbatches * sum(p.fwd_s + p.bwd_s for p in rows)
        span = len(rows) * pred.pipeline_s[pi]
        out.append(PipelineUse(pi, len(pipe.stages), pipe.microbatches, pred.pipeline_s[pi],
                               max(0.0, 1 - busy / span) if span > 0 else 0.0))
    return tuple(out)


def _memory(pred: Prediction) -> tuple[StageMemory, ...]:
    return tuple(StageMemory(p.pipeline, p.stage, p.gpu, p.memory_bytes, p.memory_capacity_bytes,
                             p.memory_capacity_bytes - p.memory_bytes,
                             (p.memory_capacity_bytes - p.memory_bytes) / p.memory_capacity_bytes)
                 for p in pred.per_stage)


def idle_gpus(plan: Plan, cluster: ClusterSpec) -> tuple[dict[str, int], tuple[str, ...]]:
    """GPUs of the cluster the plan leaves unused: counts per type and device ranges."""
    used = {d for p in plan.pipelines for s in p.stages for d in expand_devices(s.devices)}
    free = [(n.name, i) for n in cluster.node_list for i in range(n.gpus) if (n.name, i) not in used]
    by_type: dict[str, int] = {}
    for node_name, _ in free:
        gpu = cluster.node(node_name).gpu
        by_type[gpu] = by_type.get(gpu, 0) + 1
    return dict(sorted(by_type.items())), tuple(compress_devices(free))


def with_extra_node(cluster: ClusterSpec, gpu: str) -> ClusterSpec:
    """The cluster with one more node in the first node group of GPU type `gpu`."""
    data = cluster.model_dump()
    for group in data["nodes"]:
        if group["gpu"] == gpu:
            group["nodes"] += 1
            return ClusterSpec.model_validate(data)
    raise HetplanError("gpu", f"the cluster has no {gpu} nodes")


def what_if_inputs(plan: Plan, cluster: ClusterSpec) -> list[tuple[str, str, ClusterSpec, TrainingSpec]]:
    """(name, change, cluster, training) of each what-if, in a fixed order."""
    training = plan.training.model_copy(update={"micro_batches": (plan.micro_batch,)})
    out = [("re-search", "same cluster and batch: is there a faster plan?", cluster, training)]
    for gpu in sorted(cluster.counts_by_type()):
        group = next(g for g in cluster.nodes if g.gpu == gpu)
        out.append((f"+1 {gpu} node", f"one more node of {group.node_gpus} x {gpu}",
                    with_extra_node(cluster, gpu), training))
    double = training.model_copy(update={"global_batch": 2 * training.global_batch})
    out.append(("2x global batch", f"global batch {training.global_batch} -> {double.global_batch}",
                cluster, double))
    return out


def run_what_ifs(plan: Plan, cluster: ClusterSpec, cost: CostModel, pred: Prediction,
                 time_limit: float = WHAT_IF_TIME_LIMIT_S) -> tuple[WhatIf, ...]:
    """Re-run the search for each what-if and compare its predicted step with the plan's."""
    from planner.search import search

    out = []
    for name, change, c, training in what_if_inputs(plan, cluster):
        try:
            res = search(plan.model, c, training, cost=cost, time_limit=time_limit)
        except HetplanError as exc:
            out.append(WhatIf(name, change, None, None, None, None, None, None, False, f"{exc.field}: {exc.reason}"))
            continue
        p = res.prediction
        out.append(WhatIf(name, change, p.step_s, p.tokens_per_s, p.step_s / pred.step_s - 1,
                          p.tokens_per_s / pred.tokens_per_s - 1, res.plan.num_gpus, len(res.plan.pipelines),
                          res.timed_out, None))
    return tuple(out)


def explain(plan: Plan, cluster: ClusterSpec, cost: CostModel | None = None, *, what_if: bool = True,
            time_limit: float = WHAT_IF_TIME_LIMIT_S, search_cost: CostModel | None = None) -> Explanation:
    """Explain a valid plan on `cluster` (raises HetplanError for an invalid one). `search_cost` (default:
    `cost`) scores the what-ifs, so a profile model's fallback list can be kept to the plan's own layers."""
    cost = cost or AnalyticCostModel()
    pred = evaluate(plan, cluster, cost)
    by_type, devices = idle_gpus(plan, cluster)
    return Explanation(pred, plan.num_gpus, _bottleneck(plan, pred), _pipeline_use(plan, pred), _memory(pred),
                       by_type, devices, run_what_ifs(plan, cluster, search_cost or cost, pred, time_limit) if what_if else ())
