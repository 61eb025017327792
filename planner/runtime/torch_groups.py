"""Create the torch.distributed process groups of a plan on one rank (torch is imported only here, lazily).

Every rank calls `process_groups(plan, rank)` after `torch.distributed.init_process_group`; each one
walks the same `GroupLayout.groups` list and calls `new_group` for every entry (torch requires all ranks
in every `new_group` call, in one order), and keeps the handles of the groups it belongs to. P2P
neighbours are plain global ranks: `send`/`recv` go over the default group and need no group of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.errors import HetplanError
from planner.plan import Plan
from planner.runtime.groups import GroupLayout, RankGroups, group_layout, rank_groups
from planner.specs.cluster import ClusterSpec


@dataclass(frozen=True, slots=True)
class ProcessGroups:
    """One rank's torch process groups: handles for tp/cp/hp/stage-dp, one per layer range for
    gradients, and the members of each (`ranks`) so callers never ask torch who is in a group."""

    rank: int
    world_size: int
    members: RankGroups
    tp: Any
    cp: Any
    hp: Any
    stage_dp: Any
    dp: tuple[tuple[tuple[int, int], Any], ...]  # (layer range, gradient group handle)

    @property
    def prev_ranks(self) -> tuple[int, ...]:
        return self.members.prev_ranks

    @property
    def next_ranks(self) -> tuple[int, ...]:
        return self.members.next_ranks


def _torch_dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:
        raise HetplanError("torch", "building process groups needs PyTorch (pip install torch)") from None
    return dist


def process_groups(plan: Plan, rank: int, cluster: ClusterSpec | None = None, *,
                   backend: str | None = None, layout: GroupLayout | None = None) -> ProcessGroups:
    """Create every group of `plan` (collective: all ranks must call this) and return this rank's.

    `cluster` only checks the plan's devices against the real pool; without it the nodes the plan names
    stand in (`groups.cluster_from_plan`). `backend` is passed to `new_group` (default: the world's)."""
    dist = _torch_dist()
    if not dist.is_available() or not dist.is_initialized():
        raise HetplanError("torch.distributed", "call torch.distributed.init_process_group first")
    layout = layout if layout is not None else group_layout(plan, cluster)
    world = dist.get_world_size()
    if world != layout.world_size:
        raise HetplanError("world_size", f"the plan has {layout.world_size} ranks, torch.distributed has {world}")
    if dist.get_rank() != rank:
        raise HetplanError("rank", f"rank {rank} given, torch.distributed says this process is {dist.get_rank()}")
    mine = rank_groups(layout, rank)
    handles: dict[tuple[int, ...], Any] = {}
    for spec in layout.groups:  # same list, same order on every rank
        handle = dist.new_group(ranks=list(spec.ranks), backend=backend)
        if rank in spec.ranks:
            handles[spec.ranks] = handle
    return ProcessGroups(
        rank=rank, world_size=world, members=mine, tp=handles[mine.tp.ranks], cp=handles[mine.cp.ranks],
        hp=handles[mine.hp.ranks], stage_dp=handles[mine.stage_dp.ranks],
        dp=tuple((layers, handles[g.ranks]) for layers, g in mine.dp))


def check_groups(groups: ProcessGroups) -> list[str]:
    """Smoke-test the groups on a live job (collective): all-reduce [1, rank] on each of this rank's
    groups and exchange ranks with pipeline neighbours; return what differed (empty = all fine).
    Run it once after launch to catch a launcher whose rank numbering differs from the plan's."""
    import torch

    dist = _torch_dist()
    problems: list[str] = []
    m = groups.members
    named = [("tp", groups.tp, m.tp.ranks), ("cp", groups.cp, m.cp.ranks), ("hp", groups.hp, m.hp.ranks),
             ("stage_dp", groups.stage_dp, m.stage_dp.ranks)]
    named += [(f"dp layers {a}-{b}", h, g.ranks) for ((a, b), h), (_, g) in zip(groups.dp, m.dp)]
    for name, handle, ranks in named:
        t = torch.tensor([1.0, float(groups.rank)], dtype=torch.float64)
        dist.all_reduce(t, group=handle)
        want = (float(len(ranks)), float(sum(ranks)))
        if (t[0].item(), t[1].item()) != want:
            problems.append(f"rank {groups.rank} {name}: all_reduce gave {t.tolist()}, expected {list(want)}")
    ops = [dist.P2POp(dist.isend, torch.tensor([float(groups.rank)]), peer) for peer in m.next_ranks]
    got = {peer: torch.zeros(1) for peer in m.prev_ranks}
    ops += [dist.P2POp(dist.irecv, buf, peer) for peer, buf in got.items()]
    # send/recv towards later stages only, so each pair is matched exactly once
    for req in (dist.batch_isend_irecv(ops) if ops else []):
        req.wait()
    for peer, buf in got.items():
        if buf.item() != float(peer):
            problems.append(f"rank {groups.rank}: p2p from {peer} carried {buf.item()}")
    return problems
