"""`hetplan emit PLAN.json --cluster C.yaml --target megatron|flagscale|rankmap|any --out DIR`:
write launch files for a validated plan. `any` writes every target that can express the plan and says
why the others cannot. Files are never silently overwritten and never land outside DIR."""

from __future__ import annotations

from pathlib import Path

import typer

from planner.cli.evaluate_cmd import CLUSTER_OPT, PLAN_ARG
from planner.cli.output import print_json, show, warn
from planner.emit.targets import EMITTERS
from planner.errors import HetplanError
from planner.plan import load_plan
from planner.specs.cluster import load_cluster
from planner.validate import violations


def _safe_target(out: Path, name: str) -> Path:
    root = out.resolve()
    path = (root / name).resolve()
    if root not in path.parents:
        raise HetplanError("--out", f"refusing to write '{name}' outside {out}")
    return path


def emit_command(
    plan_path: Path = PLAN_ARG,
    cluster_path: Path = CLUSTER_OPT,
    target: str = typer.Option("any", "--target", help=f"{', '.join(EMITTERS)} or any"),
    out: Path = typer.Option(..., "--out", help="directory for the launch files"),
    force: bool = typer.Option(False, "--force", help="replace existing files"),
    json_out: bool = typer.Option(False, "--json", help="print what was written as JSON on stdout"),
) -> None:
    """Write the launch files of a plan for one engine (or every engine that can run it)."""
    if target != "any" and target not in EMITTERS:
        raise HetplanError("--target", f"unknown target '{target}' ({', '.join(EMITTERS)}, any)")
    plan, cluster = load_plan(plan_path), load_cluster(cluster_path)
    found = violations(plan, cluster)
    if found:
        raise HetplanError(found[0].where, f"{found[0].reason} [{found[0].rule}]")
    names = list(EMITTERS) if target == "any" else [target]
    files: dict[str, str] = {}
    refused: dict[str, str] = {}
    for name in names:
        try:
            files.update(EMITTERS[name](plan, cluster))
        except HetplanError as exc:
            if target != "any":
                raise
            refused[name] = exc.reason
    paths = {name: _safe_target(out, name) for name in sorted(files)}
    clash = [str(p) for p in paths.values() if p.exists()]
    if clash and not force:
        raise HetplanError("--out", f"{clash[0]} exists (use --force to replace it)")
    for name, path in paths.items():  # everything is checked before the first byte is written
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[name], encoding="utf-8")
    if json_out:
        print_json({"written": [str(p) for p in paths.values()], "refused": refused})
        return
    for p in paths.values():
        show(f"wrote {p}")
    for name, reason in refused.items():
        warn(f"{name}: {reason}")


def register(app: typer.Typer) -> None:
    app.command("emit")(emit_command)
