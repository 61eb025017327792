"""One unit of the search on the blocks coverage (`units.solve_unit`): when it builds plan templates,
and how a wide replica class's plan is re-solved at the pipeline count it chose."""

from __future__ import annotations

import time

import pytest

from planner.costmodel.analytic import AnalyticCostModel
from planner.search.providers import BlocksProvider
from planner.search.space import block_types, resource_classes, stage_shapes
from planner.search.units import RESOLVES, Unit, UnitContext, solve_unit
from planner.specs import ClusterSpec, ModelSpec, NodeGroup, TrainingSpec
from solvers.assign import SolverStats

COST = AnalyticCostModel()
MODEL = ModelSpec(name="unit-model", num_layers=6, hidden=1024, ffn_hidden=4096, num_heads=8, num_kv_heads=8,
                  vocab=32000, activation="swiglu", norm="rmsnorm", learned_positions=False)
CLUSTER = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=2, gpus_per_node=8),
                             NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=8)])
TRAINING = TrainingSpec(global_batch=64, seq_len=2048)
CLASSES = resource_classes(CLUSTER)
AVAIL = tuple(rc.gpus for rc in CLASSES)


def _provider(b: int) -> tuple[BlocksProvider, list[int]]:
    """A provider whose `plan_templates` calls are recorded (the pipeline counts asked for)."""
    shapes = {rc.index: stage_shapes(MODEL, TRAINING, rc, b) for rc in CLASSES}
    provider = BlocksProvider(COST, MODEL, TRAINING, CLASSES, block_types(shapes), AVAIL, b, CLUSTER.single_node)
    calls: list[int] = []
    build = provider.plan_templates

    def recorded(replicas: int) -> list:
        calls.append(replicas)
        return build(replicas)

    provider.plan_templates = recorded  # type: ignore[method-assign]
    return provider, calls


def _solve(provider: BlocksProvider, lo: int, hi: int, incumbent_s: float | None = None) -> UnitContext:
    ctx = UnitContext(MODEL, TRAINING, CLUSTER, CLASSES, COST, AVAIL, [], [], set(), SolverStats(),
                      {"assignments": 0})
    b = provider.micro_batch
    solve_unit(Unit(b, provider, lo, hi, TRAINING.global_batch // b), ctx, "cpsat", time.perf_counter(), None,
               incumbent_s)
    return ctx


@pytest.mark.parametrize("b, replicas", [(1, 3), (2, 4)])
def test_a_unit_the_incumbent_rules_out_builds_no_plan_templates(b: int, replicas: int) -> None:
    """Below its bound the incumbent leaves nothing to find: only the bound templates are built,
    and that bound still holds for the unit's own plan. Above its plan the plan templates are built."""
    provider, calls = _provider(b)
    free = _solve(provider, replicas, replicas)
    assert calls == [replicas] and free.candidates and free.solved
    plan_s, bound_s = free.candidates[0].step_s, free.solved[0].bound_s
    assert bound_s <= plan_s

    calls.clear()
    ruled_out = _solve(provider, replicas, replicas, incumbent_s=0.99 * bound_s)
    assert calls == [] and not ruled_out.candidates
    assert 0.99 * bound_s / (1 + 1e-3) <= ruled_out.solved[0].bound_s <= plan_s

    calls.clear()
    open_unit = _solve(provider, replicas, replicas, incumbent_s=1.01 * plan_s)
    assert calls == [replicas] and open_unit.candidates
    assert open_unit.candidates[0].step_s == pytest.approx(plan_s)


def test_a_wide_class_is_re_solved_at_the_pipeline_count_it_chose() -> None:
    """Tails are first costed for the class's lowest count; each re-solve costs them for the count
    the previous plan chose, until a count repeats. Here that finds a faster plan."""
    provider, calls = _provider(1)
    ctx = _solve(provider, 2, 24)
    counts = [len(c.plan.pipelines) for c in ctx.candidates]
    assert calls[0] == 2 and len(calls) >= 3  # re-solved more than once: the test has something to check
    assert calls[1:] == counts[:len(calls) - 1]
    assert counts[-1] in calls or len(calls) == RESOLVES + 1  # the last plan was costed for its own count
    assert all(2 <= k <= 24 for k in counts)
    assert min(c.step_s for c in ctx.candidates) < ctx.candidates[0].step_s
    assert ctx.solved[0].bound_s <= min(c.step_s for c in ctx.candidates)


def test_packed_templates_unpack_to_equal_templates() -> None:
    """Bound templates travel between processes as columns (`templates.PackedTemplates`); what
    comes out must be the same templates, floats bit for bit, skeletons and stages included."""
    import pickle

    from planner.search.templates import PackedTemplates

    provider, _ = _provider(2)
    _, lb_set = provider.templates(2, 3)
    plan_set = [provider.resolved(t) for t in provider.plan_templates(2)[:5]]
    assert lb_set and all(t.skeleton is not None for t in lb_set) and all(t.stages for t in plan_set)
    for templates in (lb_set, plan_set, lb_set[:1] + plan_set[:1], []):
        back = pickle.loads(pickle.dumps(PackedTemplates.of(templates))).unpack()
        assert back == templates
        assert [type(t.usage[0]) for t in back] == [int] * len(back)


def test_node_packing_is_first_fit_in_file_order() -> None:
    """`placement._NodePool` resumes its scan per group size; the GPUs it hands out must be exactly
    those of a plain first-fit scan from the first node, on mixed node sizes and random requests."""
    import random

    from planner.errors import HetplanError
    from planner.search.placement import _NodePool

    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=3, gpus_per_node=8),
                                 NodeGroup(gpu="A100-SXM4-40GB", nodes=2, gpus_per_node=4),
                                 NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=8)])
    rc = resource_classes(cluster)
    assert len(rc) == 2  # node sizes differ: two classes
    for seed in range(20):
        rng = random.Random(seed)
        for klass in rc:
            pool = _NodePool(cluster, klass)
            free = [(n.name, [True] * n.gpus) for n in pool.nodes]
            sizes = [rng.choice([1, 2, 4, 8]) for _ in range(12)]  # any order, not only largest first
            for size in sizes:
                want = None
                for name, slots in free:  # the reference: first fit from the first node, every time
                    starts = [s for s in range(0, len(slots) - size + 1, size) if all(slots[s:s + size])]
                    if starts:
                        slots[starts[0]:starts[0] + size] = [False] * size
                        want = [(name, k) for k in range(starts[0], starts[0] + size)]
                        break
                if want is None:
                    with pytest.raises(HetplanError):
                        pool.take(size)
                    continue
                assert pool.take(size) == want
