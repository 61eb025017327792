"""Sweep reports: a CSV of every (scenario, planner) record, a markdown comparison, two plots.

The comparison takes, per scenario, our plan against the fastest *valid* baseline plan (an invalid
or infeasible baseline is listed in the notes, never counted as best). Speed-up is
`baseline step / our step - 1`, both plans scored by the same evaluator under the scenario's cost
model. Output order follows the records (scenarios as given, planners in registry order), so the
same records always give the same files. matplotlib is imported only to draw the plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import write_csv
from benchmarks.runner import OURS
from planner.cli.output import json_text, warn

FIELDS = ["scenario", "planner", "status", "model", "gpus", "gpu_types", "global_batch", "seq_len", "cost",
          "step_s", "tokens_per_s", "mfu", "tflops_per_gpu", "planning_s", "lower_bound_s", "gap", "gpus_used",
          "pipelines", "micro_batch", "bottleneck", "reason", "violations", "key"]
NOTE_CHARS = 100


def csv_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "violations": "; ".join(r.get("violations") or [])} for r in records]


def _scenarios(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r["scenario"], []).append(r)
    return out


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= NOTE_CHARS else text[: NOTE_CHARS - 3] + "..."


def summary(records: Sequence[dict[str, Any]], ours: str = OURS) -> list[dict[str, Any]]:
    """One row per scenario: our plan, the best valid baseline, speed-up, planning times, notes."""
    out = []
    for name, rows in _scenarios(records).items():
        mine = next((r for r in rows if r["planner"] == ours), None)
        valid = [(r["step_s"], i, r) for i, r in enumerate(rows) if r["planner"] != ours and r.get("status") == "ok"]
        best = min(valid, key=lambda v: v[:2])[2] if valid else None  # ties: the first in registry order
        our_ok = mine is not None and mine.get("status") == "ok"
        speedup = 100 * (best["step_s"] / mine["step_s"] - 1) if our_ok and best else None
        ratio = mine["tokens_per_s"] / best["tokens_per_s"] if our_ok and best else None
        notes = [f"{r['planner']}: {r.get('status')} ({_short(r.get('reason', ''))})"
                 for r in rows if r.get("status") != "ok"]
        first = rows[0]
        out.append({
            "scenario": name, "model": first["model"], "gpus": first["gpus"], "cost": first.get("cost"),
            "ours_status": mine.get("status") if mine else None,
            "ours_step_s": mine.get("step_s") if our_ok else None,
            "ours_gap": mine.get("gap") if our_ok else None,
            "ours_planning_s": mine.get("planning_s") if mine else None,
            "best_baseline": best["planner"] if best else None,
            "best_baseline_step_s": best["step_s"] if best else None,
            "baseline_planning_s": best.get("planning_s") if best else None,
            "speedup_pct": speedup, "throughput_ratio": ratio, "notes": notes})
    return out


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(head: list[str], body: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body])


def markdown(records: Sequence[dict[str, Any]], ours: str = OURS) -> str:
    """The comparison table per scenario, then every record."""
    rows = summary(records, ours)
    head = ["scenario", "GPUs", "model", "cost", f"{ours} step s", "gap %", "best baseline", "baseline step s",
            "speed-up", f"{ours} planning s", "baseline planning s", "notes"]
    body = [[r["scenario"], str(r["gpus"]), r["model"], r["cost"] or "-",
             _f(r["ours_step_s"], ".4f") if r["ours_step_s"] is not None else (r["ours_status"] or "-"),
             _f(None if r["ours_gap"] is None else 100 * r["ours_gap"], ".2f"), r["best_baseline"] or "none valid",
             _f(r["best_baseline_step_s"], ".4f"), _f(r["speedup_pct"], "+.1f") + ("%" if r["speedup_pct"] is not None else ""),
             _f(r["ours_planning_s"], ".2f"), _f(r["baseline_planning_s"], ".2f"), "; ".join(r["notes"]) or "all valid"]
            for r in rows]
    detail_head = ["scenario", "planner", "status", "step s", "tokens/s", "MFU %", "GPUs used", "planning s",
                   "gap %", "reason"]
    detail = [[r["scenario"], r["planner"], str(r.get("status")), _f(r.get("step_s"), ".4f"),
               _f(r.get("tokens_per_s"), ",.0f"), _f(None if r.get("mfu") is None else 100 * r["mfu"], ".1f"),
               _f(r.get("gpus_used"), "d"), _f(r.get("planning_s"), ".2f"),
               _f(None if r.get("gap") is None else 100 * r["gap"], ".2f"), _short(r.get("reason") or "")]
              for r in records]
    intro = (f"Speed-up = best valid baseline step / {ours} step - 1; every plan is re-scored by the same "
             "evaluator under its scenario's cost model and checked by the plan validator. Planning times are "
             "wall-clock seconds of each planner in its worker.")
    lines = ["# hetplan bench", "", intro, "", *_table(head, body), "", "## Every planner", "",
             *_table(detail_head, detail), ""]
    return "\n".join(lines)


def plots(out_dir: Path, records: Sequence[dict[str, Any]], ours: str = OURS) -> list[Path]:
    """throughput_ratio.png (ours / best baseline, per scenario) and search_time.png (planning time
    against GPUs, log-log, one line per planner)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    rows = [r for r in summary(records, ours) if r["throughput_ratio"] is not None]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(rows) + 2), 4.5))
    ax.bar([r["scenario"] for r in rows], [r["throughput_ratio"] for r in rows], color="tab:blue")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"tokens/s: {ours} / best valid baseline")
    ax.set_title("Throughput ratio per scenario (same evaluator)")
    ax.tick_params(axis="x", labelrotation=60)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    fig.tight_layout()
    written.append(out_dir / "throughput_ratio.png")
    fig.savefig(written[-1], dpi=120, metadata={"Software": None})
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    planners = list(dict.fromkeys(r["planner"] for r in records))
    for name in planners:
        pts = sorted((r["gpus"], r["planning_s"]) for r in records
                     if r["planner"] == name and (r.get("planning_s") or 0) > 0)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs in the pool")
    ax.set_ylabel("planning time, s")
    ax.set_title("Planning time against pool size")
    if planners:
        ax.legend()
    fig.tight_layout()
    written.append(out_dir / "search_time.png")
    fig.savefig(written[-1], dpi=120, metadata={"Software": None})
    plt.close(fig)
    return written


def write_report(out: Path, records: Sequence[dict[str, Any]], with_plots: bool = True,
                 ours: str = OURS) -> list[Path]:
    """results.csv, results.json (records without plans), report.md and, with matplotlib, plots/."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "results.csv", FIELDS, csv_rows(records))
    slim = [{k: v for k, v in r.items() if k != "plan"} for r in records]
    (out / "results.json").write_text(json_text({"records": slim, "summary": summary(records, ours)}),
                                      encoding="utf-8")
    (out / "report.md").write_text(markdown(records, ours), encoding="utf-8")
    written = [out / "results.csv", out / "results.json", out / "report.md"]
    if with_plots:
        try:
            written += plots(out / "plots", records, ours)
        except ImportError:
            warn("matplotlib is not installed: no plots (pip install 'hetplan[plot]')")
    return written
