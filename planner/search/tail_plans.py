"""Plan templates whose stage options respect caps on the stage tails.

A blocks provider's plan templates take, per stage, the option with the least F+B and cost the tail
afterwards. A stage-dp option with a slow gradient sync can then shadow a tensor-parallel option
with a slightly larger F+B and no sync. On small batches and small models the sync is a large part
of the step: 4 A10 + 2 T4, OPT-350M, global batch 8 gave 0.3058 s (tp 2, dp 2) where tp 4 runs
0.2910 s. Here the options are restricted to those whose tail, costed for the unit's pipeline count,
is at most e, for caps e geometric from the least tail to the largest. Each cap gives real splits
with recovered options: more templates for the plan LP. The bound does not change.

Only the rows near those the unit's LPs use are recomputed (`nearby_rows`): a cap changes which
option a stage takes, and with it, at most, a run's stage count by one.
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

from planner.search.options import pruned_options
from planner.search.space import BlockType, skeleton_usage
from planner.search.templates import Template, TemplateStage, pareto_indices
from planner.specs.training import TrainingSpec
from solvers.batched_runs import Row, batched_min_max_tails, row_skeleton, skeleton_row
from solvers.distinct import distinct
from solvers.frontier_table import batched_frontier_table
from solvers.uniform_layers import INF, Kind, UniformView, uniform_view

LEVEL_RATIO = 1.15  # a plan's largest tail v has a cap within [v, LEVEL_RATIO·v] (`_levels`)


def _capped(view: UniformView, cap: float) -> UniformView:
    """The view with every option whose tail exceeds `cap` ruled out (F+B +inf)."""
    kinds = [Kind(np.where(k.tail <= cap, k.fb, INF), k.tail, k.mem_fixed, k.act)
             for k in (view.first, view.mid, view.last, view.whole)]
    return UniformView(view.n, *kinds, view.capacity)


def _levels(views: list[UniformView], ratio: float, lo: float | None = None, hi: float | None = None) -> list[float]:
    """Caps from `hi` (default: the largest tail of a usable option; the top cap is `hi` itself)
    down to `lo` (default: the least such tail), ascending. Below the top, every cap is the tail of
    a usable option, the largest one under the previous cap / `ratio`, so every option tail v in
    [lo, hi] has a cap in [v, ratio·v]: a split whose largest tail is v is dominated in (A, C) by a
    split under that cap, whose tail is at most ratio·v. Caps at option tails (rather than a
    geometric grid) skip the ranges no option's tail falls in."""
    tails = np.concatenate([k.tail[np.isfinite(k.fb)].ravel() for v in views
                            for k in (v.first, v.mid, v.last, v.whole)])
    tails = tails[np.isfinite(tails)]
    if not tails.size:
        return []
    lo = float(np.min(tails)) if lo is None else lo
    hi = float(np.max(tails)) if hi is None else min(hi, float(np.max(tails)))
    if hi <= lo or lo <= 0:
        return [max(hi, lo)]
    values = distinct(tails[(tails >= lo) & (tails <= hi)])
    caps = [hi]
    while True:
        below = values[values < caps[-1] / ratio]
        if not below.size:
            return caps[::-1]
        caps.append(float(below[-1]))


def nearby_rows(skeletons: set[tuple[BlockType, ...]]) -> set[Row]:
    """The rows (`batched_runs.skeleton_row`) of `skeletons`, their runs in every order (A -> B
    beside B -> A: the LP may lean on either), and each of those with one run one stage longer or
    shorter (a tail cap moves a stage to another option, and the best split may then take one
    stage more or fewer; `chain_check.py --seed 35` pool 0 lost 0.011 % without them while the
    assignment LP still rounded plans at every tail level). Rows
    outside a provider's coverage are dropped by `tail_plan_templates`."""
    out: set[Row] = set()
    for sk in skeletons:
        row = skeleton_row(sk)
        runs = [row[k:k + 2] for k in range(0, len(row), 2)]
        for order in permutations(runs):
            base = tuple(x for run in order for x in run)
            out.add(base)
            for k in range(1, len(base), 2):
                out.update(base[:k] + (base[k] + step,) + base[k + 1:] for step in (-1, 1) if base[k] + step >= 1)
    return out


class TailPlans:
    """The tail-capped plan templates of `BlocksProvider` (a mixin, like `TailLevels`: it reads the
    provider's shapes, classes, skeleton rows, stage options, uniform flags and training spec)."""

    shapes: dict
    classes: list
    rows: dict
    training: TrainingSpec
    _uniform: dict[BlockType, bool]

    def tail_plan_templates(self, replicas: int, rows: set[Row],
                            ratio: float = LEVEL_RATIO, e_cap: float = INF) -> list[Template]:
        """Plan templates (stages filled in) of the skeletons of `rows` that are in this provider's
        coverage (identical decoder layers only) with every stage's tail, costed for `replicas`
        pipelines, under each cap of `_levels`: from the least largest tail any of their splits can
        have (lower caps leave no split) up to `e_cap` (a plan with a larger tail cannot beat the
        best so far)."""
        # memory as for the plan templates, but with ZeRO the optimizer states of every plan here
        # are sharded over at least `replicas` pipelines: stages that fit only so (five single
        # RTX-4090 stages of Llama-2 7B beside a second pipeline) become plans
        r_mem = replicas if self.training.zero else 1
        groups = {row[0::2] for row in rows} & set(self.rows)
        for bt in {bt for g in groups for bt in g} - set(self._uniform):
            self._uniform[bt] = self._costings()[bt].uniform  # as the frontiers would find
        groups = {g for g in groups if all(self._uniform[bt] for bt in g)}
        if not groups:
            return []
        bts = sorted({bt for g in groups for bt in g})
        with_tails = self._with_tails(r_mem, self._tail_options(replicas, replicas), bts)
        opts, _, keep = pruned_options(with_tails, {bt: self.shapes[bt] for bt in bts}, use_tail=True,
                                       uniform=self._uniform)
        views = {bt: uniform_view(opts[bt], trusted=True) for bt in bts}
        plain = [row for g in sorted(groups) for row in self.rows[g] if row in rows]
        if not plain:
            return []
        least = [t for t in batched_min_max_tails(views, plain).values() if t is not None]
        if not least or min(least) > e_cap:
            return []
        levels = _levels(list(views.values()), ratio, lo=min(least), hi=e_cap)
        capped = {(bt, j): _capped(views[bt], e) for bt in bts for j, e in enumerate(levels)}
        rows = [tuple(x for k in range(0, len(row), 2) for x in ((row[k], j), row[k + 1]))
                for row in plain for j in range(len(levels))]
        table = batched_frontier_table(capped, rows)
        n_cls = len(self.classes)
        skeletons = [tuple(bt for bt, _ in row_skeleton(row)) for row in table.rows]
        of = np.repeat(np.arange(len(skeletons)), table.counts).tolist()
        usages = [skeleton_usage(sk, n_cls) for sk in skeletons]
        a, c, e = table.a.tolist(), table.c.tolist(), table.e.tolist()
        # pruned as `prune_templates` would (same keys and order), stages built for the kept only
        out = []
        for q in pareto_indices([usages[k] for k in of], a, c, e):
            lo, hi = int(table.start[q]), int(table.start[q + 1])
            stages = tuple(TemplateStage(bt.cls, self.shapes[bt][keep[bt][o]], first, last)
                           for bt, o, first, last in zip(skeletons[of[q]], table.option[lo:hi].tolist(),
                                                         table.first[lo:hi].tolist(), table.last[lo:hi].tolist()))
            out.append(Template(usages[of[q]], a[q], c[q], e[q], None, stages))
        return out
