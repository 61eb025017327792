"""The default search alone on random mixed pools: time, step, gap and work per pool.

    python benchmarks/random_search.py [--seed 31] [--count 30] [--csv FILE]

Draws the pools of `chain_check.py` (same seed, same pools) and runs only the default search on
each, one worker, so that a change to the search can be compared pool by pool on two checkouts
(run it on each, then compare the "step s" columns; times vary by 10-30 % from run to run on a
busy 2-core machine). Prints one row per pool and a summary; `--csv` also writes the rows. Draws
that fit nowhere are skipped.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.chain_check import draw
from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError
from planner.search import api

HEAD = ["#", "pool", "GPUs", "coverage", "search s", "step s", "lower bound s", "gap %", "units refined",
        "units polished"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--csv", type=Path, default=None)
    args = ap.parse_args()
    cost = AnalyticCostModel()
    rng = random.Random(args.seed)
    rows: list[list[str]] = []
    print("| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD), flush=True)
    for i in range(args.count):
        name, model, cluster, training = draw(rng)
        try:
            res = api.search(model, cluster, training, cost=cost)
        except HetplanError:
            continue
        row = [str(i), name, str(cluster.num_gpus), res.coverage, f"{res.stats['search_s']:.2f}",
               f"{res.prediction.step_s:.5f}", f"{res.lower_bound_s:.5f}", f"{100 * res.gap:.2f}",
               str(res.stats["units_refined"]), str(res.stats["units_polished"])]
        rows.append(row)
        print("| " + " | ".join(row) + " |", flush=True)
    if args.csv is not None:
        with args.csv.open("w", newline="") as f:
            csv.writer(f).writerows([HEAD] + rows)
    if rows:
        times = [float(r[4]) for r in rows]
        gaps = [float(r[7]) for r in rows]
        print(f"\n{len(rows)} pools; search {sum(times):.1f} s in all, median {statistics.median(times):.2f} s, "
              f"at most {max(times):.2f} s; gap at most {max(gaps):.2f} %")


if __name__ == "__main__":
    main()
