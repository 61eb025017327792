"""`hetplan evaluate` and `hetplan validate`: check and score any plan file on a cluster file.

Both read the public `hetplan.plan/v1` format, so plans from the search, from baselines or written
by hand go through the same rules (`planner.validate`) and the same evaluator (`planner.evaluate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from planner.cli.output import fmt_gib, fmt_ms, key_values, print_json, show, table, warn
from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import CostModel
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.plan import Plan, Prediction, load_plan
from planner.specs.cluster import ClusterSpec, load_cluster
from planner.validate import violations

PLAN_ARG = typer.Argument(..., metavar="PLAN.json", help="plan file (hetplan.plan/v1 JSON or YAML)")
CLUSTER_OPT = typer.Option(..., "--cluster", help="cluster YAML/JSON file")
PROFILES_OPT = typer.Option(None, "--profiles", help="folder of measured layer profiles (analytic fallback)")
JSON_OPT = typer.Option(False, "--json", help="print JSON on stdout instead of tables")


KNOBS_OPT = typer.Option(None, "--knobs", help="knob file from `hetplan calibrate` (default: packaged)")


def load_cost_model(profiles: Path | None, measured_only: bool = False, knobs_file: Path | None = None) -> CostModel:
    """The analytic model, or measured profiles from `profiles` with the analytic model as fallback
    (none with `measured_only`: unmeasured points are then errors, and the search skips them).
    The profile module is imported only when asked for."""
    knobs = None
    if knobs_file is not None:
        from planner.costmodel.knobs import load_knobs

        knobs = load_knobs(knobs_file)
    if profiles is None:
        return AnalyticCostModel(knobs)
    try:
        from planner.costmodel.profile import MeasuredCostModel  # type: ignore[import-not-found]
    except ImportError:
        raise HetplanError("--profiles", "measured profiles are not supported by this install "
                                         "(planner.costmodel.profile is missing)") from None
    return MeasuredCostModel.from_dir(profiles, fallback=None if measured_only else AnalyticCostModel(knobs))


def report_fallbacks(cost: CostModel) -> None:
    """Say on stderr which layers were modelled although profiles were given (filled while scoring)."""
    for item in getattr(cost, "fallbacks", None) or []:
        warn(f"profile fallback: {item}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _load(plan_path: Path, cluster_path: Path) -> tuple[Plan, ClusterSpec]:
    return load_plan(plan_path), load_cluster(cluster_path)


def _stage_rows(plan: Plan, pred: Prediction) -> list[tuple[Any, ...]]:
    stages = [s for p in plan.pipelines for s in p.stages]
    rows = []
    for sp, stage in zip(pred.per_stage, stages, strict=True):
        rows.append((sp.pipeline, sp.stage, sp.gpu, f"{stage.layers[0]}-{stage.layers[1]}",
                     f"{stage.tp}/{stage.cp}/{stage.hp}/{stage.dp}", stage.recompute,
                     plan.pipelines[sp.pipeline].microbatches if sp.stage == 0 else "",
                     fmt_ms(sp.fwd_s), fmt_ms(sp.bwd_s), fmt_ms(sp.grad_sync_s),
                     f"{fmt_gib(sp.memory_bytes)} / {fmt_gib(sp.memory_capacity_bytes)}",
                     "measured" if sp.measured else "modelled"))
    return rows


def evaluate_plan(
    plan_path: Path = PLAN_ARG,
    cluster_path: Path = CLUSTER_OPT,
    profiles: Path | None = PROFILES_OPT,
    knobs: Path | None = KNOBS_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Validate a plan (every rule, memory included) and score it, stage by stage."""
    plan, cluster = _load(plan_path, cluster_path)
    cost = load_cost_model(profiles, knobs_file=knobs)
    found = violations(plan, cluster, cost)
    if found:
        v = found[0]
        more = f" (+{len(found) - 1} more, see `hetplan validate`)" if len(found) > 1 else ""
        raise HetplanError(v.where, f"{v.reason} [{v.rule}]{more}")
    pred = evaluate(plan, cluster, cost, check=False)
    report_fallbacks(cost)
    if json_out:
        print_json({"num_gpus": plan.num_gpus, "num_pipelines": len(plan.pipelines),
                    **pred.model_dump(mode="json")})
        return
    show(
        key_values(f"{plan.model.name}: {_count(len(plan.pipelines), 'pipeline')} on {plan.num_gpus} GPUs, "
                   f"micro_batch {plan.micro_batch}, global batch {plan.training.global_batch}, "
                   f"seq {plan.training.seq_len}, {plan.schedule}", [
                       ("step time", f"{pred.step_s:.4f} s"),
                       ("tokens/s", f"{pred.tokens_per_s:,.0f}"),
                       ("TFLOP/s per GPU (model)", f"{pred.tflops_per_gpu:.1f}"),
                       ("MFU", f"{100 * pred.mfu:.1f} %"),
                       ("slowest pipeline", f"{max(pred.pipeline_s):.4f} s"),
                       ("grad sync + optimizer tail", f"{pred.tail_s:.4f} s"),
                       ("bottleneck", pred.bottleneck),
                       ("cost sources", ", ".join(f"{g}: {s}" for g, s in pred.cost_sources.items())),
                   ]),
        table("Per stage (m: microbatches of the pipeline; F, B per microbatch; sync once per step)",
              ["pipe", "stage", "gpu", "layers", "tp/cp/hp/dp", "recompute", "m", "F ms", "B ms",
               "sync ms", "mem GiB / cap", "costs"],
              _stage_rows(plan, pred),
              right=["pipe", "stage", "m", "F ms", "B ms", "sync ms", "mem GiB / cap"]),
    )


def validate_plan(
    plan_path: Path = PLAN_ARG,
    cluster_path: Path = CLUSTER_OPT,
    profiles: Path | None = PROFILES_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """List every rule the plan breaks (memory included); exit status 2 if there is any."""
    plan, cluster = _load(plan_path, cluster_path)
    cost = load_cost_model(profiles)
    found = violations(plan, cluster, cost)
    report_fallbacks(cost)
    if json_out:
        print_json([{"rule": v.rule, "where": v.where, "reason": v.reason} for v in found])
    elif not found:
        show(f"ok: valid plan ({_count(len(plan.pipelines), 'pipeline')}, {plan.num_gpus} GPUs)")
    for v in found:
        typer.echo(f"error: {v.where}: {v.reason} [{v.rule}]", err=True)
    if found:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate_plan)
    app.command("validate")(validate_plan)
