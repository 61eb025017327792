"""Megatron-LM launch: command-line arguments and per-node torchrun scripts.

Megatron runs one uniform (tp, cp, dp, pp) grid: every pipeline replica identical, every stage the same
tp/cp, no intra-stage dp or head parallelism. Only the layer split may be uneven, through
`--pipeline-model-parallel-layout` (E = embedding, t = decoder layer, L = loss/head, '|' between stages).
Anything else is refused with the reason. Flag sources: docs/emit.md.
"""

from __future__ import annotations

import shlex

from planner.emit.placement import (
    RankInfo,
    node_order,
    pipeline_difference,
    rank_order,
    require_contiguous_nodes,
)
from planner.errors import HetplanError
from planner.plan import Plan, Stage
from planner.specs.cluster import ClusterSpec
from planner.uniform import even_layer_split

TARGET = "megatron"


def _refuse(reason: str) -> HetplanError:
    return HetplanError("target", f"{TARGET} cannot run this plan: {reason}")


def check_megatron(plan: Plan) -> None:
    """Raise HetplanError('target', ...) naming the first thing Megatron cannot express."""
    reason = pipeline_difference(plan)
    if reason:
        raise _refuse(reason)
    first = plan.pipelines[0].stages[0]
    for pi, pipe in enumerate(plan.pipelines):
        for si, stage in enumerate(pipe.stages):
            where = f"pipeline {pi} stage {si}"
            if stage.hp > 1:
                raise _refuse(f"{where} uses head parallelism hp={stage.hp} (no Ulysses in Megatron-LM)")
            if stage.dp > 1:
                raise _refuse(f"{where} uses intra-stage dp={stage.dp}; Megatron's dp is whole replicas")
            if (stage.tp, stage.cp) != (first.tp, first.cp):
                raise _refuse(f"per-stage tp/cp differ: {where} has tp={stage.tp} cp={stage.cp}, pipeline 0 "
                              f"stage 0 has tp={first.tp} cp={first.cp}")
            if stage.recompute != first.recompute:
                raise _refuse(f"per-stage recompute differs: {where} uses '{stage.recompute}', pipeline 0 "
                              f"stage 0 uses '{first.recompute}'")


def layout_string(plan: Plan) -> str:
    """`--pipeline-model-parallel-layout` value for pipeline 0: one '|'-separated entry per stage."""
    last_layer = plan.model.num_layers + 1
    parts = []
    for stage in plan.pipelines[0].stages:
        first, last = stage.layers
        decoders = len(range(max(first, 1), min(last, plan.model.num_layers) + 1))
        piece = "E" if first == 0 else ""
        if decoders:
            piece += "t" if decoders == 1 else f"t*{decoders}"
        if last == last_layer:
            piece += "L"
        parts.append(piece)
    return "|".join(parts)


def _even_split(plan: Plan) -> bool:
    """Megatron's default split: num_layers / pp decoder layers per stage, embedding first, head last."""
    stages = plan.pipelines[0].stages
    if plan.model.num_layers % len(stages):
        return False
    return [tuple(st.layers) for st in stages] == even_layer_split(plan.model, len(stages))


def _recompute_args(stage: Stage) -> list[str]:
    if stage.recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if stage.recompute == "selective":
        return ["--recompute-granularity", "selective"]
    return []


def megatron_args(plan: Plan, cluster: ClusterSpec) -> list[str]:
    """Parallelism, batch and model-shape arguments for pretrain_gpt.py (data/optimizer flags are the
    user's); refuses plans Megatron cannot express."""
    check_megatron(plan)
    ranks = rank_order(plan, cluster)
    require_contiguous_nodes(ranks, TARGET)
    ref = plan.pipelines[0]
    stage = ref.stages[0]
    model, training = plan.model, plan.training
    pp, dp = len(ref.stages), len(plan.pipelines)
    args = [
        "--tensor-model-parallel-size", str(stage.tp),
        "--pipeline-model-parallel-size", str(pp),
        "--context-parallel-size", str(stage.cp),
        "--num-layers", str(model.num_layers),
        "--hidden-size", str(model.hidden),
        "--ffn-hidden-size", str(model.ffn_hidden),
        "--num-attention-heads", str(model.num_heads),
        "--seq-length", str(training.seq_len),
        "--max-position-embeddings", str(max(training.seq_len, model.seq_len)),
        "--micro-batch-size", str(plan.micro_batch),
        "--global-batch-size", str(plan.micro_batch * ref.microbatches * dp),
    ]
    if model.kv_heads != model.num_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if stage.tp > 1 and training.sequence_parallel:
        args.append("--sequence-parallel")
    if pp > 1 and not _even_split(plan):
        args += ["--pipeline-model-parallel-layout", layout_string(plan)]
    args += _recompute_args(stage)
    if training.dtype in ("bf16", "fp16"):
        args.append(f"--{training.dtype}")
    if training.zero >= 1:
        args.append("--use-distributed-optimizer")
    return args


def launch_scripts(plan: Plan, cluster: ClusterSpec, entry: str = "pretrain_gpt.py") -> dict[str, str]:
    """One bash script per node (keyed by node name, in node-rank order) running torchrun with a static
    --node-rank; CUDA_VISIBLE_DEVICES lists the node's GPUs in local-rank order."""
    args = megatron_args(plan, cluster)
    ranks: list[RankInfo] = rank_order(plan, cluster)
    nodes = node_order(plan, cluster, ranks)
    lines: list[list[str]] = []
    for a in args:
        if a.startswith("--") or not lines:
            lines.append([a])
        else:
            lines[-1].append(shlex.quote(a))
    joined = " \\\n    ".join(" ".join(line) for line in lines)
    out: dict[str, str] = {}
    for k, slot in enumerate(nodes):
        out[slot.name] = (
            "#!/usr/bin/env bash\n"
            f"# hetplan: Megatron-LM node rank {k} of {len(nodes)} = {slot.name} ({slot.gpu}), "
            f"global ranks {slot.first_rank}..{slot.first_rank + slot.slots - 1}\n"
            "set -euo pipefail\n"
            f"export CUDA_VISIBLE_DEVICES={','.join(str(g) for g in slot.gpus)}\n"
            f"torchrun --nnodes {len(nodes)} --node-rank {k} --nproc-per-node {slot.slots} \\\n"
            "    --master-addr \"${MASTER_ADDR:?set MASTER_ADDR to node rank 0}\" "
            "--master-port \"${MASTER_PORT:-6000}\" \\\n"
            f"    {entry} \\\n    {joined} \\\n    \"$@\"\n"
        )
    return out
