"""The template provider of small pools: every ordered sequence of stage groups (exact coverage)."""

from __future__ import annotations

from planner.costmodel.base import CostModel
from planner.search.options import OptionContext, build_options
from planner.search.options import pruned_options
from planner.search.providers import ProviderStats
from planner.search.space import BlockType, ResourceClass, StageShape
from planner.search.templates import Template, exact_skeletons, prune_templates, skeleton_templates
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec


class ExactProvider:
    """Every ordered sequence of stage groups, the full (A, C, E) frontier of each, memory variants
    for pipelines run with fewer microbatches than stages. Costed per replica class, so with
    lo == hi both sets coincide and the search is exact."""

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
        opts, shapes, _ = pruned_options(opts, self.shapes, use_tail=True)
        found = [t for sk in self.skeletons for t in skeleton_templates(sk, opts, shapes, len(self.classes))]
        kept = prune_templates(found)
        self.stats.skeletons += len(self.skeletons)
        self.stats.pruned += len(found) - len(kept)
        return kept

    def templates(self, lo: int, hi: int) -> tuple[list[Template], list[Template]]:
        plan_set = self._set(lo, lo)
        if lo == hi or self.training.zero == 0:
            return plan_set, plan_set
        return plan_set, self._set(lo, hi)
