"""The stage options a blocks provider reads (`ProviderOptions`, a mixin of `BlocksProvider`):
every block type costed once (`options.OptionCosting`), of identical layers on the kind cells only
(`OptionCosting.kind_options`: the ranges the batched sweeps read), others on every layer range;
the tails re-costed per replica class, the last few kept; and the uniform views refinement and the
bound's least tails take, with a class's tails swapped in."""

from __future__ import annotations

from functools import partial

import numpy as np

from planner.costmodel.base import CostModel
from planner.search.options import OptionContext, OptionCosting
from planner.search.space import BlockType, ResourceClass, StageShape
from planner.search.tail_levels import TAIL_CACHE
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.partition import StageOptions
from solvers.uniform_layers import KindCellOptions, UniformView, full_options, uniform_view, with_tail

Options = StageOptions | KindCellOptions  # of identical layers: on the kind cells only


class ProviderOptions:
    """The option tables of `BlocksProvider` (a mixin: it reads the provider's cost model, model,
    training spec, classes, shapes, microbatch size and uniform flags, and keeps the costing, the
    full options by memory replica count, the tails by replica class and the base views)."""

    cost: CostModel
    model: ModelSpec
    training: TrainingSpec
    classes: list[ResourceClass]
    shapes: dict[BlockType, list[StageShape]]
    micro_batch: int
    single_node: bool
    _r_lb: int
    _uniform: dict[BlockType, bool]
    _costing: dict[BlockType, OptionCosting] | None
    _full: dict[int, dict[BlockType, Options]]
    _tails: dict[tuple[int, int], dict[BlockType, Options]]
    _base_views: dict[BlockType, object]

    def _options(self, r_sync: int, r_mem: int, tails_only: bool = False) -> dict[BlockType, Options]:
        """Every block type's options: of identical layers on the kind cells only (what the
        batched sweeps read, `OptionCosting.kind_options`), others on every layer range."""
        costing = self._costings()
        return {bt: (c.kind_options if c.uniform else c.options)(r_sync, r_mem, tails_only)
                for bt, c in costing.items()}

    def _costings(self) -> dict[BlockType, OptionCosting]:
        if self._costing is None:  # per block type, what does not depend on the replica counts
            self._build_costing(None)
        assert self._costing is not None
        return self._costing

    def _build_costing(self, bases: dict | None) -> None:
        """Build the option costing of every block type, from `bases` (the `OptionCosting.basis`
        lists a frontier worker computed, by block type) where given."""
        ctx = OptionContext(self.model, self.training, self.micro_batch, 1, 1, self.single_node)
        self._costing = {bt: OptionCosting(self.cost, self.classes[bt.cls], shp, ctx,
                                           None if bases is None else bases[bt])
                         for bt, shp in self.shapes.items()}

    def _tail_options(self, r_sync: int, r_mem: int) -> dict[BlockType, Options]:
        """Stage tails costed for `r_sync` / `r_mem` replicas (`_options(tails_only=True)`); the
        last few classes' are kept, as a unit's solve, re-solves and refinement ask again."""
        key = (r_sync, r_mem)
        if key not in self._tails:
            if len(self._tails) >= TAIL_CACHE:
                self._tails.pop(next(iter(self._tails)))
            self._tails[key] = self._options(r_sync, r_mem, tails_only=True)
        return self._tails[key]

    def _with_tails(self, r_mem: int, tails: dict[BlockType, Options],
                    bts: list[BlockType]) -> dict[BlockType, Options]:
        """The options of `bts` as `_full_options(r_mem)` has them (F+B, memory), with the stage
        tails of `tails` (re-costed for some replica class)."""
        full = self._full_options(r_mem)
        out: dict[BlockType, Options] = {}
        for bt in bts:
            f, t = full[bt], tails[bt]
            if isinstance(f, KindCellOptions):
                out[bt] = KindCellOptions(f.fb, t.tail, f.mem_fixed, f.act, f.capacity, f.num_layers,
                                          partial(_joined, f, t))
            else:
                out[bt] = StageOptions(f.fb, t.tail, f.mem_fixed, f.act, f.capacity)
        return out

    def _full_options(self, r_mem: int) -> dict[BlockType, Options]:
        """Every stage option of every block type (sync for one replica, memory for `r_mem`),
        built once; not handed between processes (cheaper to rebuild than to pickle)."""
        if r_mem not in self._full:
            self._full[r_mem] = self._options(1, r_mem)
        return self._full[r_mem]

    def _tail_view(self, bt: BlockType, tail: np.ndarray) -> UniformView | None:
        """The uniform view of `bt` (memory as for the bound protos) with these tails, or None."""
        if not self._uniform.get(bt):
            return None
        if bt not in self._base_views:
            self._base_views[bt] = uniform_view(self._full_options(self._r_lb)[bt], trusted=True)
        return with_tail(self._base_views[bt], tail)


def _joined(base: Options, tails: Options) -> StageOptions:
    """Full options of `base`'s F+B and memory with `tails`'s tails (`BlocksProvider._with_tails`,
    expanded for the general DP)."""
    f, t = full_options(base), full_options(tails)
    return StageOptions(f.fb, t.tail, f.mem_fixed, f.act, f.capacity)
