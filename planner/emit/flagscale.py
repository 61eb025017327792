"""FlagScale heterogeneous training: the `hetero` config section and the typed hostfile.

FlagScale runs a chain of process meshes, each a (tp, cp, ep, dp, pp) grid on one device type, with
`hetero_pipeline_layer_split` giving decoder layers per pipeline stage. A mesh here is a maximal run of
consecutive stages with the same (gpu type, tp, cp, stage dp) in every pipeline; its dp is
pipelines x stage dp. Each rule enforced is listed in docs/emit.md with its source.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from planner.emit.placement import node_order, pipeline_difference, rank_order, require_contiguous_nodes
from planner.errors import HetplanError
from planner.plan import Plan, Stage
from planner.specs.cluster import ClusterSpec

TARGET = "flagscale"


def _refuse(reason: str) -> HetplanError:
    return HetplanError("target", f"{TARGET} cannot run this plan: {reason}")


@dataclass(frozen=True, slots=True)
class Mesh:
    """One FlagScale process mesh: `pp` consecutive stages starting at `first_stage`."""

    gpu: str
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    first_stage: int

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.dp * self.pp


def _shape(stage: Stage) -> tuple[str, int, int, int]:
    return stage.gpu, stage.tp, stage.cp, stage.dp


def _decoders(plan: Plan, stage: Stage) -> int:
    first, last = stage.layers
    return len(range(max(first, 1), min(last, plan.model.num_layers) + 1))


def check_flagscale(plan: Plan) -> None:
    """Raise HetplanError('target', ...) naming the first rule FlagScale's hetero mode would break."""
    reason = pipeline_difference(plan)
    if reason:
        raise _refuse(reason)
    ref = plan.pipelines[0]
    for pi, pipe in enumerate(plan.pipelines):
        for si, (stage, base) in enumerate(zip(pipe.stages, ref.stages)):
            if _shape(stage) != _shape(base):
                raise _refuse(f"pipelines differ: pipeline {pi} stage {si} is (gpu, tp, cp, dp) = "
                              f"{_shape(stage)}, pipeline 0 has {_shape(base)}")
    for si, stage in enumerate(ref.stages):
        if stage.hp > 1:
            raise _refuse(f"stage {si} uses head parallelism hp={stage.hp} (no Ulysses in FlagScale meshes)")
        if stage.cp != ref.stages[0].cp:
            raise _refuse(f"cp differs across meshes: stage {si} has cp={stage.cp}, stage 0 has "
                          f"cp={ref.stages[0].cp} (FlagScale requires one cp for all meshes)")
        if stage.recompute != ref.stages[0].recompute:
            raise _refuse(f"per-stage recompute differs (stage {si} '{stage.recompute}' vs stage 0 "
                          f"'{ref.stages[0].recompute}'); per-stage recompute is not emitted")
        if _decoders(plan, stage) == 0:
            raise _refuse(f"stage {si} holds no decoder layer (hetero_pipeline_layer_split entries must be "
                          "positive and standalone embedding stages are unsupported)")
        if plan.micro_batch % stage.dp:
            raise _refuse(f"stage {si} dp={stage.dp} does not divide micro_batch {plan.micro_batch}")


def meshes(plan: Plan) -> list[Mesh]:
    """Maximal runs of consecutive stages with the same (gpu, tp, cp, dp); dp counts all replicas."""
    check_flagscale(plan)
    stages = plan.pipelines[0].stages
    reps = len(plan.pipelines)
    ep = 1
    out: list[Mesh] = []
    start = 0
    for si in range(1, len(stages) + 1):
        if si == len(stages) or _shape(stages[si]) != _shape(stages[start]):
            s = stages[start]
            out.append(Mesh(s.gpu, s.tp, s.cp, ep, reps * s.dp, si - start, start))
            start = si
    dp0_mbs = out[0].dp * (plan.micro_batch // stages[0].dp)
    for i, m in enumerate(out):
        if dp0_mbs % m.dp:
            raise _refuse(f"mesh {i} dp={m.dp} does not divide dp_0 x micro_batch_size = {dp0_mbs}")
    return out


def hetero_section(plan: Plan, cluster: ClusterSpec) -> dict:
    """The `system.hetero` mapping of a FlagScale train config."""
    mesh_list = meshes(plan)
    require_contiguous_nodes(rank_order(plan, cluster), TARGET)
    flat: list[int] = []
    for m in mesh_list:
        flat += [m.tp, m.cp, m.ep, m.dp, m.pp]
    types = [m.gpu for m in mesh_list]
    return {
        "enable_hetero": True,
        "hetero_use_cpu_communication": False,
        "hetero_process_meshes": flat,
        "hetero_pipeline_layer_split": [_decoders(plan, s) for s in plan.pipelines[0].stages],
        "hetero_device_types": types,
        "hetero_current_device_type": types[0],
        "standalone_embedding_stage": False,
    }


def flagscale_config(plan: Plan, cluster: ClusterSpec) -> dict:
    """A train-config fragment: `system` (parallel sizes, recompute, hetero) and `model` (batch, layers)."""
    hetero = hetero_section(plan, cluster)
    stages = plan.pipelines[0].stages
    first = stages[0]
    system: dict = {
        "tensor_model_parallel_size": first.tp,
        "pipeline_model_parallel_size": len(stages),
        "context_parallel_size": first.cp,
        "sequence_parallel": plan.training.sequence_parallel and any(s.tp > 1 for s in stages),
        "use_distributed_optimizer": plan.training.zero >= 1,
    }
    if first.recompute == "full":
        system.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif first.recompute == "selective":
        system.update(recompute_granularity="selective")
    system["hetero"] = hetero
    model = {
        "num_layers": plan.model.num_layers,
        "seq_length": plan.training.seq_len,
        "micro_batch_size": plan.micro_batch // first.dp,
        "global_batch_size": plan.micro_batch * plan.pipelines[0].microbatches * len(plan.pipelines),
    }
    return {"system": system, "model": model}


def flagscale_yaml(plan: Plan, cluster: ClusterSpec) -> str:
    """YAML text of `flagscale_config` (key order kept)."""
    return yaml.safe_dump(flagscale_config(plan, cluster), sort_keys=False)


def hostfile(plan: Plan, cluster: ClusterSpec, hosts: dict[str, str] | None = None) -> str:
    """`host slots=N type=GPU` lines in node-rank order; `hosts` maps node names to real addresses."""
    check_flagscale(plan)
    ranks = rank_order(plan, cluster)
    require_contiguous_nodes(ranks, TARGET)
    hosts = hosts or {}
    lines = [f"{hosts.get(n.name, n.name)} slots={n.slots} type={n.gpu}" for n in node_order(plan, cluster, ranks)]
    return "\n".join(lines) + "\n"
