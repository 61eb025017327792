"""Which ranks form which process group for any valid plan (pipelines may differ): the pure part.

Ranks and groups come from the one shared rank order (`planner.emit.placement.rank_order`) through the
engine-neutral rank map (`planner.emit.rankmap.rank_map`); nothing here re-derives placement. What this
module adds is what a launcher needs to *create* the groups:

* one global creation order (`GroupLayout.groups`): torch requires every rank to take part in every
  `new_group` call, in the same order, so all ranks walk the same list;
* gradient (dp) groups deduplicated by members: different layer ranges can share one holder set, and
  creating it twice would only waste communicators;
* the pipeline p2p pairs between consecutive stages of each pipeline, whatever their shapes.

P2P pairing rule: stage s has n_a ranks and stage s+1 n_b ranks, both in rank order (tp fastest, then
cp, hp, stage dp). With N = max(n_a, n_b), index i in 0..N-1 pairs rank a[i*n_a//N] with b[i*n_b//N].
Identical shapes pair rank k with rank k (Megatron's tp-rank-to-tp-rank send); otherwise every rank of
both stages gets at least one partner and shards that sit at the same relative position are paired.
How activations are resharded between different shapes is the engine's business; these pairs only say
who talks to whom.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.emit.placement import RankInfo, rank_order
from planner.emit.rankmap import rank_map
from planner.errors import HetplanError
from planner.plan import Plan, expand_devices
from planner.specs.cluster import ClusterSpec, NodeGroup

SHARD_KINDS = ("tp", "cp", "hp", "stage_dp")
GROUP_KINDS = (*SHARD_KINDS, "dp")


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One process group to create: its kind, a readable label and its sorted global ranks."""

    kind: str
    label: str
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True, slots=True)
class GradGroup:
    """The gradient group a rank uses for one layer range it holds (index into GroupLayout.groups)."""

    layers: tuple[int, int]
    tp: int
    tp_rank: int
    group: int


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """Every group of a plan in creation order, plus the data to find one rank's groups."""

    world_size: int
    ranks: tuple[RankInfo, ...]
    groups: tuple[GroupSpec, ...]
    grad: tuple[GradGroup, ...]
    p2p: tuple[tuple[int, int], ...]  # (sender on stage s, receiver on stage s+1), same pipeline


@dataclass(frozen=True, slots=True)
class RankGroups:
    """The groups one rank belongs to and its pipeline neighbours (global ranks)."""

    rank: int
    info: RankInfo
    tp: GroupSpec
    cp: GroupSpec
    hp: GroupSpec
    stage_dp: GroupSpec
    dp: tuple[tuple[tuple[int, int], GroupSpec], ...]  # (layer range, gradient group), in layer order
    prev_ranks: tuple[int, ...]
    next_ranks: tuple[int, ...]


def cluster_from_plan(plan: Plan) -> ClusterSpec:
    """A stand-in cluster with just the nodes and GPUs the plan names, so the shared rank order can be
    used when no cluster file is at hand (a launcher on the nodes only needs the plan). Node indices the
    plan skips get a one-GPU placeholder node of the plan's first GPU type."""
    sizes: dict[int, tuple[str, int]] = {}
    for pi, pipe in enumerate(plan.pipelines):
        for si, stage in enumerate(pipe.stages):
            for node, gpu_idx in expand_devices(stage.devices):
                if not node.startswith("node") or not node[4:].isdigit():
                    raise HetplanError(f"pipelines[{pi}].stages[{si}].devices",
                                       f"node '{node}' is not of the form nodeK")
                k = int(node[4:])
                gpu, most = sizes.get(k, (stage.gpu, 0))
                sizes[k] = (gpu, max(most, gpu_idx + 1))
    if not sizes:
        raise HetplanError("pipelines", "a plan needs at least one pipeline")
    filler = next(iter(sizes.values()))[0]
    groups = [NodeGroup(gpu=sizes.get(k, (filler, 1))[0], nodes=1, gpus_per_node=sizes.get(k, (filler, 1))[1])
              for k in range(max(sizes) + 1)]
    return ClusterSpec(nodes=groups)


def p2p_pairs(stage_a: list[int], stage_b: list[int]) -> list[tuple[int, int]]:
    """Sender/receiver pairs between two consecutive stages (rule in the module docstring)."""
    n_a, n_b = len(stage_a), len(stage_b)
    n = max(n_a, n_b)
    return [(stage_a[i * n_a // n], stage_b[i * n_b // n]) for i in range(n)]


def group_layout(plan: Plan, cluster: ClusterSpec | None = None) -> GroupLayout:
    """All process groups of `plan` in the order every rank must create them."""
    cluster = cluster if cluster is not None else cluster_from_plan(plan)
    ranks = rank_order(plan, cluster)
    rmap = rank_map(plan, cluster)
    groups: list[GroupSpec] = []
    for kind in SHARD_KINDS:
        for members in rmap["groups"][kind]:
            first = ranks[members[0]]
            groups.append(GroupSpec(kind, f"{kind} p{first.pipeline}s{first.stage}", tuple(members)))
    by_members: dict[tuple[int, ...], int] = {}
    grad: list[GradGroup] = []
    for entry in rmap["groups"]["dp"]:
        members = tuple(entry["ranks"])
        layers = (entry["layers"][0], entry["layers"][1])
        if members not in by_members:
            by_members[members] = len(groups)
            groups.append(GroupSpec("dp", f"dp layers {layers[0]}-{layers[1]} tp{entry['tp']}.{entry['tp_rank']}",
                                    members))
        grad.append(GradGroup(layers, entry["tp"], entry["tp_rank"], by_members[members]))
    pairs: list[tuple[int, int]] = []
    for pipe in rmap["groups"]["pp"]:
        for a, b in zip(pipe["stages"], pipe["stages"][1:]):
            pairs.extend(p2p_pairs(a, b))
    return GroupLayout(len(ranks), tuple(ranks), tuple(groups), tuple(grad), tuple(sorted(pairs)))


def rank_groups(layout: GroupLayout, rank: int) -> RankGroups:
    """The groups and neighbours of one global rank."""
    if not 0 <= rank < layout.world_size:
        raise HetplanError("rank", f"rank {rank} is outside 0..{layout.world_size - 1}")
    mine = {kind: [g for g in layout.groups if g.kind == kind and rank in g.ranks] for kind in SHARD_KINDS}
    for kind, found in mine.items():
        if len(found) != 1:  # cannot happen for a rank map: shard groups partition the ranks
            raise RuntimeError(f"rank {rank} is in {len(found)} {kind} groups")
    dp = tuple((g.layers, layout.groups[g.group]) for g in layout.grad if rank in layout.groups[g.group].ranks)
    return RankGroups(
        rank=rank, info=layout.ranks[rank], tp=mine["tp"][0], cp=mine["cp"][0], hp=mine["hp"][0],
        stage_dp=mine["stage_dp"][0], dp=tuple(sorted(dp)),
        prev_ranks=tuple(sorted({a for a, b in layout.p2p if b == rank})),
        next_ranks=tuple(sorted({b for a, b in layout.p2p if a == rank})))
