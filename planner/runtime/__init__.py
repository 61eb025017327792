"""Runtime helpers for launching a plan: torch.distributed process groups for any valid plan.

`group_layout` / `rank_groups` are pure (which ranks form which group); `process_groups` creates the
torch groups on one rank. torch is imported only when `process_groups` runs, so `import planner`
and `import planner.runtime` never need it.
"""

from planner.runtime.groups import GroupLayout, GroupSpec, RankGroups, group_layout, rank_groups
from planner.runtime.torch_groups import ProcessGroups, check_groups, process_groups

__all__ = ["GroupLayout", "GroupSpec", "ProcessGroups", "RankGroups", "check_groups", "group_layout",
           "process_groups", "rank_groups"]
