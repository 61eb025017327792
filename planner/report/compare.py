"""Two plans side by side on one cluster: predicted step, throughput, MFU, per-pipeline time, GPUs used,
and the differences in shape that explain the gap.

Both plans are scored by the one evaluator with one cost model, so the numbers are comparable; when the
global batches differ, tokens/s (not step time) is the fair measure and the comparison says so.
"""

from __future__ import annotations

from typing import Any

from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import CostModel
from planner.evaluate import evaluate
from planner.plan import Pipeline, Plan
from planner.specs.cluster import ClusterSpec


def pipeline_shape(pipe: Pipeline) -> list[str]:
    """One short string per stage: 'A100-SXM4-80GB L0-2 tp2/cp1/hp1/dp1 none'."""
    return [f"{s.gpu} L{s.layers[0]}-{s.layers[1]} tp{s.tp}/cp{s.cp}/hp{s.hp}/dp{s.dp} {s.recompute}"
            for s in pipe.stages]


def gpus_by_type(plan: Plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for pipe in plan.pipelines:
        for s in pipe.stages:
            out[s.gpu] = out.get(s.gpu, 0) + s.num_gpus
    return dict(sorted(out.items()))


def plan_summary(plan: Plan, cluster: ClusterSpec, cost: CostModel | None = None) -> dict[str, Any]:
    """What `compare` shows of one plan (the plan is validated, memory included)."""
    pred = evaluate(plan, cluster, cost or AnalyticCostModel())
    return {
        "model": plan.model.name, "global_batch": plan.training.global_batch, "seq_len": plan.training.seq_len,
        "micro_batch": plan.micro_batch, "schedule": plan.schedule,
        "num_gpus": plan.num_gpus, "gpus_by_type": gpus_by_type(plan), "num_pipelines": len(plan.pipelines),
        "stages_per_pipeline": [len(p.stages) for p in plan.pipelines],
        "microbatches_per_pipeline": [p.microbatches for p in plan.pipelines],
        "shapes": [pipeline_shape(p) for p in plan.pipelines],
        "step_s": pred.step_s, "tokens_per_s": pred.tokens_per_s, "mfu": pred.mfu,
        "tflops_per_gpu": pred.tflops_per_gpu, "pipeline_s": list(pred.pipeline_s), "tail_s": pred.tail_s,
        "bottleneck": pred.bottleneck,
    }


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = []
    for key, what in (("model", "model"), ("seq_len", "sequence length"), ("global_batch", "global batch"),
                      ("micro_batch", "micro batch"), ("schedule", "schedule"), ("num_gpus", "GPUs used"),
                      ("num_pipelines", "pipelines")):
        if a[key] != b[key]:
            out.append(f"{what}: {a[key]} vs {b[key]}")
    if a["global_batch"] != b["global_batch"] or a["seq_len"] != b["seq_len"]:
        out.append("the steps process different token counts: compare tokens/s, not step time")
    if a["gpus_by_type"] != b["gpus_by_type"]:
        types = sorted(set(a["gpus_by_type"]) | set(b["gpus_by_type"]))
        out.append("GPUs by type: " + ", ".join(f"{g} {a['gpus_by_type'].get(g, 0)} vs {b['gpus_by_type'].get(g, 0)}"
                                                for g in types))
    if sorted(a["shapes"]) == sorted(b["shapes"]) and a["shapes"] != b["shapes"]:
        out.append("same pipelines in a different order")
    elif a["shapes"] != b["shapes"]:
        for pi in range(max(a["num_pipelines"], b["num_pipelines"])):
            sa = a["shapes"][pi] if pi < a["num_pipelines"] else None
            sb = b["shapes"][pi] if pi < b["num_pipelines"] else None
            if sa == sb:
                continue
            if sa is None or sb is None:
                out.append(f"pipeline {pi}: only in {'B' if sa is None else 'A'} ({len(sa or sb)} stages)")
            elif len(sa) != len(sb):
                out.append(f"pipeline {pi}: {len(sa)} vs {len(sb)} stages")
            else:
                for si, (x, y) in enumerate(zip(sa, sb)):
                    if x != y:
                        out.append(f"pipeline {pi} stage {si}: {x} vs {y}")
    if a["microbatches_per_pipeline"] != b["microbatches_per_pipeline"]:
        out.append(f"microbatches per pipeline: {a['microbatches_per_pipeline']} vs {b['microbatches_per_pipeline']}")
    return out


def compare(plan_a: Plan, plan_b: Plan, cluster: ClusterSpec, cost: CostModel | None = None) -> dict[str, Any]:
    """Side-by-side prediction of two plans; `b_vs_a` ratios are B over A (speedup > 1: B is faster)."""
    cost = cost or AnalyticCostModel()
    a, b = plan_summary(plan_a, cluster, cost), plan_summary(plan_b, cluster, cost)
    speedup = b["tokens_per_s"] / a["tokens_per_s"]
    faster = "tie" if abs(speedup - 1) <= 1e-9 else ("b" if speedup > 1 else "a")
    return {
        "a": a, "b": b,
        "b_vs_a": {"step_ratio": b["step_s"] / a["step_s"], "speedup": speedup,
                   "mfu_ratio": b["mfu"] / a["mfu"] if a["mfu"] > 0 else None,
                   "gpus_delta": b["num_gpus"] - a["num_gpus"]},
        "faster": faster,
        "differences": _differences(a, b),
    }
