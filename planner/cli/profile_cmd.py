"""`hetplan profile` (time a catalog model's layers with PyTorch), `hetplan profile-links` (time
collectives over torch.distributed) and `hetplan profiles` (list profile files).

torch is imported only inside `profile` and `profile-links`; without it they print one line naming the
`profile` extra, and every other command (including `profiles`) works without torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from planner.cli.output import print_json, show, table, warn
from planner.errors import HetplanError

REPO_PROFILES = Path(__file__).resolve().parents[2] / "profiles"
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG]?)(i?[bB])?\s*$")
_UNIT = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def int_list(text: str, field: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); every value a positive integer."""
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise HetplanError(field, f"expected comma-separated integers, got '{text}'") from None
    if not vals or min(vals) < 1:
        raise HetplanError(field, f"expected positive integers, got '{text}'")
    return vals


def size_list(text: str, field: str = "--sizes") -> tuple[int, ...]:
    """'1K,64K,1M' -> bytes (K/M/G are binary: 1K = 1024 bytes), sorted and unique."""
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _SIZE.match(part)
        if not m:
            raise HetplanError(field, f"'{part}' is not a size (e.g. 4096, 64K, 16M, 1G)")
        out.append(int(float(m.group(1)) * _UNIT[m.group(2).lower()]))
    if not out or min(out) < 1:
        raise HetplanError(field, f"expected positive sizes, got '{text}'")
    return tuple(sorted(set(out)))


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise HetplanError("--out", f"{out} exists (use --force to replace it)")


# -- hetplan profile --------------------------------------------------------------------------------
def profile_command(
    model: str = typer.Option(..., "--model", help="catalog model name"),
    tp: str = typer.Option("1", "--tp", help="tensor-parallel degrees, e.g. 1,2,4 (per-rank shapes)"),
    mbs: str = typer.Option("1", "--mbs", help="microbatch sizes, e.g. 1,2,4"),
    seq: int | None = typer.Option(None, "--seq", min=1, help="sequence length (default: the model's)"),
    device: str = typer.Option("cuda", "--device", help="cuda or cpu"),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32"),
    warmup: int = typer.Option(3, "--warmup", min=0, help="unrecorded repetitions first"),
    reps: int = typer.Option(10, "--reps", min=1, help="recorded repetitions (the median is kept)"),
    max_spread: float = typer.Option(0.2, "--max-spread", min=0.0,
                                     help="refuse if (max-min)/median of any timing's repetitions exceeds this"),
    recompute: str = typer.Option("none,selective,full", "--recompute",
                                  help="none plus any of selective, full (activation checkpointing)"),
    attention: str = typer.Option("flash", "--attention", help="flash (torch SDPA) or naive (explicit softmax)"),
    gpu_name: str | None = typer.Option(None, "--gpu-name",
                                        help="catalog GPU type to label the profile with (required on cpu)"),
    threads: int | None = typer.Option(None, "--threads", min=1, help="cpu: torch threads for the run"),
    out: Path = typer.Option(..., "--out", help="profile JSON to write"),
    force: bool = typer.Option(False, "--force", help="replace an existing file"),
    json_out: bool = typer.Option(False, "--json", help="print a JSON summary on stdout"),
) -> None:
    """Time forward, backward and recompute of each layer kind of a catalog model with PyTorch."""
    from planner.specs.models import get_model

    spec = get_model(model, "--model")
    if device not in ("cuda", "cpu"):
        raise HetplanError("--device", f"unknown device '{device}' (cuda, cpu)")
    if dtype not in ("bf16", "fp16", "fp32"):
        raise HetplanError("--dtype", f"unknown dtype '{dtype}' (bf16, fp16, fp32)")
    if attention not in ("flash", "naive"):
        raise HetplanError("--attention", f"unknown attention '{attention}' (flash, naive)")
    _check_out(out, force)
    from planner.profiling import require_torch

    require_torch("profile")
    from planner.costmodel.profile import write_profile
    from planner.profiling.build import ProfileRequest, check_spread, run_profile

    req = ProfileRequest(model=spec, tps=int_list(tp, "--tp"), micro_batches=int_list(mbs, "--mbs"),
                         seq_len=seq or spec.seq_len, device=device, dtype=dtype,  # type: ignore[arg-type]
                         warmup=warmup, reps=reps, attention=attention,  # type: ignore[arg-type]
                         recompute=tuple(m.strip() for m in recompute.split(",") if m.strip()),
                         gpu_name=gpu_name, threads=threads)
    run = run_profile(req)
    rows = [(m.layer, m.tp, m.micro_batch, m.recompute, f"{m.fwd.median_ms:.3f}", f"{m.bwd.median_ms:.3f}",
             f"{m.spread:.3f}", f"{m.act_bytes / 2**20:.2f}") for m in run.measurements]
    show(table(f"{run.profile.model} on {run.profile.meta['device']} ({run.profile.gpu}), seq {req.seq_len}",
               ["layer", "tp", "mb", "recompute", "fwd ms", "bwd ms", "spread", "act MiB"], rows,
               right=["tp", "mb", "fwd ms", "bwd ms", "spread", "act MiB"]))
    check_spread(run, max_spread)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_profile(run.profile, out)
    if json_out:
        print_json({"written": str(out), "gpu": run.profile.gpu, "model": run.profile.model,
                    "entries": len(run.profile.entries), "max_spread": run.worst.spread,
                    "worst": run.worst.label})
    else:
        show(f"wrote {out} ({len(run.profile.entries)} entries, worst spread {run.worst.spread:.3f})")


# -- hetplan profile-links --------------------------------------------------------------------------
def profile_links_command(
    backend: str = typer.Option("nccl", "--backend", help="nccl (GPUs) or gloo (CPU processes)"),
    nproc: int = typer.Option(2, "--nproc", min=2, help="local processes to spawn (ignored under torchrun)"),
    sizes: str | None = typer.Option(None, "--sizes", help="message sizes, e.g. 4K,1M,64M (default: a sweep)"),
    ops: str = typer.Option("all_reduce,all_gather,reduce_scatter,all_to_all,p2p", "--ops",
                            help="collectives to time"),
    warmup: int = typer.Option(2, "--warmup", min=0, help="unrecorded repetitions per size"),
    reps: int = typer.Option(5, "--reps", min=1, help="recorded repetitions per size (median kept)"),
    gpu_name: str | None = typer.Option(None, "--gpu-name", help="catalog GPU type the ranks ran on"),
    into: Path | None = typer.Option(None, "--into", help="also merge the tables into this profile file"),
    out: Path = typer.Option(..., "--out", help="links JSON (hetplan.links/v1) to write"),
    force: bool = typer.Option(False, "--force", help="replace an existing file"),
    json_out: bool = typer.Option(False, "--json", help="print a JSON summary on stdout"),
) -> None:
    """Time all-reduce, all-gather, reduce-scatter, all-to-all and send/recv over message sizes."""
    from planner.profiling.links import OPS, LinksRequest, default_sizes, merge_into, run_links, write_links

    if backend not in ("nccl", "gloo"):
        raise HetplanError("--backend", f"unknown backend '{backend}' (nccl, gloo)")
    op_list = tuple(o.strip() for o in ops.split(",") if o.strip())
    unknown = [o for o in op_list if o not in OPS]
    if unknown or not op_list:
        raise HetplanError("--ops", f"unknown op(s) {unknown or op_list} (known: {', '.join(OPS)})")
    _check_out(out, force)
    if into is not None and not into.is_file():
        raise HetplanError("--into", f"no such profile file: {into}")
    req = LinksRequest(backend=backend, nproc=nproc,  # type: ignore[arg-type]
                       sizes=size_list(sizes) if sizes else default_sizes(backend), ops=op_list,
                       warmup=warmup, reps=reps, gpu_name=gpu_name)
    doc = run_links(req)
    if doc is None:  # a non-zero rank under torchrun: rank 0 writes
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    write_links(doc, out)
    if into is not None:
        merge_into(into, doc)
    rows = [(c.op, c.ranks, c.link, f"{c.bytes[0]:.0f}", f"{c.bytes[-1]:.0f}", f"{c.time_ms[0]:.3f}",
             f"{c.time_ms[-1]:.3f}") for c in doc.collectives]
    if json_out:
        print_json({"written": str(out), "merged_into": str(into) if into else None,
                    "collectives": [c.model_dump(mode="json") for c in doc.collectives]})
        return
    show(table(f"{backend} x {doc.meta['world_size']} ({doc.meta['device']})",
               ["op", "ranks", "link", "min bytes", "max bytes", "min ms", "max ms"], rows,
               right=["ranks", "min bytes", "max bytes", "min ms", "max ms"]), f"wrote {out}")


# -- hetplan profiles -------------------------------------------------------------------------------
def profiles_command(
    dirs: list[Path] = typer.Argument(None, metavar="[DIR...]", help="folders or files to list"),
    shipped: bool = typer.Option(True, "--shipped/--no-shipped", help="include the repository's profiles/"),
    json_out: bool = typer.Option(False, "--json", help="print JSON on stdout instead of a table"),
) -> None:
    """List profile files: GPU type, model, measured or modelled, tp / microbatch coverage, date."""
    from planner.profiling.listing import list_profiles

    roots = ([REPO_PROFILES] if shipped and REPO_PROFILES.is_dir() else []) + list(dirs or [])
    if not roots:
        raise HetplanError("DIR", "no folder to list (give one; the repository's profiles/ is not present)")
    for r in roots:
        if not r.exists():
            raise HetplanError("DIR", f"no such file or directory: {r}")
    rows = list_profiles(roots)
    for r in rows:
        if r["kind"] == "invalid":
            warn(f"{r['path']}: {r['error']}")
    if json_out:
        print_json(rows)
        return
    cols = ["file", "gpu", "model", "source", "dtype", "tp", "micro_batch", "seq", "date"]
    show(table(f"{len(rows)} profile files", ["file", "gpu", "model", "source", "dtype", "tp", "mb", "seq",
                                              "date"], [[_cell(_display(r, c)) for c in cols] for r in rows]))


def _display(row: dict[str, Any], col: str) -> Any:
    """Table cells: paths relative to the working folder, links files named by their ops."""
    if col == "file":
        path = Path(row["path"])
        try:
            return path.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            return path
    if row["kind"] == "links" and col == "model":
        return "links: " + ",".join(row.get("ops", []))
    if row["kind"] == "invalid" and col == "source":
        return "invalid"
    return row.get(col)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):  # long integer series shortened to their range
        if len(value) > 3 and all(isinstance(v, int) for v in value):
            return f"{value[0]}..{value[-1]}"
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_command)
    app.command("profile-links")(profile_links_command)
    app.command("profiles")(profiles_command)
