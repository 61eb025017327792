"""Random mixed pools: what the mesh-chain candidate adds, and whether the bound holds against
plans from the engine-restricted searches.

    python benchmarks/chain_check.py [--seed 11] [--count 40] [--markdown]

Draws pools of two or three of nine GPU types (1-3 nodes of 1, 2, 4 or 8 GPUs each), OPT-350M,
GPT-Neo-2.7B or Llama-2 7B, global batch 8-128, sequence 1024-4096, ZeRO 0 or 1. Per pool it runs
the default search, the same with `chains="never"` and `--target flagscale` (every chain, no DP
cap) and prints their steps and times: what the chain candidate
(`planner.search.candidates.chain_candidate`) gained, what it cost, and how far the default
still trails the full chain search. "bound" checks the reported bounds: no FlagScale or Megatron
plan that lies inside the search's coverage may be faster than the coverage's bound
(`SearchResult.coverage_bound_s`). Draws that fit nowhere are skipped.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError
from planner.search import api
from planner.search.explain import outside_coverage
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model

GPUS = ("RTX-3090", "RTX-4090", "A100-SXM4-40GB", "V100-SXM2-16GB", "T4", "A10", "L4", "H100-SXM5-80GB",
        "A100-SXM4-80GB")
MODELS = ("opt-350m", "gpt-neo-2.7b", "llama2-7b")
HEAD = ["#", "pool", "GPUs", "coverage", "search s", "of it chains s", "step s", "without chains s",
        "chain gain %", "flagscale s", "vs flagscale %", "bound"]


def draw(rng: random.Random) -> tuple[str, object, ClusterSpec, TrainingSpec]:
    nodes = [NodeGroup(gpu=g, nodes=rng.randint(1, 3), gpus_per_node=rng.choice([1, 2, 4, 8]))
             for g in rng.sample(GPUS, rng.randint(2, 3))]
    model = get_model(rng.choice(MODELS))
    training = TrainingSpec(global_batch=rng.choice([8, 16, 32, 64, 128]), seq_len=rng.choice([1024, 2048, 4096]),
                            zero=rng.choice([0, 0, 1]))
    pool = " + ".join(f"{n.nodes}x{n.gpus_per_node} {n.gpu}" for n in nodes)
    return (f"{model.name}, {pool}, gb {training.global_batch}, seq {training.seq_len}, zero {training.zero}",
            model, ClusterSpec(nodes=nodes), training)


def bound_holds(res: api.SearchResult, others: list[api.SearchResult]) -> bool:
    """No plan of `others` inside `res`'s coverage is faster than the coverage's bound."""
    covered = res.coverage_bound_s if res.coverage_bound_s is not None else res.lower_bound_s
    return all(o.prediction.step_s >= covered * (1 - 1e-9) for o in others
               if not outside_coverage(o.plan, res.coverage))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    cost = AnalyticCostModel()
    rng = random.Random(args.seed)
    rows, gains, broken = [], [], 0
    sep = " | " if args.markdown else "  "
    if args.markdown:
        print("| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD), flush=True)
    for i in range(args.count):
        name, model, cluster, training = draw(rng)
        try:
            res = api.search(model, cluster, training, cost=cost)
            never = api.search(model, cluster, training, cost=cost, chains="never")
            chain = api.search(model, cluster, training, cost=cost, target="flagscale")
            grid = api.search(model, cluster, training, cost=cost, target="megatron")
        except HetplanError:
            continue
        step = res.prediction.step_s
        gain = 100 * (1 - step / never.prediction.step_s)
        ok = bound_holds(res, [chain, grid]) and bound_holds(never, [chain, grid])
        broken += not ok
        gains.append(gain)
        row = [str(i), name, str(cluster.num_gpus), res.coverage, f"{res.stats['search_s']:.2f}",
               f"{res.stats['chain_s']:.2f}", f"{step:.5f}", f"{never.prediction.step_s:.5f}", f"{gain:.3f}",
               f"{chain.prediction.step_s:.5f}", f"{100 * (step / chain.prediction.step_s - 1):+.3f}",
               "ok" if ok else "VIOLATED"]
        rows.append(row)
        print(("| " + sep.join(row) + " |") if args.markdown else sep.join(row), flush=True)
    won = [g for g in gains if g > 0]
    print(f"\n{len(rows)} pools searched; the chain candidate won on {len(won)} "
          f"(up to {max(won, default=0.0):.2f} %); bounds violated on {broken}")


if __name__ == "__main__":
    main()
