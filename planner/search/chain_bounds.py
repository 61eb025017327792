"""Lower bounds that order the FlagScale chain queue (`flagscale_grid.best_flagscale_plan`).

A chain is a run of meshes (`MeshWidth`, stage count) on one pipeline template; its step is
A + (m - 1)·C + E plus the fixed overhead, over every layer split. Each bound here is at most that
for every split of the chains it stands for, from cheapest to tightest: the fluid bottleneck of
every run combination at once (`fluid_bounds`), whole decoder layers per stage with memory caps and
receives (`integral_bound`), the least largest tail any split can have (`least_largest_tail`, added
to the former), and per run order a few tail-capped levels of its frontier (`tail_levels_bound`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from planner.search.space import StageShape
from solvers.capped_points import batched_capped_points
from solvers.distinct import distinct
from solvers.partition import StageOptions
from solvers.uniform_layers import KindCellOptions, UniformView, kind_cells

TAIL_LEVELS = 12  # tail caps of the bound that decides whether an order needs its (A, C, E) frontier


@dataclass(frozen=True, eq=False)
class MeshWidth:
    """Stages of one width on one class within a group, with what the lower bounds need."""

    cls: int
    width: int  # GPUs per stage per replica
    shapes: tuple[StageShape, ...]
    dec_s: float  # least F+B of any decoder layer over the shapes (no receives)
    recv_s: float  # least receive time over the shapes
    kmax: int  # most decoder layers one stage can hold (one microbatch in flight)


def fluid_bounds(choices: list[list[tuple[MeshWidth | None, int]]], n_dec: int, m: int,
                 overhead_s: float) -> np.ndarray:
    """Step-time lower bound of every run combination (fluid bottleneck); inf = impossible.

    `integral_bound` without whole layers or per-stage caps, for every combination at once: the
    bottleneck C is at least every stage's one layer plus receive and the fluid C at which the
    meshes hold every layer, A at least each stage's one layer, the other layers at the least d,
    and the receives. So it is at most `integral_bound` (scaled by 1 - 1e-9 against rounding),
    and the chain queue, which refines these in order, pops the same entries in the same order
    as with a looser bound, after fewer refinements (`many_types.py --seed 24` pool 14, 96 GPUs
    of seven types: 218,522 calls of `integral_bound` with the bound without receives)."""
    k = len(choices)
    shape = tuple(len(c) for c in choices)

    def spread(ci: int, values: np.ndarray) -> np.ndarray:  # class ci's values along its own axis
        view = [1] * k
        view[ci] = -1
        return values.reshape(view)
    return _fluid([_class_columns(row) for row in choices], spread, shape, n_dec, m, overhead_s)


def fluid_bounds_below(choices: list[list[tuple[MeshWidth | None, int]]], n_dec: int, m: int,
                       overhead_s: float, cutoff_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The run combinations whose `fluid_bounds` is finite and below `cutoff_s` (flat indices into
    its array, ascending) and those bounds, the same numbers. A combination's bound is at least m
    times its fluid C, which is at least its layers over its speed sum(p / d): only the speed is
    summed over every combination, the rest only where that leaves the bound below the cutoff (on
    the 64-GPU ladder pool, against its first plan, 10 % of the combinations of the groups bounded,
    whose `fluid_bounds` over all of them had been a fifth of the chains' search)."""
    if not math.isfinite(cutoff_s):
        lb = fluid_bounds(choices, n_dec, m, overhead_s).ravel()
        keep = np.flatnonzero(np.isfinite(lb) & (lb < cutoff_s))
        return keep, lb[keep]
    cols = [_class_columns(row) for row in choices]
    shape = tuple(len(c) for c in choices)
    speed = np.zeros(shape)
    for ci, col in enumerate(cols):
        view = [1] * len(cols)
        view[ci] = -1
        np.add(speed, col[0].reshape(view), out=speed)
    with np.errstate(divide="ignore"):
        # `_fluid`'s bound with C at the fluid one without receives and A at C, less 1e-12 for
        # the order of its rounding; inf where the speed is 0
        floor = (m * (n_dec / (1 + 1e-12) / speed.ravel()) * (1 - 1e-9) + overhead_s) * (1 - 1e-9) * (1 - 1e-12)
    live = np.flatnonzero(floor < cutoff_s)
    picks = np.unravel_index(live, shape)
    lb = _fluid(cols, lambda ci, values: values[picks[ci]], (len(live),), n_dec, m, overhead_s)
    ok = np.isfinite(lb) & (lb < cutoff_s)
    return live[ok], lb[ok]


def _class_columns(row: list[tuple[MeshWidth | None, int]]) -> tuple[np.ndarray, ...]:
    """Per choice of one class: p / d, p·r / d, p, p·d, p·kmax, d + r, d and r (the last three
    0, inf and inf for "unused")."""
    p = np.array([c[1] for c in row], dtype=float)
    d = np.array([c[0].dec_s if c[0] else 0.0 for c in row])
    r = np.array([c[0].recv_s if c[0] else 0.0 for c in row])
    km = np.array([c[0].kmax if c[0] else 0 for c in row], dtype=float)
    used = p > 0
    safe_d = np.where(used, d, 1.0)
    return (np.where(used, p / safe_d, 0.0), np.where(used, p * r / safe_d, 0.0), p, p * d, p * km,
            np.where(used, d + r, 0.0), np.where(used, d, math.inf), np.where(used, r, math.inf))


def _fluid(cols: list[tuple[np.ndarray, ...]], place, shape: tuple[int, ...], n_dec: int, m: int,
           overhead_s: float) -> np.ndarray:
    """`fluid_bounds`' numbers over `shape`, each class's columns (`_class_columns`) laid onto it
    by `place(class, values)` (broadcast along the class's axis, or gathered per combination)."""
    speed, per_recv, stages, a_s, cap = (np.zeros(shape) for _ in range(5))  # per_recv: sum of p·r/d
    least_c = np.zeros(shape)  # max d + r over the meshes used (where one stage only: its d, below)
    dmin, rmin = np.full(shape, math.inf), np.full(shape, math.inf)
    for ci, (sp, pr, p, pd, pk, dr, d, r) in enumerate(cols):  # in place: these arrays span every combination
        np.add(speed, place(ci, sp), out=speed)
        np.add(per_recv, place(ci, pr), out=per_recv)
        np.add(stages, place(ci, p), out=stages)
        np.add(a_s, place(ci, pd), out=a_s)
        np.add(cap, place(ci, pk), out=cap)
        np.maximum(least_c, place(ci, dr), out=least_c)
        np.minimum(dmin, place(ci, d), out=dmin)
        np.minimum(rmin, place(ci, r), out=rmin)
    ok = (stages >= 1) & (stages <= n_dec) & (cap >= n_dec) & (speed > 0)
    on = stages > 1  # every stage of a multi-stage pipeline receives at least once
    with np.errstate(divide="ignore", invalid="ignore"):
        fluid_c = (n_dec / (1 + 1e-12) + np.where(on, per_recv, 0.0)) / speed
        c = np.maximum(np.where(on, least_c, a_s), fluid_c * (1 - 1e-9))  # one stage: a_s is its d
        floor_a = a_s + (n_dec - stages) * dmin + np.where(on, 2 * (stages - 1) * rmin, 0.0)
        return np.where(ok, (np.maximum(floor_a, c) + (m - 1) * c + overhead_s) * (1 - 1e-9), math.inf)


def group_fluid_bound(choices: list[list[tuple[MeshWidth | None, int]]], n_dec: int, m: int,
                      overhead_s: float) -> float:
    """A bound at most `fluid_bounds` of every combination of `choices`, from one number: a
    combination's C is at least its fluid C, the layers over its speed sum(p / d), which is at
    most the sum over classes of each class's fastest choice; its step at least m·C plus the
    overhead (scaled as `fluid_bounds` scales). The chain queue drops a group whose bound reaches
    the cutoff without bounding its combinations one by one (on the 64-GPU ladder pool most of
    its groups; `fluid_bounds` over all of them had been a fifth of the chains' search)."""
    speed = sum(max((p / w.dec_s for w, p in row if w is not None and p > 0), default=0.0) for row in choices)
    return speed_bound(speed, n_dec, m, overhead_s)


def speed_bound(speed: float, n_dec: int, m: int, overhead_s: float) -> float:
    """`group_fluid_bound` of choices whose speeds sum(p / d), each class's fastest, add up to at
    most `speed` (non-increasing in it: a speed at least theirs gives a bound at most theirs)."""
    if speed <= 0:
        return math.inf
    fluid_c = n_dec / (1 + 1e-12) / speed * (1 - 1e-9)
    return (m * fluid_c + overhead_s) * (1 - 1e-9) * (1 - 1e-12)


def integral_bound(meshes: list[tuple[MeshWidth, int]], n_dec: int, m: int, overhead_s: float) -> float:
    """Lower bound with whole decoder layers per stage, per-stage memory caps and receives.

    A split whose bottleneck is C has, on every stage of mesh w, k <= min(kmax, (C - r)/d) decoder
    layers (d, r: the mesh's least decoder and receive time; r counted once where there are several
    stages). For each candidate bottleneck c = k·d + r of some mesh at or above the least feasible
    one, the least A that places every layer under those caps (at least one per stage, the rest on
    the meshes of least d first) plus (m - 1)·c bounds every split whose bottleneck is at least c;
    the least over c bounds them all. The scan stops once (m - 1)·c alone passes the best. The
    chain queue makes tens of thousands of calls on pools of many types (`many_types.py --seed 13`
    pool 11: 23,937), so each mesh's numbers are read once and each candidate's caps computed once."""
    stages = sum(p for _, p in meshes)
    if stages > n_dec or sum(w.kmax * p for w, p in meshes) < n_dec:
        return math.inf
    on = 1.0 if stages > 1 else 0.0  # every stage of a multi-stage pipeline receives at least once
    rows = [(p, w.kmax, on * w.recv_s, w.dec_s) for w, p in meshes]  # r counted where stages receive
    least_c = max(d + r for _, _, r, d in rows)  # every stage holds a layer
    # no C below the fluid one holds every layer (a mesh holds at most p·(C - r)/d of them): the
    # candidates are walked up from there, merged from each mesh's k·d + r (building and sorting
    # every one was most of a call)
    fluid = (n_dec / (1 + 1e-12) + sum(p * r / d for p, _, r, d in rows)) / sum(p / d for p, _, _, d in rows)
    lowest = max(least_c, fluid * (1 - 1e-9))

    def multiples(km: int, r: float, d: float) -> Iterator[float]:
        k0 = max(1, math.floor((lowest - r) / d) - 1)  # one step down against rounding
        return (k * d + r for k in range(k0, km + 1))

    cands = (c for c, _ in itertools.groupby(heapq.merge(*(multiples(km, r, d) for _, km, r, d in rows)))
             if c >= least_c)
    recvs = 2 * (stages - 1) * min(w.recv_s for w, _ in meshes)
    by_speed = [rows[i] for i in sorted(range(len(rows)), key=lambda i: rows[i][3])]
    floor_a = sum(p * d for p, _, _, d in rows) + (n_dec - stages) * by_speed[0][3] + recvs
    best = math.inf
    held = False  # caps only grow with c: once every layer fits, it fits at every later c
    for c_s in cands:
        if not held:
            held = sum(p * min(km, max(0, math.floor((c_s - r) / d * (1 + 1e-12)))) for p, km, r, d in rows) >= n_dec
            if not held:
                continue  # below the least bottleneck that holds them all
        if max(floor_a, c_s) + (m - 1) * c_s >= best:
            break
        left, a_s = n_dec - stages, recvs
        for p, km, r, d in by_speed:  # one layer per stage, then the rest on the fastest meshes first
            extra = min(left, p * min(km, max(0, math.floor((c_s - r) / d * (1 + 1e-12)))) - p)
            a_s += (p + extra) * d
            left -= extra
        best = min(best, max(a_s, c_s) + (m - 1) * c_s)
    return best + overhead_s


def tail_levels_bound(views: dict[int, UniformView | None], order: tuple[tuple[MeshWidth, int], ...], m: int,
                      e_lo: float, e_hi: float) -> float:
    """A lower bound on the run order's least A + (m - 1)·C + E (`views` by id of each width),
    between the level-1 bound and the exact (A, C, E) frontier, for a fraction of the latter's
    cost. With P(e) the least A + (m - 1)·C of splits whose tails are all <= e, from one batched
    sweep over `TAIL_LEVELS` caps e_1 < ... < e_K = e_hi spread over (e_lo, e_hi] (e_lo: the least
    largest tail of any split; e_hi: the largest tail on the (A, C) frontier, so P(e_hi) is the least
    A + (m - 1)·C of all), a split whose largest tail lies in (e_(j-1), e_j] costs at least
    P(e_j) + e_(j-1), and one above e_K at least P(e_K) + e_K (each stage holding at most m
    microbatches). -inf where the batched sweep does not apply (a view is not uniform)."""
    if any(views.get(id(w)) is None for w, _ in order) or not e_hi > e_lo:
        return -math.inf
    caps = [float(e) for e in np.linspace(e_lo, e_hi, TAIL_LEVELS + 1)[1:]]
    row = tuple(x for w, p in order for x in (id(w), p))
    points = batched_capped_points({id(w): views[id(w)] for w, _ in order}, [row] * len(caps), caps, max_flight=m)
    least = [min((a + (m - 1) * c for a, c in points.get(j, [])), default=math.inf) for j in range(len(caps))]
    return min(min(p + e for p, e in zip(least, [e_lo] + caps[:-1])), least[-1] + caps[-1])


def tails_by_length(opts: StageOptions | KindCellOptions) -> np.ndarray:
    """Per layer count k, the least tail of a stage holding k consecutive layers (any option,
    memory for one microbatch in flight); inf where no such stage exists. On kind cells (identical
    layers) every range of k layers is one of them in every field."""
    ok = np.isfinite(opts.fb) & (opts.mem_fixed + opts.act <= opts.capacity)
    least = np.where(ok, opts.tail, math.inf).min(axis=0)  # (first, end), or per kind cell
    n = opts.num_layers
    if isinstance(opts, KindCellOptions):
        first, end = kind_cells(n)
        out = np.full(n + 1, math.inf)
        np.minimum.at(out, end - first, least)
        return out
    return np.array([math.inf] + [float(np.diagonal(least, offset=k).min()) for k in range(1, n + 1)])


def least_largest_tail(meshes: list[tuple[np.ndarray, int]]) -> float:
    """The least E such that stages whose tails are all <= E can hold every layer: with t_w(k) the
    least tail of a stage of mesh w holding k layers (`tails_by_length`), its p stages hold at most
    p * max{k : t_w(k) <= E}. Every split's largest tail is at least this E (inf: none fits).
    Every candidate E at once: max{k : t_w(k) <= E} is where E falls in t_w's suffix minima."""
    layers = len(meshes[0][0]) - 1
    cands = distinct(np.concatenate([t[np.isfinite(t)] for t, _ in meshes]))
    if not len(cands):
        return math.inf
    held = np.zeros(len(cands))
    for t, p in meshes:
        suffix = np.minimum.accumulate(t[::-1])[::-1]  # non-decreasing in k
        held = held + p * np.maximum(0, np.searchsorted(suffix, cands, side="right") - 1)
    fits = np.flatnonzero(held >= layers)
    return float(cands[fits[0]]) if len(fits) else math.inf
