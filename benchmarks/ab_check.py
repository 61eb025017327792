"""Two versions of the search side by side: the same pools in fresh processes, alternating, and
whether every answer is the same.

    python benchmarks/ab_check.py BASE [--pools ladder:16,32,64 chain:33:20 many:16:24]
                                  [--rounds 2] [--workers 2] [--max-gpus 128] [--time-limit 120]
                                  [--stop-gap G]

BASE is a commit (checked out into a temporary git worktree, removed afterwards) or the path of
another checkout; the version measured against it is this checkout. Pools: `ladder:G,G,...` (the
rungs of `search_scale.py`), `chain:SEED:COUNT` and `many:SEED:COUNT` (the draws of
`chain_check.py` and `many_types.py`; pools above `--max-gpus` are left out). Each pool runs once
per round in a fresh process per version, the two one after the other, the first of them swapped
from round to round, so the machine's drift within the hour falls on both alike. Per pool: each
version's step, bound, plan (hash of its JSON) and seconds (median over the rounds); a version
whose answer differs between rounds is flagged (the search is deterministic). The summary counts
the pools whose answers are identical, those where this checkout's step is faster or slower, those
where a run crashed (never counted identical), the gaps above 2 %, and the seconds in all (of
the pools both answered). On a busy 2-core machine a pool's time varies by 10-30 % from run to
run: compare totals over many pools, not one pool. `--stop-gap G` passes `stop_gap` to both versions'
searches."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
GAP_GOAL = 0.02

# Run in a fresh interpreter with the checkout's directory first on the path, so that it imports
# that version's `planner` and `benchmarks` (argv: checkout, kind, arguments, workers, limits). The
# pools are built here rather than by a shared helper, which an older commit would not have.
CHILD = r"""
import hashlib, json, random, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
kind, a, b, workers, max_gpus, limit = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), \
    int(sys.argv[6]), float(sys.argv[7])
extra = {} if sys.argv[8] == "none" else {"stop_gap": float(sys.argv[8])}
import planner
if Path(sys.argv[1]).resolve() not in Path(planner.__file__).resolve().parents:
    sys.exit(f"planner came from {planner.__file__}, not from {sys.argv[1]}")
from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError
from planner.search import api
if kind == "ladder":
    from benchmarks.search_scale import ladder_cluster
    from planner.specs import TrainingSpec
    from planner.specs.models import get_model
    model = get_model("llama2-13b")
    cluster = ladder_cluster(a)
    training = TrainingSpec(global_batch=max(256, 4 * a), seq_len=model.seq_len)
else:
    if kind == "chain":
        from benchmarks.chain_check import draw
    else:
        from benchmarks.many_types import draw
    rng = random.Random(a)
    for _ in range(b + 1):
        _, model, cluster, training = draw(rng)
if cluster.num_gpus > max_gpus:
    print(json.dumps({"skip": f"{cluster.num_gpus} GPUs"}))
    sys.exit()
start = time.perf_counter()
try:
    res = api.search(model, cluster, training, cost=AnalyticCostModel(), time_limit=limit, workers=workers, **extra)
except HetplanError as exc:
    print(json.dumps({"answer": f"error: {exc}", "seconds": time.perf_counter() - start}))
    sys.exit()
seconds = time.perf_counter() - start
plan = hashlib.sha1(res.plan.to_json().encode()).hexdigest()[:12]
print(json.dumps({"answer": [res.prediction.step_s, res.lower_bound_s, plan], "seconds": seconds}))
"""


def parse_pools(specs: list[str]) -> list[tuple[str, int, int]]:
    """`ladder:16,32` -> (ladder, 16, 0), (ladder, 32, 0); `chain:33:20` -> (chain, 33, 0..19).
    ValueError naming the spec for anything else."""
    pools: list[tuple[str, int, int]] = []
    for spec in specs:
        kind, _, rest = spec.partition(":")
        if kind == "ladder" and all(g.isdigit() for g in rest.split(",")):
            pools += [("ladder", int(g), 0) for g in rest.split(",")]
        elif kind in ("chain", "many") and len(rest.split(":")) == 2 and all(x.isdigit() for x in rest.split(":")):
            seed, count = (int(x) for x in rest.split(":"))
            pools += [(kind, seed, i) for i in range(count)]
        else:
            raise ValueError(f"'{spec}' is not ladder:G[,G...], chain:SEED:COUNT or many:SEED:COUNT")
    return pools


def run_one(checkout: Path, pool: tuple[str, int, int], workers: int, max_gpus: int, limit: float,
            stop_gap: float | None = None) -> dict:
    """One search of one pool in a fresh process of `checkout`: its answer and seconds, or a skip."""
    kind, a, b = pool
    done = subprocess.run([sys.executable, "-c", CHILD, str(checkout), kind, str(a), str(b), str(workers),
                           str(max_gpus), str(limit), "none" if stop_gap is None else repr(stop_gap)],
                          capture_output=True, text=True, timeout=limit * 3 + 120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"answer": f"crash: {tail}", "seconds": float("nan")}
    return json.loads(lines[-1])


def compare(pools: list[tuple[str, int, int]], base: Path, mine: Path, rounds: int, workers: int,
            max_gpus: int, limit: float, out: TextIO = sys.stdout, stop_gap: float | None = None) -> dict[str, float]:
    """Run every pool `rounds` times on both checkouts, alternating; print a line per pool and the
    summary, and return the summary's numbers."""
    tally = {"pools": 0, "identical": 0, "faster": 0, "slower": 0, "other": 0, "crashed": 0, "unstable": 0,
             "base_gaps": 0, "mine_gaps": 0, "base_s": 0.0, "mine_s": 0.0}
    for pool in pools:
        got: dict[str, list[dict]] = {"base": [], "mine": []}
        for r in range(rounds):
            order = [("base", base), ("mine", mine)]
            for name, checkout in order if r % 2 == 0 else order[::-1]:
                got[name].append(run_one(checkout, pool, workers, max_gpus, limit, stop_gap))
        if any("skip" in x for x in got["base"] + got["mine"]):
            continue
        tally["pools"] += 1
        answers = {k: [json.dumps(x["answer"]) for x in v] for k, v in got.items()}
        unstable = [k for k, v in answers.items() if len(set(v)) > 1]
        tally["unstable"] += bool(unstable)
        seconds = {k: statistics.median(x["seconds"] for x in v) for k, v in got.items()}
        a, m = got["base"][0]["answer"], got["mine"][0]["answer"]
        if any(isinstance(x, str) and x.startswith("crash") for x in (a, m)):
            verdict = "crashed"  # never counted as identical, even where both crashed alike
        elif a == m:
            verdict = "identical"
        elif isinstance(a, list) and isinstance(m, list):
            verdict = "faster" if m[0] < a[0] * (1 - 1e-12) else "slower" if m[0] > a[0] * (1 + 1e-12) else "other"
        else:
            verdict = "other"
        tally[verdict] += 1
        if verdict != "crashed":  # the totals compare pools both versions answered
            tally["base_s"] += seconds["base"]
            tally["mine_s"] += seconds["mine"]
        for key, ans in (("base_gaps", a), ("mine_gaps", m)):
            tally[key] += isinstance(ans, list) and ans[0] > ans[1] * (1 + GAP_GOAL)
        shown = {k: (f"step {v[0]:.6f} bound {v[1]:.6f} plan {v[2]}" if isinstance(v, list) else v)
                 for k, v in (("base", a), ("mine", m))}
        print(f"{pool[0]}:{pool[1]}:{pool[2]}  {verdict}  {seconds['base']:.2f} s -> {seconds['mine']:.2f} s"
              + ("" if verdict == "identical" else f"  base {shown['base']}  mine {shown['mine']}")
              + (f"  UNSTABLE: {', '.join(unstable)}" if unstable else ""), file=out, flush=True)
    change = (tally["mine_s"] / tally["base_s"] - 1) * 100 if tally["base_s"] else 0.0
    print(f"{tally['pools']} pools: identical {tally['identical']}, faster step {tally['faster']}, slower step "
          f"{tally['slower']}, other {tally['other']}, crashed {tally['crashed']}, answers differing between rounds "
          f"{tally['unstable']}; "
          f"gaps above {GAP_GOAL:.0%}: base {tally['base_gaps']}, this checkout {tally['mine_gaps']}; seconds: "
          f"base {tally['base_s']:.1f}, this checkout {tally['mine_s']:.1f} ({change:+.1f} %)", file=out, flush=True)
    return tally


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="a commit (checked out into a temporary worktree) or another checkout's path")
    ap.add_argument("--pools", nargs="+", default=["ladder:16,32,64", "chain:33:20"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-gpus", type=int, default=128)
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--stop-gap", type=float, default=None, help="stop_gap for both versions' searches")
    args = ap.parse_args(argv)
    try:
        pools = parse_pools(args.pools)
    except ValueError as exc:
        ap.error(f"--pools: {exc}")
    if Path(args.base).is_dir():
        if not (Path(args.base) / "planner" / "search").is_dir():
            ap.error(f"base: '{args.base}' is a directory but not a hetplan checkout (no planner/search)")
        compare(pools, Path(args.base).resolve(), ROOT, args.rounds, args.workers, args.max_gpus, args.time_limit,
                stop_gap=args.stop_gap)
        return
    with tempfile.TemporaryDirectory(prefix="ab_check_") as tmp:
        tree = Path(tmp) / "base"
        added = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.base],
                               capture_output=True, text=True)
        if added.returncode != 0:
            ap.error(f"base: '{args.base}' is neither a directory nor a commit of this repository")
        try:
            compare(pools, tree, ROOT, args.rounds, args.workers, args.max_gpus, args.time_limit,
                    stop_gap=args.stop_gap)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


if __name__ == "__main__":
    main()
