"""The one evaluator: closed-form step time, memory and per-stage breakdown of any valid plan.

Step time = max over pipelines of the pipeline time (1F1B or GPipe closed form of
`costmodel.stage`) + the largest tail (exposed gradient sync + optimizer step) + fixed overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.costmodel import stage as st
from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import CostModel, DeviceClass, LayerTable, Shard, device_class_of
from planner.costmodel.knobs import Knobs
from planner.costmodel.shapes import model_flops_per_sequence
from planner.errors import HetplanError, InfeasibleError
from planner.plan import Plan, Prediction, Stage, StagePrediction, expand_devices
from planner.specs.cluster import ClusterSpec


@dataclass(frozen=True, slots=True)
class StageCost:
    dev: DeviceClass
    table: LayerTable
    sums: st.StageSums
    first: int
    last: int


def stage_device_class(cluster: ClusterSpec, stage: Stage, by_group: dict[int, DeviceClass] | None = None
                       ) -> DeviceClass:
    """The device class of the node group the stage's first device is on (`by_group`: the classes
    found so far, by node group)."""
    node_name, _ = expand_devices(stage.devices[:1])[0]
    group = cluster.node(node_name).group
    if by_group is None:
        return device_class_of(cluster.nodes[group])
    if group not in by_group:
        by_group[group] = device_class_of(cluster.nodes[group])
    return by_group[group]


def stage_shard(plan: Plan, stage: Stage) -> Shard:
    return Shard(stage.tp, stage.cp, stage.hp, plan.micro_batch // stage.dp, stage.recompute,
                 plan.training.seq_len)


def stage_costs(plan: Plan, cluster: ClusterSpec, cost: CostModel) -> list[list[StageCost]]:
    """Per pipeline and stage, its device class, layer table and prefix sums. A plan for thousands
    of GPUs repeats a few stages hundreds of times on as many nodes: the class is built once per
    node group (a stage lies on one node class) and the sums once per table."""
    out = []
    devs: dict[int, DeviceClass] = {}
    sums: dict[int, tuple[LayerTable, st.StageSums]] = {}  # by table identity; the table is kept alive
    for pipe in plan.pipelines:
        row = []
        for stage in pipe.stages:
            dev = stage_device_class(cluster, stage, devs)
            table = cost.layer_table(dev, stage_shard(plan, stage), plan.model, plan.training)
            if id(table) not in sums:
                sums[id(table)] = (table, st.StageSums.of(table))
            row.append(StageCost(dev, table, sums[id(table)][1], stage.layers[0], stage.layers[1]))
        out.append(row)
    return out


def stage_memory_report(plan: Plan, cluster: ClusterSpec,
                        cost: CostModel) -> list[tuple[int, int, str, float, int]]:
    """(pipeline, stage, gpu, bytes needed, bytes usable) for every stage."""
    replicas = len(plan.pipelines)
    out = []
    for pi, (pipe, costs) in enumerate(zip(plan.pipelines, stage_costs(plan, cluster, cost))):
        n = len(pipe.stages)
        for si, (stage, sc) in enumerate(zip(pipe.stages, costs)):
            flight = st.in_flight(plan.schedule, n, si, pipe.microbatches)
            need = st.stage_memory_bytes(sc.table, sc.sums, sc.first, sc.last, flight, plan.training.zero,
                                         st.weight_copies(replicas, stage.dp, stage.cp, stage.hp))
            out.append((pi, si, stage.gpu, need, st.memory_capacity_bytes(cost.knobs, sc.dev)))
    return out


def _stage_numbers(plan: Plan, stage: Stage, sc: StageCost, si: int, n: int, microbatches: int,
                   replicas: int, knobs: Knobs, single: bool) -> tuple:
    """(forward, backward, gradient sync, optimizer, memory, measured flags) of one stage."""
    f = sc.sums.fwd_s(sc.first, sc.last)
    b = sc.sums.bwd_s(sc.first, sc.last)
    recv = st.recv_s(knobs, sc.dev, sc.table, single)
    if si > 0:
        f += recv
    if si < n - 1:
        b += recv
    params = sc.sums.params(sc.first, sc.last)
    copies = st.weight_copies(replicas, stage.dp, stage.cp, stage.hp)
    sync_s = st.grad_sync_s(knobs, sc.dev, params, stage.tp, copies, plan.training.zero, single)
    opt_s = st.optimizer_s(knobs, sc.dev, params, plan.training.zero, copies)
    flight = st.in_flight(plan.schedule, n, si, microbatches)
    mem = st.stage_memory_bytes(sc.table, sc.sums, sc.first, sc.last, flight, plan.training.zero, copies)
    flags = tuple(bool(x) for x in sc.table.measured[sc.first:sc.last + 1])
    return f, b, sync_s, opt_s, mem, flags


def evaluate(plan: Plan, cluster: ClusterSpec, cost: CostModel | None = None, *,
             check: bool = True) -> Prediction:
    """Score a plan. With `check`, an invalid plan (memory included) raises instead of being scored."""
    cost = cost or AnalyticCostModel()
    if check:  # every rule but memory here; memory below, from the numbers the score needs anyway
        from planner.validate import memory_violation, validate

        validate(plan, cluster)
    knobs = cost.knobs
    replicas = len(plan.pipelines)
    single = cluster.single_node
    pipe_times, tails, per_stage = [], [], []
    worst = (-1.0, "")
    measured_by_gpu: dict[str, set[bool]] = {}
    seen: dict[tuple, tuple] = {}  # a stage's numbers by what they depend on (copies repeat stages)
    for pi, (pipe, costs) in enumerate(zip(plan.pipelines, stage_costs(plan, cluster, cost))):
        fwd, bwd, sync, opt = [], [], [], []
        n = len(costs)
        for si, (stage, sc) in enumerate(zip(pipe.stages, costs)):
            key = (id(sc.table), sc.dev.key, sc.first, sc.last, stage.tp, stage.cp, stage.hp, stage.dp,
                   si, n, pipe.microbatches)
            if key not in seen:
                seen[key] = _stage_numbers(plan, stage, sc, si, n, pipe.microbatches, replicas, knobs, single)
            f, b, sync_s, opt_s, mem, flags = seen[key]
            capacity = st.memory_capacity_bytes(knobs, sc.dev)
            if check:
                broken = memory_violation(pi, si, stage.gpu, mem, capacity)
                if broken is not None:
                    raise HetplanError(broken.where, f"{broken.reason} [{broken.rule}]")
            measured = all(flags)
            measured_by_gpu.setdefault(stage.gpu, set()).update(flags)
            fwd.append(f)
            bwd.append(b)
            sync.append(sync_s)
            opt.append(opt_s)
            per_stage.append(StagePrediction(
                pipeline=pi, stage=si, gpu=stage.gpu, fwd_s=f, bwd_s=b, memory_bytes=int(mem),
                memory_capacity_bytes=capacity, grad_sync_s=sync_s,
                measured=measured))
        t = st.pipeline_time_s(plan.schedule, fwd, bwd, pipe.microbatches)
        pipe_times.append(t)
        tails.append(max(st.stage_tail_s(knobs, b, y, o) for b, y, o in zip(bwd, sync, opt)))
        si_max = max(range(n), key=lambda i: fwd[i] + bwd[i])
        if t > worst[0]:
            worst = (t, f"pipeline {pi} stage {si_max} ({pipe.stages[si_max].gpu}, layers "
                        f"{pipe.stages[si_max].layers[0]}-{pipe.stages[si_max].layers[1]}): "
                        f"F+B {1e3 * (fwd[si_max] + bwd[si_max]):.2f} ms per microbatch")
    if not pipe_times:
        raise InfeasibleError("pipelines", "a plan needs at least one pipeline")
    tail = max(tails)
    step = max(pipe_times) + tail + knobs.step_overhead_s
    tokens = plan.training.global_batch * plan.training.seq_len
    flops = model_flops_per_sequence(plan.model, plan.training.seq_len) * plan.training.global_batch
    gpus = [(s.gpu, s.num_gpus) for p in plan.pipelines for s in p.stages]
    from planner.specs.gpus import get_gpu

    peak = sum(get_gpu(g).peak_flops(plan.training.dtype) * k for g, k in gpus)
    num_gpus = sum(k for _, k in gpus)
    sources = {g: ("measured" if v == {True} else "modelled" if v == {False} else "mixed")
               for g, v in sorted(measured_by_gpu.items())}
    return Prediction(
        step_s=step, tokens_per_s=tokens / step, mfu=flops / step / peak,
        tflops_per_gpu=flops / step / num_gpus / 1e12, pipeline_s=pipe_times,
        grad_sync_s=max(p.grad_sync_s for p in per_stage), tail_s=tail,
        overhead_s=knobs.step_overhead_s, per_stage=per_stage,
        bottleneck=worst[1] if max(pipe_times) >= tail else f"gradient sync + optimizer tail {tail:.3f} s",
        cost_sources=sources)
