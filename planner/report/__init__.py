"""Reports over plans: why a plan is what it is (`explain`), two plans side by side (`compare`), and a
PNG of the simulated schedule (`timeline_png`, needs matplotlib, imported only when used)."""

from planner.report.compare import compare, plan_summary
from planner.report.explain import Explanation, explain

__all__ = ["Explanation", "compare", "explain", "plan_summary"]
