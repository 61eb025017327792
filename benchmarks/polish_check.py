"""What `--polish always` and `--target flagscale` find against the default search.

    python benchmarks/polish_check.py [--workers 2] [--max-gpus 64] [--markdown]

For every bench scenario (`benchmarks/scenarios/`) up to `--max-gpus` and the ladder rungs of
`search_scale.py` up to 64 GPUs, prints the default search's step and time (`polish="auto"`), the same
with `polish="always"`, and the best plan of `--target flagscale`, each scored by the one evaluator.
A step below the default's is a plan the default search missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scenario import load_scenarios
from benchmarks.search_scale import LADDER, ladder_cluster
from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError
from planner.search import search
from planner.specs import TrainingSpec
from planner.specs.models import get_model


def _pools(max_gpus: int) -> list[tuple]:
    """(name, model, cluster, training, cost model) of every pool compared."""
    out = [(sc.name, sc.model, sc.cluster, sc.training, sc.cost_model())
           for sc in load_scenarios() if sc.cluster.num_gpus <= max_gpus]
    model = get_model("llama2-13b")
    for gpus in (g for g in LADDER if g <= min(64, max_gpus)):
        training = TrainingSpec(global_batch=max(256, 4 * gpus), seq_len=model.seq_len)
        out.append((f"ladder rung {gpus}", model, ladder_cluster(gpus), training, AnalyticCostModel()))
    return out


def _timed(*args: object, **kwargs: object) -> tuple[float | None, float]:
    start = time.perf_counter()
    try:
        step = search(*args, **kwargs).prediction.step_s
    except HetplanError:
        step = None
    return step, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-gpus", type=int, default=64, help="skip bench scenarios with more GPUs")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    head = ["pool", "auto step s", "auto s", "always step s", "always s", "always vs auto %", "flagscale step s",
            "flagscale vs auto %"]
    rows = []
    for name, model, cluster, training, cost in _pools(args.max_gpus):
        auto, t_auto = _timed(model, cluster, training, cost=cost, workers=args.workers)
        always, t_always = _timed(model, cluster, training, cost=cost, workers=args.workers, polish="always")
        fs, _ = _timed(model, cluster, training, cost=cost, target="flagscale")

        def pct(x: float | None) -> str:
            return "-" if x is None or auto is None else f"{100 * (x / auto - 1):+.2f}"

        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.4f}"

        rows.append([name, fmt(auto), f"{t_auto:.2f}", fmt(always), f"{t_always:.2f}", pct(always), fmt(fs), pct(fs)])
        print(f"# {name} done", file=sys.stderr, flush=True)
    print(f"workers {args.workers}; step times under each pool's cost model, search times in seconds")
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        print("\n".join("| " + " | ".join(r) + " |" for r in rows))
    else:
        widths = [max(len(x) for x in col) for col in zip(head, *rows)]
        print("\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [head, *rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
