"""Launch-file emitters: turn a plan into what a real engine runs (see docs/emit.md).

All emitters share one rank order (`planner.emit.placement`) and refuse, with
`HetplanError("target", reason)`, a plan their engine cannot express.
"""

import sys
import types

from planner.emit.placement import NodeSlot, RankInfo, node_order, rank_order

__all__ = ["NodeSlot", "RankInfo", "node_order", "rank_order"]


class _EmitPackage(types.ModuleType):
    """`from planner import emit; emit(plan, cluster, "any")`: the package is callable (it runs
    `planner.emit.targets.emit`) and stays a package, so `planner.emit.megatron` and friends import
    as usual."""

    def __call__(self, plan, cluster, target: str = "any"):  # noqa: ANN001, ANN204 - see targets.emit
        from planner.emit.targets import emit

        return emit(plan, cluster, target)


sys.modules[__name__].__class__ = _EmitPackage
