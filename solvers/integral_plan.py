"""Whole copy counts near the least step, where rounding the LP's fractional copies falls short.

`assign_lp` finds plans by rounding its LP's copies (down, up, paired, dived, spare GPUs filled).
On pools of many GPU types the LP spreads a few pipelines over many templates, a fraction of
each, and no rounding of them is near the best whole plan: Llama-2 7B on 145 GPUs of seven types
(`benchmarks/many_types.py --seed 1`, pool 7), one unit of seven pipelines, LP bound 4.2017 s,
rounded plan 4.5412 s, exact integer optimum over the same templates 4.2968 s (`solvers.assign`,
6.7 s: every tail level solved).

This search asks, per trial step T, for whole copies finishing below it: the tails E of the
templates that fit (A + E <= T) are cut into at most `buckets` ranges of consecutive distinct
values, and for each range [e_lo, e_hi], lowest first, copies of templates with E <= e_hi whose
capacities at pipeline time T - e_hi reach the microbatches (`solvers.assign._check`: capacity
bounds, a greedy answer, then CP-SAT) form a plan of step at most T. Bisection on T between a
lower bound and the best step known keeps the least plan found. It is a heuristic (a check that
finds nothing, or stops at its work cap, only moves the bisection up), so it only ever adds a plan,
never a bound; the work is capped so that the same input gives the same plan.
"""

from __future__ import annotations

import time

import numpy as np

from solvers.assign import (
    Assignment,
    AssignProblem,
    SolverStats,
    _caps,
    _check,
    _Groups,
)
from solvers.deal import deal
from solvers.distinct import distinct
from solvers.integral_bound import reach


def _plan_below(p: AssignProblem, t: float, buckets: int, time_limit_s: float, work_s: float,
                stats: SolverStats, groups: _Groups) -> Assignment | None:
    """Whole copies whose step (pipeline time + largest tail) is at most t, or None if no tail
    range's check finds one (module doc)."""
    tails = distinct(p.e_s[p.a_s + p.e_s <= t])
    for part in np.array_split(tails, min(buckets, len(tails))) if len(tails) else []:
        allowed = p.e_s <= part[-1]
        timed_out = stats.timed_out
        found = _check(p, allowed, t - float(part[-1]), "cpsat", time_limit_s, stats, groups, work_s)
        stats.timed_out = timed_out  # a check stopped by its cap proves nothing here, and claims nothing
        if found is not None:
            per_copy, pipe = deal(p, found, _caps(p, allowed, t - float(part[-1])))
            return Assignment(tuple(found.tolist()), per_copy, pipe, float(np.max(p.e_s[found > 0])))
    return None


def _plan_within(p: AssignProblem, t: float, buckets: int, time_limit_s: float, work_s: float,
                 stats: SolverStats, groups: _Groups, max_checks: int) -> Assignment | None:
    """`_plan_below` with each tail range checked at its lowest tail and cut at the largest tail
    of the copies found until they fit at it (`integral_bound.reach` with `split`): a plan whose
    largest tail lies inside a range is found, where checking the range at its highest tail
    misses it."""
    timed_out = stats.timed_out
    found = reach(p, t, stats, groups, buckets, time_limit_s, work_s, split=True, max_checks=max_checks,
                  skip_cut=True)[1]
    stats.timed_out = timed_out  # as in `_plan_below`: a capped check claims nothing here
    if found is None:
        return None
    e_w = float(np.max(p.e_s[found > 0]))
    per_copy, pipe = deal(p, found, _caps(p, p.e_s <= e_w, t - e_w))
    return Assignment(tuple(found.tolist()), per_copy, pipe, e_w)


def integral_plan(p: AssignProblem, lower_s: float, upper_s: float, rel_tol: float = 1e-3, buckets: int = 16,
                  time_limit_s: float = 10.0, work_s: float = 0.2, max_checks: int = 64,
                  deadline: float | None = None, stats: SolverStats | None = None,
                  split: bool = False) -> Assignment | None:
    """The least-step whole plan found below `upper_s` (the best step known), bisecting the step
    down to `lower_s` (a lower bound, e.g. the LP's) to `rel_tol`; None if none is found. Each
    CP-SAT model stops after `work_s` of its deterministic time (`time_limit_s` of wall time at
    most), the bisection after `max_checks` feasibility checks or past `deadline`
    (time.perf_counter(); then `stats.truncated` is set). With `split` each trial step cuts its
    tail ranges at the copies found (`_plan_within`) rather than checking each at its top."""
    stats = stats or SolverStats()
    groups = _Groups.of_problem(p)
    checks0 = stats.feasibility_checks
    lo, hi = lower_s, upper_s
    best: Assignment | None = None
    first = True
    while hi - lo > rel_tol * hi and stats.feasibility_checks - checks0 < max_checks:
        if deadline is not None and time.perf_counter() > deadline:
            stats.truncated = True  # the time limit cut it: the plan may be poorer than without it
            break
        # first just below `upper_s`, the easiest trial: where even it finds nothing the search
        # ends there (the 64-GPU ladder rung: 64 checks, 3.3 s, for nothing when bisecting at once)
        mid = hi * (1 - rel_tol) if first else (lo + hi) / 2
        found = (_plan_within(p, mid, buckets, time_limit_s, work_s, stats, groups, checks0 + max_checks) if split
                 else _plan_below(p, mid, buckets, time_limit_s, work_s, stats, groups))
        if found is None and first:
            break
        first = False
        if found is None:
            lo = mid
        else:
            best, hi = found, min(mid, found.objective_s)
    return best
