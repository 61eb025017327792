"""The Megatron grid searched before the frontiers (`candidates.early_grid`): its step caps every
frontier's A (`solvers.horizon.Horizon.a_max`), it is searched once, and the answer is the one
the search gives without it, with any number of workers."""

from __future__ import annotations

import pytest

import planner.search.candidates as candidates
from planner.search import search
from tests.test_search_refine import BIG_CLUSTER, BIG_MODEL, BIG_TRAINING, COST


def _search(monkeypatch: pytest.MonkeyPatch, early: bool, workers: int = 1, **kwargs):
    monkeypatch.setattr(candidates, "EARLY_GRID_MIN_ROWS", 0 if early else 10**9)
    return search(BIG_MODEL, BIG_CLUSTER, BIG_TRAINING, cost=COST, workers=workers, **kwargs)


def test_the_early_grid_caps_the_frontiers_and_keeps_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer templates (the splits of A above the grid's step less the overhead are left out),
    the same plan and bound, the grid searched once (the later candidate runs take its plan)."""
    calls: list[float] = []
    grid = candidates.best_megatron_plan

    def counted(*args, **kwargs):
        if args[1] is BIG_CLUSTER:  # not a single type's nodes (`best_single_type_plan`)
            calls.append(kwargs.get("cutoff_s", float("inf")))
        return grid(*args, **kwargs)
    monkeypatch.setattr(candidates, "best_megatron_plan", counted)
    plain = _search(monkeypatch, early=False)
    assert calls and all(c < float("inf") for c in calls)  # with the best plan as cutoff
    calls.clear()
    early = _search(monkeypatch, early=True)
    assert calls == [float("inf")]
    assert early.plan.to_json() == plain.plan.to_json()
    assert early.lower_bound_s == plain.lower_bound_s and early.gap == plain.gap
    assert early.counts()["templates"] < plain.counts()["templates"]
    assert early.stats["megatron_grid_s"] > 0


def test_the_early_grid_answer_does_not_depend_on_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which sizes are capped does not depend on `workers` (`frontier_workers.BESIDE_PILOT`): one
    and two workers give the same plan, bound and counts, with a stop gap too."""
    for stop_gap in (None, 0.02):
        one = _search(monkeypatch, early=True, workers=1, stop_gap=stop_gap)
        two = _search(monkeypatch, early=True, workers=2, stop_gap=stop_gap)
        assert two.plan.to_json() == one.plan.to_json()
        assert two.lower_bound_s == one.lower_bound_s
        assert two.counts() == one.counts()


def test_the_coverage_bound_never_claims_more_than_the_grid_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    """With capped frontiers the reported coverage bound is at most the grid's step and the
    reported bound at most the plan's. (On this pool the capped units' bounds stay below the
    grid's step, so `api.search`'s cap on the coverage bound does not bind here: this checks the
    property, not that line.)"""
    from planner.search.megatron_grid import best_megatron_plan

    res = _search(monkeypatch, early=True)
    grid = best_megatron_plan(BIG_MODEL, BIG_CLUSTER, BIG_TRAINING, COST, [1, 2, 4, 8, 16])
    assert grid is not None
    assert res.coverage_bound_s is not None and res.coverage_bound_s <= grid[1].step_s
    assert res.lower_bound_s <= res.prediction.step_s <= grid[1].step_s


def test_a_short_time_limit_leaves_the_grid_after_the_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a time limit below `EARLY_GRID_MIN_LIMIT_S` the grid is not searched first (it would
    eat into the frontiers' deadline); with a longer one, or none, it is."""
    assert not candidates.wants_early_grid(64, 10_000, time_limit=2.0)
    assert candidates.wants_early_grid(64, 10_000, time_limit=candidates.EARLY_GRID_MIN_LIMIT_S)
    assert candidates.wants_early_grid(64, 10_000) and not candidates.wants_early_grid(65, 10_000)
    assert not candidates.wants_early_grid(64, candidates.EARLY_GRID_MIN_ROWS - 1)
    limited = _search(monkeypatch, early=True, time_limit=5.0)
    plain = _search(monkeypatch, early=False, time_limit=5.0)
    assert limited.counts()["templates"] == plain.counts()["templates"]  # nothing capped
