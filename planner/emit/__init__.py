"""Launch-file emitters: turn a plan into what a real engine runs (see docs/emit.md).

All emitters share one rank order (`planner.emit.placement`) and refuse, with
`HetplanError("target", reason)`, a plan their engine cannot express.
"""

from planner.emit.placement import NodeSlot, RankInfo, node_order, rank_order

__all__ = ["NodeSlot", "RankInfo", "node_order", "rank_order"]
