"""Whole pipeline copies instead of the LP's fractional ones, where few pipelines make the
difference: with at most a handful of copies the LP relaxation of "which templates, how many
copies" can sit far above any plan (`assign_lp._lp_time` asks this only where the LP holds the
batch)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

INTEGRAL_COPIES = 4  # bounds with at most this many pipelines take the integer optimum
INTEGRAL_GROUPS = 64  # ... three or four only with at most this many usage groups holding a microbatch
INTEGRAL_NODES = 200  # ... and when the search takes at most this many steps (else the LP's answer stands)


class _TooLong(Exception):
    """`whole_copies` ran past `INTEGRAL_NODES`."""


def whole_copies(usage: np.ndarray, avail: np.ndarray, max_copies: int,
                 pairs: Callable[[], tuple[np.ndarray, np.ndarray]], group_caps: np.ndarray,
                 need: float, min_copies: int = 0) -> tuple[float, np.ndarray] | None:
    """Copies of usage groups (rows of `usage`, groups may repeat, at least `min_copies` and at
    most `max_copies`) that fit `avail` and hold at least `need` microbatches (`group_caps` per copy
    of each group), with their total and counts per group, or, if none do, the most any such copies
    hold (below `need`; 0 where no `min_copies` copies fit). On random pools
    of 10 and 20 GPUs (`benchmarks/chain_check.py --seed 24`, pools 3 and 7) the lowest bounds were
    of two- to four-pipeline units refined as far as tails go, and the gaps stayed at 2.9 and 3.1 %.

    At most two copies: every single copy and fitting pair at once (`pairs`: the groups that fit
    together). Three or four (`INTEGRAL_COPIES`): depth-first over groups by capacity, cut where
    the copies left at the largest capacity that fits, or the free GPUs at the best capacity per
    GPU, cannot reach `need`; only with at most `INTEGRAL_GROUPS` groups holding a microbatch and
    `INTEGRAL_NODES` steps (the ladder's 32- and 64-GPU pools, 100-360 groups of about equal
    capacity, took thousands per call). None where it does not run."""
    counts = np.zeros(len(group_caps))
    live = np.flatnonzero(group_caps > 0)
    if not live.size:
        return 0.0, counts
    if max_copies <= 2:
        alone = np.where(np.all(usage <= avail, axis=1), group_caps, 0.0)
        one = int(np.argmax(alone))
        value, pick = (float(alone[one]), [one]) if min_copies <= 1 else (0.0, [])
        i, j = pairs()
        if max_copies == 2 and i.size:
            both = group_caps[i] + group_caps[j]
            k = int(np.argmax(both))
            if both[k] > value:
                value, pick = float(both[k]), [int(i[k]), int(j[k])]
        for g in pick:
            counts[g] += 1
        return value, counts
    if max_copies > INTEGRAL_COPIES or live.size > INTEGRAL_GROUPS:
        return None
    order = live[np.lexsort((live, -group_caps[live]))]  # by capacity, then group
    caps, use = group_caps[order], usage[order]
    per_gpu = caps / np.maximum(use.sum(axis=1), 1)
    best: list = [0.0, ()]
    nodes = [0]

    def dfs(start: int, left: int, free: np.ndarray, value: float, pick: tuple[int, ...]) -> bool:
        nodes[0] += 1
        if nodes[0] > INTEGRAL_NODES:
            raise _TooLong
        if value > best[0] and len(pick) >= min_copies:
            best[0], best[1] = value, pick
        if value >= need and len(pick) >= min_copies:
            return True
        if not left:
            return False
        fits = start + np.flatnonzero(np.all(use[start:] <= free, axis=1))
        if not fits.size or value + min(left * caps[fits[0]], per_gpu[fits].max() * free.sum()) < need:
            return False
        for k in fits.tolist():
            if value + left * caps[k] < need:
                return False  # capacities only fall from here
            if dfs(k, left - 1, free - use[k], value + caps[k], pick + (k,)):
                return True
        return False

    try:
        dfs(0, max_copies, avail.astype(np.int64), 0.0, ())
    except _TooLong:
        return None
    for k in best[1]:
        counts[int(order[k])] += 1
    return float(best[0]), counts
