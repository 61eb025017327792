"""Collective and point-to-point times: alpha-beta with size-dependent efficiency.

`bw_gbs` is the per-GPU unidirectional link bandwidth in GB/s; sizes are bytes of the whole tensor
being reduced/gathered (per rank for all-to-all). Ring algorithms; see shared/data/anchors.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.costmodel.knobs import Knobs


@dataclass(frozen=True, slots=True)
class Link:
    """A link class: per-GPU GB/s and per-hop latency; `inter` marks a NIC path."""

    bw_gbs: float
    alpha_s: float
    inter: bool


def link_eff(knobs: Knobs, size_bytes: float, link: Link) -> float:
    eff = knobs.coll_eff_max * size_bytes / (size_bytes + knobs.coll_half_bytes)
    return eff * knobs.nic_eff if link.inter else eff


def _transfer_s(knobs: Knobs, size_bytes: float, link: Link) -> float:
    if size_bytes <= 0:
        return 0.0
    return size_bytes / (link.bw_gbs * 1e9 * link_eff(knobs, size_bytes, link))


def all_reduce_s(knobs: Knobs, size_bytes: float, n: int, link: Link) -> float:
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.alpha_s + _transfer_s(knobs, 2 * (n - 1) / n * size_bytes, link)


def all_gather_s(knobs: Knobs, size_bytes: float, n: int, link: Link) -> float:
    """Also the reduce-scatter time: (n-1)/n of the tensor crosses each GPU's link."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return (n - 1) * link.alpha_s + _transfer_s(knobs, (n - 1) / n * size_bytes, link)


reduce_scatter_s = all_gather_s


def all_to_all_s(knobs: Knobs, bytes_per_rank: float, n: int, link: Link) -> float:
    if n <= 1 or bytes_per_rank <= 0:
        return 0.0
    return (n - 1) * link.alpha_s + _transfer_s(knobs, (n - 1) / n * bytes_per_rank, link)


def p2p_s(knobs: Knobs, size_bytes: float, link: Link) -> float:
    if size_bytes <= 0:
        return 0.0
    return link.alpha_s + _transfer_s(knobs, size_bytes, link)


def hierarchical_all_reduce_s(knobs: Knobs, size_bytes: float, n: int, per_node: int,
                              intra: Link, inter: Link) -> float:
    """All-reduce over n ranks, `per_node` of them sharing a node: intra reduce-scatter,
    inter all-reduce of the 1/per_node shard, intra all-gather."""
    if n <= 1:
        return 0.0
    g = max(1, min(per_node, n))
    nodes = -(-n // g)
    intra_s = 2 * all_gather_s(knobs, size_bytes, g, intra)
    return intra_s + all_reduce_s(knobs, size_bytes / g, nodes, inter)
