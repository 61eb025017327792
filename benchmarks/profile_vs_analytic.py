"""Analytic model vs measured profiles: decoder-layer fwd+bwd per (model, GPU, tp, microbatch).

    python benchmarks/profile_vs_analytic.py [--profiles profiles/sailor] [--attention naive] [--csv out.csv]
    python benchmarks/profile_vs_analytic.py --profiles profiles/h200 --attention flash --by-tp
    python benchmarks/profile_vs_analytic.py --profiles profiles/h200 --ratio-to profiles/sailor --quiet

Prints one row per measured decoder entry, then the mean absolute percentage error (MAPE) and the median
measured/analytic ratio per GPU type, over all files and over the files without import warnings. The
ratio per GPU is what a per-GPU efficiency calibration would have to absorb. Files written by
`hetplan profile` time one TP rank's compute (meta `tp_communication: not executed`): for those the
analytic side leaves out its TP collectives too (the term `MeasuredCostModel` adds back), so both
sides are compute; Sailor's runs include their TP communication, and so does the analytic side there.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import DeviceClass, Shard
from planner.costmodel.knobs import Knobs, default_knobs
from planner.costmodel.profile import load_profiles
from planner.specs.gpus import get_gpu
from planner.specs.models import get_model
from planner.specs.training import TrainingSpec

REPO = Path(__file__).resolve().parents[1]
FIELDS = ["model", "gpu", "tp", "micro_batch", "measured_ms", "analytic_ms", "rel_err", "flagged"]


def compare(profile_dir: Path, knobs: Knobs, attention: str, sp: bool) -> list[dict]:
    analytic = AnalyticCostModel(knobs)
    rows = []
    for prof in load_profiles(profile_dir):
        gpu, model = get_gpu(prof.gpu), get_model(prof.model)
        dev = DeviceClass(gpu, gpu.gpus_per_node, gpu.intra_bw_gbs, gpu.nic_gbps / 8.0)
        flagged = bool(prof.meta.get("warnings"))
        for e in prof.entries:
            if e.layer != "decoder" or e.recompute != "none":
                continue
            training = TrainingSpec(global_batch=e.micro_batch, seq_len=e.seq_len,
                                    dtype="fp16" if prof.dtype == "fp32" else prof.dtype,
                                    attention=attention, sequence_parallel=sp)
            shard = Shard(e.tp, e.cp, e.hp, e.micro_batch, "none", e.seq_len)
            t = analytic.layer_table(dev, shard, model, training)
            ana_ms = 1e3 * float(t.fwd_s[1] + t.bwd_s[1])
            if e.tp > 1 and str(prof.meta.get("tp_communication", "")).startswith("not executed"):
                ana_ms -= 1e3 * 2 * analytic.tp_collective_s(dev, shard, model, training)  # fwd and bwd
            meas_ms = e.fwd_ms + e.bwd_ms
            rows.append({"model": prof.model, "gpu": prof.gpu, "tp": e.tp, "micro_batch": e.micro_batch,
                         "measured_ms": meas_ms, "analytic_ms": ana_ms,
                         "rel_err": (ana_ms - meas_ms) / meas_ms, "flagged": flagged})
    return rows


def by_tp(rows: list[dict]) -> list[str]:
    """Markdown rows: per model, per tp, measured / analytic as min / median / max over microbatches."""
    tps = sorted({r["tp"] for r in rows})
    out = ["| model | " + " | ".join(f"tp {t}" for t in tps) + " |", "| --- |" + " --- |" * len(tps)]
    for model in sorted({r["model"] for r in rows}):
        cells = []
        for t in tps:
            v = [r["measured_ms"] / r["analytic_ms"] for r in rows if r["model"] == model and r["tp"] == t]
            cells.append(f"{min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f}" if v else "")
        out.append(f"| {model} | " + " | ".join(cells) + " |")
    return out


def decoder_ms(prof) -> dict[tuple[int, int, int], float]:  # noqa: ANN001 - a loaded Profile
    """Decoder fwd+bwd without recompute by (tp, microbatch, sequence length)."""
    return {(e.tp, e.micro_batch, e.seq_len): e.fwd_ms + e.bwd_ms for e in prof.entries
            if e.layer == "decoder" and e.recompute == "none" and e.cp == e.hp == 1}


def ratios(profile_dir: Path, other_dir: Path) -> list[tuple[str, str, int, float, float]]:
    """Per model of `profile_dir` and GPU of `other_dir`'s file of that model: (model, its GPU,
    shapes in common, least and largest ratio of the other file's decoder time to this one's)."""
    mine = {p.model: decoder_ms(p) for p in load_profiles(profile_dir)}
    out = []
    for other in load_profiles(other_dir):
        if other.model not in mine:
            continue
        theirs, ours = decoder_ms(other), mine[other.model]
        common = sorted(set(ours) & set(theirs))
        if common:
            r = [theirs[k] / ours[k] for k in common]
            out.append((other.model, other.gpu, len(common), min(r), max(r)))
    return sorted(out)


def summary(rows: list[dict]) -> list[tuple[str, int, float, float, int, float, float]]:
    """(gpu, n, MAPE, median measured/analytic, n unflagged, MAPE unflagged, ratio unflagged)."""
    out = []
    for gpu in sorted({r["gpu"] for r in rows}):
        mine = [r for r in rows if r["gpu"] == gpu]
        clean = [r for r in mine if not r["flagged"]]

        def stats(rs: list[dict]) -> tuple[float, float]:
            if not rs:
                return float("nan"), float("nan")
            return (100 * statistics.fmean(abs(r["rel_err"]) for r in rs),
                    statistics.median(r["measured_ms"] / r["analytic_ms"] for r in rs))

        m_all, r_all = stats(mine)
        m_clean, r_clean = stats(clean)
        out.append((gpu, len(mine), m_all, r_all, len(clean), m_clean, r_clean))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=REPO / "profiles" / "sailor")
    ap.add_argument("--attention", choices=["flash", "naive"], default="naive",
                    help="analytic attention kernel; Sailor's runs were non-flash (see profile meta)")
    ap.add_argument("--sp", action="store_true", help="analytic model with sequence parallelism")
    ap.add_argument("--builtin-knobs", action="store_true", help="Knobs() constants, not the packaged file")
    ap.add_argument("--csv", type=Path, help="write every row to this CSV file")
    ap.add_argument("--quiet", action="store_true", help="summary only")
    ap.add_argument("--by-tp", action="store_true",
                    help="also a markdown table of measured / analytic per model and tp")
    ap.add_argument("--ratio-to", type=Path,
                    help="also each same-model file there: its decoder time over these, shape for shape")
    args = ap.parse_args(argv)
    knobs = Knobs() if args.builtin_knobs else default_knobs()
    rows = compare(args.profiles, knobs, args.attention, args.sp)
    if not args.quiet:
        print(f"{'model':<14}{'gpu':<17}{'tp':>3}{'mb':>5}{'measured ms':>13}{'analytic ms':>13}{'rel err':>9}")
        for r in rows:
            print(f"{r['model']:<14}{r['gpu']:<17}{r['tp']:>3}{r['micro_batch']:>5}{r['measured_ms']:>13.3f}"
                  f"{r['analytic_ms']:>13.3f}{100 * r['rel_err']:>8.1f}%{'  *' if r['flagged'] else ''}")
        print("* file flagged at import (anomalously slow, see its meta.warnings)\n")
    print(f"decoder fwd+bwd, analytic ({args.attention} attention, sp={args.sp}, "
          f"{'built-in' if args.builtin_knobs else 'packaged'} knobs) vs measurements in {args.profiles}")
    print(f"{'gpu':<17}{'n':>4}{'MAPE':>8}{'meas/ana':>10}{'n clean':>9}{'MAPE':>8}{'meas/ana':>10}")
    for gpu, n, m, r, nc, mc, rc in summary(rows):
        print(f"{gpu:<17}{n:>4}{m:>7.1f}%{r:>10.2f}{nc:>9}{mc:>7.1f}%{rc:>10.2f}")
    if args.by_tp:
        print("\ndecoder fwd+bwd measured / analytic, min / median / max over microbatch sizes")
        print("\n".join(by_tp(rows)))
    if args.ratio_to:
        print(f"\ndecoder fwd+bwd (recompute none) in {args.ratio_to} over {args.profiles}, "
              "same tp, microbatch and seq")
        print(f"{'model':<14}{'gpu':<17}{'shapes':>7}{'least':>8}{'largest':>9}")
        for model, gpu, n, lo, hi in ratios(args.profiles, args.ratio_to):
            print(f"{model:<14}{gpu:<17}{n:>7}{lo:>8.1f}{hi:>9.1f}")
    if args.csv:
        with args.csv.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS)
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
