"""torchtitan launch: command-line overrides for `torchtitan.train` and per-node torchrun scripts.

torchtitan runs one device mesh (pp, dp_replicate, dp_shard, cp, tp), tp fastest and pp outermost —
the shared rank order with data index = pipeline · stage-dp + stage-dp rank. So every pipeline must be
identical and every stage must have the same (tp, cp, stage dp); GPU types and the layer split may
differ per stage (the split goes to `module_fqns_per_model_part`, one model part per stage, with
torchtitan's decoder FQNs tok_embeddings, layers.i, norm, lm_head). The model shape and data come from
the user's `--module/--config`. Flag names: docs/emit.md.
"""

from __future__ import annotations

import shlex

from planner.emit.placement import pipeline_difference
from planner.emit.slurm import torchrun_scripts
from planner.errors import HetplanError
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec

TARGET = "torchtitan"
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe"}
RECOMPUTE = {"none": "activation-checkpoint:none", "selective": "activation-checkpoint:selective",
             "full": "activation-checkpoint:full"}


def _refuse(reason: str) -> HetplanError:
    return HetplanError("target", f"{TARGET} cannot run this plan: {reason}")


def check_torchtitan(plan: Plan) -> None:
    """Raise HetplanError('target', ...) naming the first thing torchtitan's single mesh cannot express."""
    reason = pipeline_difference(plan)
    if reason:
        raise _refuse(reason)
    first = plan.pipelines[0].stages[0]
    for pi, pipe in enumerate(plan.pipelines):
        for si, stage in enumerate(pipe.stages):
            where = f"pipeline {pi} stage {si}"
            if stage.hp > 1:
                raise _refuse(f"{where} uses head parallelism hp={stage.hp} (torchtitan has no Ulysses axis)")
            if (stage.tp, stage.cp, stage.dp) != (first.tp, first.cp, first.dp):
                raise _refuse(f"per-stage degrees differ: {where} has tp={stage.tp} cp={stage.cp} dp={stage.dp}, "
                              f"pipeline 0 stage 0 has tp={first.tp} cp={first.cp} dp={first.dp} "
                              "(one device mesh for the whole model)")
            if stage.recompute != first.recompute:
                raise _refuse(f"per-stage recompute differs: {where} uses '{stage.recompute}', pipeline 0 "
                              f"stage 0 uses '{first.recompute}' (one activation_checkpoint config)")
    if plan.micro_batch % first.dp:
        raise _refuse(f"stage dp={first.dp} does not divide micro_batch {plan.micro_batch}")
    if plan.training.dtype == "fp16":
        raise _refuse("fp16 training (torchtitan mixes bfloat16/float32 only)")


def model_parts(plan: Plan) -> list[list[str]]:
    """torchtitan module FQNs per pipeline stage: layer 0 = tok_embeddings, 1..N = layers.0..N-1,
    N+1 = norm + lm_head."""
    n = plan.model.num_layers
    parts: list[list[str]] = []
    for stage in plan.pipelines[0].stages:
        first, last = stage.layers
        names = ["tok_embeddings"] if first == 0 else []
        names += [f"layers.{i - 1}" for i in range(max(first, 1), min(last, n) + 1)]
        if last == n + 1:
            names += ["norm", "lm_head"]
        parts.append(names)
    return parts


def torchtitan_overrides(plan: Plan) -> list[str]:
    """`torchtitan.train` overrides for parallelism, batch and recompute (after --module/--config)."""
    check_torchtitan(plan)
    ref = plan.pipelines[0]
    stage = ref.stages[0]
    training = plan.training
    pp, reps = len(ref.stages), len(plan.pipelines)
    data = reps * stage.dp
    rank_batch = plan.micro_batch // stage.dp
    sharded = training.zero >= 1
    args = [
        "--parallelism.data-parallel-replicate-degree", str(1 if sharded else data),
        "--parallelism.data-parallel-shard-degree", str(data if sharded else 1),
        "--parallelism.tensor-parallel-degree", str(stage.tp),
        "--parallelism.context-parallel-degree", str(stage.cp),
        "--parallelism.pipeline-parallel-degree", str(pp),
    ]
    if sharded and data > 1:
        args += ["--parallelism.fsdp-reshard-after-forward", "always" if training.zero == 3 else "never"]
    if stage.tp > 1:
        args.append("--parallelism.enable-sequence-parallel" if training.sequence_parallel
                    else "--parallelism.no-enable-sequence-parallel")
    if pp > 1:
        # one step = every microbatch of a replica through the pipeline; no gradient accumulation
        local_batch = rank_batch * ref.microbatches
        args += ["--parallelism.pipeline-parallel-schedule", SCHEDULES[plan.schedule],
                 "--parallelism.pipeline-parallel-microbatch-size", str(rank_batch),
                 "--parallelism.module-fqns-per-model-part", *(",".join(p) for p in model_parts(plan)),
                 "--training.disable-cuda-graphs"]
    else:
        # no pipeline: each microbatch is one gradient-accumulation step
        local_batch = rank_batch
    args += [
        "--training.local-batch-size", str(local_batch),
        "--training.global-batch-size", str(plan.micro_batch * ref.microbatches * reps),
        "--training.seq-len", str(training.seq_len),
        "--training.mixed-precision-param", "bfloat16",
        RECOMPUTE[stage.recompute],  # a tyro subcommand: must come last
    ]
    return args


def torchtitan_files(plan: Plan, cluster: ClusterSpec) -> dict[str, str]:
    """The `torchtitan` target: overrides (one shell-quoted line) and one torchrun script per node that
    runs `-m torchtitan.train --module $TT_MODULE --config $TT_CONFIG "$@" <overrides>`; the script's
    own arguments come before the overrides because the activation-checkpoint subcommand ends them."""
    args = torchtitan_overrides(plan)
    command = ("-m torchtitan.train --module \"${TT_MODULE:-llama3}\" "
               "--config \"${TT_CONFIG:?set TT_CONFIG to a config_registry function of TT_MODULE}\" \"$@\" \\\n    "
               + shlex.join(args))
    out = {"torchtitan/overrides.txt": shlex.join(args) + "\n"}
    for name, script in torchrun_scripts(plan, cluster, command, TARGET, "torchtitan").items():
        out[f"torchtitan/launch_{name}.sh"] = script
    return out
