"""Engine-neutral rank map for any plan (pipelines may differ): who runs where, and every process group.

Custom launchers and engine adapters read this instead of re-deriving placement. Ranks follow the shared
order of `planner.emit.placement`; all values are plain ints/strings/lists, so the map is JSON-ready
and identical for identical inputs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import pairwise

from planner.emit.placement import RankInfo, node_order, rank_order
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec

RANKMAP_FORMAT = "hetplan.rankmap/v1"


def _groups_by(ranks: list[RankInfo], key) -> list[list[int]]:
    buckets: dict[tuple, list[int]] = defaultdict(list)
    for r in ranks:
        buckets[key(r)].append(r.rank)
    return sorted(buckets.values())


def _layer_ranges(plan: Plan) -> list[tuple[int, int]]:
    """Split 0..N+1 at every stage boundary of every pipeline: each range has one set of holders."""
    last = plan.model.num_layers + 1
    cuts = {0, last + 1}
    for pipe in plan.pipelines:
        for stage in pipe.stages:
            cuts.add(stage.layers[0])
            cuts.add(stage.layers[1] + 1)
    edges = sorted(c for c in cuts if 0 <= c <= last + 1)
    return [(a, b - 1) for a, b in pairwise(edges)]


def _dp_groups(plan: Plan, ranks: list[RankInfo]) -> list[dict]:
    """Gradient-sync groups: per layer range, holders with the same tp degree and tp rank (cp/hp/dp
    copies hold the same weight shard). Several groups of different tp for one range mean the engine
    must reshard gradients between them."""
    out: list[dict] = []
    tp_of = {(pi, si): s.tp for pi, p in enumerate(plan.pipelines) for si, s in enumerate(p.stages)}
    for first, last in _layer_ranges(plan):
        buckets: dict[tuple[int, int], list[int]] = defaultdict(list)
        for r in ranks:
            if r.layers[0] <= first and last <= r.layers[1]:
                buckets[(tp_of[(r.pipeline, r.stage)], r.tp_rank)].append(r.rank)
        for (tp, t), members in sorted(buckets.items()):
            out.append({"layers": [first, last], "tp": tp, "tp_rank": t, "ranks": sorted(members)})
    return out


def rank_map(plan: Plan, cluster: ClusterSpec) -> dict:
    """Rank table, node order and process groups (tp, cp, hp, dp per layer range, pp per pipeline)."""
    ranks = rank_order(plan, cluster)
    groups = {
        "tp": _groups_by(ranks, lambda r: (r.pipeline, r.stage, r.cp_rank, r.hp_rank, r.dp_rank)),
        "cp": _groups_by(ranks, lambda r: (r.pipeline, r.stage, r.tp_rank, r.hp_rank, r.dp_rank)),
        "hp": _groups_by(ranks, lambda r: (r.pipeline, r.stage, r.tp_rank, r.cp_rank, r.dp_rank)),
        "stage_dp": _groups_by(ranks, lambda r: (r.pipeline, r.stage, r.tp_rank, r.cp_rank, r.hp_rank)),
        "dp": _dp_groups(plan, ranks),
        "pp": [{"pipeline": pi,
                "stages": [[r.rank for r in ranks if r.pipeline == pi and r.stage == si]
                           for si in range(len(pipe.stages))]}
               for pi, pipe in enumerate(plan.pipelines)],
    }
    return {
        "format": RANKMAP_FORMAT,
        "world_size": len(ranks),
        "nodes": [{"name": n.name, "gpu": n.gpu, "gpus": list(n.gpus), "first_rank": n.first_rank}
                  for n in node_order(plan, cluster, ranks)],
        "ranks": [{"rank": r.rank, "node": r.node, "local_gpu": r.local_gpu, "gpu": r.gpu,
                   "pipeline": r.pipeline, "stage": r.stage, "tp_rank": r.tp_rank, "cp_rank": r.cp_rank,
                   "hp_rank": r.hp_rank, "dp_rank": r.dp_rank, "layers": list(r.layers)} for r in ranks],
        "groups": groups,
    }


def rank_map_json(plan: Plan, cluster: ClusterSpec) -> str:
    """Deterministic JSON text of `rank_map` (2-space indent, trailing newline)."""
    return json.dumps(rank_map(plan, cluster), indent=2) + "\n"
