"""Template providers: what pipelines the assignment problem may choose from, for one microbatch size
and one replica class [lo, hi], as two sets: templates to build plans from, and optimistic templates
whose assignment optimum is a lower bound for every plan of the covered space.

* `ExactProvider`: every ordered sequence of stage groups, the full (A, C, E) frontier of each,
  memory variants for pipelines run with fewer microbatches than stages. Costed per replica class,
  so with lo == hi both sets coincide and the search is exact.
* `BlocksProvider` (large pools): pipelines of at most two runs of identical groups of different GPU
  classes; the (A, C) frontier is computed once per microbatch size (it does not depend on the
  replica count) and each template's tail is re-costed per class. The bound uses, per skeleton, the
  least tail any split can have, so it holds for every plan of that space; memory assumes each
  pipeline runs at least as many microbatches as it has stages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from planner.costmodel.base import CostModel
from planner.search.options import OptionContext, build_options
from planner.search.space import BlockType, ResourceClass, StageShape
from planner.search.templates import (Template, TemplateStage, block_skeletons, exact_skeletons,
                                      prune_templates, skeleton_templates)
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.partition import (StageOptions, min_max_tail, split_frontier, subset_options,
                               undominated_options)


@dataclass
class ProviderStats:
    skeletons: int = 0
    templates: int = 0
    pruned: int = 0


def _usage(skeleton: tuple[BlockType, ...], num_classes: int) -> tuple[int, ...]:
    usage = [0] * num_classes
    for bt in skeleton:
        usage[bt.cls] += bt.gpus
    return tuple(usage)


def _pruned(opts: dict[BlockType, StageOptions], shapes: dict[BlockType, list[StageShape]],
            use_tail: bool) -> tuple[dict[BlockType, StageOptions], dict[BlockType, list[StageShape]],
                                     dict[BlockType, list[int]]]:
    out_o, out_s, out_k = {}, {}, {}
    for bt, o in opts.items():
        keep = undominated_options(o, use_tail)
        out_o[bt] = subset_options(o, keep)
        out_s[bt] = [shapes[bt][k] for k in keep]
        out_k[bt] = keep
    return out_o, out_s, out_k


class ExactProvider:
    coverage = "exact"

    def __init__(self, cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
                 shapes: dict[BlockType, list[StageShape]], avail: tuple[int, ...], micro_batch: int,
                 single_node: bool) -> None:
        self.cost, self.model, self.training, self.classes = cost, model, training, classes
        self.shapes, self.micro_batch, self.single_node = shapes, micro_batch, single_node
        self.skeletons = exact_skeletons(list(shapes), avail, model.num_layer_slots)
        self.stats = ProviderStats()

    def _set(self, r_sync: int, r_mem: int) -> list[Template]:
        ctx = OptionContext(self.model, self.training, self.micro_batch, r_sync, r_mem, self.single_node)
        opts = {bt: build_options(self.cost, self.classes[bt.cls], shp, ctx) for bt, shp in self.shapes.items()}
        opts, shapes, _ = _pruned(opts, self.shapes, use_tail=True)
        found = [t for sk in self.skeletons for t in skeleton_templates(sk, opts, shapes, len(self.classes))]
        kept = prune_templates(found)
        self.stats.skeletons += len(self.skeletons)
        self.stats.templates += len(found)
        self.stats.pruned += len(found) - len(kept)
        return kept

    def templates(self, lo: int, hi: int) -> tuple[list[Template], list[Template]]:
        plan_set = self._set(lo, lo)
        if lo == hi or self.training.zero == 0:
            return plan_set, plan_set
        return plan_set, self._set(lo, hi)


@dataclass(frozen=True)
class _Proto:
    skeleton: tuple[BlockType, ...]
    a_s: float
    c_s: float
    ranges: tuple[tuple[int, int], ...]
    full_options: tuple[int, ...]  # indices into the unpruned shape lists


class BlocksProvider:
    def __init__(self, cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
                 shapes: dict[BlockType, list[StageShape]], avail: tuple[int, ...], micro_batch: int,
                 single_node: bool, max_blocks: int = 2, deadline: float | None = None) -> None:
        self.cost, self.model, self.training, self.classes = cost, model, training, classes
        self.shapes, self.micro_batch, self.single_node = shapes, micro_batch, single_node
        self.coverage = f"blocks<={max_blocks}"
        self.skeletons = block_skeletons(list(shapes), avail, model.num_layer_slots, max_blocks)
        self.stats = ProviderStats(skeletons=len(self.skeletons))
        self.deadline = deadline
        self.truncated = False  # the deadline stopped the frontier enumeration: no bound from here
        r_all = max(1, sum(avail))
        self.plan_protos = self._protos(1)
        self.lb_protos = self.plan_protos if training.zero == 0 else self._protos(r_all)

    def _options(self, r_sync: int, r_mem: int) -> dict[BlockType, StageOptions]:
        ctx = OptionContext(self.model, self.training, self.micro_batch, r_sync, r_mem, self.single_node)
        return {bt: build_options(self.cost, self.classes[bt.cls], shp, ctx) for bt, shp in self.shapes.items()}

    def _protos(self, r_mem: int) -> list[_Proto]:
        full = self._options(1, r_mem)
        opts, _, keep = _pruned(full, self.shapes, use_tail=False)
        out = []
        for sk in self.skeletons:
            if self.deadline is not None and time.perf_counter() > self.deadline:
                self.truncated = True
                break
            for split in split_frontier([opts[bt] for bt in sk], with_tail=False):
                idx = tuple(keep[bt][o] for bt, o in zip(sk, split.options))
                out.append(_Proto(sk, split.a_s, split.c_s, split.ranges, idx))
        self.stats.templates += len(out)
        return out

    def templates(self, lo: int, hi: int) -> tuple[list[Template], list[Template]]:
        n_cls = len(self.classes)
        tails = self._options(lo, lo)
        plan_set = []
        for p in self.plan_protos:
            e = max(float(tails[bt].tail[o, first, last + 1])
                    for bt, o, (first, last) in zip(p.skeleton, p.full_options, p.ranges))
            stages = tuple(TemplateStage(bt.cls, self.shapes[bt][o], first, last)
                           for bt, o, (first, last) in zip(p.skeleton, p.full_options, p.ranges))
            plan_set.append(Template(_usage(p.skeleton, n_cls), p.a_s, p.c_s, e, None, stages))
        lb_tails = tails if self.training.zero == 0 else self._options(lo, hi)
        e_min: dict[tuple[BlockType, ...], float | None] = {}
        lb_set = []
        for p in self.lb_protos:
            if p.skeleton not in e_min:
                e_min[p.skeleton] = min_max_tail([lb_tails[bt] for bt in p.skeleton])
            e = e_min[p.skeleton]
            if e is None:
                continue
            lb_set.append(Template(_usage(p.skeleton, n_cls), p.a_s, p.c_s, e, None, ()))
        kept = prune_templates(plan_set)
        self.stats.pruned += len(plan_set) - len(kept)
        return kept, prune_templates(lb_set)
