"""Random small pools where the full search might trail the best Megatron grid.

    python benchmarks/grid_check.py [--seed 1] [--count 40] [--polish auto|always|never]

Draws pools of one to three of seven GPU types (1-2 nodes of 1, 2 or 4 GPUs each), OPT-350M or
GPT-Neo-2.7B, global batch 8-64 and sequence 512-2048; searches each with the defaults and prints
every pool where the plan is slower than the best Megatron grid (`benchmarks.baselines`), over the
whole pool or one GPU type. The search adds the best Megatron grid as a candidate
(`planner.search.candidates.megatron_grid_candidate`), so none should be; the pools where that candidate was the answer's
source (the units' own plans trailed it) are counted and printed. `--polish never` turns the plan
polish off (`planner.search.unit_loop.finish`): what the polish fixes then shows as pools where
the grid candidate was added. Draws that fit nowhere are skipped.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.baselines.megatron_uniform import best_uniform_plan
from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError
from planner.search import api
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model

GPUS = ("RTX-3090", "RTX-4090", "A100-SXM4-40GB", "V100-SXM2-16GB", "T4", "A10", "L4")
MODELS = ("opt-350m", "gpt-neo-2.7b")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--polish", default="auto", choices=("auto", "always", "never"))
    args = ap.parse_args()
    cost = AnalyticCostModel()
    rng = random.Random(args.seed)
    searched, slower, worst, from_grid = 0, 0, 0.0, 0
    for _ in range(args.count):
        nodes = [NodeGroup(gpu=g, nodes=rng.randint(1, 2), gpus_per_node=rng.choice([1, 2, 4]))
                 for g in rng.sample(GPUS, rng.randint(1, 3))]
        cluster = ClusterSpec(nodes=nodes)
        model = get_model(rng.choice(MODELS))
        training = TrainingSpec(global_batch=rng.choice([8, 16, 32, 64]), seq_len=rng.choice([512, 1024, 2048]))
        try:
            result = api.search(model, cluster, training, cost=cost, polish=args.polish)
        except HetplanError:
            continue
        searched += 1
        pool = " + ".join(f"{n.nodes}x{n.gpus_per_node} {n.gpu}" for n in nodes)
        if result.stats.get("megatron_grid_added"):
            from_grid += 1
            print(f"grid candidate added: {model.name}, {pool}, global batch {training.global_batch}, "
                  f"seq {training.seq_len}")
        grids = [best_uniform_plan(model, cluster, training, cost, single_type=w) for w in (None, "each")]
        best_grid = min((g[1].step_s for g in grids if g is not None), default=None)
        if best_grid is None or result.prediction.step_s <= best_grid * (1 + 1e-9):
            continue
        slower += 1
        pct = 100 * (result.prediction.step_s / best_grid - 1)
        worst = max(worst, pct)
        print(f"slower by {pct:.3f} %: {model.name}, {pool}, global batch {training.global_batch}, "
              f"seq {training.seq_len} (gap {100 * result.gap:.2f} %, {result.coverage})")
    print(f"{searched} pools searched, {slower} slower than the best Megatron grid (worst {worst:.3f} %), "
          f"{from_grid} with the grid candidate added")


if __name__ == "__main__":
    main()
