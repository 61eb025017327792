"""Water-filling: how many microbatches each copy of each template runs.

Every copy starts with one microbatch; each next one goes to the copy whose pipeline time grows
least (a copy of template t holding m microbatches takes A_t + (m - 1)·C_t), ties to the lower
template index, then the lower copy. Done one microbatch at a time with a heap, that is
O(M log R): at 16,384 GPUs (65,536 microbatches, hundreds of copies) 3.6 million heap pops per
plan. `deal` reaches the same answer by selection: it finds the value V of the last increment
taken (bisection over the floats, counting per template), gives every copy all its increments
below V and hands the increments equal to V out in (template, copy) order.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # solvers.assign imports this module
    from solvers.assign import AssignProblem

Dealt = tuple[tuple[tuple[int, ...], ...], float]  # microbatches per copy, per template; max pipeline time


def deal(p: AssignProblem, counts: np.ndarray, caps: np.ndarray) -> Dealt:
    """Microbatches of every copy (`counts[t]` copies of template t, at most `caps[t]` each) and
    the resulting largest pipeline time; the heap's answer (`deal_by_heap`), found by selection."""
    used = np.flatnonzero(counts).tolist()
    n = {t: int(counts[t]) for t in used}
    a = {t: float(p.a_s[t]) for t in used}
    c = {t: float(p.c_s[t]) for t in used}
    top = {t: int(caps[t]) - 1 for t in used}  # increments one copy can take
    left = p.microbatches - sum(n.values())
    if left > 0 and (any(c[t] <= 0 for t in used if top[t] >= 1) or sum(n[t] * max(top[t], 0) for t in used) < left):
        return deal_by_heap(p, counts, caps)  # equal increments within one copy, or no room: the heap's way

    def taken(t: int, v: float) -> int:
        """Increments of one copy of t whose value A + m·C (m >= 1) is at most v."""
        if top[t] < 1 or a[t] + c[t] > v:
            return 0
        m = min(top[t], max(1, int((v - a[t]) // c[t])))
        while m > 1 and a[t] + m * c[t] > v:
            m -= 1
        while m < top[t] and a[t] + (m + 1) * c[t] <= v:
            m += 1
        return m

    below = {t: 0 for t in used}
    bonus = {t: 0 for t in used}
    if left > 0:
        live = [t for t in used if top[t] >= 1]
        lo = min(a[t] + c[t] for t in live)
        hi = max(a[t] + top[t] * c[t] for t in live)
        lo_bits, hi_bits = (int(np.float64(x).view(np.int64)) for x in (lo, hi))  # positive floats: bits ordered

        def enough(bits: int) -> bool:
            v = float(np.int64(bits).view(np.float64))
            return sum(n[t] * taken(t, v) for t in live) >= left

        if not enough(lo_bits):
            while hi_bits - lo_bits > 1:
                mid = (lo_bits + hi_bits) // 2
                if enough(mid):
                    hi_bits = mid
                else:
                    lo_bits = mid
            lo_bits = hi_bits
        value = float(np.int64(lo_bits).view(np.float64))  # the last increment taken
        under = float(np.nextafter(value, -np.inf))
        below = {t: taken(t, under) for t in used}
        ties = left - sum(n[t] * below[t] for t in used)
        for t in used:  # ascending template index, copies in order
            if ties > 0 and taken(t, value) > below[t]:
                bonus[t] = min(n[t], ties)
                ties -= bonus[t]
    per_t: list[tuple[int, ...]] = [()] * len(counts)  # most templates have no copy
    pipe = -np.inf
    for t in used:
        per_t[t] = tuple(1 + below[t] + (1 if r < bonus[t] else 0) for r in range(n[t]))
        pipe = max(pipe, p.a_s[t] + (max(per_t[t]) - 1) * p.c_s[t])
    return tuple(per_t), float(pipe)


def deal_by_heap(p: AssignProblem, counts: np.ndarray, caps: np.ndarray) -> Dealt:
    """The same water-filling one microbatch at a time (the definition `deal` is tested against)."""
    heap: list[tuple[float, int, int]] = []
    mbs: dict[tuple[int, int], int] = {}
    for t in np.flatnonzero(counts):
        for r in range(int(counts[t])):
            mbs[(int(t), r)] = 1
            if caps[t] > 1:
                heapq.heappush(heap, (float(p.a_s[t] + p.c_s[t]), int(t), r))
    left = p.microbatches - len(mbs)
    while left > 0:
        _, t, r = heapq.heappop(heap)
        mbs[(t, r)] += 1
        left -= 1
        m = mbs[(t, r)]
        if m < caps[t]:
            heapq.heappush(heap, (float(p.a_s[t] + m * p.c_s[t]), t, r))
    per_t: list[tuple[int, ...]] = [()] * len(counts)
    for t in np.flatnonzero(counts).tolist():
        per_t[t] = tuple(mbs[(t, r)] for r in range(int(counts[t])))
    pipe = max(p.a_s[t] + (m - 1) * p.c_s[t] for (t, _), m in mbs.items())
    return tuple(per_t), float(pipe)
