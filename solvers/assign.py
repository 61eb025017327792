"""How many copies of each pipeline template to run, and how many microbatches each copy gets.

Plain data in: per template its pipeline time A + (m-1)·C for m microbatches, tail E, memory cap on
m, GPU usage per class; GPU counts per class, total microbatches M and a range for the number of
pipelines R. Minimises  max over copies (A + (m-1)·C) + max over used templates E.

Method (exact): for each candidate tail cap e (the distinct E values, ascending, stopping once e
plus the unrestricted least pipeline time cannot win), search the least pipeline time T. At a given T a copy of template t can take at most
cap_t(T) = min(max_m, floor((T - A)/C) + 1) microbatches; T is feasible iff an integer program
(CP-SAT by default, or PuLP with CBC/HiGHS) finds copy counts within the GPU counts and R range
whose capacities reach M (capacity bounds and a greedy answer settle most checks without it).
T is bisected to 0.1 %, then lowered breakpoint by breakpoint until a T just below is infeasible,
so the answer is the exact optimum, not a tolerance. Microbatches are then dealt out by water-filling, which is exactly
min-max optimal for the chosen copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from solvers.count_floor import capacity_with_floor
from solvers.deal import deal
from solvers.distinct import distinct
from solvers.small_lp import SmallLP

BIG_M = 10**9


@dataclass(frozen=True, slots=True)
class AssignProblem:
    a_s: np.ndarray  # (T,)
    c_s: np.ndarray  # (T,)
    e_s: np.ndarray  # (T,)
    max_microbatches: np.ndarray  # (T,) int, BIG_M = unlimited
    usage: np.ndarray  # (T, K) GPUs per class
    avail: np.ndarray  # (K,)
    microbatches: int  # M
    replicas: tuple[int, int]  # inclusive range for the number of pipelines


@dataclass(frozen=True, slots=True)
class Assignment:
    counts: tuple[int, ...]  # copies of each template
    microbatches: tuple[tuple[int, ...], ...]  # per template, microbatches of each copy
    pipe_s: float
    tail_s: float
    bound_s: float = 0.0  # lower bound on the optimum of this problem (== objective when exact)

    @property
    def objective_s(self) -> float:
        return self.pipe_s + self.tail_s


@dataclass
class SolverStats:
    feasibility_checks: int = 0
    ilp_solves: int = 0
    timed_out: bool = False  # an ILP hit its time limit: no optimality or bound claim
    truncated: bool = False  # the tail levels were cut short by the deadline; the bound still holds


def _caps(p: AssignProblem, allowed: np.ndarray, t: float) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        k = np.floor((t - p.a_s) / p.c_s + 1e-12) + 1
    k = np.where(t + 1e-15 >= p.a_s, k, 0)
    k = np.minimum(k, p.max_microbatches)
    k = np.minimum(k, p.microbatches)
    return np.where(allowed, k, 0).astype(np.int64)


def _ub_counts(p: AssignProblem) -> np.ndarray:
    with np.errstate(divide="ignore"):
        per_class = np.where(p.usage > 0, p.avail[None, :] // np.maximum(p.usage, 1), BIG_M)
    return np.minimum(per_class.min(axis=1), p.replicas[1])


def _feasible_cpsat(p: AssignProblem, caps: np.ndarray, ub: np.ndarray, time_limit_s: float | None,
                    stats: SolverStats, work_s: float | None = None) -> np.ndarray | None:
    from ortools.sat.python import cp_model

    idx = [i for i in range(len(caps)) if caps[i] > 0 and ub[i] > 0]
    if not idx:
        return None
    if int(sum(int(caps[i]) * int(ub[i]) for i in idx)) < p.microbatches:
        return None
    model = cp_model.CpModel()
    n = {i: model.NewIntVar(0, int(ub[i]), f"copies_{i}") for i in idx}
    for k in range(p.usage.shape[1]):
        terms = [int(p.usage[i, k]) * n[i] for i in idx if p.usage[i, k]]
        if terms:
            model.Add(sum(terms) <= int(p.avail[k]))
    total = sum(n.values())
    model.Add(total >= p.replicas[0])
    model.Add(total <= min(p.replicas[1], p.microbatches))
    model.Add(sum(int(caps[i]) * n[i] for i in idx) >= p.microbatches)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
    if work_s is not None:  # CP-SAT's deterministic time: the same stop on every run
        solver.parameters.max_deterministic_time = work_s
    stats.ilp_solves += 1
    status = solver.Solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        out = np.zeros(len(caps), dtype=np.int64)
        for i in idx:
            out[i] = solver.Value(n[i])
        return out
    if status == cp_model.UNKNOWN:
        stats.timed_out = True
    return None


def _feasible_pulp(p: AssignProblem, caps: np.ndarray, ub: np.ndarray, time_limit_s: float | None,
                   stats: SolverStats, solver_name: str) -> np.ndarray | None:
    import pulp

    idx = [i for i in range(len(caps)) if caps[i] > 0 and ub[i] > 0]
    if not idx or int(sum(int(caps[i]) * int(ub[i]) for i in idx)) < p.microbatches:
        return None
    prob = pulp.LpProblem("copies", pulp.LpMaximize)
    n = {i: pulp.LpVariable(f"copies_{i}", 0, int(ub[i]), cat="Integer") for i in idx}
    prob += pulp.lpSum(int(caps[i]) * n[i] for i in idx)
    for k in range(p.usage.shape[1]):
        terms = [int(p.usage[i, k]) * n[i] for i in idx if p.usage[i, k]]
        if terms:
            prob += pulp.lpSum(terms) <= int(p.avail[k])
    prob += pulp.lpSum(n.values()) >= p.replicas[0]
    prob += pulp.lpSum(n.values()) <= min(p.replicas[1], p.microbatches)
    kwargs = {"msg": False}
    if time_limit_s is not None:
        kwargs["timeLimit"] = max(1, int(math.ceil(time_limit_s)))
    backend = pulp.HiGHS(**kwargs) if solver_name == "highs" else pulp.PULP_CBC_CMD(**kwargs)
    stats.ilp_solves += 1
    from solvers.quiet import quiet_stdout

    with quiet_stdout():
        prob.solve(backend)
    # sol_status, not only status: after a time limit CBC can report "Optimal" for a poor answer.
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        if prob.sol_status == pulp.LpSolutionNoSolutionFound:
            stats.timed_out = True
        return None
    out = np.zeros(len(caps), dtype=np.int64)
    for i in idx:
        out[i] = int(round(n[i].value() or 0))
    if int(np.dot(out, caps)) < p.microbatches:
        return None
    return out


@dataclass(frozen=True, slots=True)
class _Groups:
    """Templates grouped by GPU-usage vector, and which usage vectors fit inside which; the
    capacity LP over the groups is built on first use (`_lp_short`) and warm-started after."""

    of: np.ndarray  # (T,) group of each template
    inside: np.ndarray  # (G, G) bool: usage[j] <= usage[i] componentwise, j != i
    usage: np.ndarray  # (G, K) the distinct usage vectors
    lp: list = field(default_factory=list)  # [its limits b, SmallLP] once built

    @staticmethod
    def of_problem(p: AssignProblem) -> "_Groups":
        usage, of = np.unique(p.usage, axis=0, return_inverse=True)
        inside = np.all(usage[:, None, :] <= usage[None, :, :], axis=2)
        np.fill_diagonal(inside, False)
        return _Groups(of.reshape(-1), inside, usage)


def _collapse(p: AssignProblem, caps: np.ndarray, groups: _Groups) -> np.ndarray:
    """Keep, per GPU-usage vector, only the template with the largest capacity (lowest index on
    ties), and drop usage vectors that need more GPUs than another with at least the same capacity.
    Any solution of the full problem maps onto the kept templates without losing capacity."""
    n_groups = groups.inside.shape[0]
    best_cap = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(best_cap, groups.of, caps)
    # representative: first template (lowest index) reaching its group's best capacity
    is_best = (caps == best_cap[groups.of]) & (caps > 0)
    rep = np.full(n_groups, -1)
    idx = np.flatnonzero(is_best)[::-1]
    rep[groups.of[idx]] = idx
    live = best_cap > 0
    dominated = (groups.inside & live[:, None] & (best_cap[:, None] >= best_cap[None, :])).any(axis=0)
    keep = live & ~dominated
    out = np.zeros_like(caps)
    chosen = rep[keep]
    out[chosen] = caps[chosen]
    return out


def _greedy(p: AssignProblem, caps: np.ndarray, ub: np.ndarray) -> np.ndarray | None:
    """A quick feasible answer: templates by capacity per GPU (or, when few pipelines are allowed,
    by capacity per copy), as many copies as fit."""
    gpus = p.usage.sum(axis=1)
    live = np.flatnonzero((caps > 0) & (ub > 0)).tolist()
    for key in ((lambda i: (-caps[i] / gpus[i], gpus[i], i)), (lambda i: (-caps[i], gpus[i], i))):
        found = _greedy_in_order(p, caps, ub, sorted(live, key=key))
        if found is not None:
            return found
    return None


def _greedy_in_order(p: AssignProblem, caps: np.ndarray, ub: np.ndarray, order: list[int]) -> np.ndarray | None:
    left = p.avail.copy()
    counts = np.zeros(len(caps), dtype=np.int64)
    total_cap, copies = 0, 0
    limit = min(p.replicas[1], p.microbatches)
    for i in order:
        if copies >= limit or total_cap >= p.microbatches:
            break
        use = p.usage[i]
        fit = int(np.min(left[use > 0] // use[use > 0])) if np.any(use > 0) else limit
        need = -(-(p.microbatches - total_cap) // int(caps[i]))
        take = max(0, min(fit, int(ub[i]), limit - copies, need))
        if take:
            left -= take * use
            counts[i] += take
            copies += take
            total_cap += take * int(caps[i])
    if total_cap >= p.microbatches and copies >= p.replicas[0]:
        return counts
    return None


def _surely_infeasible(p: AssignProblem, caps: np.ndarray, ub: np.ndarray) -> bool:
    """Capacity bounds from feasible duals of the LP relaxation: a price y_c per GPU of class c (and
    z per copy) with usage_t·y + z >= cap_t for every template bounds the capacity by
    avail·y + R·z. Tried: per-class prices from single-class templates (scaled up until mixed ones
    are covered), one price for every GPU, and a price per copy alone."""
    live = (caps > 0) & (ub > 0)
    if not live.any():
        return True
    usage = p.usage[live].astype(float)
    cap = caps[live].astype(float)
    gpus = usage.sum(axis=1)
    copies = min(p.replicas[1], p.microbatches)
    bounds = [float(np.max(cap / gpus)) * float(p.avail.sum()), float(np.max(cap)) * copies]
    single = (usage > 0).sum(axis=1) == 1
    y = np.zeros(usage.shape[1])
    for c in range(usage.shape[1]):
        on_c = single & (usage[:, c] > 0)
        if on_c.any():
            y[c] = float(np.max(cap[on_c] / usage[on_c, c]))
    covered = usage @ y
    need = np.where(covered > 0, cap / np.maximum(covered, 1e-300), np.inf)
    scale = float(np.max(need))
    if np.isfinite(scale):
        bounds.append(float(p.avail @ (y * max(1.0, scale))))
    return min(bounds) < p.microbatches


def _lp_short(p: AssignProblem, caps: np.ndarray, groups: _Groups) -> bool:
    """Whether even fractional copies fall short of M: max sum n·cap over usage groups (each its
    best capacity) within the GPUs of each class and the most pipelines (`solvers.small_lp`). A
    relaxation (no integrality, no per-template count limits; the least pipeline count priced,
    `solvers.count_floor`), so a value below M proves there are no whole copies either. Where
    the greedy answer fails, most checks are settled so: 60 % of the CP-SAT models of
    `many_types.py --seed 1` pool 7 (232 of them, 3.3 s) had an LP optimum below M, and CP-SAT
    found none of those feasible."""
    b = np.append(p.avail.astype(float), float(min(p.replicas[1], p.microbatches)))
    if not groups.lp or not np.array_equal(groups.lp[0], b):  # built for this problem's limits
        rows = np.vstack([groups.usage.T, np.ones((1, groups.usage.shape[0]))])
        groups.lp[:] = [b, SmallLP(rows, b)]
    best = np.zeros(groups.usage.shape[0])
    np.maximum.at(best, groups.of, caps.astype(float))
    need = p.microbatches * (1 - 1e-9) - 1e-9
    if p.replicas[0] > 1:  # at least that many copies, each holding a microbatch (priced: any price bounds)
        value, _ = capacity_with_floor(groups.lp[1], best, p.replicas[0], need)
    else:
        value, _ = groups.lp[1].solve(best)
    return value < need


def _check(p: AssignProblem, allowed: np.ndarray, t: float, backend: str, time_limit_s: float | None,
           stats: SolverStats, groups: _Groups, work_s: float | None = None) -> np.ndarray | None:
    """Copy counts whose capacities at pipeline time t reach M, or None if there are none (or, with
    `stats.timed_out` set, none found within the time limit or CP-SAT's `work_s`)."""
    stats.feasibility_checks += 1
    ub = _ub_counts(p)
    caps = _caps(p, allowed, t)
    if _surely_infeasible(p, caps, ub):
        return None
    caps = _collapse(p, caps, groups)
    quick = _greedy(p, caps, ub)
    if quick is not None:
        return quick
    if _lp_short(p, caps, groups):
        return None
    if backend == "cpsat":
        return _feasible_cpsat(p, caps, ub, time_limit_s, stats, work_s)
    return _feasible_pulp(p, caps, ub, time_limit_s, stats, backend)


def _min_time(p: AssignProblem, allowed: np.ndarray, backend: str, time_limit_s: float | None,
              stats: SolverStats, groups: _Groups, lower: float,
              upper: tuple[float, np.ndarray, np.ndarray] | None) -> tuple[float, np.ndarray, np.ndarray] | None:
    """Least pipeline time using only `allowed` templates, exactly: bisection to 0.1 %, then step
    down breakpoint by breakpoint (a T just below the current optimum must be infeasible). "Just
    below" is below the slack `_caps` allows (1e-12 of a C): one float step below, a copy at
    exactly the current time still counted as fitting, the feasibility check could return it
    again, and the descent stopped 5e-4 above a template with the same tail (`oracle_fuzz.py
    --seed 62` draw 1,441: A100-80 -> A100-40 chosen over A100-80 -> A100-80)."""
    def check(t: float) -> np.ndarray | None:
        return _check(p, allowed, t, backend, time_limit_s, stats, groups)

    if not allowed.any():
        return None
    lo = max(lower, float(np.min(p.a_s[allowed])))
    if lower > 0:  # `lower` is the least time over all templates: reaching it here settles the level
        at_lo = check(lo)
        if at_lo is not None:
            caps = _caps(p, allowed, lo)
            return deal(p, at_lo, caps)[1], at_lo, caps
    if upper is not None and upper[0] >= lo:
        below = check(float(np.nextafter(upper[0], -np.inf)))
        if below is None:
            return upper
        hi, found = upper[0], below
    else:
        hi = lo
        found = check(hi)
    span = float(np.max(p.a_s[allowed]) + p.microbatches * np.max(p.c_s[allowed]))
    while found is None:
        if hi > span * 2:
            return None
        lo = hi
        hi = hi * 2 if hi > 0 else 1e-6
        found = check(hi)
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        sol = check(mid)
        if sol is None:
            lo = mid
        else:
            hi, found = mid, sol
    caps = _caps(p, allowed, hi)
    _, t_now = deal(p, found, caps)
    band = 2 * (1e-12 * float(np.max(p.c_s[allowed])) + 1e-15)  # twice `_caps`' slack
    while True:
        t_try = min(float(np.nextafter(t_now, -np.inf)), t_now - band)
        sol = check(t_try)
        if sol is None:
            break
        caps_try = _caps(p, allowed, t_try)
        _, t_new = deal(p, sol, caps_try)
        if t_new >= t_now:
            break
        found, caps, t_now = sol, caps_try, t_new
    return t_now, found, caps


def _tail_levels(e_values: np.ndarray, width_s: float, exact_upto: int) -> list[tuple[float, float]]:
    """(cap, floor) pairs in increasing order: plans whose largest tail T_e satisfies
    floor <= T_e <= cap (and T_e above the previous cap) are searched at this cap. Every distinct
    tail is its own level when there are few (floor = cap: exact), else buckets `width_s` wide."""
    tails = distinct(e_values)
    if len(tails) <= exact_upto or width_s <= 0:
        return [(float(c), float(c)) for c in tails]
    out = []
    i = 0
    while i < len(tails):
        j = int(np.searchsorted(tails, float(tails[i]) + width_s, side="right"))
        out.append((float(tails[j - 1]), float(tails[i])))
        i = j
    return out


def solve_assignment(p: AssignProblem, backend: str = "cpsat",
                     time_limit_s: float | None = None, stats: SolverStats | None = None,
                     tail_width_rel: float = 1e-3, exact_levels: int = 200,
                     deadline: float | None = None) -> Assignment | None:
    """Optimal copies and microbatch counts (see module docstring), or None if infeasible.

    With more than `exact_levels` distinct tails, tails are grouped into buckets `tail_width_rel`
    of the least pipeline time wide; `Assignment.bound_s` then is a lower bound on the optimum
    that is at most one bucket below it (equal to the optimum otherwise). Past `deadline`
    (time.perf_counter()) the remaining levels are skipped: the best so far is returned and the bound
    covers the skipped levels with the least pipeline time plus their tail floor."""
    import time

    stats = stats or SolverStats()
    every = np.ones(len(p.a_s), dtype=bool)
    groups = _Groups.of_problem(p)
    base = _min_time(p, every, backend, time_limit_s, stats, groups, 0.0, None)
    if base is None:
        return None
    t_bound = base[0]
    best: Assignment | None = None
    bound = np.inf
    upper = None
    for e, e_floor in _tail_levels(p.e_s, tail_width_rel * t_bound, exact_levels):
        if best is not None and t_bound + e_floor >= best.objective_s:
            bound = min(bound, t_bound + e_floor)
            break
        if best is not None and deadline is not None and time.perf_counter() > deadline:
            stats.truncated = True
            bound = min(bound, t_bound + e_floor)
            break
        allowed = p.e_s <= e
        if best is not None:
            # Only a pipeline time below best - e_floor can improve on `best`; one check settles it.
            target = float(np.nextafter(best.objective_s - e_floor, -np.inf))
            sol = _check(p, allowed, target, backend, time_limit_s, stats, groups)
            if sol is None:
                bound = min(bound, best.objective_s)
                continue
            caps_t = _caps(p, allowed, target)
            upper = (deal(p, sol, caps_t)[1], sol, caps_t)
        res = _min_time(p, allowed, backend, time_limit_s, stats, groups, t_bound, upper)
        if res is None:
            continue
        t, counts, caps = res
        upper = res
        per_t, pipe = deal(p, counts, caps)
        tail = float(np.max(p.e_s[counts > 0]))
        bound = min(bound, pipe + e_floor)
        cand = Assignment(tuple(int(x) for x in counts), per_t, pipe, tail)
        if best is None or cand.objective_s < best.objective_s - 1e-15:
            best = cand
    if best is None:
        return None
    return Assignment(best.counts, best.microbatches, best.pipe_s, best.tail_s,
                      min(bound, best.objective_s))
