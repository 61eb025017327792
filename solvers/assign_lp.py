"""Template assignment for large pools: an LP lower bound and a rounded integer plan.

Same problem as `solvers.assign` (minimise max pipeline time + max tail over copies of templates),
solved without integer programs, for pools where copies number in the hundreds:

* Bound. At pipeline time T a copy of template t holds at most k_t(T) = floor((T - A_t)/C_t) + 1
  microbatches (and at most its memory cap and M). Dropping the integrality of the copy counts
  only enlarges what copies can hold, so if the LP  max sum_t n_t·kappa_t(T)  s.t.
  usage·n <= avail, R_lo <= sum_{kappa_t > 0} n_t, sum n <= R_hi, n >= 0  is below M, no plan has
  pipeline time T (every pipeline of a plan holds a microbatch; the lower row is priced,
  `solvers.count_floor`; the cheap bound, `pipeline_time_bound`, leaves it out). Newton steps from above (the LP's copies at a feasible T stay feasible, so the
  T where they first hold M is LP-feasible too), certified by one LP just below, give T_LP(e) for the
  templates with tail <= e; every plan whose largest tail is e costs at least T_LP(e) + e. The tail
  levels are refined branch-and-bound style: T_LP is non-increasing in e, so for levels i..j every
  plan costs at least T_LP(e_j) + e_i.
* Plan. At a few trial times just above the bound, the LP's copy counts rounded down (and up where
  the GPUs allow), spare GPUs filled with copies of the same and then other templates; each candidate
  is scored exactly (`pipe_time_of`) and the best dealt out by water-filling (`solvers.deal`).
  Plans are rounded at the largest tail level and at the level where the bound search ends, not at
  each level it bisects through: on 40 random pools (`benchmarks/chain_check.py` draws, seeds 33
  and 34) the plans and gaps were the same and the search took 10 % less time (281 s against 313 s);
  of seed 35's first 30 pools one plan came out 0.011 % slower (pool 0: 8.02870 s against
  8.02784 s) and the ladder's 16,384-GPU plan 0.1 % faster (7.592 s against 7.599 s). Rounding at
  every level in the plan polish only got pool 0 back but lost the ladder's gain again, for 2 %
  more time on the 40 pools: not kept.
  With at most `DIVE_MAX_COPIES` pipelines the LP is also dived (`_dive`), and with at most two the
  fastest one or two copies are found exactly (`_best_pair`): rounding a handful of fractional
  copies down is where plans of small pools lost most.
  The plan is a real plan of the templates; its distance to the bound is the gap the search reports.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import numpy as np

from solvers.assign import Assignment, AssignProblem, SolverStats, _caps
from solvers.copy_time import least_time, least_true
from solvers.count_floor import capacity_with_floor
from solvers.deal import deal
from solvers.distinct import distinct
from solvers.few_copies import INTEGRAL_COPIES, whole_copies
from solvers.small_lp import SmallLP


def joinable(p: AssignProblem) -> np.ndarray:
    """Templates that fit in a plan of at least `p.replicas[0]` copies: with the fewest GPUs any
    template uses for each other copy, in every class and in all. The LP drops the lower limit
    on the pipeline count, so without this it bounds a unit of four pipelines by one copy of a
    template using the whole pool (`benchmarks/chain_check.py --seed 29` pool 25); leaving out
    templates no plan of the unit can hold keeps every bound valid."""
    others = max(p.replicas[0], 1) - 1
    if not others or not len(p.a_s):
        return np.ones(len(p.a_s), dtype=bool)
    least = p.usage.min(axis=0)
    total = p.usage.sum(axis=1)
    per_class = np.all(p.usage + others * least <= p.avail, axis=1)
    return per_class & (total + others * int(total.min()) <= int(p.avail.sum()))


def _kappa(p: AssignProblem, allowed: np.ndarray, t: float) -> np.ndarray:
    """Per-copy capacity at pipeline time t: whole microbatches (only the copy counts are relaxed)."""
    return _caps(p, allowed, t).astype(float)


@dataclass
class _CapacityLP:
    """max sum_g n_g·cap_g over usage groups g (templates of equal GPU usage share a column)."""

    usage: np.ndarray  # (G, K) distinct usage vectors
    of: np.ndarray  # (T,) group of each template
    avail: np.ndarray
    max_copies: int
    stats: SolverStats
    min_copies: int = 0  # plans of the problem have at least this many pipelines (`count_floor`)

    def __post_init__(self) -> None:
        order = np.argsort(self.of, kind="stable")
        self._order = order  # templates grouped by usage group, for `best_per_group`
        self._starts = np.flatnonzero(np.r_[True, np.diff(self.of[order]) != 0])
        self._lp: SmallLP | None = None
        self._pairs: tuple[np.ndarray, np.ndarray] | None = None

    def nonzero_usage(self) -> list[list[tuple[int, int]]]:
        """Per template, its (class, GPUs) pairs with GPUs > 0 (computed once)."""
        if getattr(self, "_nonzero", None) is None:
            per_group = [[(int(k), int(u)) for k, u in enumerate(row) if u] for row in self.usage.tolist()]
            self._nonzero = [per_group[g] for g in self.of.tolist()]
        return self._nonzero

    def rows(self) -> np.ndarray:
        """The constraint rows: GPUs of each class per group, then one copy per group."""
        return np.vstack([self.usage.T, np.ones((1, self.usage.shape[0]))]).astype(float)

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Usage groups (i, j), i <= j, whose copies fit the GPUs together (computed once)."""
        if self._pairs is None:
            # class by class: 4-6x faster than one (G, G, classes) array reduced over its short last axis
            fit = np.ones((len(self.usage),) * 2, dtype=bool)
            for col, room in zip(self.usage.T, self.avail.tolist()):
                fit &= col[:, None] + col[None, :] <= room
            self._pairs = np.nonzero(np.triu(fit))
        return self._pairs

    def best_per_group(self, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Largest capacity of each usage group and the (lowest-index) template reaching it."""
        n_groups = self.usage.shape[0]
        best = np.maximum(np.maximum.reduceat(caps[self._order], self._starts), 0.0)
        rep = np.full(n_groups, -1)
        hit = np.flatnonzero((caps == best[self.of]) & (caps > 0))[::-1]
        rep[self.of[hit]] = hit
        return best, rep

    def solve_integral(self, group_caps: np.ndarray, need: float) -> tuple[float, np.ndarray] | None:
        """The integer problem instead of the LP where it is small (`few_copies.whole_copies`):
        copies that fit the GPUs and hold at least `need` microbatches, or None where it does not
        run (the LP's answer then stands)."""
        found = whole_copies(self.usage, self.avail, self.max_copies, self.pairs, group_caps, need,
                             self.min_copies)
        if found is not None:
            self.stats.ilp_solves += 1
        return found

    def solve(self, group_caps: np.ndarray, need: float | None = None) -> tuple[float, np.ndarray]:
        """LP optimum and copy counts per group (`solvers.small_lp`, warm-started from the last
        solve: only the objective changes), under the lower limit on copies (`count_floor`). With
        `need`, a value below it is all the caller asks (a proof that no plan holds `need`): the
        limit is then priced only as far as that takes."""
        if not np.any(group_caps > 0):
            return 0.0, np.zeros(len(group_caps))
        if self._lp is None:
            self._lp = SmallLP(self.rows(), np.append(self.avail.astype(float), float(self.max_copies)))
        self.stats.ilp_solves += 1
        if self.min_copies > 0:
            return capacity_with_floor(self._lp, group_caps, self.min_copies, need)
        return self._lp.solve(group_caps)


def unique_rows(usage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(usage, axis=0, return_inverse=True)` for non-negative integer rows, through one
    mixed-radix key per row (lexicographic order preserved): the axis-0 form sorts a structured
    view and was a hot spot."""
    rows, cols = usage.shape
    base = int(usage.max(initial=0)) + 1
    if rows == 0 or base ** max(cols, 1) >= 2 ** 62:
        found, inverse = np.unique(usage, axis=0, return_inverse=True)
        return found, inverse.reshape(-1)
    weights = base ** np.arange(cols - 1, -1, -1, dtype=np.int64)
    _, first, inverse = np.unique(usage @ weights, return_index=True, return_inverse=True)
    return usage[first], inverse.reshape(-1)


def _root(p: AssignProblem, allowed: np.ndarray, copies: np.ndarray, lo: float, hi: float) -> float:
    """Least T in [lo, hi] at which these (fractional, per-template) copies hold M microbatches;
    `hi` must reach it (`solvers.copy_time`: only the copies' templates are costed)."""
    used = np.flatnonzero((copies > 0) & allowed)
    cap = np.minimum(p.max_microbatches[used], p.microbatches).astype(float)
    return least_time(p.a_s[used], p.c_s[used], cap, copies[used], p.microbatches * (1 - 1e-12), lo, hi)


def _lp_time(p: AssignProblem, lp: _CapacityLP, allowed: np.ndarray, hi: float | None,
             rel_tol: float, floor: float = 0.0) -> float | None:
    """A T proven infeasible for the LP within `rel_tol` of the least LP-feasible one (so a lower
    bound on the least pipeline time), or None if no T is feasible. `floor` is a known lower bound
    on that least T (e.g. the LP time of a superset of `allowed`); the search for a feasible T
    then starts just above it instead of doubling up from the least A.

    Newton-like from above: the LP's copies at a feasible T hold, at every T, at most what the LP
    can (they stay feasible), so the T where those copies first hold M is still LP-feasible; repeat
    until T·(1 - rel_tol) is proven infeasible by the LP itself."""
    if not allowed.any():
        return None

    def capacity(t: float) -> tuple[float, np.ndarray]:
        kappa = _kappa(p, allowed, t)
        best, rep = lp.best_per_group(kappa)
        value, x = lp.solve(best, enough)
        if value >= enough and lp.max_copies <= INTEGRAL_COPIES:  # the LP cannot tell: whole copies
            value, x = lp.solve_integral(best, enough) or (value, x)
        copies = np.zeros(len(kappa))
        live = np.flatnonzero(rep >= 0)
        copies[rep[live]] = x[live]
        return value, copies

    lo = max(float(np.min(p.a_s[allowed])), floor)
    enough = p.microbatches * (1 - 1e-12)
    if capacity(lo)[0] >= enough:
        return lo
    span = float(np.max(p.a_s[allowed]) + p.microbatches * np.max(p.c_s[allowed]))
    step = 0.05 if floor > 0 else 1.0  # near a known bound: grow by 5 %, 10 %, 20 %, ...
    t = hi if hi is not None and hi > lo else max(lo * (1 + step), 1e-6)
    value, copies = capacity(t)
    while value < enough:
        if t > 2 * span:
            return None
        step = min(2 * step, 1.0)
        lo, t = t, t * (1 + step)
        value, copies = capacity(t)
    for _ in range(100):
        t = _root(p, allowed, copies, lo, t)
        probe = max(lo, t * (1 - rel_tol))
        value, below = capacity(probe)
        if value < enough:
            return probe
        copies = below
        t = probe
    return lo
def pipeline_time_bound(p: AssignProblem, stats: SolverStats | None = None, rel_tol: float = 1e-4,
                        floor: float = 0.0) -> float | None:
    """A lower bound on the least max pipeline time of any plan of p (tails ignored), or None when
    the LP shows that no plan exists. `floor`: a known lower bound on it (see `_lp_time`), e.g.
    the bound of the same templates with more pipelines allowed: every template takes part
    (no `joinable`) and the lower limit on pipelines is left out (no `count_floor`), so that
    bound only falls as the replica class rises."""
    stats = stats or SolverStats()
    usage, of = unique_rows(p.usage)
    lp = _CapacityLP(usage, of, p.avail, min(p.replicas[1], p.microbatches), stats)
    return _lp_time(p, lp, np.ones(len(p.a_s), dtype=bool), None, rel_tol, floor)


SUPPORT_SLACKS = (1e-3, 4e-3, 1.6e-2, 6.4e-2)  # relative slack on `total_s` in `lp_support`, widened in turn


def lp_support(p: AssignProblem, total_s: float, max_levels: int = 40,
               stats: SolverStats | None = None, fewest: bool = False) -> np.ndarray:
    """Templates the LP relaxation uses to reach M microbatches within `total_s` (pipeline time plus
    largest tail), over up to `max_levels` tail levels: where a bound of about `total_s` comes from.
    Only a guide for refining templates; no bound relies on it.

    A bound of `solve_assignment_lp` is T_LP(e_j) + e_i over a merged tail range [e_i, e_j] as wide
    as its `rel_tol` (1e-3 of the bound), so at level e_j the pipeline time left can be that much
    short of what the templates need; the slack is widened (`SUPPORT_SLACKS`) until some level
    holds M. With one fixed slack of 1e-3 the support of a two-pipeline unit came out empty
    (`benchmarks/chain_check.py --seed 28` pool 12): it was never refined and its optimistic tail
    left the gap at 3.6 %. With `fewest`, the LP counts its fewest pipelines as the bound's does
    (`count_floor`; refinement's guide); without, as the plans' rounding sees it (the polish's:
    with the limit, `many_types.py --seed 2` pool 25 polished a five-pipeline unit from other
    groups and ended 0.37 % slower, gap 1.56 %)."""
    stats = stats or SolverStats()
    usage, of = unique_rows(p.usage)
    lp = _CapacityLP(usage, of, p.avail, min(p.replicas[1], p.microbatches), stats,
                     p.replicas[0] if fewest else 0)
    levels = distinct(p.e_s[p.e_s < total_s])
    if len(levels) > max_levels:
        levels = levels[distinct(np.linspace(0, len(levels) - 1, max_levels).round().astype(int))]
    used = np.zeros(len(p.a_s), dtype=bool)
    fits = joinable(p)
    for slack in SUPPORT_SLACKS:
        below = float(np.min(p.e_s))
        for e in levels:
            # tails up to e, pipeline time as if the tail were the previous sampled level (plus the
            # slack, for a merged tail range reaching below it)
            kappa = _kappa(p, (p.e_s <= e) & fits, total_s - below + slack * total_s)
            best, rep = lp.best_per_group(kappa)
            value, x = lp.solve(best, p.microbatches * (1 - 1e-12))
            if value >= p.microbatches * (1 - 1e-12):
                live = np.flatnonzero((rep >= 0) & (x > 1e-9))
                used[rep[live]] = True
            below = float(e)
        if used.any():
            break
    return used


def pipe_time_of(p: AssignProblem, counts: np.ndarray) -> float | None:
    """Least max pipeline time of these copies (every copy at least one microbatch), or None."""
    used = np.flatnonzero(counts)
    if used.size == 0 or counts.sum() > p.microbatches:
        return None
    n = counts[used].astype(float)
    a, c = p.a_s[used], p.c_s[used]
    cap_max = np.minimum(p.max_microbatches[used], p.microbatches).astype(float)
    if float(n @ cap_max) < p.microbatches:
        return None
    lo = float(np.max(a))  # every copy holds one by then
    return least_time(a, c, cap_max, n, float(p.microbatches), lo, float(np.max(a + (cap_max - 1) * c)))


def _fill(p: AssignProblem, counts: np.ndarray, order: np.ndarray, nonzero: list[list[tuple[int, int]]]) -> np.ndarray:
    """Add copies of the templates in `order` (each as many as fit) while GPUs and the pipeline
    count allow. Plain Python: a handful of classes, hundreds of templates."""
    out = counts.copy()
    left = [int(v) for v in p.avail - out @ p.usage]
    room_copies = min(p.replicas[1], p.microbatches) - int(out.sum())
    gpus_left = sum(left)
    for i in order.tolist():
        if room_copies <= 0 or gpus_left <= 0:  # every template uses some GPU
            break
        use = nonzero[i]
        room = min((left[k] // u for k, u in use), default=0)
        take = min(room, room_copies)
        if take > 0:
            out[i] += take
            room_copies -= take
            for k, u in use:
                left[k] -= take * u
                gpus_left -= take * u
    return out


DIVE_MAX_COPIES = 4  # LP diving (`_dive`) only where a plan has at most this many pipelines


def _dive(p: AssignProblem, lp: _CapacityLP, group_caps: np.ndarray, rep: np.ndarray) -> np.ndarray | None:
    """LP diving: commit one copy of the template the LP uses most, re-solve the LP for the GPUs,
    pipelines and microbatches left, until the copies hold all M microbatches (None if the LP
    runs short first). With a few pipelines, rounding the LP's copies down loses a whole
    pipeline's worth of GPUs; diving re-plans what is left after each choice."""
    counts = np.zeros(len(p.a_s), dtype=np.int64)
    left = p.avail.astype(float).copy()
    copies_left = min(p.replicas[1], p.microbatches)
    need = float(p.microbatches)
    rows = lp.rows()
    while need > 1e-9:
        if copies_left <= 0:
            return None
        fits = np.all(lp.usage <= left[None, :], axis=1) & (rep >= 0)
        value, x = SmallLP(rows, np.append(left, float(copies_left))).solve(np.where(fits, group_caps, 0.0))
        lp.stats.ilp_solves += 1
        if value < need * (1 - 1e-12) or not np.any(x > 1e-9):
            return None
        g = int(np.argmax(np.where(fits, x, -1.0)))
        counts[rep[g]] += 1
        left -= lp.usage[g]
        copies_left -= 1
        need -= float(group_caps[g])
    return counts


PAIR_MAX_COPIES = 2  # plans of at most this many pipelines are also found exactly (`_best_pair`)


def _best_pair(p: AssignProblem, lp: _CapacityLP, allowed: np.ndarray, t_lo: float,
               t_hi: float) -> np.ndarray | None:
    """The copies (one or two, `p.replicas` permitting) with the least pipeline time in
    [t_lo, t_hi] among the `allowed` templates, to 1e-9 relative: at a trial time the best
    template of each usage group holds the most microbatches, so a pair of groups that fits the
    GPUs and holds M exists exactly when such copies do. None if none holds M by `t_hi`."""
    lo_r, hi_r = p.replicas[0], min(p.replicas[1], p.microbatches)
    pairs = lp.pairs()

    def pick(t: float) -> np.ndarray | None:
        best, rep = lp.best_per_group(_caps(p, allowed, t).astype(float))
        if lo_r <= 1 <= hi_r:
            one = np.flatnonzero(best >= p.microbatches)
            if one.size:
                counts = np.zeros(len(p.a_s), dtype=np.int64)
                counts[rep[one[0]]] = 1
                return counts
        if lo_r <= 2 <= hi_r and pairs[0].size:
            i, j = pairs
            bi, bj = best[i], best[j]
            ok = np.flatnonzero((bi + bj >= p.microbatches) & (bi > 0) & (bj > 0))
            if ok.size:
                counts = np.zeros(len(p.a_s), dtype=np.int64)
                counts[rep[i[ok[0]]]] += 1
                counts[rep[j[ok[0]]]] += 1
                return counts
        return None

    if pick(t_hi) is None:
        return None
    if pick(t_lo) is not None:
        return pick(t_lo)
    return pick(least_true(lambda t: pick(t) is not None, t_lo, t_hi, 1e-9))


def _plan_at_level(p: AssignProblem, lp: _CapacityLP, allowed: np.ndarray, t_lb: float,
                   rel_tol: float) -> Assignment | None:
    """Integer plans near the LP optimum of the `allowed` templates: at a few pipeline times just
    above the LP bound, the LP's copies rounded down (and up where the GPUs allow), spare GPUs
    filled with the same templates; each scored exactly. The best is dealt out by water-filling."""
    best: tuple[float, np.ndarray] | None = None
    nonzero = lp.nonzero_usage()
    for step in (1e-4, 1e-3, 4e-3, 1.6e-2, 6.4e-2, 0.25):
        t = max(t_lb, 1e-12) * (1 + step)
        caps = _caps(p, allowed, t)
        group_best, rep = lp.best_per_group(caps.astype(float))
        if group_best.sum() == 0:
            continue
        _, x = lp.solve(group_best)
        live = np.flatnonzero((rep >= 0) & (x > 1e-9))
        if live.size == 0:
            continue
        support = rep[live]
        floor = np.zeros(len(caps), dtype=np.int64)
        floor[support] = np.floor(x[live] + 1e-9).astype(np.int64)
        ceil = floor.copy()
        ceil[support] = np.ceil(x[live] - 1e-9).astype(np.int64)
        gpus = np.maximum(p.usage.sum(axis=1), 1)
        others = rep[rep >= 0]  # spare GPUs may also take other templates' copies
        support = support[np.lexsort((support, -caps[support] / gpus[support]))]
        others = others[np.lexsort((others, -caps[others] / gpus[others]))]
        tries = [floor, ceil]
        if min(p.replicas[1], p.microbatches) <= PAIR_MAX_COPIES and step == 1e-4:
            paired = _best_pair(p, lp, allowed, t_lb, t_lb * 1.25)
            if paired is not None:
                tries.append(paired)
        if p.replicas[1] <= DIVE_MAX_COPIES:
            dived = _dive(p, lp, group_best, rep)
            if dived is not None:
                tries.append(dived)
        for counts in tries:
            if np.any(counts @ p.usage > p.avail):
                continue
            counts = _fill(p, _fill(p, counts, support, nonzero), others, nonzero)
            if not (p.replicas[0] <= counts.sum() <= min(p.replicas[1], p.microbatches)):
                continue
            pipe = pipe_time_of(p, counts)
            if pipe is None:
                continue
            obj = pipe + float(np.max(p.e_s[counts > 0]))
            if best is None or obj < best[0] - 1e-15:
                best = (obj, counts)
        if best is not None and best[0] <= (t + float(np.min(p.e_s[allowed]))) * (1 + rel_tol):
            break
    if best is None:
        return None
    counts = best[1]
    pipe = pipe_time_of(p, counts)
    per_t, dealt = deal(p, counts, _caps(p, counts > 0, pipe))
    return Assignment(tuple(counts.tolist()), per_t, dealt, float(np.max(p.e_s[counts > 0])))


def solve_assignment_lp(p: AssignProblem, stats: SolverStats | None = None, rel_tol: float = 1e-3,
                        incumbent_s: float | None = None, deadline: float | None = None,
                        bound_only: bool = False) -> Assignment | None:
    """Best rounded plan and a valid lower bound (`bound_s`) for problem p; None if the LP shows no
    plan exists. With `incumbent_s`, tail levels that cannot beat it are only bounded, and when no
    level can, the result has no copies (`counts` all zero) and only `bound_s` is meaningful."""
    stats = stats or SolverStats()
    if not len(p.e_s):
        return None  # no template: no plan
    usage, of = unique_rows(p.usage)
    lp = _CapacityLP(usage, of, p.avail, min(p.replicas[1], p.microbatches), stats, p.replicas[0])
    loose = _CapacityLP(usage, of, p.avail, min(p.replicas[1], p.microbatches), stats)  # plans only
    levels = distinct(p.e_s)
    fits = joinable(p)
    memo: dict[int, float | None] = {}
    best: Assignment | None = None

    def f(i: int) -> float | None:
        if i not in memo:
            allowed = (p.e_s <= levels[i]) & fits
            # fewer templates need at least the time of any larger level's bound
            floor = max((v for j, v in memo.items() if j > i and v is not None), default=0.0)
            memo[i] = _lp_time(p, lp, allowed, None, rel_tol / 10, floor)
        return memo[i]

    def target() -> float:
        cut = best.objective_s if best is not None else np.inf
        if incumbent_s is not None:
            cut = min(cut, incumbent_s)
        return cut / (1 + rel_tol)

    def try_plan(i: int) -> None:
        nonlocal best
        if bound_only:
            return
        t = f(i)
        if t is None or t + levels[0] >= target():
            return
        allowed = (p.e_s <= levels[i]) & fits
        cands = [_plan_at_level(p, lp, allowed, t, rel_tol)]
        if lp.min_copies > 0:  # the LP without its fewest pipelines rounds near its own optimum, to other plans
            t_loose = _lp_time(p, loose, allowed, None, rel_tol / 10)
            cands.append(None if t_loose is None else _plan_at_level(p, loose, allowed, t_loose, rel_tol))
        for cand in cands:
            if cand is not None and (best is None or cand.objective_s < best.objective_s - 1e-15):
                best = cand

    last = len(levels) - 1
    if f(last) is None:
        return None
    try_plan(last)
    heap = [(f(last) + float(levels[0]), 0, last)]
    bound = heap[0][0]
    while heap:
        bound, i, j = heapq.heappop(heap)
        if bound >= target():
            break
        if i == j or levels[j] - levels[i] <= rel_tol * bound:
            # the least bound left is within rel_tol of every plan in its levels: final
            try_plan(j)
            break
        if deadline is not None and time.perf_counter() > deadline:
            stats.truncated = True
            break
        # split by tail value, not index: depth ~ log2(tail range / (rel_tol·T))
        m = int(np.searchsorted(levels, (levels[i] + levels[j]) / 2, side="right")) - 1
        m = min(max(m, i), j - 1)
        fm = f(m)
        if fm is not None:
            heapq.heappush(heap, (fm + float(levels[i]), i, m))
        heapq.heappush(heap, (f(j) + float(levels[m + 1]), m + 1, j))
    if best is None:
        return Assignment(tuple([0] * len(p.a_s)), tuple(() for _ in p.a_s), np.inf, 0.0, bound)
    return Assignment(best.counts, best.microbatches, best.pipe_s, best.tail_s, min(bound, best.objective_s))
