"""Sizes swept for their bound first (`BlocksProvider.sweep_bound_first`): the bound's protos from the
first rounds of the split-frontier sweep, each row cut there standing in by its screen, and the plans'
frontiers swept whole only when first asked for. The bound protos must bound every split of the whole
frontier, the plans must be those a plain provider gives, and a stop-gap search that uses it must
answer as one process does."""

from __future__ import annotations

import pytest

from planner.search import providers
from planner.search import search
from planner.search.space import block_types, resource_classes, stage_shapes
from planner.search.units import Unit, cheap_bound
from planner.specs import ClusterSpec, TrainingSpec
from solvers.assign import SolverStats
from tests.test_search_refine import BIG_CLUSTER, BIG_MODEL, BIG_TRAINING, COST


def _provider(b: int, zero: int) -> providers.BlocksProvider:
    training = BIG_TRAINING.model_copy(update={"zero": zero})
    classes = resource_classes(BIG_CLUSTER)
    shapes = {rc.index: stage_shapes(BIG_MODEL, training, rc, b) for rc in classes}
    return providers.BlocksProvider(COST, BIG_MODEL, training, classes, block_types(shapes),
                                    tuple(rc.gpus for rc in classes), b, BIG_CLUSTER.single_node)


@pytest.mark.parametrize("zero", [0, 1])
def test_bound_protos_bound_every_split_and_plans_come_whole(zero: int) -> None:
    whole, first = _provider(2, zero), _provider(2, zero)
    first.sweep_bound_first(2)
    bound = first.lb_protos
    assert first._plan_protos is None and not first.cut_short  # rounds are not a deadline
    assert len(bound) < len(whole.lb_protos)  # two rounds leave most rows cut, each with one screen
    by_skeleton: dict = {}
    for p in bound:
        by_skeleton.setdefault(p.skeleton, []).append(p)
    # every split of the whole frontier has a bound proto of its skeleton at most as large in A and C
    for p in whole.plan_protos:
        assert any(q.a_s <= p.a_s * (1 + 1e-12) and q.c_s <= p.c_s * (1 + 1e-12)
                   for q in by_skeleton.get(p.skeleton, [])), p
    # the plans' frontiers, swept when first asked for, are the plain provider's
    assert [(p.skeleton, p.a_s, p.c_s) for p in first.plan_protos] == \
        [(p.skeleton, p.a_s, p.c_s) for p in whole.plan_protos]
    assert first.lb_protos is bound  # asking for plans leaves the bound's protos as they were
    microbatches = BIG_TRAINING.global_batch // 2
    avail = tuple(rc.gpus for rc in first.classes)
    for lo, hi in ((1, 1), (2, 2), (3, 4)):
        loose = cheap_bound(Unit(2, first, lo, hi, microbatches), avail, SolverStats())
        tight = cheap_bound(Unit(2, whole, lo, hi, microbatches), avail, SolverStats())
        assert loose is not None and tight is not None and loose <= tight * (1 + 1e-12)


def test_a_stop_gap_search_sweeps_bound_first_and_answers_as_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a stop gap the sizes swept after the early grid but the smallest take the bound-first
    sweep, in the frontier workers and in one process alike, with the same plan, bound and counts."""
    from benchmarks.search_scale import ladder_cluster
    from planner.specs.models import get_model

    marked: list[int] = []
    mark = providers.BlocksProvider.sweep_bound_first

    def watched(self: providers.BlocksProvider, rounds: int) -> None:
        marked.append(self.micro_batch)
        mark(self, rounds)
    monkeypatch.setattr(providers.BlocksProvider, "sweep_bound_first", watched)
    model = get_model("llama2-13b")
    training = TrainingSpec(global_batch=128, seq_len=model.seq_len)
    cluster: ClusterSpec = ladder_cluster(32)
    two = search(model, cluster, training, cost=COST, workers=2, stop_gap=0.02)
    assert sorted(set(marked)) == [8, 16]  # size 4, the smallest after the grid, sweeps whole
    marked.clear()
    one = search(model, cluster, training, cost=COST, workers=1, stop_gap=0.02)
    assert sorted(set(marked)) == [8, 16]  # size 4, the smallest after the grid, sweeps whole
    assert two.plan.to_json() == one.plan.to_json() and two.lower_bound_s == one.lower_bound_s
    assert two.counts() == one.counts() and two.gap <= 0.02


def test_plans_asked_of_a_bound_first_size_come_from_its_whole_frontier(monkeypatch: pytest.MonkeyPatch) -> None:
    """`chain_check.py --seed 35` pool 15 (29 GPUs): a unit of size 8, swept for its bound first,
    is solved for plans; its process sweeps that size's plans' frontier whole then, and the answer
    is one process's and the plain search's (no size swept bound-first)."""
    import random

    from benchmarks.chain_check import draw
    from planner.search import api

    rng = random.Random(35)
    for _ in range(16):
        _, model, cluster, training = draw(rng)
    whole: list[int] = []
    rows = providers.BlocksProvider._proto_rows

    def watched(self: providers.BlocksProvider, r_mem: int, part: int, parts: int, with_stages: bool = True,
                rounds: int | None = None):
        if self.bound_rounds is not None and rounds is None:
            whole.append(self.micro_batch)
        return rows(self, r_mem, part, parts, with_stages, rounds)
    monkeypatch.setattr(providers.BlocksProvider, "_proto_rows", watched)
    one = search(model, cluster, training, cost=COST, workers=1, stop_gap=0.02)
    assert 8 in whole
    two = search(model, cluster, training, cost=COST, workers=2, stop_gap=0.02)
    monkeypatch.setattr(api, "BOUND_ROUNDS", None)
    plain = search(model, cluster, training, cost=COST, workers=1, stop_gap=0.02)
    for other in (two, plain):
        assert one.plan.to_json() == other.plan.to_json() and one.lower_bound_s == other.lower_bound_s


def test_bound_first_sizes_sweep_alike_where_the_grid_finds_no_plan() -> None:
    """`many_types.py --seed 30` pool 22 (Llama-2 70B on 62 GPUs): the early grid finds no plan,
    so its cap on A is infinite; the frontier workers must still sweep the larger sizes bound-first
    as the parent marks them (they swept them whole, and the parent, expecting the bound's parts,
    failed on the missing ones). Two workers answer as one."""
    import random

    from benchmarks.many_types import draw

    rng = random.Random(30)
    for _ in range(23):
        _, model, cluster, training = draw(rng)
    two = search(model, cluster, training, cost=COST, workers=2, stop_gap=0.02)
    one = search(model, cluster, training, cost=COST, workers=1, stop_gap=0.02)
    assert two.plan.to_json() == one.plan.to_json() and two.lower_bound_s == one.lower_bound_s
