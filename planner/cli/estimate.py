"""`hetplan estimate`: predict one homogeneous Megatron-style run (tp x cp x pp grid, DP derived).

The run is built by `planner.uniform.uniform_plan` and scored by the one evaluator with check=False,
so a configuration that does not fit memory still gets a time; memory fit is reported separately
(`planner.evaluate.stage_memory_report`). Shape rules (tp | heads, cp | seq, ...) are checked up
front and fail with the option that is wrong.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

import typer

from planner.cli.output import GIB, key_values, print_json, show
from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.shapes import layer_fwd_flops, model_flops_per_sequence
from planner.errors import HetplanError
from planner.evaluate import evaluate, stage_memory_report
from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.gpus import get_gpu
from planner.specs.models import ModelSpec, load_model
from planner.specs.training import TrainingSpec
from planner.uniform import uniform_plan
from planner.validate import violations


class RecomputeOpt(StrEnum):
    none = "none"
    selective = "selective"
    full = "full"


class AttentionOpt(StrEnum):
    flash = "flash"
    naive = "naive"


def recompute_flops_per_sequence(model: ModelSpec, seq_len: int, recompute: str) -> float:
    """Extra FLOPs per sequence that recomputation executes (the SC'21 / Korthikanti convention).

    full: one more forward of every decoder block (so decoder FLOPs x 4/3; the LM head is not
    recomputed, matching 96·B·s·l·h²·(1 + s/6h + V/16lh)); selective: one more forward of the
    attention core of every decoder block."""
    extra = 0.0
    for layer in model.layers():
        if layer.kind != "decoder":
            continue
        fl = layer_fwd_flops(model, layer.kind, 1, seq_len)
        if recompute == "full":
            extra += fl.gemm + fl.attn_full
        elif recompute == "selective":
            extra += fl.attn_full
    return extra


def _check_shape(model: ModelSpec, *, gpus: int, tp: int, cp: int, pp: int, mbs: int, global_batch: int,
                 seq: int, gpus_per_node: int) -> int:
    """Reject grids Megatron would refuse, naming the option; returns the derived DP degree."""
    if model.num_heads % tp:
        raise HetplanError("--tp", f"tp {tp} does not divide {model.name}'s {model.num_heads} attention heads")
    if model.kv_heads % tp:
        raise HetplanError("--tp", f"tp {tp} does not divide {model.name}'s {model.kv_heads} KV heads")
    if model.ffn_hidden % tp:
        raise HetplanError("--tp", f"tp {tp} does not divide ffn_hidden {model.ffn_hidden}")
    if seq % cp:
        raise HetplanError("--cp", f"cp {cp} does not divide the sequence length {seq}")
    if tp * cp > gpus_per_node:
        raise HetplanError("--tp", f"tp*cp = {tp * cp} exceeds {gpus_per_node} GPUs per node "
                                   "(tensor/context groups stay inside a node)")
    if pp > model.num_layers:
        raise HetplanError("--pp", f"pp {pp} exceeds {model.name}'s {model.num_layers} decoder layers")
    if gpus % (tp * cp * pp):
        raise HetplanError("--gpus", f"{gpus} GPUs are not divisible by tp*cp*pp = {tp * cp * pp}")
    dp = gpus // (tp * cp * pp)
    if global_batch % (mbs * dp):
        raise HetplanError("--global-batch", f"global batch {global_batch} is not divisible by "
                                             f"mbs x dp = {mbs} x {dp}")
    return dp


def estimate_run(model: ModelSpec, gpu_name: str, *, gpus: int, tp: int, pp: int, cp: int = 1, mbs: int = 1,
                 global_batch: int, seq: int | None = None, recompute: str = "none",
                 gpus_per_node: int | None = None, nic_gbps: float | None = None, zero: int = 0,
                 attention: str = "flash", sequence_parallel: bool = False) -> dict[str, Any]:
    """The prediction as plain data (the `--json` document)."""
    gpu = get_gpu(gpu_name, "--gpu")
    per_node = gpus_per_node or gpu.gpus_per_node
    seq_len = seq or model.seq_len
    dp = _check_shape(model, gpus=gpus, tp=tp, cp=cp, pp=pp, mbs=mbs, global_batch=global_batch,
                      seq=seq_len, gpus_per_node=per_node)
    cluster = ClusterSpec(nodes=[NodeGroup(gpu=gpu.name, nodes=math.ceil(gpus / per_node),
                                           gpus_per_node=per_node, nic_gbps=nic_gbps)])
    training = TrainingSpec(global_batch=global_batch, seq_len=seq_len, zero=zero, attention=attention,
                            sequence_parallel=sequence_parallel)
    plan = uniform_plan(model, training, cluster, tp=tp, pp=pp, cp=cp, micro_batch=mbs,
                        recompute=recompute, gpus=gpus)
    for v in violations(plan, cluster):  # safety net: any rule the up-front checks missed
        raise HetplanError(v.where, f"{v.reason} [{v.rule}]")
    cost = AnalyticCostModel()
    pred = evaluate(plan, cluster, cost, check=False)
    memory = stage_memory_report(plan, cluster, cost)
    peak = max(need for _, _, _, need, _ in memory)
    capacity = min(cap for _, _, _, _, cap in memory)
    fits = all(need <= cap for _, _, _, need, cap in memory)
    model_flops = model_flops_per_sequence(model, seq_len) * global_batch
    hw_flops = model_flops + recompute_flops_per_sequence(model, seq_len, recompute) * global_batch
    peak_flops = gpu.peak_flops(training.dtype)
    return {
        "model": model.name, "gpu": gpu.name, "gpus": gpus, "gpus_per_node": per_node,
        "tp": tp, "cp": cp, "pp": pp, "dp": dp, "micro_batch": mbs, "global_batch": global_batch,
        "seq_len": seq_len, "microbatches_per_pipeline": global_batch // (mbs * dp),
        "recompute": recompute, "zero": zero, "attention": attention,
        "sequence_parallel": sequence_parallel and tp > 1,
        "step_s": pred.step_s,
        "tokens_per_s": pred.tokens_per_s,
        "tflops_per_gpu": model_flops / pred.step_s / gpus / 1e12,
        "hw_tflops_per_gpu": hw_flops / pred.step_s / gpus / 1e12,
        "mfu": model_flops / pred.step_s / gpus / peak_flops,
        "peak_memory_gb": peak / 1e9,
        "peak_memory_gib": peak / GIB,
        "memory_capacity_gib": capacity / GIB,
        "fits": fits,
        "pipeline_s": max(pred.pipeline_s),
        "tail_s": pred.tail_s,
        "overhead_s": pred.overhead_s,
        "bottleneck": pred.bottleneck,
    }


def estimate(
    model: str = typer.Option(..., "--model", help="catalog name or a YAML/JSON ModelSpec file"),
    gpu: str = typer.Option(..., "--gpu", help="GPU type (catalog name or alias, see `hetplan gpus`)"),
    gpus: int = typer.Option(..., "--gpus", min=1, help="total GPUs"),
    tp: int = typer.Option(1, "--tp", min=1, help="tensor-parallel degree"),
    pp: int = typer.Option(1, "--pp", min=1, help="pipeline stages"),
    cp: int = typer.Option(1, "--cp", min=1, help="context-parallel degree"),
    mbs: int = typer.Option(1, "--mbs", min=1, help="microbatch size (sequences)"),
    global_batch: int = typer.Option(..., "--global-batch", min=1, help="sequences per step"),
    seq: int | None = typer.Option(None, "--seq", min=1, help="sequence length (default: the model's)"),
    recompute: RecomputeOpt = typer.Option(RecomputeOpt.none, "--recompute", help="activation recompute"),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=1, help="default: catalog typical"),
    nic_gbps: float | None = typer.Option(None, "--nic-gbps", min=0.001, help="inter-node Gb/s per GPU"),
    zero: int = typer.Option(0, "--zero", min=0, max=3, help="0 plain DP, 1 distributed optimizer, 2, 3"),
    attention: AttentionOpt = typer.Option(AttentionOpt.flash, "--attention", help="attention kernel"),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel/--no-sequence-parallel",
                                           help="Megatron sequence parallelism (off by default, as in Megatron)"),
    json_out: bool = typer.Option(False, "--json", help="print JSON on stdout instead of a table"),
) -> None:
    """Predict a homogeneous Megatron-style run: step time, tokens/s, TFLOP/s, MFU, memory."""
    spec = load_model(model, "--model")
    result = estimate_run(spec, gpu, gpus=gpus, tp=tp, pp=pp, cp=cp, mbs=mbs, global_batch=global_batch,
                          seq=seq, recompute=recompute.value, gpus_per_node=gpus_per_node,
                          nic_gbps=nic_gbps, zero=zero, attention=attention.value,
                          sequence_parallel=sequence_parallel)
    if json_out:
        print_json(result)
        return
    r = result
    title = (f"{r['model']} on {r['gpus']} x {r['gpu']}: tp {r['tp']} cp {r['cp']} pp {r['pp']} dp {r['dp']}, "
             f"mbs {r['micro_batch']}, global batch {r['global_batch']}, seq {r['seq_len']}, "
             f"recompute {r['recompute']}, zero {r['zero']}")
    show(key_values(title, [
        ("step time", f"{r['step_s']:.3f} s"),
        ("tokens/s", f"{r['tokens_per_s']:,.0f}"),
        ("TFLOP/s per GPU (model)", f"{r['tflops_per_gpu']:.1f}"),
        ("TFLOP/s per GPU (with recompute)", f"{r['hw_tflops_per_gpu']:.1f}"),
        ("MFU", f"{100 * r['mfu']:.1f} %"),
        ("peak memory per GPU", f"{r['peak_memory_gib']:.2f} GiB of {r['memory_capacity_gib']:.2f} GiB usable"),
        ("fits", "yes" if r["fits"] else "NO (try --recompute full, --zero 1, or more tp/pp)"),
        ("bottleneck", r["bottleneck"]),
    ]))


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)
