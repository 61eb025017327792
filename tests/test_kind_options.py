"""Options of identical layers costed on the kind cells only (`OptionCosting.kind_options`): the
same values, cell for cell, as the full tables; the views built from them equal those built from
the full tables; tails on any other ranges (`tails_at`) as the full tables have them; and the
uniform flag (from the layer tables) agrees with the check on the full tables."""

from __future__ import annotations

import numpy as np
import pytest

from planner.costmodel.analytic import AnalyticCostModel
from planner.search.options import OptionContext, OptionCosting, pruned_options
from planner.search.space import block_types, costable_shapes, resource_classes
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model
from solvers.partition import undominated_options
from solvers.uniform_layers import KindCellOptions, _is_uniform, full_options, kind_cells, uniform_view, with_tail

COST = AnalyticCostModel()
CLUSTER = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=1, gpus_per_node=8),
                             NodeGroup(gpu="V100-SXM2-32GB", nodes=2, gpus_per_node=4)])
FIELDS = ("fb", "tail", "mem_fixed", "act")


def _costings(zero: int, micro_batch: int) -> list[OptionCosting]:
    model = get_model("llama2-7b")
    training = TrainingSpec(global_batch=64, seq_len=model.seq_len, zero=zero)
    classes = resource_classes(CLUSTER)
    shapes = {rc.index: costable_shapes(COST, model, training, rc, micro_batch, False) for rc in classes}
    ctx = OptionContext(model, training, micro_batch, 1, 1, False)
    return [OptionCosting(COST, classes[bt.cls], shp, ctx) for bt, shp in block_types(shapes).items()]


@pytest.mark.parametrize("zero,micro_batch", [(0, 1), (1, 2), (3, 4)])
def test_kind_options_equal_the_full_tables_on_the_kind_cells(zero: int, micro_batch: int) -> None:
    costings = _costings(zero, micro_batch)
    assert costings and all(c.uniform for c in costings)
    for c in costings:
        for r_sync, r_mem, tails_only in ((1, 1, False), (4, 4, True), (8, 2, False), (1, 16, False)):
            full = c.options(r_sync, r_mem, tails_only)
            kind = c.kind_options(r_sync, r_mem, tails_only)
            assert isinstance(kind, KindCellOptions) and kind.capacity == full.capacity
            i, j = kind_cells(full.num_layers)
            for f in (("tail",) if tails_only else FIELDS):
                assert np.array_equal(getattr(full, f)[:, i, j], getattr(kind, f)), f
            expanded = full_options(kind)
            for f in FIELDS:
                assert np.array_equal(getattr(expanded, f), getattr(full, f))
            if tails_only:
                continue
            # the views, and a view's tails swapped for another count's, are the same arrays
            a, b = uniform_view(full, trusted=True), uniform_view(kind)
            other_full, other_kind = c.options(3, 3, True), c.kind_options(3, 3, True)
            for va, vb in ((a, b), (with_tail(a, other_full.tail), with_tail(b, other_kind.tail))):
                for k in ("first", "mid", "last", "whole"):
                    for f in FIELDS:
                        assert np.array_equal(getattr(getattr(va, k), f), getattr(getattr(vb, k), f)), (k, f)


def test_tails_on_any_ranges_equal_the_full_tables() -> None:
    c = _costings(1, 2)[0]
    n = c.n
    rng = np.random.default_rng(5)
    first = rng.integers(0, n, size=40)
    end = np.minimum(first + rng.integers(1, n, size=40), n)
    for r_sync, r_mem in ((1, 1), (6, 2)):
        got = c.tails_at(r_sync, r_mem, ("test", r_sync), first, end)
        assert np.array_equal(got, c.options(r_sync, r_mem, True).tail[:, first, end])


def test_pruning_kind_options_keeps_what_pruning_the_full_tables_on_kind_cells_keeps() -> None:
    costings = _costings(0, 1)
    for use_tail in (False, True):
        for c in costings:
            full, kind = c.options(2, 2), c.kind_options(2, 2)
            assert undominated_options(kind, use_tail) == undominated_options(full, use_tail,
                                                                              kind_cells(full.num_layers))
        types = {k: c for k, c in enumerate(costings)}
        got = pruned_options({k: c.kind_options(2, 2) for k, c in types.items()},
                             {k: c.shapes for k, c in types.items()}, use_tail, dict.fromkeys(types, True))
        want = pruned_options({k: c.options(2, 2) for k, c in types.items()},
                              {k: c.shapes for k, c in types.items()}, use_tail, dict.fromkeys(types, True))
        assert got[2] == want[2] and got[1] == want[1]
        for k in types:  # the kept kind options expand to the kept full ones
            for f in FIELDS:
                assert np.array_equal(getattr(full_options(got[0][k]), f), getattr(want[0][k], f))


class _SlowFifthLayer(AnalyticCostModel):
    """The analytic model with decoder layer 5 a little slower: position-dependent layers."""

    def layer_table(self, dev, shard, model, training):
        table = super().layer_table(dev, shard, model, training)
        fwd = table.fwd_s.copy()
        fwd[5] *= 1.25
        return type(table)(fwd, table.bwd_s, table.params_per_gpu, table.act_bytes, table.work_bytes, table.measured,
                           table.boundary_bytes)


def test_the_uniform_flag_agrees_with_the_check_on_the_full_tables() -> None:
    model = get_model("llama2-7b")
    training = TrainingSpec(global_batch=64, seq_len=model.seq_len)
    classes = resource_classes(CLUSTER)
    ctx = OptionContext(model, training, 1, 1, 1, False)
    for cost, uniform in ((COST, True), (_SlowFifthLayer(), False)):
        shapes = {rc.index: costable_shapes(cost, model, training, rc, 1, False) for rc in classes}
        for bt, shp in block_types(shapes).items():
            c = OptionCosting(cost, classes[bt.cls], shp, ctx)
            assert c.uniform == uniform == _is_uniform(c.options(1, 1))
            if not uniform:
                with pytest.raises(ValueError, match="identical decoder layers"):
                    c.kind_options(1, 1)


def test_a_search_over_position_dependent_layers_takes_the_general_dp() -> None:
    """With one decoder layer slower, no costing is uniform: the search's blocks provider costs
    every layer range and splits with the general DP; its plan evaluates to its prediction and is
    no faster than the same pool's plan with identical layers (every stage costs at least as much)."""
    from planner.evaluate import evaluate
    from planner.search import search

    model = get_model("llama2-7b")
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=1, gpus_per_node=4),
                                 NodeGroup(gpu="V100-SXM2-32GB", nodes=1, gpus_per_node=4)])
    training = TrainingSpec(global_batch=32, seq_len=model.seq_len)
    slow = _SlowFifthLayer()
    got = search(model, cluster, training, cost=slow, workers=1)
    plain = search(model, cluster, training, cost=COST, workers=1)
    assert got.coverage.startswith("blocks")
    assert evaluate(got.plan, cluster, slow).step_s == pytest.approx(got.prediction.step_s, rel=1e-9)
    assert got.lower_bound_s <= got.prediction.step_s
    assert got.prediction.step_s > plain.prediction.step_s


class _SlowFifthOnV100(AnalyticCostModel):
    """Position-dependent layers on the V100s only: skeletons mixing them with A100 runs take the
    general DP with the A100's kind options expanded."""

    def layer_table(self, dev, shard, model, training):
        table = super().layer_table(dev, shard, model, training)
        if "V100" not in dev.gpu.name:
            return table
        fwd = table.fwd_s.copy()
        fwd[5] *= 1.25
        return type(table)(fwd, table.bwd_s, table.params_per_gpu, table.act_bytes, table.work_bytes, table.measured,
                           table.boundary_bytes)


@pytest.mark.parametrize("zero", [0, 1])
def test_mixing_identical_and_position_dependent_layers_matches_the_general_dp_everywhere(monkeypatch, zero) -> None:
    """One GPU type's layers position-dependent, the other's identical: the search (kind options
    for the identical ones, expanded where a skeleton mixes them with the other) finds the plan and
    bound of the same search with every type costed on every range and split by the general DP."""
    import dataclasses

    from planner.search import options, search

    model = get_model("llama2-7b")
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=1, gpus_per_node=4),
                                 NodeGroup(gpu="V100-SXM2-32GB", nodes=1, gpus_per_node=4)])
    training = TrainingSpec(global_batch=32 * (1 + zero), seq_len=model.seq_len, zero=zero)
    cost = _SlowFifthOnV100()
    classes = resource_classes(cluster)
    flags = {rc.dev.gpu.name: OptionCosting(cost, rc, costable_shapes(cost, model, training, rc, 1, False),
                                            OptionContext(model, training, 1, 1, 1, False)).uniform for rc in classes}
    assert flags == {"A100-SXM4-80GB": True, "V100-SXM2-32GB": False}
    got = search(model, cluster, training, cost=cost, workers=1)
    shape_basis = options._shape_basis
    monkeypatch.setattr(options, "_shape_basis", lambda *a: dataclasses.replace(shape_basis(*a), uniform=False))
    general = search(model, cluster, training, cost=cost, workers=1)
    assert got.coverage == general.coverage
    assert got.prediction.step_s == pytest.approx(general.prediction.step_s, rel=1e-9)
    assert got.lower_bound_s == pytest.approx(general.lower_bound_s, rel=1e-9)


@pytest.mark.parametrize("zero,micro_batch", [(0, 1), (1, 2)])
def test_the_mesh_chains_read_kind_options_as_the_full_tables(zero: int, micro_batch: int) -> None:
    """The mesh chains' stage options on the kind cells (`flagscale_grid._masked_kind`: no
    embedding-only or head-only stage) give the same views as the masked full tables, expand to
    them, and give the same least tail per layer count (`chain_bounds.tails_by_length`), where
    each range of k identical layers is one of the kind cells."""
    from planner.search import chain_bounds as cb
    from planner.search import flagscale_grid as fg
    for c in _costings(zero, micro_batch):
        for r in (1, 3):
            full = fg._masked(c.options(r, r))
            kind = fg._masked_kind(c.kind_options(r, r))
            expanded = full_options(kind)
            for f in FIELDS:
                assert np.array_equal(getattr(expanded, f), getattr(full, f)), f
            a, b = uniform_view(full), uniform_view(kind)
            assert a is not None and b is not None
            for k in ("first", "mid", "last", "whole"):
                for f in FIELDS:
                    assert np.array_equal(getattr(getattr(a, k), f), getattr(getattr(b, k), f)), (k, f)
            want, got = cb.tails_by_length(full), cb.tails_by_length(kind)
            assert np.array_equal(want, got) and np.isfinite(got[1:]).any()
