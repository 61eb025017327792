"""How the search scales with the pool: a ladder of mixed pools from 8 to 16384 GPUs.

    python benchmarks/search_scale.py [--model llama2-13b] [--time-limit 120] [--min-gpus 8] [--max-gpus 256]
                                      [--hard-timeout S] [--workers N] [--target megatron|flagscale|...]
                                      [--chains auto|always|never] [--stop-gap G]
                                      [--csv out.csv] [--markdown]

Pools mix three GPU types up to 64 GPUs (A100-80, H100, V100-32 in proportions 3:2:2) and four above
(plus A10, 3:2:2:1), in nodes of 8 (smaller nodes where a rung has fewer nodes than types). The
global batch grows with the pool (4 sequences per GPU, at least 256). Each rung runs in a child
process: `--time-limit` is passed to the search, which checks it between units of work, and
`--hard-timeout` (default 3x the limit + 60 s) kills a rung whose single unit overruns, reported as
such rather than hidden. "of it grid s" and "of it chains s" are the parts of the search time spent
on the Megatron-grid and the mesh-chain candidates (`planner.search.candidates`). `--stop-gap G`
passes `stop_gap` to the search: each rung ends once its gap is at most G (0.02: the issue's 2 %).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_csv
from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError
from planner.search import search
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model

LADDER = (8, 16, 32, 64, 128, 256, 1024, 4096, 16384)
MIX3 = (("A100-SXM4-80GB", 3), ("H100-SXM5-80GB", 2), ("V100-SXM2-32GB", 2))
MIX4 = (*MIX3, ("A10", 1))
FIELDS = ["gpus", "types", "global_batch", "search_s", "grid_s", "chain_s", "step_s", "lower_bound_s", "gap_pct", "coverage",
          "timed_out", "pipelines", "gpus_used", "idle_gpus", "status"]


def _apportion(total: int, weights: list[int]) -> list[int]:
    """Largest-remainder split of `total` units by `weights`, every share at least 1."""
    share = [max(1, total * w // sum(weights)) for w in weights]
    rest = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % sum(weights)), i))
    k = 0
    while sum(share) < total:
        share[rest[k % len(rest)]] += 1
        k += 1
    while sum(share) > total:
        i = max(range(len(share)), key=lambda j: (share[j], -j))
        share[i] -= 1
    return share


def ladder_cluster(gpus: int) -> ClusterSpec:
    """The rung's pool: nodes of 8 split by type weights (smaller nodes when too few nodes)."""
    mix = MIX3 if gpus <= 64 else MIX4
    per_node = 8
    while gpus // per_node < len(mix) and per_node > 1:
        per_node //= 2
    counts = _apportion(gpus // per_node, [w for _, w in mix])
    return ClusterSpec(nodes=[NodeGroup(gpu=g, nodes=n, gpus_per_node=per_node)
                              for (g, _), n in zip(mix, counts) if n])


def run_rung(gpus: int, model_name: str, seq_len: int | None, time_limit: float, workers: int = 1,
             target: str | None = None, chains: str = "auto", stop_gap: float | None = None) -> dict:
    model = get_model(model_name)
    cluster = ladder_cluster(gpus)
    training = TrainingSpec(global_batch=max(256, 4 * gpus), seq_len=seq_len or model.seq_len)
    types = "+".join(f"{n}x{g}" for g, n in sorted(cluster.counts_by_type().items()))
    row = {"gpus": cluster.num_gpus, "types": types, "global_batch": training.global_batch}
    start = time.perf_counter()
    try:
        res = search(model, cluster, training, cost=AnalyticCostModel(), time_limit=time_limit, workers=workers,
                     target=target, chains=chains, stop_gap=stop_gap)
    except HetplanError as exc:
        return {**row, "search_s": time.perf_counter() - start, "status": f"error: {exc}"}
    return {**row, "search_s": res.stats.get("search_s", time.perf_counter() - start),
            "grid_s": res.stats.get("megatron_grid_s"), "chain_s": res.stats.get("chain_s"), "step_s": res.prediction.step_s, "lower_bound_s": res.lower_bound_s, "gap_pct": 100 * res.gap,
            "coverage": res.coverage, "timed_out": res.timed_out, "pipelines": len(res.plan.pipelines),
            "gpus_used": res.plan.num_gpus, "idle_gpus": sum(res.idle_gpus.values()), "status": "ok"}


def _child(queue: mp.Queue, args: tuple) -> None:
    queue.put(run_rung(*args))


def run_isolated(gpus: int, model_name: str, seq_len: int | None, time_limit: float, hard_s: float,
                 workers: int = 1, target: str | None = None, chains: str = "auto",
                 stop_gap: float | None = None) -> dict:
    """One rung in a child process, killed after `hard_s` seconds (its own child, by handle)."""
    ctx = mp.get_context("fork")
    queue: mp.Queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, (gpus, model_name, seq_len, time_limit, workers, target, chains,
                                                                  stop_gap)))
    start = time.perf_counter()
    proc.start()
    proc.join(hard_s)
    if proc.is_alive():
        proc.terminate()
        proc.join()
        return {"gpus": gpus, "types": "+".join(f"{n}x{g}" for g, n in
                                                sorted(ladder_cluster(gpus).counts_by_type().items())),
                "search_s": time.perf_counter() - start, "status": f"killed after {hard_s:.0f} s (no answer)"}
    return queue.get() if not queue.empty() else {"gpus": gpus, "status": f"child exited {proc.exitcode}"}


def _fmt(value: object, spec: str = "") -> str:
    if value is None or value == "":
        return "-"
    return format(value, spec) if spec else str(value)


def table_lines(rows: list[dict], markdown: bool) -> list[str]:
    head = ["GPUs", "types", "search s", "of it grid s", "of it chains s", "step s", "lower bound s", "gap %", "coverage",
            "timed out", "pipelines", "idle GPUs", "status"]
    body = [[_fmt(r.get("gpus")), _fmt(r.get("types")), _fmt(r.get("search_s"), ".1f"), _fmt(r.get("grid_s"), ".2f"),
             _fmt(r.get("chain_s"), ".2f"),
             _fmt(r.get("step_s"), ".3f"),
             _fmt(r.get("lower_bound_s"), ".3f"), _fmt(r.get("gap_pct"), ".2f"), _fmt(r.get("coverage")),
             _fmt(r.get("timed_out")), _fmt(r.get("pipelines")), _fmt(r.get("idle_gpus")), _fmt(r.get("status"))]
            for r in rows]
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(b) + " |" for b in body]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [head, *body]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-13b")
    ap.add_argument("--seq-len", type=int, default=None, help="default: the model's")
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds, passed to search")
    ap.add_argument("--hard-timeout", type=float, default=None, help="kill a rung after this many seconds")
    ap.add_argument("--max-gpus", type=int, default=max(LADDER))
    ap.add_argument("--min-gpus", type=int, default=min(LADDER), help="skip smaller rungs")
    ap.add_argument("--workers", type=int, default=2, help="processes for the split frontiers (search's workers)")
    ap.add_argument("--target", default=None, help="search only plans this engine runs (megatron, flagscale, ...)")
    ap.add_argument("--chains", default="auto", choices=("auto", "always", "never"),
                    help="the search's mesh-chain candidate (planner.search.candidates)")
    ap.add_argument("--stop-gap", type=float, default=None, help="the search's stop_gap (end once the gap is this)")
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    hard = args.hard_timeout or 3 * args.time_limit + 60
    rows = []
    for gpus in (g for g in LADDER if args.min_gpus <= g <= args.max_gpus):
        row = run_isolated(gpus, args.model, args.seq_len, args.time_limit, hard, args.workers, args.target,
                           args.chains, args.stop_gap)
        rows.append(row)
        print(f"# {gpus} GPUs done: {row.get('status')} in {row.get('search_s', 0):.1f} s", file=sys.stderr, flush=True)
    target = f", target {args.target}" if args.target else ""
    target += f", chains {args.chains}" if args.chains != "auto" else ""
    target += f", stop gap {args.stop_gap:g}" if args.stop_gap is not None else ""
    print(f"model {args.model}, time limit {args.time_limit:g} s, analytic cost model, workers {args.workers}{target}")
    print("\n".join(table_lines(rows, args.markdown)))
    if args.csv:
        write_csv(args.csv, FIELDS, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
