"""`hetplan explain`, `hetplan compare` and `hetplan schedule`: read one or two plan files on a cluster file.

They take the plan and cluster exactly as `hetplan evaluate` does (a plan file does not name its cluster,
so `--cluster` is required), validate first (memory included), and score with the same cost model
options (`--profiles`, `--knobs`). Tables and the text timeline go to stderr; `--json` prints on stdout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from planner.cli.evaluate_cmd import (
    CLUSTER_OPT,
    JSON_OPT,
    KNOBS_OPT,
    PLAN_ARG,
    PROFILES_OPT,
    load_cost_model,
    report_fallbacks,
)
from planner.cli.output import fmt_gib, fmt_ms, key_values, print_json, show, table
from planner.costmodel.base import CostModel
from planner.errors import HetplanError
from planner.plan import Plan, load_plan
from planner.report.compare import compare
from planner.report.explain import WHAT_IF_TIME_LIMIT_S, Explanation, explain
from planner.specs.cluster import ClusterSpec, load_cluster
from planner.validate import violations


def _checked(plan: Plan, cluster: ClusterSpec, cost: CostModel, label: str = "") -> None:
    """Refuse an invalid plan in one line, as `hetplan evaluate` does."""
    found = violations(plan, cluster, cost)
    if found:
        v = found[0]
        more = f" (+{len(found) - 1} more, see `hetplan validate`)" if len(found) > 1 else ""
        raise HetplanError(f"{label}{v.where}", f"{v.reason} [{v.rule}]{more}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def _show_explanation(plan: Plan, e: Explanation) -> None:
    pred, b = e.prediction, e.bottleneck
    idle = ", ".join(f"{n} x {g}" for g, n in e.idle_by_type.items())
    show(
        key_values(f"{plan.model.name} on {e.num_gpus} GPUs: {len(plan.pipelines)} pipeline(s), micro_batch "
                   f"{plan.micro_batch}, global batch {plan.training.global_batch}", [
                       ("step time", f"{pred.step_s:.4f} s"),
                       ("tokens/s", f"{pred.tokens_per_s:,.0f}"),
                       ("MFU", f"{100 * pred.mfu:.1f} %"),
                       ("step = pipeline + tail + overhead",
                        f"{b.pipeline_s:.4f} + {b.tail_s:.4f} + {b.overhead_s:.4f} s"),
                       ("bottleneck", b.text),
                       ("bottleneck stage busy", (f"{100 * b.steady_share:.0f} % of its pipeline's time "
                                                  "(the rest is fill and drain)")),
                       ("idle GPUs", f"{idle} ({', '.join(e.idle_devices)})" if idle else "none"),
                   ]),
        table("Pipelines (bubble = idle share)", ["pipe", "stages", "m", "time ms", "bubble"],
              [(p.pipeline, p.stages, p.microbatches, fmt_ms(p.time_s), f"{100 * p.bubble_fraction:.1f} %")
               for p in e.pipelines], right=["pipe", "stages", "m", "time ms", "bubble"]),
        table("Memory per GPU", ["pipe", "stage", "gpu", "used GiB", "usable GiB", "headroom GiB", "headroom"],
              [(m.pipeline, m.stage, m.gpu, fmt_gib(m.used_bytes), fmt_gib(m.capacity_bytes),
                fmt_gib(m.headroom_bytes), f"{100 * m.headroom_fraction:.1f} %") for m in e.memory],
              right=["pipe", "stage", "used GiB", "usable GiB", "headroom GiB", "headroom"]),
    )
    if e.what_if:
        show(table("What would change the answer (search re-run with the plan's micro batch; change vs this plan)",
                   ["what-if", "step s", "step", "tokens/s", "tokens/s", "GPUs", "pipes", "note"],
                   [(w.name, "-" if w.step_s is None else f"{w.step_s:.4f}", _pct(w.step_change),
                     "-" if w.tokens_per_s is None else f"{w.tokens_per_s:,.0f}", _pct(w.tokens_per_s_change),
                     "-" if w.num_gpus is None else w.num_gpus, "-" if w.pipelines is None else w.pipelines,
                     w.error or ("time limit hit" if w.timed_out else ""))
                    for w in e.what_if],
                   right=["step s", "step", "tokens/s", "GPUs", "pipes"]))


def explain_command(
    plan_path: Path = PLAN_ARG,
    cluster_path: Path = CLUSTER_OPT,
    profiles: Path | None = PROFILES_OPT,
    knobs: Path | None = KNOBS_OPT,
    what_if: bool = typer.Option(True, "--what-if/--no-what-if", help="re-run the search with one more node of "
                                 "each type and with 2x the global batch"),
    time_limit: float = typer.Option(WHAT_IF_TIME_LIMIT_S, "--time-limit", min=0.01,
                                     help="seconds per what-if search"),
    json_out: bool = JSON_OPT,
) -> None:
    """Why this plan: bottleneck stage, memory headroom per stage, idle GPUs, and what would change it."""
    plan, cluster = load_plan(plan_path), load_cluster(cluster_path)
    cost = load_cost_model(profiles, knobs_file=knobs)
    _checked(plan, cluster, cost)
    result = explain(plan, cluster, cost, what_if=what_if, time_limit=time_limit,
                     search_cost=load_cost_model(profiles, knobs_file=knobs))
    report_fallbacks(cost)
    if json_out:
        print_json(result.to_dict())
        return
    _show_explanation(plan, result)


def _compare_rows(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    a, b = doc["a"], doc["b"]

    def both(fmt: Any, key: str) -> tuple[str, str]:
        return fmt(a[key]), fmt(b[key])

    rows = [
        ("step time s", *both(lambda x: f"{x:.4f}", "step_s")),
        ("tokens/s", *both(lambda x: f"{x:,.0f}", "tokens_per_s")),
        ("MFU", *both(lambda x: f"{100 * x:.1f} %", "mfu")),
        ("TFLOP/s per GPU", *both(lambda x: f"{x:.1f}", "tflops_per_gpu")),
        ("GPUs used", *both(str, "num_gpus")),
        ("GPUs by type", *both(lambda d: ", ".join(f"{n} {g}" for g, n in d.items()), "gpus_by_type")),
        ("pipelines", *both(str, "num_pipelines")),
        ("stages per pipeline", *both(lambda v: ",".join(map(str, v)), "stages_per_pipeline")),
        ("microbatches per pipeline", *both(lambda v: ",".join(map(str, v)), "microbatches_per_pipeline")),
        ("pipeline time ms", *both(lambda v: ", ".join(fmt_ms(x) for x in v), "pipeline_s")),
        ("micro batch / global batch", f"{a['micro_batch']} / {a['global_batch']}",
         f"{b['micro_batch']} / {b['global_batch']}"),
    ]
    return rows


def compare_command(
    plan_a: Path = typer.Argument(..., metavar="PLAN_A.json", help="first plan file (hetplan.plan/v1)"),
    plan_b: Path = typer.Argument(..., metavar="PLAN_B.json", help="second plan file (hetplan.plan/v1)"),
    cluster_path: Path = CLUSTER_OPT,
    profiles: Path | None = PROFILES_OPT,
    knobs: Path | None = KNOBS_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Two plans side by side on one cluster: step, tokens/s, MFU, pipelines, GPUs and how their shapes differ."""
    a, b, cluster = load_plan(plan_a), load_plan(plan_b), load_cluster(cluster_path)
    cost = load_cost_model(profiles, knobs_file=knobs)
    _checked(a, cluster, cost, "PLAN_A: ")
    _checked(b, cluster, cost, "PLAN_B: ")
    doc = compare(a, b, cluster, cost)
    report_fallbacks(cost)
    if json_out:
        print_json(doc)
        return
    ratio = doc["b_vs_a"]
    verdict = {"a": "A is faster", "b": "B is faster", "tie": "A and B tie"}[doc["faster"]]
    show(table(f"A = {plan_a}, B = {plan_b}", ["", "A", "B"], _compare_rows(doc)),
         f"{verdict}: B/A tokens/s {ratio['speedup']:.3f}x, step time {ratio['step_ratio']:.3f}x, "
         f"GPUs {ratio['gpus_delta']:+d}")
    show(f"A bottleneck: {doc['a']['bottleneck']}", f"B bottleneck: {doc['b']['bottleneck']}")
    for line in doc["differences"] or ["same shape"]:
        show(f"- {line}")


def _timeline_json(timeline: Any) -> dict[str, Any]:
    return {
        "step_s": timeline.step_s, "closed_form_step_s": timeline.closed_form_step_s,
        "tail_s": timeline.tail_s, "overhead_s": timeline.overhead_s,
        "pipelines": [{
            "pipeline": pi, "schedule": t.schedule, "microbatches": t.microbatches, "makespan_s": t.makespan_s,
            "closed_form_s": t.closed_form_s, "busy_s": list(t.busy_s), "idle_s": list(t.idle_s),
            "peak_in_flight": list(t.peak_in_flight),
            "ops": [{"stage": o.stage, "kind": o.kind, "microbatch": o.microbatch, "start_s": o.start_s,
                     "end_s": o.end_s} for o in t.ops]} for pi, t in enumerate(timeline.pipelines)],
    }


def schedule_command(
    plan_path: Path = PLAN_ARG,
    cluster_path: Path = CLUSTER_OPT,
    profiles: Path | None = PROFILES_OPT,
    knobs: Path | None = KNOBS_OPT,
    png: Path | None = typer.Option(None, "--png", help="write the timeline as a PNG (needs matplotlib)"),
    force: bool = typer.Option(False, "--force", help="replace an existing --png file"),
    width: int = typer.Option(72, "--width", min=8, max=400, help="columns of the text timeline"),
    json_out: bool = JSON_OPT,
) -> None:
    """Simulated pipeline timeline of a plan: text on stderr, or a PNG with --png."""
    from planner.simulate import render_timeline_text, simulate_plan

    plan, cluster = load_plan(plan_path), load_cluster(cluster_path)
    cost = load_cost_model(profiles, knobs_file=knobs)
    _checked(plan, cluster, cost)
    if png is not None and png.exists() and not force:
        raise HetplanError("--png", f"{png} exists (use --force to replace it)")
    timeline = simulate_plan(plan, cluster, cost, check=False)
    report_fallbacks(cost)
    written = None
    if png is not None:
        from planner.report.timeline_png import render_png

        png.parent.mkdir(parents=True, exist_ok=True)
        written = render_png(timeline, png, f"{plan.model.name}: simulated step {timeline.step_s:.4g} s "
                                            f"(closed form {timeline.closed_form_step_s:.4g} s)")
    if json_out:
        print_json({**_timeline_json(timeline), "png": str(written) if written else None})
        return
    if written is not None:
        show(f"wrote {written}")
        return
    for pi, t in enumerate(timeline.pipelines):
        show(f"pipeline {pi}: {t.num_stages} stage(s), {t.microbatches} microbatches",
             render_timeline_text(t, width))
    show(f"step {timeline.step_s:.4f} s simulated (closed form {timeline.closed_form_step_s:.4f} s) = slowest "
         f"pipeline + tail {timeline.tail_s:.4f} s + overhead {timeline.overhead_s:.4f} s")


def register(app: typer.Typer) -> None:
    app.command("explain")(explain_command)
    app.command("compare")(compare_command)
    app.command("schedule")(schedule_command)
