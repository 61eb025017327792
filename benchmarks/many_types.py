"""The default search on random pools of many GPU types: time, step, gap and what the mesh chains did.

    python benchmarks/many_types.py [--seed 1 [2 ...]] [--count 24] [--time-limit 120] [--workers 1]
                                    [--stop-gap G] [--csv FILE]

`chain_check.py` and `random_search.py` draw pools of two or three types and at most ~60 GPUs; users
with mixed fleets meet more: here three to seven of eleven types, 1-16 nodes of 1-8 GPUs each (up to
several hundred GPUs), eight models up to 70B, 1k-64k tokens, global batches 8-1,024, ZeRO 0 or 1.
Each plan is checked again: the validator must accept it and the evaluator must reproduce its
step, else the row says so. "plan found s" is when the final plan was first the best, and what
found it (`planner.search.history`): where it comes long before the end, the rest of the search
went to proving the gap. Draws that fit nowhere are listed with the reason. Times vary by 10-30 %
from run to run on a busy 2-core machine. The last lines sum the run up: how many draws fit, how
many of those end within a 2 % gap (the issue's target), which do not, the search times, and when
and by which phase the final plans were found. `--stop-gap G` passes `stop_gap` to the search.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.search import api
from planner.search.history import plan_found
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import ModelSpec, get_model
from planner.validate import violations

GPUS = ("RTX-3090", "RTX-4090", "A100-SXM4-40GB", "A100-SXM4-80GB", "V100-SXM2-16GB", "V100-SXM2-32GB", "T4", "A10",
        "L4", "H100-SXM5-80GB", "H200-SXM-141GB")
MODELS = ("opt-350m", "gpt-neo-2.7b", "llama2-7b", "llama3-8b", "llama2-13b", "gpt3-6.7b", "llama2-70b", "opt-30b")
GAP_GOAL = 0.02  # the gap the summary counts pools within
HEAD = ["seed", "#", "pool", "GPUs", "search s", "plan found s", "step s", "lower bound s", "gap %", "GPUs used",
        "chain", "timed out", "check"]


def draw(rng: random.Random) -> tuple[str, ModelSpec, ClusterSpec, TrainingSpec]:
    """One pool, model and training setup (the same sequence for the same seed)."""
    nodes = [NodeGroup(gpu=g, nodes=rng.choice([1, 1, 2, 3, 4, 8, 16]), gpus_per_node=rng.choice([1, 2, 4, 8, 8]))
             for g in rng.sample(GPUS, rng.randint(3, 7))]
    model = get_model(rng.choice(MODELS))
    seq = rng.choice([1024, 2048, 4096, 8192, 32768, 65536])
    training = TrainingSpec(global_batch=rng.choice([8, 16, 32, 64, 128, 256, 512, 1024]), seq_len=seq,
                            zero=rng.choice([0, 0, 1]))
    pool = " + ".join(f"{n.nodes}x{n.gpus_per_node} {n.gpu}" for n in nodes)
    name = f"{model.name}, seq {training.seq_len}, gb {training.global_batch}, zero {training.zero}: {pool}"
    return name, model, ClusterSpec(nodes=nodes), training


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, nargs="+", default=[1], help="one or more seeds, run in turn")
    ap.add_argument("--count", type=int, default=24, help="draws per seed")
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--stop-gap", type=float, default=None, help="the search's stop_gap (end once the gap is this)")
    ap.add_argument("--csv", type=Path, default=None)
    args = ap.parse_args()
    cost = AnalyticCostModel()
    rows: list[list[str]] = []
    drawn = 0
    print("| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD), flush=True)
    for seed in args.seed:
        rng = random.Random(seed)
        for i in range(args.count):
            name, model, cluster, training = draw(rng)
            drawn += 1
            try:
                res = api.search(model, cluster, training, cost=cost, time_limit=args.time_limit,
                                 workers=args.workers, stop_gap=args.stop_gap)
            except HetplanError as e:
                print(f"| {seed} | {i} | {name} | {cluster.num_gpus} | {e} |", flush=True)
                continue
            again = evaluate(res.plan, cluster, cost).step_s
            ok = not violations(res.plan, cluster, cost) and abs(again - res.prediction.step_s) <= 1e-9 * again
            found = plan_found(res.history)
            row = [str(seed), str(i), name, str(cluster.num_gpus), f"{res.stats['search_s']:.2f}",
                   f"{found.seconds:.2f} ({found.phase})" if found else "-",
                   f"{res.prediction.step_s:.5f}", f"{res.lower_bound_s:.5f}", f"{100 * res.gap:.2f}",
                   str(res.plan.num_gpus),
                   "won" if res.stats.get("chain_added") else ("ran" if res.stats.get("chain_s") else "-"),
                   str(res.timed_out), "ok" if ok else "FAILED"]
            rows.append(row)
            print("| " + " | ".join(row) + " |", flush=True)
    print(summary(rows, drawn))
    if args.csv is not None:
        with args.csv.open("w", newline="") as f:
            csv.writer(f).writerows([HEAD] + rows)


def summary(rows: list[list[str]], drawn: int) -> str:
    """The run in a few lines: draws that fit, how many of them end within `GAP_GOAL`, the rest by
    seed and pool with their gaps, and the search times."""
    at = {name: k for k, name in enumerate(HEAD)}
    gaps = [float(r[at["gap %"]]) for r in rows]
    times = sorted(float(r[at["search s"]]) for r in rows)
    over = [f"seed {r[at['seed']]} pool {r[at['#']]} {r[at['gap %']]} %" for r, g in zip(rows, gaps)
            if g > 100 * GAP_GOAL]
    lines = [f"{len(rows)} of {drawn} draws fit; {len(rows) - len(over)} of them end within a "
             f"{100 * GAP_GOAL:.0f} % gap" + (f"; above it: {', '.join(over)}" if over else "")]
    if times:
        lines.append(f"search s: median {statistics.median(times):.1f}, least {times[0]:.1f}, most {times[-1]:.1f}")
    # "1.23 (polish)": when the final plan was first the best, and the phase that found it
    found = [r[at["plan found s"]].split() for r in rows if r[at["plan found s"]] != "-"]
    if found:
        phases = Counter(phase.strip("()") for _, phase in found)
        lines.append(f"plan found s: median {statistics.median(float(s) for s, _ in found):.1f}, latest "
                     f"{max(float(s) for s, _ in found):.1f}; by " + ", ".join(
                         f"{name} {n}" for name, n in sorted(phases.items(), key=lambda x: (-x[1], x[0]))))
    failed = sum(r[at["check"]] != "ok" for r in rows)
    if failed:
        lines.append(f"{failed} of those plans FAILED the validator or the evaluator's step")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
