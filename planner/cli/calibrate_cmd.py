"""`hetplan calibrate MEASUREMENTS.csv`: fit the analytic model's knobs to measured step times and write
a knob file (`hetplan.knobs/v1`) that `--knobs FILE` loads in `plan` and `evaluate`."""

from __future__ import annotations

from pathlib import Path

import typer

from planner.cli.output import key_values, print_json, show
from planner.errors import HetplanError


def calibrate_command(
    measurements: Path = typer.Argument(..., metavar="MEASUREMENTS.csv",
                                        help="measured runs, columns as shared/data/calibration_measurements.csv"),
    out: Path = typer.Option(Path("knobs.json"), "--out", help="knob file to write"),
    fit: str = typer.Option("gemm_eff_max per GPU type,coll_eff_max,step_overhead_s", "--fit",
                            help="comma-separated knobs; 'X per GPU type' fits X for every GPU with 2+ rows"),
    force: bool = typer.Option(False, "--force", help="replace an existing knob file"),
    json_out: bool = typer.Option(False, "--json", help="print JSON on stdout instead of a table"),
) -> None:
    """Fit a few shared knobs (never one per row) by least squares on log step time."""
    from planner.calibrate import load_measurements, predict_step_s
    from planner.knob_fit import fit_knobs, write_knobs
    from planner.costmodel.knobs import default_knobs

    if out.exists() and not force:
        raise HetplanError("--out", f"{out} exists (use --force to replace it)")
    rows, skipped = load_measurements(measurements)
    if not rows:
        raise HetplanError(str(measurements), "no usable measurement rows")
    start = default_knobs()
    names = tuple(x.strip() for x in fit.split(",") if x.strip())

    def mape(knobs) -> float:  # noqa: ANN001 - Knobs
        return sum(abs(predict_step_s(m, knobs) / m.step_s - 1) for m in rows) / len(rows)

    before = mape(start)
    fitted = fit_knobs(rows, start, names)
    after = mape(fitted)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_knobs(fitted, out)
    result = {"rows": len(rows), "skipped": len(skipped), "mape_before": before, "mape_after": after,
              "fitted": list(names), "written": str(out)}
    if json_out:
        print_json(result)
        return
    show(key_values(f"calibrated on {len(rows)} rows ({len(skipped)} skipped)", [
        ("MAPE before", f"{100 * before:.1f} %"), ("MAPE after", f"{100 * after:.1f} %"),
        ("fitted", ", ".join(names)), ("written", str(out))]))


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate_command)
