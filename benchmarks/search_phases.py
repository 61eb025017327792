"""Where a search's wall time goes, phase by phase, on the ladder's pools.

    python benchmarks/search_phases.py [--gpus 16 32 64] [--workers 2] [--time-limit 120] [--stop-gap G]

Runs `planner.search` on `search_scale.ladder_cluster(g)` (Llama-2 13B, global batch
max(256, 4g)) and prints, per pool, when each large-pool phase of `api.search` started and ended
(seconds from the call): the split frontiers (`prefetch_frontiers`), the best-first units
(`best_first`), the engine candidates run before refinement (`run_engines`), refinement (`refine`)
and the polish, with the engine candidates when they run after refinement (`finish`: before
refinement too, where the gap is open, `unit_loop.close_gap`; each call's span is shown); the
time before the frontiers is setup (stage shapes, skeletons), the time after the last phase the
result's assembly. "cpu s" is the processor time of the search and its worker processes (user and
system, this process and its reaped children): below "search s" times the workers, the workers
waited (a batch waits for its slowest unit); above a `--workers 1` run's, work was done twice or
spent around the tasks (each worker builds the caches of every microbatch size it meets; pickling,
forking). The phases are wrapped, not changed: the plan is the search's own.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.search_scale import ladder_cluster
from planner.costmodel.analytic import AnalyticCostModel
from planner.search import api, unit_loop
from planner.specs import TrainingSpec
from planner.specs.models import get_model

PHASES = ((api, "prefetch_frontiers"), (api, "best_first"), (unit_loop, "run_engines"), (unit_loop, "refine"),
          (unit_loop, "finish"))


def timed(spans: dict[str, list[tuple[float, float]]], name: str, fn: Callable, zero: list[float]) -> Callable:
    """`fn`, recording (start, end) of each call in `spans[name]`, from `zero[0]`."""
    def run(*args: object, **kwargs: object) -> object:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spans.setdefault(name, []).append((t - zero[0], time.perf_counter() - zero[0]))
    return run


def cpu_s() -> float:
    """Processor seconds (user and system) of this process and of its children reaped so far."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--stop-gap", type=float, default=None, help="passed to the search (e.g. 0.02)")
    args = ap.parse_args()
    model = get_model("llama2-13b")
    spans: dict[str, list[tuple[float, float]]] = {}
    zero = [0.0]
    originals = {(module, name): getattr(module, name) for module, name in PHASES}
    for (module, name), fn in originals.items():
        setattr(module, name, timed(spans, name, fn, zero))
    print("| GPUs | search s | cpu s | " + " | ".join(f"{name} s" for _, name in PHASES) + " | step s | gap % |")
    print("|---" * (5 + len(PHASES)) + "|")
    try:
        for g in args.gpus:
            spans.clear()
            training = TrainingSpec(global_batch=max(256, 4 * g), seq_len=model.seq_len)
            cpu0 = cpu_s()
            zero[0] = time.perf_counter()
            res = api.search(model, ladder_cluster(g), training, cost=AnalyticCostModel(),
                             time_limit=args.time_limit, workers=args.workers, stop_gap=args.stop_gap)
            total = time.perf_counter() - zero[0]
            cpu = cpu_s() - cpu0  # the search's pools are closed (workers reaped) when it returns
            cells = [", ".join(f"{a:.2f}-{b:.2f}" for a, b in spans[name]) if name in spans else "-"
                     for _, name in PHASES]
            print(f"| {g} | {total:.2f} | {cpu:.2f} | " + " | ".join(cells)
                  + f" | {res.prediction.step_s:.4f} | {100 * res.gap:.2f} |", flush=True)
    finally:
        for (module, name), fn in originals.items():
            setattr(module, name, fn)


if __name__ == "__main__":
    main()
