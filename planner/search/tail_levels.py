"""Tail-capped levels: tighter bound templates for the skeleton groups a unit's bound leans on.

The bound templates of `BlocksProvider.templates` pair each skeleton's (A, C) frontier with the
least tail any of its splits can have, which is optimistic when the least-tail split is slow. For
the groups that matter (`units.refine_unit` picks them) the frontiers are recomputed under a ladder
of caps on every stage's tail, so each level's points carry a tail close to what they cost.
"""

from __future__ import annotations

import math
import time

import numpy as np

from planner.search.options import pruned_options
from planner.search.space import BlockType, StageShape, skeleton_usage
from planner.search.templates import Template, skeleton_group
from planner.specs.training import TrainingSpec
from solvers.batched_runs import Row, batched_min_max_tails, row_skeleton
from solvers.capped_points import batched_capped_points
from solvers.partition import StageOptions, min_max_tail, tail_capped_frontier
from solvers.uniform_layers import INF, KindCellOptions, full_options, uniform_view

_LATE = object()  # a group whose tail-capped levels the deadline cut short
TAIL_CACHE = 4  # replica classes whose stage tails (and tail-capped levels) a provider keeps


def _finite_levels(e_lo: float, t_max: float, e_cap: float, ratio: float) -> int:
    """How many capped levels e_lo·ratio^k a group gets: up to its largest tail, or `e_cap`."""
    return int(math.log(max(min(e_cap, t_max), e_lo) / e_lo) / math.log(ratio)) + 2


def _cut(entry: tuple, e_cap: float, ratio: float) -> tuple | None:
    """A group's cached levels as computed for `e_cap`: (levels, least tails, points by
    (skeleton, level)), the finite levels past e_cap's dropped and the uncapped level renumbered;
    None when the cache holds fewer levels than `e_cap` needs."""
    levels, least, found, e_lo, t_max = entry
    want, have = _finite_levels(e_lo, t_max, e_cap, ratio), len(levels) - 1
    if want > have:
        return None
    if want == have:
        return levels, least, found
    cut = {(sk, want if j == have else j): pts for (sk, j), pts in found.items() if j < want or j == have}
    return levels[:want] + [INF], least, cut


class TailLevels:
    """The tail-capped levels of `BlocksProvider` (a mixin: it reads the provider's shapes,
    classes, skeleton rows, stage options, uniform views and training spec, and keeps the levels of
    the class it last refined in `_class_levels`, a few classes deep)."""

    shapes: dict[BlockType, list[StageShape]]
    skeletons: list[tuple[BlockType, ...]]
    _class_levels: dict[tuple[int, int], tuple[dict, dict, dict]]
    _groups: dict | None
    rows: dict[tuple[BlockType, ...], list[Row]]
    training: TrainingSpec
    _uniform: dict[BlockType, bool]

    skeleton_group = staticmethod(skeleton_group)

    def level_templates(self, lo: int, hi: int, groups: set[tuple[BlockType, ...]], e_cap: float,
                        ratio: float = 1.5, deadline: float | None = None
                        ) -> tuple[list[Template], set[tuple[BlockType, ...]]]:
        """Tighter bound templates for the skeletons of `groups`, and the
        groups they cover (their `templates` bound templates are then superseded).

        Each group's (A, C) frontiers are recomputed under caps e_0 < e_1 < ... (geometric, ratio
        `ratio`, up to `e_cap`, then no cap) on every stage's tail for this class. A split with
        largest tail E lies under cap e_j for the first e_j >= E, so a point of level j's frontier
        has A and C no larger, while E > e_{j-1}: that point with tail max(E_min, e_{j-1}) (E_min
        the skeleton's least possible largest tail) bounds the split."""
        # keyed by what the tails are costed for: the rounds of one unit's refinement, and the lower
        # part of a split class (same lowest count), reuse the levels. Levels computed for a higher
        # e_cap are cut back to this one's (each level is solved on its own, so the cut equals a
        # fresh computation): the answer never depends on what a worker process solved before.
        key = (lo, hi if self.training.zero else lo)
        if key not in self._class_levels:
            if len(self._class_levels) >= TAIL_CACHE:
                self._class_levels.pop(next(iter(self._class_levels)))
            tails = self._tail_options(*key)
            # memory with ZeRO for the class's most pipelines (every plan of it shards optimizer
            # states over at most that many), not the search's: tighter, and still below each plan
            self._class_levels[key] = (self._with_tails(key[1] if self.training.zero else self._r_lb, tails,
                                                        list(tails)), {}, {})
        with_tails, cache, pruned = self._class_levels[key]
        order = sorted(groups, key=lambda g: tuple((bt.cls, bt.gpus) for bt in g))
        missing = [g for g in order if (g, ratio) not in cache
                   or (cache[(g, ratio)] is not None and _cut(cache[(g, ratio)], e_cap, ratio) is None)]
        if missing:
            found = self._level_frontiers(with_tails, pruned, missing, e_cap, ratio, deadline)
            cache.update({(g, ratio): v for g, v in found.items() if v is not _LATE})
        order = [g for g in order if (g, ratio) in cache]  # a group the deadline cut short stays as it was
        n_cls = len(self.classes)
        out: list[Template] = []
        covered: set[tuple[BlockType, ...]] = set()
        for g in order:
            if cache[(g, ratio)] is None:
                continue
            cut = _cut(cache[(g, ratio)], e_cap, ratio)
            if cut is None:  # the deadline kept a finer computation from replacing a coarser one
                continue
            covered.add(g)
            levels, least, found = cut
            for (sk, j), points in found.items():
                e_min = least.get(sk)
                if e_min is None:
                    continue
                e = e_min if j == 0 else max(e_min, levels[j - 1])
                out.extend(Template(skeleton_usage(sk, n_cls), a, c, e, None, (), sk) for a, c in points)
        return out, covered

    def _level_frontiers(self, with_tails: dict[BlockType, StageOptions | KindCellOptions],
                         pruned: dict[BlockType, StageOptions | KindCellOptions],
                         groups: list[tuple[BlockType, ...]], e_cap: float, ratio: float,
                         deadline: float | None = None) -> dict[tuple[BlockType, ...], object]:
        """Per group, (levels, least tail per skeleton, {(skeleton, level): [(A, C), ...]}, lowest
        level, largest tail) (see `_cut`), or None
        when no skeleton of it has a split; groups of identical layers in one batched sweep, the
        others (e.g. measured, position-dependent layers) skeleton by skeleton with the general DP,
        until `deadline` (groups it cuts short are `_LATE`: not covered, not cached)."""
        bts = list(dict.fromkeys(bt for g in groups for bt in g))
        new = [bt for bt in bts if bt not in pruned]  # `pruned`: this class's options so far, kept
        pruned.update(pruned_options({bt: with_tails[bt] for bt in new}, {bt: self.shapes[bt] for bt in new},
                                     use_tail=True, uniform=self._uniform)[0])
        opts = {bt: pruned[bt] for bt in bts}
        views = {bt: uniform_view(o, trusted=True) if self._uniform.get(bt) else None for bt, o in opts.items()}
        uniform = [g for g in groups if all(views[bt] is not None for bt in g)]
        least_all = self._least_tails(with_tails, set(uniform)) if uniform else {}
        members = self._group_skeletons()
        out: dict[tuple[BlockType, ...], tuple | None] = {}
        rows: list[tuple] = []
        ecaps: list[float] = []
        where: list[tuple[tuple[BlockType, ...], tuple[BlockType, ...], int]] = []  # (group, skeleton, level)
        for g in groups:
            general = g not in uniform
            if general:
                least = {sk: min_max_tail([full_options(with_tails[bt]) for bt in sk]) for sk in members.get(g, [])}
            else:
                least = {sk: t for sk, t in least_all.items() if self.skeleton_group(sk) == g}
            if not any(t is not None for t in least.values()):
                out[g] = None
                continue
            e_lo = max(min(t for t in least.values() if t is not None), 1e-9)
            t_max = max(float(np.max(opts[bt].tail[np.isfinite(opts[bt].fb)], initial=0.0)) for bt in g)
            levels = [e_lo * ratio ** k for k in range(_finite_levels(e_lo, t_max, e_cap, ratio))]
            levels.append(INF)
            out[g] = (levels, least, {}, e_lo, t_max)
            if general:
                for sk in members.get(g, []):
                    if deadline is not None and time.perf_counter() > deadline:
                        out[g] = _LATE
                        break
                    positions = [full_options(opts[bt]) for bt in sk]
                    for j, e in enumerate(levels):
                        points = [(sp.a_s, sp.c_s) for sp in tail_capped_frontier(positions, e)]
                        if points:
                            out[g][2][(sk, j)] = points
                continue
            for row in self.rows.get(g, []):
                for j, e in enumerate(levels):
                    rows.append(row)
                    ecaps.append(e)
                    where.append((g, row_skeleton(row), j))
        live = {bt: v for bt, v in views.items() if v is not None}
        for i, points in batched_capped_points(live, rows, ecaps, self._horizon()).items() if rows else ():
            g, sk, j = where[i]
            out[g][2][(sk, j)] = points
        return out

    def _group_skeletons(self) -> dict[tuple[BlockType, ...], list[tuple[BlockType, ...]]]:
        """The skeletons of each group (`skeleton_group`), computed once."""
        if self._groups is None:
            self._groups = {}
            for sk in self.skeletons:
                self._groups.setdefault(self.skeleton_group(sk), []).append(sk)
        return self._groups

    def _least_tails(self, opts: dict[BlockType, StageOptions | KindCellOptions],
                     groups: set[tuple[BlockType, ...]] | None = None) -> dict[tuple[BlockType, ...], float | None]:
        """Least possible largest stage tail of every uniform skeleton (of `groups`, default all):
        one batched sweep (`batched_min_max_tails`); other skeletons are filled in on demand by `_lb_tails`."""
        wanted = None if groups is None else {bt for g in groups for bt in g}
        views = {bt: self._tail_view(bt, o.tail) for bt, o in opts.items() if wanted is None or bt in wanted}
        views = {bt: v for bt, v in views.items() if v is not None}
        rows = [row for g, group_rows in self.rows.items() if all(bt in views for bt in g)
                and (groups is None or g in groups) for row in group_rows]
        return {row_skeleton(row): t for row, t in batched_min_max_tails(views, rows).items()}
