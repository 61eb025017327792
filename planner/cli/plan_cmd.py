"""`hetplan plan`: search the fastest plan for a model on a cluster file, print it, write plan.json.

The table and progress bar go to stderr; `--json` prints the plan and the search summary on stdout.
`--out DIR` writes DIR/plan.json (created; never silently overwritten, `--force` replaces it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from planner.cli.evaluate_cmd import KNOBS_OPT, PROFILES_OPT, _stage_rows, load_cost_model, report_fallbacks
from planner.cli.output import err_console, key_values, print_json, show, table, warn
from planner.errors import HetplanError
from planner.search import SearchResult, search
from planner.search.api import check_choice
from planner.search.history import plan_found
from planner.specs.cluster import ClusterSpec, load_cluster
from planner.specs.models import load_model
from planner.specs.training import TrainingSpec


def _int_list(text: str | None, field: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise HetplanError(field, f"'{text}' is not a comma-separated list of integers") from None
    if not values or any(v < 1 for v in values):
        raise HetplanError(field, "needs positive integers")
    return values


def write_plan_file(out: Path, text: str, force: bool) -> Path:
    """Write out/plan.json; refuse to replace an existing file unless `force`."""
    if out.exists() and not out.is_dir():
        raise HetplanError("--out", f"{out} exists and is not a directory")
    target = out / "plan.json"
    if target.exists() and not force:
        raise HetplanError("--out", f"{target} exists (use --force to replace it)")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".plan.json.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
    return target


def summary(result: SearchResult) -> dict[str, Any]:
    """The deterministic part of a search result (no wall-clock times)."""
    stats = result.counts()
    return {
        "lower_bound_s": result.lower_bound_s, "gap": result.gap, "coverage": result.coverage,
        "coverage_bound_s": result.coverage_bound_s,
        "timed_out": result.timed_out, "idle_gpus": result.idle_gpus, "explanation": result.explanation,
        "explored": stats,
        "alternatives": [{"step_s": p.predicted.step_s if p.predicted else None, "micro_batch": p.micro_batch,
                          "pipelines": len(p.pipelines), "gpus": p.num_gpus} for p in result.alternatives],
        "history": [m.deterministic() for m in result.history],
    }


def _found(result: SearchResult) -> str:
    """When the plan was first the best (seconds into the search, and what found it): a time limit
    past it returns the same plan."""
    m = plan_found(result.history)
    return "-" if m is None else f"{m.seconds:.2f} s into the search ({m.phase.replace('_', ' ')})"


def _beyond(result: SearchResult) -> str:
    """', its bound X s' when the plan lies outside the coverage and beats that bound."""
    covered = result.coverage_bound_s
    if covered is None or covered <= result.lower_bound_s:
        return ""
    return f", its bound {covered:.4f} s (the plan lies outside it)"


def _launch_files(result: SearchResult, cluster: ClusterSpec, target: str) -> tuple[dict[str, str], dict[str, str]]:
    """Launch files of the target(s) for the chosen plan; with `any`, the reasons of those refused."""
    from planner.emit.targets import EMITTERS

    names = list(EMITTERS) if target == "any" else [target]
    files: dict[str, str] = {}
    refused: dict[str, str] = {}
    for name in names:
        try:
            files.update(EMITTERS[name](result.plan, cluster))
        except HetplanError as exc:
            if target != "any":
                raise
            refused[name] = exc.reason
    return files, refused


def plan_command(
    cluster_path: Path = typer.Argument(..., metavar="CLUSTER.yaml", help="cluster YAML/JSON file"),
    model: str = typer.Option(..., "--model", help="catalog name or a YAML/JSON ModelSpec file"),
    global_batch: int = typer.Option(..., "--global-batch", min=1, help="sequences per step"),
    seq: int | None = typer.Option(None, "--seq", min=1, help="sequence length (default: the model's)"),
    zero: int = typer.Option(0, "--zero", min=0, max=3, help="0 plain DP, 1 distributed optimizer, 2, 3"),
    recompute: str = typer.Option("none,selective,full", "--recompute", help="modes the search may use"),
    micro_batches: str | None = typer.Option(None, "--micro-batches", help="microbatch sizes, e.g. 1,2,4"),
    time_limit: float | None = typer.Option(None, "--time-limit", min=0.01,
                                            help="seconds; best plan so far + gap (checked between pieces "
                                                 "of work: the first plan may take longer)"),
    solver: str = typer.Option("cpsat", "--solver", help="assignment ILP: cpsat, cbc or highs"),
    max_blocks: int = typer.Option(3, "--max-blocks", min=1, max=3,
                                   help="runs of identical groups per pipeline (large pools)"),
    refine_gap: float = typer.Option(0.015, "--refine-gap", min=0.0,
                                     help="large pools: tighten the bound until the gap is at most this "
                                          "(0.015 = 1.5 %)"),
    stop_gap: float | None = typer.Option(None, "--stop-gap", min=0.0,
                                          help="large pools: stop once the gap is at most this (0.02 = 2 %), "
                                               "skipping the polish and further refinement; "
                                               "faster, the plan may be up to that much slower"),
    polish: str = typer.Option("auto", "--polish",
                               help="re-solve the best units' plans with tail-capped stage options: auto (the two "
                                    "lowest-bound units; four when the gap misses --refine-gap or tails are 5 % of "
                                    "the step), always (four), never; also the units the best plan came from"),
    chains: str = typer.Option("auto", "--chains",
                               help="also try the most promising FlagScale mesh chains (pipelines of any number "
                                    "of runs): auto (pools up to 64 GPUs whose coverage leaves such pipelines out "
                                    "or whose gap stays above --refine-gap), always, never"),
    workers: int = typer.Option(min(4, os.cpu_count() or 1), "--workers", min=1,
                                help="processes for the split frontiers (large pools); the plan does not depend on it"),
    profiles: Path | None = PROFILES_OPT,
    knobs: Path | None = KNOBS_OPT,
    measured_only: bool = typer.Option(False, "--measured-only",
                                       help="with --profiles: plan only with measured points (no analytic fallback)"),
    target: str | None = typer.Option(None, "--target", help="megatron, flagscale, torchtitan, deepspeed "
                                      "(search only plans that engine runs), slurm or any; with --out, also "
                                      "write the launch files"),
    out: Path | None = typer.Option(None, "--out", help="write DIR/plan.json (and launch files with --target)"),
    force: bool = typer.Option(False, "--force", help="replace an existing DIR/plan.json"),
    json_out: bool = typer.Option(False, "--json", help="print JSON on stdout instead of tables"),
) -> None:
    """Search the fastest plan (with a lower bound and its gap) and print or write it."""
    for keyword, value in (("solver", solver), ("polish", polish), ("chains", chains), ("target", target)):
        check_choice(keyword, value, f"--{keyword}")  # the API's own check names its keyword
    spec = load_model(model, "--model")
    cluster = load_cluster(cluster_path)
    modes = tuple(m.strip() for m in recompute.split(",") if m.strip())
    bad = [m for m in modes if m not in ("none", "selective", "full")]
    if bad or not modes:
        raise HetplanError("--recompute", f"unknown mode(s) {bad or modes}: use none, selective, full")
    training = TrainingSpec(global_batch=global_batch, seq_len=seq or spec.seq_len, zero=zero,
                            recompute=modes, micro_batches=_int_list(micro_batches, "--micro-batches"))
    if measured_only and profiles is None:
        raise HetplanError("--measured-only", "needs --profiles DIR")
    cost = load_cost_model(profiles, measured_only, knobs)
    if out is not None and (out / "plan.json").exists() and not force:
        raise HetplanError("--out", f"{out / 'plan.json'} exists (use --force to replace it)")
    if json_out or not sys.stderr.isatty():  # a progress bar only for a person at a terminal
        result = search(spec, cluster, training, cost=cost, time_limit=time_limit, solver=solver,
                        max_blocks=max_blocks, target=target, workers=workers, refine_gap=refine_gap,
                        polish=polish, chains=chains, stop_gap=stop_gap)
    else:
        from rich.progress import Progress

        with Progress(console=err_console(), transient=True) as bar:
            task = bar.add_task("searching", total=1.0)
            result = search(spec, cluster, training, cost=cost, time_limit=time_limit, solver=solver,
                            max_blocks=max_blocks, target=target, workers=workers, refine_gap=refine_gap,
                            polish=polish, chains=chains, stop_gap=stop_gap,
                            progress=lambda f, msg: bar.update(task, completed=f, description=msg))
    if profiles is not None:  # say which numbers of the chosen plan were modelled, not measured
        from planner.evaluate import evaluate

        fresh = load_cost_model(profiles, measured_only, knobs)
        evaluate(result.plan, cluster, fresh, check=False)
        report_fallbacks(fresh)
    plan_text = result.plan.to_json()
    launch, refused = _launch_files(result, cluster, target) if target and out is not None else ({}, {})
    clash = [n for n in launch if (out / n).exists()] if out is not None else []
    if clash and not force:
        raise HetplanError("--out", f"{out / clash[0]} exists (use --force to replace it)")
    written = write_plan_file(out, plan_text, force) if out is not None else None
    for name, text in sorted(launch.items()):
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for name, reason in refused.items():
        warn(f"{name}: {reason}")
    if json_out:
        import json

        print_json({"plan": json.loads(plan_text), "search": summary(result),
                    "written": str(written) if written else None,
                    "launch_files": sorted(str(out / n) for n in launch) if out is not None else [],
                    "refused": refused})
        return
    pred = result.prediction
    show(
        key_values(f"{spec.name} on {result.plan.num_gpus} GPUs: {len(result.plan.pipelines)} pipeline(s), "
                   f"micro_batch {result.plan.micro_batch}, global batch {global_batch}, seq {training.seq_len}", [
                       ("step time", f"{pred.step_s:.4f} s"),
                       ("lower bound", f"{result.lower_bound_s:.4f} s (gap {100 * result.gap:.2f} %)"),
                       ("tokens/s", f"{pred.tokens_per_s:,.0f}"),
                       ("MFU", f"{100 * pred.mfu:.1f} %"),
                       ("bottleneck", pred.bottleneck),
                       ("coverage", result.coverage + (" (time limit hit)" if result.timed_out else "")
                        + (" (stopped at --stop-gap)" if result.stats.get("stopped_at_gap") else "")
                        + _beyond(result)),
                       ("search time", f"{result.stats.get('search_s', 0.0):.2f} s"),
                       ("plan found", _found(result)),
                       ("cost sources", ", ".join(f"{g}: {s}" for g, s in pred.cost_sources.items())),
                   ]),
        table("Stages (m: microbatches of the pipeline; F, B per microbatch)",
              ["pipe", "stage", "gpu", "layers", "tp/cp/hp/dp", "recompute", "m", "F ms", "B ms",
               "sync ms", "mem GiB / cap", "costs"],
              _stage_rows(result.plan, pred),
              right=["pipe", "stage", "m", "F ms", "B ms", "sync ms", "mem GiB / cap"]),
    )
    for line in result.explanation:
        if "memory headroom" not in line:  # headroom is in the stage table
            show(line)
    if written:
        show(f"wrote {written}")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
