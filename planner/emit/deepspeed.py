"""DeepSpeed launch: ds_config.json, the pipeline description (topology + stage boundaries), hostfile and
a `deepspeed` launcher command.

DeepSpeed runs one (pipe, data, model) grid (`PipeModelDataParallelTopology`, model fastest, pipe
outermost) — the shared rank order with data index = pipeline · stage-dp + stage-dp rank. So pipelines
must be identical and every stage must have the same (tp, stage dp): one micro batch per GPU
(micro_batch / stage dp) and one gradient-accumulation count (the replica's microbatches) for all
ranks. With more than one stage DeepSpeed's PipelineEngine needs ZeRO stage < 2. Stage boundaries go
to `parts` (PipelineModule's own form: stage s holds layer specs parts[s]..parts[s+1]-1 of
[embedding, N blocks, norm + head]); DeepSpeed has no partition method that takes them, so the
model sets them (docs/emit.md). Without a pipeline, tp > 1 is AutoTP (`tensor_parallel.autotp_size`).
"""

from __future__ import annotations

import json

from planner.emit.placement import (
    NodeSlot,
    node_order,
    pipeline_difference,
    rank_order,
    require_contiguous_nodes,
)
from planner.errors import HetplanError
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec

TARGET = "deepspeed"
PIPE_FORMAT = "hetplan.deepspeed-pipe/v1"


def _refuse(reason: str) -> HetplanError:
    return HetplanError("target", f"{TARGET} cannot run this plan: {reason}")


def check_deepspeed(plan: Plan) -> None:
    """Raise HetplanError('target', ...) naming the first thing DeepSpeed's grid cannot express."""
    reason = pipeline_difference(plan)
    if reason:
        raise _refuse(reason)
    ref = plan.pipelines[0]
    first = ref.stages[0]
    for pi, pipe in enumerate(plan.pipelines):
        for si, stage in enumerate(pipe.stages):
            where = f"pipeline {pi} stage {si}"
            if stage.cp > 1 or stage.hp > 1:
                raise _refuse(f"{where} uses cp={stage.cp} hp={stage.hp}; sequence splitting is not emitted "
                              "for DeepSpeed (its pipeline grid has no sequence axis)")
            if (stage.tp, stage.dp) != (first.tp, first.dp):
                raise _refuse(f"per-stage degrees differ: {where} has tp={stage.tp} dp={stage.dp}, pipeline 0 "
                              f"stage 0 has tp={first.tp} dp={first.dp} (one micro batch and one grid for all "
                              "ranks)")
            if stage.recompute != first.recompute:
                raise _refuse(f"per-stage recompute differs: {where} uses '{stage.recompute}', pipeline 0 "
                              f"stage 0 uses '{first.recompute}'")
    if first.recompute == "selective":
        raise _refuse("selective recompute (DeepSpeed checkpoints whole layers: activation_checkpoint_interval)")
    if plan.micro_batch % first.dp:
        raise _refuse(f"stage dp={first.dp} does not divide micro_batch {plan.micro_batch} (one micro batch "
                      "per GPU)")
    if len(ref.stages) > 1 and plan.training.zero >= 2:
        raise _refuse(f"ZeRO stage {plan.training.zero} with {len(ref.stages)} pipeline stages (DeepSpeed's "
                      "PipelineEngine supports ZeRO stage 0 or 1)")
    if plan.training.dtype == "fp8":
        raise _refuse("fp8 GEMMs (ds_config has no fp8 switch; use bf16 or Transformer Engine layers)")


def batch_numbers(plan: Plan) -> dict[str, int]:
    """train_batch_size = micro batch per GPU x gradient accumulation x data-parallel size."""
    check_deepspeed(plan)
    ref = plan.pipelines[0]
    sdp = ref.stages[0].dp
    return {"train_batch_size": plan.micro_batch * ref.microbatches * len(plan.pipelines),
            "train_micro_batch_size_per_gpu": plan.micro_batch // sdp,
            "gradient_accumulation_steps": ref.microbatches}


def ds_config(plan: Plan) -> dict:
    """The ds_config mapping: batch numbers, precision, ZeRO stage, AutoTP size without a pipeline."""
    config: dict = dict(batch_numbers(plan))
    dtype = plan.training.dtype
    config["bf16"] = {"enabled": dtype == "bf16"}
    config["fp16"] = {"enabled": dtype == "fp16"}
    config["zero_optimization"] = {"stage": plan.training.zero}
    stages = plan.pipelines[0].stages
    if len(stages) == 1 and stages[0].tp > 1:
        config["tensor_parallel"] = {"autotp_size": stages[0].tp}
    return config


def pipeline_parts(plan: Plan) -> list[int]:
    """PipelineModule `parts`: stage s holds layer specs parts[s]..parts[s+1]-1 (plan layer indices)."""
    stages = plan.pipelines[0].stages
    return [s.layers[0] for s in stages] + [stages[-1].layers[1] + 1]


def pipeline_spec(plan: Plan) -> dict:
    """Topology and stage boundaries for PipelineModule (`PipeModelDataParallelTopology` arguments)."""
    check_deepspeed(plan)
    stages = plan.pipelines[0].stages
    first = stages[0]
    return {
        "format": PIPE_FORMAT,
        "topology": {"num_pp": len(stages), "num_mp": first.tp, "num_dp": len(plan.pipelines) * first.dp},
        "parts": pipeline_parts(plan),
        "num_layer_specs": plan.model.num_layers + 2,
        "layer_specs": "0 = embedding, 1..N = decoder blocks, N+1 = final norm + head",
        "activation_checkpoint_interval": 1 if first.recompute == "full" else 0,
        "seq_len": plan.training.seq_len,
        "gpus": [s.gpu for s in stages],
    }


def hostfile(plan: Plan, cluster: ClusterSpec) -> str:
    """`host slots=N` lines in node-rank order (the deepspeed launcher numbers ranks in this order)."""
    return "".join(f"{n.name} slots={cluster.node(n.name).gpus}\n" for n in _launch_nodes(plan, cluster))


def include_string(plan: Plan, cluster: ClusterSpec) -> str:
    """The launcher's --include value, 'node:gpu,gpu@node:...' in node-rank order."""
    return "@".join(f"{n.name}:{','.join(str(g) for g in n.gpus)}" for n in _launch_nodes(plan, cluster))


def _launch_nodes(plan: Plan, cluster: ClusterSpec) -> list[NodeSlot]:
    """node_order, refusing what the deepspeed launcher would renumber: it gives each host one block of
    ranks in hostfile order and runs a host's selected GPUs in ascending order."""
    check_deepspeed(plan)
    ranks = rank_order(plan, cluster)
    require_contiguous_nodes(ranks, TARGET)
    nodes = node_order(plan, cluster, ranks)
    for n in nodes:
        if list(n.gpus) != sorted(n.gpus):
            raise _refuse(f"{n.name} runs ranks {n.first_rank}.. on GPUs {list(n.gpus)}; the deepspeed launcher "
                          "assigns a host's GPUs in ascending order, so list each node's devices ascending")
    return nodes


def launch_script(plan: Plan, cluster: ClusterSpec) -> str:
    """`deepspeed --hostfile hostfile --include ... ENTRY ... --deepspeed_config ds_config.json`."""
    include = include_string(plan, cluster)
    return (
        "#!/usr/bin/env bash\n"
        f"# hetplan: DeepSpeed, {plan.num_gpus} ranks; ranks follow hostfile order, then --include GPUs\n"
        "set -euo pipefail\n"
        "HERE=\"$(cd \"$(dirname \"$0\")\" && pwd)\"\n"
        f"deepspeed --hostfile \"$HERE/hostfile\" --include {include} \\\n"
        "    --master_addr \"${MASTER_ADDR:?set MASTER_ADDR to the first hostfile host}\" "
        "--master_port \"${MASTER_PORT:-29500}\" \\\n"
        "    \"$@\" --deepspeed_config \"$HERE/ds_config.json\"\n"
    )


def deepspeed_files(plan: Plan, cluster: ClusterSpec) -> dict[str, str]:
    """The `deepspeed` target: ds_config.json, pipeline.json, hostfile, launch.sh."""
    return {
        "deepspeed/ds_config.json": json.dumps(ds_config(plan), indent=2) + "\n",
        "deepspeed/pipeline.json": json.dumps(pipeline_spec(plan), indent=2) + "\n",
        "deepspeed/hostfile": hostfile(plan, cluster),
        "deepspeed/launch.sh": launch_script(plan, cluster),
    }
