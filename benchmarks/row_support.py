"""How few skeleton rows a bound needs: the case for computing split frontiers lazily.

    python benchmarks/row_support.py [--gpus 32] [--model llama2-13b]

The blocks coverage computes the full (A, C) split frontier of every skeleton row of every
microbatch size (about 2,000 rows and 10,000 splits per size at 32 GPUs), then solves LPs over
them. This script runs the ladder rung's search (`search_scale.ladder_cluster`), keeps its
providers, and for each microbatch size replays the cheap bound (tails dropped, every replica
count allowed) with each row first standing in as its ideal point (least A, least C: a valid
optimistic template, as the cut-row screens are) and expanded to its real frontier only when the
LP leans on it, until it leans on no ideal point. It prints the rows that took, the LP rounds, and
the bound reached against the full frontiers' bound (an LP with several optima may stop a little
below it; never above, since ideal points only relax it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.search_scale import ladder_cluster
from planner.costmodel.analytic import AnalyticCostModel
from planner.search import api
from planner.search.space import skeleton_usage
from planner.search.templates import Template, prune_templates
from planner.search.units import problem_of
from planner.specs import TrainingSpec
from planner.specs.models import get_model
from solvers.assign import SolverStats
from solvers.assign_lp import lp_support, pipeline_time_bound


def lazy_rows(protos: list, avail: tuple[int, ...], microbatches: int
              ) -> tuple[float | None, float | None, int, int, int]:
    """(full bound, lazy bound, rows, rows expanded, LP rounds) of the cheap bound over `protos`."""
    n_cls = len(avail)
    by_row: dict[tuple, list] = {}
    for p in protos:
        by_row.setdefault(p.skeleton, []).append(p)
    real = {sk: [Template(skeleton_usage(sk, n_cls), p.a_s, p.c_s, 0.0, None, (), sk) for p in ps]
            for sk, ps in by_row.items()}
    ideal = {sk: Template(skeleton_usage(sk, n_cls), min(p.a_s for p in ps), min(p.c_s for p in ps), 0.0, None, (), sk)
             for sk, ps in by_row.items()}
    replicas = (1, min(microbatches, sum(avail)))
    stats = SolverStats()
    full = pipeline_time_bound(problem_of(prune_templates([t for ts in real.values() for t in ts]), avail,
                                        microbatches, replicas), stats)
    expanded: set[tuple] = set()
    rounds = 0
    while True:
        rounds += 1
        templates = prune_templates([t for sk in sorted(expanded, key=repr) for t in real[sk]]
                                    + [ideal[sk] for sk in real if sk not in expanded])
        problem = problem_of(templates, avail, microbatches, replicas)
        bound = pipeline_time_bound(problem, stats)
        if bound is None:
            return full, bound, len(by_row), len(expanded), rounds
        used = lp_support(problem, bound * (1 + 1e-6), stats=stats)
        leaning = {templates[k].skeleton for k in np.flatnonzero(used) if templates[k] is ideal[templates[k].skeleton]}
        if not leaning:
            return full, bound, len(by_row), len(expanded), rounds
        expanded |= leaning


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--model", default="llama2-13b")
    args = ap.parse_args()
    providers: list = []
    prefetch = api.prefetch_frontiers

    def keep(found: list, workers: int, *more: object) -> object:
        providers.extend(found)
        return prefetch(found, workers, *more)

    api.prefetch_frontiers = keep  # the search's own providers, as it built them
    model = get_model(args.model)
    cluster = ladder_cluster(args.gpus)
    training = TrainingSpec(global_batch=max(256, 4 * args.gpus), seq_len=model.seq_len)
    res = api.search(model, cluster, training, cost=AnalyticCostModel())
    print(f"{args.gpus} GPUs, {model.name}: plan {res.prediction.step_s:.4f} s, bound {res.lower_bound_s:.4f} s, "
          f"search {res.stats['search_s']:.1f} s")
    avail = tuple(rc.gpus for rc in api.resource_classes(cluster))
    print("| microbatch | rows | splits | rows expanded | LP rounds | full bound s | lazy bound s | replay s |")
    print("|---|---|---|---|---|---|---|---|")
    for p in providers:
        start = time.perf_counter()
        full, lazy, rows, grown, rounds = lazy_rows(p.lb_protos, avail, training.global_batch // p.micro_batch)
        print(f"| {p.micro_batch} | {rows} | {len(p.lb_protos)} | {grown} | {rounds} | {full:.4f} | {lazy:.4f} | "
              f"{time.perf_counter() - start:.2f} |")


if __name__ == "__main__":
    main()
