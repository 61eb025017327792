"""`hetplan bench`: run benchmark scenarios against our planner and the baselines, locally or on Ray.

Every (scenario, planner) pair is one task; with `--out DIR` each finished task is stored as
DIR/tasks/<key>.json and DIR gets results.csv, results.json, report.md and plots/. The key hashes
the task's inputs and the code version, so rerunning into the same DIR resumes: finished tasks are
read back, not rerun.

`--out` safety: DIR is created when missing; an empty DIR is taken; a DIR holding bench.json (the
marker this command writes) is resumed and its report files regenerated; any other non-empty DIR is
refused. `--force` writes into any DIR and reruns every task, replacing its record (other files in
DIR are left alone). Tables and the progress bar go to stderr; `--json` prints the summary and the
records (without plans) on stdout.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from planner.cli.output import err_console, print_json, show, table, warn
from planner.errors import HetplanError


def _benchmarks() -> Any:
    try:
        from benchmarks import executor, report, runner, scenario
    except ImportError as exc:
        raise HetplanError("bench", f"the benchmarks package is not importable ({exc}); install hetplan from a "
                                    "checkout that includes benchmarks/") from None
    return executor, report, runner, scenario


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise HetplanError("--planners", "needs at least one planner name")
    return names


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _summary_table(rows: list[dict[str, Any]], ours: str) -> Any:
    body = [(r["scenario"], r["gpus"], r["model"],
             _fmt(r["ours_step_s"], ".4f") if r["ours_step_s"] is not None else (r["ours_status"] or "-"),
             r["best_baseline"] or "none valid", _fmt(r["best_baseline_step_s"], ".4f"),
             "-" if r["speedup_pct"] is None else f"{r['speedup_pct']:+.1f}%",
             _fmt(r["ours_planning_s"], ".2f"), _fmt(r["baseline_planning_s"], ".2f"),
             "; ".join(r["notes"]) or "all valid") for r in rows]
    return table("Benchmark: speed-up = best valid baseline step / our step - 1 (same evaluator)",
                 ["scenario", "GPUs", "model", f"{ours} step s", "best baseline", "its step s", "speed-up",
                  f"{ours} plan s", "baseline plan s", "notes"], body,
                 right=["GPUs", f"{ours} step s", "its step s", "speed-up", f"{ours} plan s", "baseline plan s"])


def run_bench(scenarios: list[str], backend: str, address: str | None, workers: int | None,
              planners: str | None, time_limit: float | None, out: Path | None, force: bool, json_out: bool,
              registry: Mapping[str, Any] | None = None) -> None:
    """The command's body; `registry` replaces the default planners (tests pass fakes)."""
    executor, report, runner, scenario = _benchmarks()
    if backend not in ("local", "ray"):
        raise HetplanError("--backend", f"unknown backend '{backend}' (local, ray)")
    if address and backend != "ray":
        raise HetplanError("--address", "only with --backend ray")
    if backend == "ray":
        executor.import_ray()  # say so now, even when every task is cached
    loaded = scenario.load_scenarios(scenarios)
    if time_limit is not None:
        loaded = [dataclasses.replace(s, time_limit_s=time_limit) for s in loaded]
    if registry is None:
        registry = runner.default_planners()
        if len(registry) == 1 and planners is None:
            warn("benchmarks.baselines.BASELINES is not available: running hetplan only")
    chosen = runner.select_planners(registry, _names(planners))
    tasks = runner.make_tasks(loaded, chosen)

    def make() -> Any:
        return executor.make_executor(runner.run_task, backend, address, workers)

    with executor.stop_on_sigterm():  # SIGTERM unwinds the executor, which stops its workers
        if json_out or not sys.stderr.isatty():
            result = runner.run_sweep(tasks, make, out, force)
        else:
            from rich.progress import Progress

            with Progress(console=err_console(), transient=True) as bar:
                job = bar.add_task("benchmark", total=len(tasks))

                def tick(done: int, total: int, record: dict[str, Any]) -> None:
                    bar.update(job, completed=done, description=f"{record['scenario']} / {record['planner']}")

                result = runner.run_sweep(tasks, make, out, force, progress=tick)
    written = report.write_report(out, result.records) if out is not None else []
    rows = report.summary(result.records)
    if json_out:
        print_json({"format": runner.OUT_FORMAT, "out": str(out) if out is not None else None,
                    "ran": result.ran, "cached": result.cached, "summary": rows,
                    "records": [{k: v for k, v in r.items() if k != "plan"} for r in result.records]})
        return
    show(_summary_table(rows, runner.OURS),
         f"{len(tasks)} task(s): {result.ran} run, {result.cached} read from {out / 'tasks' if out else '-'}")
    for path in written:
        show(f"wrote {path}")


def register(app: typer.Typer, registry: Mapping[str, Any] | None = None) -> None:
    """Add `bench`; `registry` (name -> planner) replaces hetplan + benchmarks.baselines.BASELINES."""

    def bench_command(
        scenarios: list[str] | None = typer.Argument(None, metavar="[SCENARIOS]...",
                                                     help="scenario files, folders or packaged scenario names "
                                                          "(default: every file in benchmarks/scenarios)"),
        backend: str = typer.Option("local", "--backend", help="local (process pool) or ray"),
        address: str | None = typer.Option(None, "--address", help="Ray address (default: start a local Ray)"),
        workers: int | None = typer.Option(None, "--workers", min=1,
                                           help="tasks at once (local: default 1; ray: CPUs of a local Ray)"),
        planners: str | None = typer.Option(None, "--planners",
                                            help="comma-separated planner names (default: hetplan and every baseline)"),
        time_limit: float | None = typer.Option(None, "--time-limit", min=0.01,
                                                help="seconds; replaces every scenario's time_limit_s"),
        out: Path | None = typer.Option(None, "--out", help="results folder: task cache, CSV, report.md, plots"),
        force: bool = typer.Option(False, "--force", help="write into any --out folder and rerun every task"),
        json_out: bool = typer.Option(False, "--json", help="print JSON on stdout instead of tables"),
    ) -> None:
        """Benchmark sweep: hetplan against baseline planners over scenario files, resumable."""
        run_bench(list(scenarios or []), backend, address, workers, planners, time_limit, out, force, json_out,
                  registry)

    app.command("bench")(bench_command)
