"""Collective and point-to-point times: alpha-beta with size-dependent efficiency.

`bw_gbs` is the per-GPU unidirectional link bandwidth in GB/s; sizes are bytes of the whole tensor
being reduced/gathered (per rank for all-to-all). Ring algorithms; see shared/data/anchors.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.costmodel.knobs import Knobs

# Sizes may be floats or numpy arrays (the search costs every layer range at once); a float in gives
# a float out, computed with the same operations in the same order.


@dataclass(frozen=True, slots=True)
class Link:
    """A link class: per-GPU GB/s and per-hop latency; `inter` marks a NIC path."""

    bw_gbs: float
    alpha_s: float
    inter: bool


def link_eff(knobs: Knobs, size_bytes: float, link: Link) -> float:
    eff = knobs.coll_eff_max * size_bytes / (size_bytes + knobs.coll_half_bytes)
    return eff * knobs.nic_eff if link.inter else eff


def _out(value: np.ndarray) -> float | np.ndarray:
    return float(value) if value.ndim == 0 else value


def _transfer_s(knobs: Knobs, size_bytes: float | np.ndarray, link: Link) -> float | np.ndarray:
    size = np.asarray(size_bytes, dtype=float)
    positive = size > 0
    safe = np.where(positive, size, 1.0)
    return _out(np.where(positive, safe / (link.bw_gbs * 1e9 * link_eff(knobs, safe, link)), 0.0))


def all_reduce_s(knobs: Knobs, size_bytes: float | np.ndarray, n: int, link: Link) -> float | np.ndarray:
    size = np.asarray(size_bytes, dtype=float)
    if n <= 1:
        return _out(np.zeros_like(size))
    t = 2 * (n - 1) * link.alpha_s + np.asarray(_transfer_s(knobs, 2 * (n - 1) / n * size, link))
    return _out(np.where(size > 0, t, 0.0))


def all_gather_s(knobs: Knobs, size_bytes: float | np.ndarray, n: int, link: Link) -> float | np.ndarray:
    """Also the reduce-scatter time: (n-1)/n of the tensor crosses each GPU's link."""
    size = np.asarray(size_bytes, dtype=float)
    if n <= 1:
        return _out(np.zeros_like(size))
    t = (n - 1) * link.alpha_s + np.asarray(_transfer_s(knobs, (n - 1) / n * size, link))
    return _out(np.where(size > 0, t, 0.0))


reduce_scatter_s = all_gather_s


def all_to_all_s(knobs: Knobs, bytes_per_rank: float, n: int, link: Link) -> float:
    if n <= 1 or bytes_per_rank <= 0:
        return 0.0
    return (n - 1) * link.alpha_s + _transfer_s(knobs, (n - 1) / n * bytes_per_rank, link)


def p2p_s(knobs: Knobs, size_bytes: float, link: Link) -> float:
    if size_bytes <= 0:
        return 0.0
    return link.alpha_s + _transfer_s(knobs, size_bytes, link)


def hierarchical_all_reduce_s(knobs: Knobs, size_bytes: float | np.ndarray, n: int, per_node: int,
                              intra: Link, inter: Link) -> float | np.ndarray:
    """All-reduce over n ranks, `per_node` of them sharing a node: intra reduce-scatter,
    inter all-reduce of the 1/per_node shard, intra all-gather."""
    if n <= 1:
        return _out(np.zeros_like(np.asarray(size_bytes, dtype=float)))
    g = max(1, min(per_node, n))
    nodes = -(-n // g)
    intra_s = 2 * np.asarray(all_gather_s(knobs, size_bytes, g, intra))
    return _out(intra_s + np.asarray(all_reduce_s(knobs, np.asarray(size_bytes, dtype=float) / g, nodes, inter)))
