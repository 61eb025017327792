"""A lower bound on a template assignment from whole copy counts, where the LP's fractional ones sit low.

`assign_lp` bounds an assignment problem (`solvers.assign.AssignProblem`) by its LP relaxation:
fractions of pipelines may fill the GPUs each type leaves over. On pools of many GPU types that
relaxation can sit far below every plan: GPT-3 6.7B on 182 GPUs of seven types
(`benchmarks/many_types.py --seed 1`, pool 14), one unit of six pipelines bounded at 1.4387 s by
the LP, 1.537 s by the exact integer optimum over the same templates (`solvers.assign`, 12.8 s:
every tail level solved), the best plan 1.6005 s.

This bound asks one question per trial time T: can whole copies of the templates finish a step
in less than T? A copy's step is its pipeline time plus the largest tail of the templates used,
so a template with A + E >= T is in no such plan, and the tails E of the others are cut into at
most `buckets` ranges [e_lo, e_hi] of consecutive distinct values. A plan below T whose largest
tail lies in a range runs only templates with E <= e_hi, each copy in pipeline time below
T - e_lo; so if no whole copy counts of those templates reach the microbatches at pipeline time
T - e_lo (`solvers.assign._check`: capacity bounds, a greedy answer, then CP-SAT), for every
range, no plan is below T. Bisection on T between a proven bound and a goal returns the largest
T so proven (to `rel_tol`). An integer program that stops at its time limit proves nothing: the
bisection treats T as reachable, so the bound stays valid whatever the time limit cuts.

`reach` is one such check, with the copies it found (the witness). With `split` a range whose
witness has a largest tail e_w above e_lo counts as reached only if those copies also fit at
pipeline time T - e_w; else the range is cut at e_w and both parts checked: ranges of thousands
of distinct tails are wide, and where tails are a fifth of the step (`many_types.py --seed 5`
pool 13) a range reached 3.5 % below every plan. `integral_bound(tighten=...)` lets the caller
tighten the witness's templates between checks (`planner.search.lift.lift_unit`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from solvers.assign import AssignProblem, SolverStats, _caps, _check, _Groups
from solvers.distinct import distinct


def reach(p: AssignProblem, t: float, stats: SolverStats, groups: _Groups | None = None, buckets: int = 16,
          time_limit_s: float = 10.0, work_s: float = 0.2, split: bool = False,
          max_checks: int | None = None, skip_cut: bool = False) -> tuple[bool, np.ndarray | None]:
    """Whether whole copy counts may finish a step below t (module doc: False proves none do),
    with the counts found, the witness (None where a check cut short proved nothing, or none
    reach). A caller that can tighten the witness's templates may ask again at the same t.

    With `split` a tail range [e_lo, e_hi] whose check finds copies whose largest tail e_w is
    above e_lo is not taken as reached unless those copies also fit at pipeline time t - e_w;
    else it is cut at e_w into [e_lo, e_w) and [e_w, e_hi], each checked in turn (the first holds
    every plan whose largest tail is below e_w, the second every other). A range lets every copy
    run until t - e_lo while its tail may be e_hi, so a wide one reaches where no plan does (tails
    a fifth of the step, on a 16-range cut of thousands of distinct tails). Past `max_checks`
    feasibility checks (counted in `stats`) the answer is "reached", which proves nothing.
    `skip_cut` (a search for plans, not a proof): a range whose check stopped at its work cap is
    passed over and the next one checked, rather than ending the search "reached"."""
    groups = groups or _Groups.of_problem(p)
    tails = distinct(p.e_s[p.a_s + p.e_s < t])
    parts = list(np.array_split(tails, min(buckets, len(tails)))) if len(tails) else []
    while parts:
        part = parts.pop(0)
        if max_checks is not None and stats.feasibility_checks >= max_checks:
            return True, None
        timed_out = stats.timed_out
        stats.timed_out = False
        found = _check(p, p.e_s <= part[-1], t - part[0], "cpsat", time_limit_s, stats, groups, work_s)
        cut, stats.timed_out = stats.timed_out, timed_out or stats.timed_out
        if cut and not skip_cut:
            return True, None
        if found is None:
            continue
        e_w = float(np.max(p.e_s[found > 0]))
        if not split or e_w <= part[0] or _holds(p, found, t - e_w):
            return True, found
        parts[:0] = [x for x in (part[part < e_w], part[part >= e_w]) if len(x)]
    return False, None


def _holds(p: AssignProblem, counts: np.ndarray, pipe_s: float) -> bool:
    """Whether `counts` copies hold every microbatch within pipeline time `pipe_s`."""
    return int(np.dot(counts, _caps(p, counts > 0, pipe_s))) >= p.microbatches


def integral_bound(p: AssignProblem, proven_s: float, goal_s: float, rel_tol: float = 1e-3, buckets: int = 16,
                   time_limit_s: float = 10.0, work_s: float = 0.2, max_checks: int = 64,
                   deadline: float | None = None, stats: SolverStats | None = None, split: bool = False,
                   tighten: Callable[[AssignProblem, np.ndarray], AssignProblem | None] | None = None) -> float:
    """The largest T in [proven_s, goal_s], to `rel_tol` of goal_s, such that no whole copy counts
    finish a step (pipeline time + largest tail) below T; `proven_s` must be a valid bound already
    (the LP's). goal_s itself when it is proven at once. Each CP-SAT model stops after `work_s`
    of its deterministic time (`time_limit_s` of wall time at most) and the bisection, at the last
    T proven, after `max_checks` feasibility checks: a fixed amount of work, the same bound each
    run (one lift on a 44-GPU pool had taken 95 s for nothing with 10 s models and 200 checks);
    or past `deadline` (time.perf_counter()). `split`: each check's tail ranges are cut at the
    copies found (`reach`).

    `tighten(p, witness)`: where whole copies reach below T, the caller may return a tighter
    problem, valid for the same plans (its witness's templates replaced by tighter ones), and T
    is checked again against it; None keeps T reached. The checks of a T checked again are
    outside `max_checks`. A T proven on any such problem bounds every plan, so the bound holds."""
    stats = stats or SolverStats()
    if goal_s <= proven_s:
        return proven_s
    groups = _Groups.of_problem(p)
    lo, hi, t = proven_s, goal_s, goal_s
    start = stats.feasibility_checks
    while (stats.feasibility_checks - start < max_checks
           and not (deadline is not None and time.perf_counter() > deadline)):
        checks = stats.feasibility_checks
        reached, witness = reach(p, t, stats, groups, buckets, time_limit_s, work_s, split, start + max_checks)
        if not reached:
            lo = t
        else:
            tighter = tighten(p, witness) if tighten is not None and witness is not None else None
            if tighter is not None:
                start += stats.feasibility_checks - checks
                p, groups = tighter, _Groups.of_problem(tighter)
                continue  # the same T, against the tighter problem
            hi = t
        if lo >= goal_s or hi - lo <= rel_tol * goal_s:
            break
        t = (lo + hi) / 2
    return lo
