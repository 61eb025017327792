"""The one global rank order every launch emitter shares, and the node (hostfile) order it implies.

Ranks are numbered stage-major: stage index outermost, then pipeline (replica), then the stage's own
device list (tp fastest, then cp, hp, and intra-stage dp; docs/plan_format.md reads a stage's devices in
consecutive groups of tp*cp*hp). For a Megatron-expressible plan this is exactly Megatron's order
(tp fastest, then cp, dp = pipelines, pp outermost), and for FlagScale it is its per-mesh
'tp-cp-ep-dp-pp' order with meshes in stage order. Emitters must not invent another order.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import HetplanError
from planner.plan import Plan, expand_devices
from planner.specs.cluster import ClusterSpec


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Where one global rank runs and which shard of which stage it holds."""

    rank: int
    node: str
    local_gpu: int
    gpu: str
    pipeline: int
    stage: int
    tp_rank: int
    cp_rank: int
    hp_rank: int
    dp_rank: int
    layers: tuple[int, int]


@dataclass(frozen=True, slots=True)
class NodeSlot:
    """One hostfile line: a node, its GPU type, and the local GPUs its ranks use, in rank order."""

    name: str
    gpu: str
    gpus: tuple[int, ...]
    first_rank: int

    @property
    def slots(self) -> int:
        return len(self.gpus)


def _stage_coords(index: int, tp: int, cp: int, hp: int) -> tuple[int, int, int, int]:
    """Device index inside a stage -> (tp, cp, hp, dp) rank; tp fastest, dp slowest."""
    t = index % tp
    c = (index // tp) % cp
    h = (index // (tp * cp)) % hp
    d = index // (tp * cp * hp)
    return t, c, h, d


def rank_order(plan: Plan, cluster: ClusterSpec) -> list[RankInfo]:
    """Global rank -> placement, stage-major; checks devices exist, match counts and are not reused."""
    if not plan.pipelines:
        raise HetplanError("pipelines", "a plan needs at least one pipeline")
    depth = max(len(p.stages) for p in plan.pipelines)
    out: list[RankInfo] = []
    used: dict[tuple[str, int], str] = {}
    for si in range(depth):
        for pi, pipe in enumerate(plan.pipelines):
            if si >= len(pipe.stages):
                continue
            stage = pipe.stages[si]
            where = f"pipelines[{pi}].stages[{si}].devices"
            devs = expand_devices(stage.devices)
            if len(devs) != stage.num_gpus:
                raise HetplanError(where, f"{len(devs)} devices for tp*cp*hp*dp = {stage.num_gpus}")
            for idx, (node_name, gpu_idx) in enumerate(devs):
                node = cluster.node(node_name)
                if gpu_idx >= node.gpus:
                    raise HetplanError(where, f"{node_name} has GPUs 0..{node.gpus - 1}, not {gpu_idx}")
                if (node_name, gpu_idx) in used:
                    raise HetplanError(where, f"{node_name}:{gpu_idx} is already used by "
                                       f"{used[(node_name, gpu_idx)]}")
                used[(node_name, gpu_idx)] = where
                t, c, h, d = _stage_coords(idx, stage.tp, stage.cp, stage.hp)
                out.append(RankInfo(len(out), node_name, gpu_idx, node.gpu, pi, si, t, c, h, d,
                                    (stage.layers[0], stage.layers[1])))
    return out


def node_order(plan: Plan, cluster: ClusterSpec, ranks: list[RankInfo] | None = None) -> list[NodeSlot]:
    """Nodes in order of their first rank (= hostfile order / torchrun node rank)."""
    ranks = rank_order(plan, cluster) if ranks is None else ranks
    order: list[str] = []
    gpus: dict[str, list[int]] = {}
    first: dict[str, int] = {}
    for r in ranks:
        if r.node not in gpus:
            order.append(r.node)
            gpus[r.node] = []
            first[r.node] = r.rank
        gpus[r.node].append(r.local_gpu)
    return [NodeSlot(n, cluster.node(n).gpu, tuple(gpus[n]), first[n]) for n in order]


def require_contiguous_nodes(ranks: list[RankInfo], target: str) -> None:
    """Launchers that number ranks node by node (torchrun, FlagScale's runner) need each node's ranks
    to be one consecutive block of the global order; refuse otherwise."""
    seen: set[str] = set()
    prev: str | None = None
    for r in ranks:
        if r.node != prev:
            if r.node in seen:
                raise HetplanError("target", f"{target}: ranks of {r.node} are not contiguous in the "
                                   f"rank order (rank {r.rank} returns to it); {target} numbers ranks "
                                   "node by node, so reorder the plan's devices")
            seen.add(r.node)
            prev = r.node


def pipeline_difference(plan: Plan) -> str | None:
    """Why the plan's pipelines are not identical replicas (stage count, microbatches, layer split),
    or None. Engines that run one grid (Megatron, FlagScale meshes) need identical replicas."""
    if not plan.pipelines:
        return "the plan has no pipelines"
    ref = plan.pipelines[0]
    for pi, pipe in enumerate(plan.pipelines):
        if len(pipe.stages) != len(ref.stages):
            return f"pipelines differ: pipeline {pi} has {len(pipe.stages)} stages, pipeline 0 has {len(ref.stages)}"
        if pipe.microbatches != ref.microbatches:
            return (f"pipelines differ: pipeline {pi} runs {pipe.microbatches} microbatches, pipeline 0 runs "
                    f"{ref.microbatches} (the batch is split evenly over data-parallel replicas)")
        for si, (stage, base) in enumerate(zip(pipe.stages, ref.stages)):
            if stage.layers != base.layers:
                return (f"pipelines differ: pipeline {pi} stage {si} holds layers {list(stage.layers)}, "
                        f"pipeline 0 holds {list(base.layers)}")
    return None
