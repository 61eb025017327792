"""The search's milestones (`SearchResult.history`): when its plans were found and its bound raised.
Each is a real state of the search: the plan is one it found, the bound holds for the final plan,
the last milestone is the result's plan and bound, and all but the seconds are the same whatever
the worker count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli.main import main
from planner.cli.plan_cmd import summary
from planner.costmodel.analytic import AnalyticCostModel
from planner.search import search
from planner.search.history import Milestone, close, plan_found
from planner.specs.cluster import load_cluster
from planner.specs.models import get_model
from planner.specs.training import TrainingSpec

COST = AnalyticCostModel()
REPO = Path(__file__).resolve().parents[1]


def _consistent(result) -> None:  # noqa: ANN001 - a SearchResult
    """The milestone properties every search result must have."""
    history = result.history
    assert history, "a search that returns a plan has at least one milestone"
    last = history[-1]
    assert last.step_s == result.prediction.step_s and last.lower_bound_s == result.lower_bound_s
    for before, after in zip(history, history[1:]):
        assert after.step_s <= before.step_s  # the best plan only gets faster
        assert before.seconds <= after.seconds <= result.stats["search_s"] + 1e-9
        if after.phase != "end":  # a milestone is taken only when the plan or the bound improved
            assert after.step_s < before.step_s or (after.lower_bound_s is not None and (
                before.lower_bound_s is None or after.lower_bound_s > before.lower_bound_s))
    for m in history:  # every bound on the way holds for the plan found in the end
        assert m.lower_bound_s is None or m.lower_bound_s <= result.prediction.step_s
        assert m.lower_bound_s is None or m.lower_bound_s <= m.step_s
    found = plan_found(history)
    assert found is not None and found.step_s == result.prediction.step_s
    assert all(m.step_s > found.step_s for m in history[:history.index(found)])


def test_large_pool_history_is_consistent_and_independent_of_workers() -> None:
    """The 16-GPU ladder pool (blocks coverage: best-first units, engine candidates, polish): the
    units' milestones have no bound until every unit is solved or bounded; after that every
    milestone's bound holds. The same milestones with one worker and with two."""
    from benchmarks.search_scale import ladder_cluster

    model = get_model("llama2-13b")
    training = TrainingSpec(global_batch=256, seq_len=model.seq_len)
    one = search(model, ladder_cluster(16), training, cost=COST, workers=1)
    two = search(model, ladder_cluster(16), training, cost=COST, workers=2)
    for result in (one, two):
        _consistent(result)
        assert result.history[0].phase == "units" and result.history[0].lower_bound_s is None
        assert any(m.lower_bound_s is not None for m in result.history)
    assert summary(one)["history"] == summary(two)["history"]
    assert [m.deterministic() for m in one.history] == summary(one)["history"]
    assert all(set(entry) == {"phase", "step_s", "lower_bound_s"} for entry in summary(one)["history"])


def test_exact_coverage_and_grid_targets_have_histories() -> None:
    """Small pools (exact coverage): the units' milestones, bounded once every unit is solved.
    An engine-restricted search: one milestone, its grid, exact within its space (gap 0)."""
    cluster = load_cluster(REPO / "examples" / "tiny_cluster.yaml")
    model = get_model("tiny")
    training = TrainingSpec(global_batch=8, seq_len=model.seq_len, micro_batches=(1, 2))
    exact = search(model, cluster, training, cost=COST, exact_limit=10**6)
    assert exact.coverage == "exact"
    _consistent(exact)
    assert {m.phase for m in exact.history} <= {"units", "end"}
    grid = search(model, cluster, training, cost=COST, target="megatron")
    assert grid.history == [Milestone("megatron-grid", grid.prediction.step_s, grid.prediction.step_s,
                                      grid.history[0].seconds)]


def test_history_helpers() -> None:
    """`plan_found` is the first milestone with the final plan, `close` adds the result's plan and
    bound only where the last milestone differs."""
    history = [Milestone("units", 10.0, None, 1.0), Milestone("units", 9.0, 8.0, 2.0),
               Milestone("polish", 8.5, 8.0, 3.0), Milestone("refinement", 8.5, 8.4, 4.0)]
    assert plan_found(history) is history[2]
    assert plan_found([]) is None
    close(history, 8.5, 8.4, 5.0)
    assert len(history) == 4
    close(history, 8.5, 8.3, 5.0)  # a size left unsolved: its fluid bound, counted at the end
    assert history[-1] == Milestone("end", 8.5, 8.3, 5.0)


def test_plan_cli_prints_the_history(capsys: pytest.CaptureFixture[str]) -> None:
    """`hetplan plan --json` lists the milestones without their seconds (the output stays the same
    for the same input); the table says when the plan was found."""
    args = ["plan", str(REPO / "examples" / "tiny_cluster.yaml"), "--model", "tiny", "--global-batch", "8",
            "--micro-batches", "1,2"]
    assert main(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    history = doc["search"]["history"]
    assert history and history[-1]["step_s"] == doc["plan"]["predicted"]["step_s"]
    assert history[-1]["lower_bound_s"] == doc["plan"]["predicted"]["lower_bound_s"]
    assert all(set(entry) == {"phase", "step_s", "lower_bound_s"} for entry in history)
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "plan found" in err and "s into the search (units)" in err
