"""The fluid bound and its LP-free relaxation (`planner.search.bounds`)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.costmodel.analytic import AnalyticCostModel
from planner.search import search
from planner.search.bounds import fluid_bound_s, fluid_work, weighted_work_bound_s
from planner.search.space import costable_shapes, resource_classes


@pytest.mark.parametrize("seed", range(10))
def test_the_weighted_bound_is_below_the_fluid_bound_and_equal_for_proportional_classes(seed: int) -> None:
    """Weak duality: never above the LP's optimum; with classes that differ by one speed factor
    (same layers runnable everywhere) it is the optimum."""
    rng = np.random.default_rng(seed)
    layers, classes = int(rng.integers(2, 12)), int(rng.integers(1, 5))
    gpus = rng.integers(1, 40, classes).astype(float)
    work = rng.uniform(0.1, 5.0, (layers, classes))
    work[rng.random(work.shape) < 0.3] = np.inf
    work[:, 0] = np.minimum(work[:, 0], 9.0)  # every layer runs somewhere
    m = int(rng.integers(1, 200))
    assert weighted_work_bound_s(work, gpus, m) <= fluid_bound_s(work, gpus, m) * (1 + 1e-6)  # CBC's tolerance
    proportional = rng.uniform(0.1, 5.0, layers)[:, None] / rng.uniform(0.5, 3.0, classes)[None, :]
    assert weighted_work_bound_s(proportional, gpus, m) == pytest.approx(fluid_bound_s(proportional, gpus, m),
                                                                         rel=1e-6)


def test_a_layer_that_runs_nowhere_gives_no_bound() -> None:
    work = np.array([[1.0, 2.0], [np.inf, np.inf]])
    assert weighted_work_bound_s(work, np.array([4.0, 4.0]), 8) == 0.0


def test_every_plan_the_search_returns_takes_at_least_the_weighted_bound() -> None:
    """The frontiers' horizon (`solvers.horizon.Horizon`) is this bound on a plan's pipeline time:
    the plan a search returns (and each alternative) runs no pipeline time below it."""
    from tests.test_search_refine import BIG_CLUSTER as cluster
    from tests.test_search_refine import BIG_MODEL as model
    from tests.test_search_refine import BIG_TRAINING as training

    cost = AnalyticCostModel()
    classes = resource_classes(cluster)
    result = search(model, cluster, training, cost=cost, top_k=5)
    for plan in [result.plan, *result.alternatives]:
        b = plan.micro_batch
        shapes = [(rc.index, s) for rc in classes
                  for s in costable_shapes(cost, model, training, rc, b)]
        work = fluid_work(cost, model, training, classes, shapes, b)
        t_lo = weighted_work_bound_s(work, np.array([rc.gpus for rc in classes], dtype=float),
                                     training.global_batch // b)
        assert 0 < t_lo <= max(plan.predicted.pipeline_s)
