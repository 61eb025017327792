"""Plan validation: every rule of the design, each failure naming the rule and where it broke.

`violations` lists them all; `validate` raises the first as a HetplanError. Memory is checked when a
cost model is given (it needs per-layer activation sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import HetplanError
from planner.plan import Plan, Stage, expand_devices
from planner.specs.cluster import ClusterSpec
from planner.specs.gpus import resolve_gpu_name


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason} [{self.rule}]"


def _stage_shape_rules(plan: Plan, stage: Stage, where: str) -> list[Violation]:
    m, out = plan.model, []
    seq = plan.training.seq_len
    if m.num_heads % (stage.tp * stage.hp):
        out.append(Violation("heads-divisible", where, f"tp*hp = {stage.tp * stage.hp} does not divide "
                                                       f"num_heads {m.num_heads}"))
    if m.kv_heads % stage.tp:
        out.append(Violation("kv-heads-divisible", where, f"tp {stage.tp} does not divide kv heads {m.kv_heads}"))
    if m.ffn_hidden % stage.tp:
        out.append(Violation("ffn-divisible", where, f"tp {stage.tp} does not divide ffn_hidden {m.ffn_hidden}"))
    if seq % (stage.cp * stage.hp):
        out.append(Violation("seq-divisible", where, f"cp*hp = {stage.cp * stage.hp} does not divide "
                                                     f"seq_len {seq}"))
    if plan.micro_batch % stage.dp:
        out.append(Violation("dp-divides-microbatch", where, f"stage dp {stage.dp} does not divide "
                                                             f"micro_batch {plan.micro_batch}"))
    if stage.recompute not in plan.training.recompute:
        out.append(Violation("recompute-allowed", where, f"recompute '{stage.recompute}' is not in "
                                                         f"training.recompute {list(plan.training.recompute)}"))
    return out


def violations(plan: Plan, cluster: ClusterSpec, cost: object | None = None) -> list[Violation]:
    """All rule violations of `plan` on `cluster` (memory too when `cost` is a CostModel)."""
    out: list[Violation] = []
    if plan.training.schedule != plan.schedule:
        out.append(Violation("schedule", "schedule", f"plan schedule '{plan.schedule}' differs from "
                                                     f"training.schedule '{plan.training.schedule}'"))
    if not plan.pipelines:
        out.append(Violation("pipelines", "pipelines", "a plan needs at least one pipeline"))
    nodes = {n.name: n for n in cluster.node_list}
    used: dict[tuple[str, int], str] = {}
    last_layer = plan.model.num_layer_slots - 1
    total_mb = 0
    for pi, pipe in enumerate(plan.pipelines):
        total_mb += pipe.microbatches
        expect = 0
        for si, stage in enumerate(pipe.stages):
            where = f"pipelines[{pi}].stages[{si}]"
            first, last = stage.layers
            if first != expect or last < first:
                out.append(Violation("layer-coverage", f"{where}.layers",
                                     f"layers [{first}, {last}] should start at {expect} and not be empty"))
            expect = max(expect, last + 1)
            try:
                gpu = resolve_gpu_name(stage.gpu, f"{where}.gpu")
            except HetplanError as exc:
                out.append(Violation("gpu-known", f"{where}.gpu", exc.reason))
                continue
            try:
                devs = expand_devices(stage.devices)
            except HetplanError as exc:
                out.append(Violation("devices-format", f"{where}.devices", exc.reason))
                continue
            if len(devs) != stage.num_gpus:
                out.append(Violation("device-count", f"{where}.devices", f"{len(devs)} devices for "
                                     f"tp*cp*hp*dp = {stage.num_gpus}"))
            for node_name, idx in devs:
                node = nodes.get(node_name)
                if node is None:
                    out.append(Violation("device-exists", f"{where}.devices", f"unknown node '{node_name}'"))
                    continue
                if idx >= node.gpus:
                    out.append(Violation("device-exists", f"{where}.devices",
                                         f"{node_name} has GPUs 0..{node.gpus - 1}, not {idx}"))
                    continue
                if node.gpu != gpu:
                    out.append(Violation("device-type", f"{where}.devices",
                                         f"{node_name}:{idx} is a {node.gpu}, stage says {gpu}"))
                key = (node_name, idx)
                if key in used:
                    out.append(Violation("device-double-booked", f"{where}.devices",
                                         f"{node_name}:{idx} is already used by {used[key]}"))
                used[key] = where
            g = stage.group_size
            if g > 1 and not cluster.allow_cross_node_tp:
                for k in range(0, len(devs) - g + 1, g):
                    if len({n for n, _ in devs[k:k + g]}) > 1:
                        out.append(Violation("group-in-node", f"{where}.devices", f"tp*cp*hp group "
                                             f"{k // g} spans nodes (allow_cross_node_tp is off)"))
            out.extend(_stage_shape_rules(plan, stage, where))
        if expect != last_layer + 1:
            out.append(Violation("layer-coverage", f"pipelines[{pi}]", f"layers end at {expect - 1}, "
                                 f"model has layers 0..{last_layer}"))
    if plan.pipelines and total_mb * plan.micro_batch != plan.training.global_batch:
        out.append(Violation("global-batch", "pipelines", f"microbatches {total_mb} x micro_batch "
                             f"{plan.micro_batch} = {total_mb * plan.micro_batch}, global batch is "
                             f"{plan.training.global_batch}"))
    if cost is not None and not out:
        from planner.evaluate import stage_memory_report

        for pi, si, gpu, need, cap in stage_memory_report(plan, cluster, cost):
            broken = memory_violation(pi, si, gpu, need, cap)
            if broken is not None:
                out.append(broken)
    return out


def memory_violation(pi: int, si: int, gpu: str, need: float, cap: float) -> Violation | None:
    """The memory rule for stage `si` of pipeline `pi` (`evaluate` checks it too, on the numbers it
    scores with, instead of costing every stage twice)."""
    if need <= cap:
        return None
    return Violation("memory", f"pipelines[{pi}].stages[{si}]",
                     f"needs {need / 2**30:.2f} GiB per {gpu}, {cap / 2**30:.2f} GiB usable")


def validate(plan: Plan, cluster: ClusterSpec, cost: object | None = None) -> None:
    """Raise HetplanError for the first violated rule."""
    found = violations(plan, cluster, cost)
    if found:
        v = found[0]
        raise HetplanError(v.where, f"{v.reason} [{v.rule}]")
