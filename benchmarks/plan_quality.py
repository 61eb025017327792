"""Plan quality: our search against the plans people write by hand, on the same cost model.

    python benchmarks/plan_quality.py [--time-limit 300] [--only a|b] [--csv out.csv] [--markdown]

Scenarios
  (a) examples/paper_mix.yaml (8x A100-80 + 16x V100-32 + 4x H100), llama2-7b and llama2-13b,
      global batch 512, seq 4096, analytic cost model.
  (b) 8x A100-SXM4-40GB + 8x V100-SXM2-16GB (nodes of 8), opt-350m and gpt-neo-2.7b at seq 2048,
      global batch 512, scored with the measured Sailor profiles (analytic fallback for layers they
      lack) and with the analytic model alone.

Baselines (benchmarks/baselines/megatron_uniform.py): the best Megatron grid over the whole pool (any
prefix of the ranks: "uniform"; only grids using the most GPUs any valid grid can: "uniform-all") and
the best grid on a single GPU type, all with an even layer split; and "Megatron+layout": the best
Megatron grid with the layer split solved exactly (`hetplan plan --target megatron`). Every plan is scored by the one evaluator, so the speed-up is
`baseline step / our step - 1` under that cost model.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from benchmarks.baselines.megatron_uniform import best_uniform_plan
from benchmarks.common import write_csv
from planner.search.api import micro_batch_sizes
from planner.search.megatron_grid import best_megatron_plan
from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import CostModel
from planner.costmodel.profile import MeasuredCostModel
from planner.errors import HetplanError
from planner.search import search
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.cluster import load_cluster
from planner.specs.models import get_model

FIELDS = ["scenario", "model", "cost", "ours_s", "megatron_layout_s", "vs_megatron_layout_pct", "uniform_s",
          "uniform_gpus", "uniform_all_s", "uniform_all_gpus",
          "single_s", "single_type", "vs_uniform_pct", "vs_uniform_all_pct", "vs_single_pct", "search_s", "gap_pct", "coverage", "timed_out", "ours_gpus", "status"]


@dataclass(frozen=True)
class Scenario:
    key: str
    name: str
    cluster: ClusterSpec
    model: str
    training: TrainingSpec
    cost_name: str


def _costs() -> dict[str, CostModel]:
    analytic = AnalyticCostModel()
    return {"analytic": analytic,
            "sailor": MeasuredCostModel.from_dir(REPO / "profiles" / "sailor", fallback=AnalyticCostModel())}


def scenarios(global_batch: int) -> list[Scenario]:
    paper = load_cluster(REPO / "examples" / "paper_mix.yaml")
    mixed = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=8),
                               NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=8)])
    out = [Scenario("a", "paper_mix", paper, m, TrainingSpec(global_batch=global_batch, seq_len=4096), "analytic")
           for m in ("llama2-7b", "llama2-13b")]
    out += [Scenario("b", "A100-40x8+V100-16x8", mixed, m, TrainingSpec(global_batch=global_batch, seq_len=2048), c)
            for m in ("opt-350m", "gpt-neo-2.7b") for c in ("sailor", "analytic")]
    return out


def _speedup_pct(base_s: float | None, ours_s: float | None) -> float | None:
    return None if base_s is None or ours_s is None else 100 * (base_s / ours_s - 1)


def run(sc: Scenario, cost: CostModel, time_limit: float) -> dict:
    model = get_model(sc.model)
    row: dict = {"scenario": sc.name, "model": sc.model, "cost": sc.cost_name}
    uniform = best_uniform_plan(model, sc.cluster, sc.training, cost)
    single = best_uniform_plan(model, sc.cluster, sc.training, cost, single_type="each")
    spread = best_uniform_plan(model, sc.cluster, sc.training, cost, most_gpus=True)
    row["uniform_s"] = uniform[1].step_s if uniform else None
    row["uniform_gpus"] = uniform[0].num_gpus if uniform else None
    row["uniform_all_s"] = spread[1].step_s if spread else None
    row["uniform_all_gpus"] = spread[0].num_gpus if spread else None
    row["single_s"] = single[1].step_s if single else None
    row["single_type"] = f"{single[0].num_gpus}x{single[0].pipelines[0].stages[0].gpu}" if single else None
    grid = best_megatron_plan(model, sc.cluster, sc.training, cost, micro_batch_sizes(sc.training))
    row["megatron_layout_s"] = grid[1].step_s if grid else None
    start = time.perf_counter()
    try:
        res = search(model, sc.cluster, sc.training, cost=cost, time_limit=time_limit)
    except HetplanError as exc:
        return {**row, "search_s": time.perf_counter() - start, "status": f"error: {exc}"}
    ours = res.prediction.step_s
    return {**row, "ours_s": ours, "vs_uniform_pct": _speedup_pct(row["uniform_s"], ours),
            "vs_megatron_layout_pct": _speedup_pct(row["megatron_layout_s"], ours),
            "vs_uniform_all_pct": _speedup_pct(row["uniform_all_s"], ours),
            "vs_single_pct": _speedup_pct(row["single_s"], ours), "search_s": res.stats.get("search_s"),
            "gap_pct": 100 * res.gap, "coverage": res.coverage, "timed_out": res.timed_out,
            "ours_gpus": res.plan.num_gpus, "status": "ok"}


def _fmt(value: object, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def table_lines(rows: list[dict], markdown: bool) -> list[str]:
    head = ["scenario", "model", "cost", "ours s (GPUs)", "Megatron+layout s", "uniform s (GPUs)",
            "uniform-all s (GPUs)", "single-type s", "vs Megatron+layout", "vs uniform", "vs uniform-all",
            "vs single", "search s", "gap %", "coverage", "timed out"]
    body = [[r["scenario"], r["model"], r["cost"], f"{_fmt(r.get('ours_s'), '.3f')} ({_fmt(r.get('ours_gpus'))})",
             _fmt(r.get("megatron_layout_s"), ".3f"),
             f"{_fmt(r.get('uniform_s'), '.3f')} ({_fmt(r.get('uniform_gpus'))})",
             f"{_fmt(r.get('uniform_all_s'), '.3f')} ({_fmt(r.get('uniform_all_gpus'))})",
             f"{_fmt(r.get('single_s'), '.3f')} ({_fmt(r.get('single_type'))})",
             _pct(r.get("vs_megatron_layout_pct")), _pct(r.get("vs_uniform_pct")),
             _pct(r.get("vs_uniform_all_pct")), _pct(r.get("vs_single_pct")),
             _fmt(r.get("search_s"), ".1f"), _fmt(r.get("gap_pct"), ".2f"), _fmt(r.get("coverage")),
             _fmt(r.get("timed_out")) if r.get("status") == "ok" else r.get("status", "")] for r in rows]
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(b) + " |" for b in body]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [head, *body]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds per search")
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--only", choices=("a", "b"), default=None, help="run one scenario family")
    ap.add_argument("--model", default=None, help="run only this model")
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    costs = _costs()
    rows = []
    for sc in scenarios(args.global_batch):
        if (args.only and sc.key != args.only) or (args.model and sc.model != args.model):
            continue
        row = run(sc, costs[sc.cost_name], args.time_limit)
        rows.append(row)
        print(f"# {sc.name} {sc.model} {sc.cost_name}: {row['status']} in {row.get('search_s') or 0:.1f} s",
              file=sys.stderr, flush=True)
    print(f"speed-up = baseline step / our step - 1 (same evaluator); search time limit {args.time_limit:g} s")
    print("\n".join(table_lines(rows, args.markdown)))
    if args.csv:
        write_csv(args.csv, FIELDS, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
