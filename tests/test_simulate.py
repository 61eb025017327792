"""The discrete-event pipeline simulator against the closed form the search optimises."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from planner.costmodel.stage import in_flight, pipeline_time_s
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.plan import Pipeline, Plan
from planner.simulate import (closed_form_bounds_s, closed_form_is_exact, render_timeline_text, simulate_pipeline,
                              simulate_plan, stage_op_order)
from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.models import get_model
from planner.specs.training import TrainingSpec
from planner.uniform import uniform_plan

REL = 1e-9
PROPS = settings(max_examples=150, deadline=None, derandomize=True)

times = hst.floats(min_value=0.01, max_value=5.0, allow_nan=False)


@hst.composite
def pipelines(draw: hst.DrawFn, max_stages: int = 7, max_mb: int = 14) -> tuple[list[float], list[float], int]:
    n = draw(hst.integers(1, max_stages))
    return (draw(hst.lists(times, min_size=n, max_size=n)), draw(hst.lists(times, min_size=n, max_size=n)),
            draw(hst.integers(1, max_mb)))


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def last_stage_bottleneck(fwd: list[float], bwd: list[float]) -> tuple[list[float], list[float]]:
    """Same stages, reordered so that the one with the largest F+B comes last."""
    k = max(range(len(fwd)), key=lambda s: fwd[s] + bwd[s])
    order = [s for s in range(len(fwd)) if s != k] + [k]
    return [fwd[s] for s in order], [bwd[s] for s in order]


# (a) where closed form and simulator agree exactly

@PROPS
@given(pipelines())
def test_gpipe_simulation_equals_closed_form_for_any_stage_times(
        case: tuple[list[float], list[float], int]) -> None:
    fwd, bwd, m = case
    sim = simulate_pipeline(fwd, bwd, m, "gpipe").makespan_s
    assert close(sim, pipeline_time_s("gpipe", fwd, bwd, m)), (fwd, bwd, m, sim)


@PROPS
@given(pipelines())
def test_1f1b_exact_with_last_stage_bottleneck_when_forwards_are_shorter_than_backwards(
        case: tuple[list[float], list[float], int]) -> None:
    fwd, bwd, m = case
    bwd = [max(fwd) + b for b in bwd]  # every backward longer than every forward
    fwd, bwd = last_stage_bottleneck(fwd, bwd)
    assert closed_form_is_exact(fwd, bwd, m)
    sim = simulate_pipeline(fwd, bwd, m).makespan_s
    assert close(sim, pipeline_time_s("1f1b", fwd, bwd, m)), (fwd, bwd, m, sim)


@PROPS
@given(pipelines(max_stages=2))
def test_1f1b_two_stages_exact_with_last_stage_bottleneck(case: tuple[list[float], list[float], int]) -> None:
    fwd, bwd, m = case
    fwd, bwd = last_stage_bottleneck(fwd, bwd)
    sim = simulate_pipeline(fwd, bwd, m).makespan_s
    assert close(sim, pipeline_time_s("1f1b", fwd, bwd, m)), (fwd, bwd, m, sim)


@PROPS
@given(hst.lists(hst.tuples(hst.floats(0.5, 1.5), hst.floats(1.8, 2.6)), min_size=1, max_size=8),
       hst.integers(1, 24))
def test_1f1b_exact_with_last_stage_bottleneck_on_typical_stage_times(
        stages: list[tuple[float, float]], m: int) -> None:
    """Typical: forwards within 3x of each other, backward about twice the forward."""
    fwd, bwd = last_stage_bottleneck([f for f, _ in stages], [f * r for f, r in stages])
    sim = simulate_pipeline(fwd, bwd, m).makespan_s
    assert close(sim, pipeline_time_s("1f1b", fwd, bwd, m)), (fwd, bwd, m, sim)


@PROPS
@given(pipelines(), hst.sampled_from(["1f1b", "gpipe"]))
def test_closed_form_equals_simulation_wherever_declared_exact(
        case: tuple[list[float], list[float], int], schedule: str) -> None:
    fwd, bwd, m = case
    if closed_form_is_exact(fwd, bwd, m, schedule):
        sim = simulate_pipeline(fwd, bwd, m, schedule).makespan_s
        assert close(sim, pipeline_time_s(schedule, fwd, bwd, m)), (fwd, bwd, m, schedule, sim)


@PROPS
@given(hst.integers(1, 8), hst.integers(1, 20), times, times)
def test_1f1b_uniform_stages_take_m_plus_s_minus_1_slots(stages: int, m: int, f: float, b: float) -> None:
    sim = simulate_pipeline([f] * stages, [b] * stages, m).makespan_s
    assert close(sim, (m + stages - 1) * (f + b)), (stages, m, f, b, sim)


@PROPS
@given(pipelines())
def test_1f1b_single_microbatch_is_one_round_trip(case: tuple[list[float], list[float], int]) -> None:
    fwd, bwd, _ = case
    sim = simulate_pipeline(fwd, bwd, 1).makespan_s
    assert close(sim, sum(fwd) + sum(bwd)) and close(sim, pipeline_time_s("1f1b", fwd, bwd, 1))


def test_equal_stage_totals_with_uneven_split_are_exact_for_fewer_microbatches_than_stages() -> None:
    fwd = [0.3, 1.1, 0.2, 0.9, 0.5]
    bwd = [1.7 - f for f in fwd]
    for m in (2, 3, 4, 9):
        assert closed_form_is_exact(fwd, bwd, m)
        sim = simulate_pipeline(fwd, bwd, m).makespan_s
        assert close(sim, pipeline_time_s("1f1b", fwd, bwd, m)), (m, sim)


@pytest.fixture(scope="module")
def two_node_cluster() -> ClusterSpec:
    return ClusterSpec(nodes=[NodeGroup(gpu="A100-40", nodes=1, gpus_per_node=4),
                              NodeGroup(gpu="V100-16", nodes=1, gpus_per_node=4)])


def mixed_plan(cluster: ClusterSpec, schedule: str) -> Plan:
    """Three replicas of different depth and microbatch count: A100 pp=4 (m=9) and two V100 pp=2
    (m=5, m=2); 16 microbatches of 1 in all."""
    training = TrainingSpec(global_batch=16, seq_len=128, schedule=schedule)
    model = get_model("tiny")
    a100 = uniform_plan(model, training, cluster, tp=1, pp=4, group=0)
    v100 = uniform_plan(model, training, cluster, tp=1, pp=2, group=1)
    pipes = [Pipeline(microbatches=9, stages=a100.pipelines[0].stages),
             Pipeline(microbatches=5, stages=v100.pipelines[0].stages),
             Pipeline(microbatches=2, stages=v100.pipelines[1].stages)]
    return Plan(model=model, training=training, micro_batch=1, schedule=schedule, pipelines=pipes)


def test_gpipe_plan_step_equals_evaluator_across_unequal_pipelines(two_node_cluster: ClusterSpec) -> None:
    plan = mixed_plan(two_node_cluster, "gpipe")
    pred = evaluate(plan, two_node_cluster)
    sim = simulate_plan(plan, two_node_cluster)
    assert [t.microbatches for t in sim.pipelines] == [9, 5, 2]
    assert [t.num_stages for t in sim.pipelines] == [4, 2, 2]
    for t, closed in zip(sim.pipelines, pred.pipeline_s):
        assert close(t.makespan_s, closed), (t.makespan_s, closed)
    assert close(sim.step_s, pred.step_s) and close(sim.closed_form_step_s, pred.step_s)


def test_1f1b_plan_pipelines_exact_where_last_stage_is_bottleneck_else_within_bounds(
        two_node_cluster: ClusterSpec) -> None:
    plan = mixed_plan(two_node_cluster, "1f1b")
    pred = evaluate(plan, two_node_cluster)
    sim = simulate_plan(plan, two_node_cluster)
    exact_seen = 0
    for pi, (t, closed) in enumerate(zip(sim.pipelines, pred.pipeline_s)):
        rows = sorted((p for p in pred.per_stage if p.pipeline == pi), key=lambda p: p.stage)
        assert [p.fwd_s for p in rows] == list(t.fwd_s) and [p.bwd_s for p in rows] == list(t.bwd_s)
        if closed_form_is_exact(t.fwd_s, t.bwd_s, t.microbatches):
            exact_seen += 1
            assert close(t.makespan_s, closed), (pi, t.makespan_s, closed)
        lo, hi = closed_form_bounds_s(t.fwd_s, t.bwd_s, t.microbatches)
        assert lo * (1 - REL) <= t.makespan_s <= hi * (1 + REL), (pi, lo, t.makespan_s, hi)
    assert exact_seen >= 1, "expected a pipeline of this plan where the closed form is exact"
    worst = max(t.makespan_s for t in sim.pipelines)
    assert close(sim.step_s, worst + pred.tail_s + pred.overhead_s)


def test_single_stage_replicas_with_different_microbatch_counts_match_evaluator(
        two_node_cluster: ClusterSpec) -> None:
    training = TrainingSpec(global_batch=12, seq_len=128)
    plan = uniform_plan(get_model("tiny"), training, two_node_cluster, tp=1, pp=1, group=0)
    plan = plan.model_copy(update={"pipelines": [p.model_copy(update={"microbatches": m})
                                                 for p, m in zip(plan.pipelines, (6, 3, 2, 1))]})
    pred = evaluate(plan, two_node_cluster)
    sim = simulate_plan(plan, two_node_cluster)
    assert close(sim.step_s, pred.step_s), (sim.step_s, pred.step_s)


# (b) the simulator is a schedule: bounds, one op at a time, dependencies

@PROPS
@given(pipelines(), hst.sampled_from(["1f1b", "gpipe"]))
def test_simulated_schedule_is_feasible_and_above_trivial_lower_bounds(
        case: tuple[list[float], list[float], int], schedule: str) -> None:
    fwd, bwd, m = case
    n = len(fwd)
    t = simulate_pipeline(fwd, bwd, m, schedule)
    totals = [f + b for f, b in zip(fwd, bwd)]
    assert t.makespan_s >= m * max(totals) * (1 - REL), "below the busiest stage's own work"
    assert t.makespan_s >= sum(totals) * (1 - REL), "below one microbatch's critical path"
    end = {(o.kind, o.stage, o.microbatch): o.end_s for o in t.ops}
    assert len(end) == len(t.ops) == 2 * n * m, "every (kind, stage, microbatch) runs exactly once"
    for o in t.ops:
        assert close(o.end_s - o.start_s, (fwd if o.kind == "F" else bwd)[o.stage])
        assert o.end_s <= t.makespan_s
        deps = []
        if o.kind == "F" and o.stage > 0:
            deps.append(("F", o.stage - 1, o.microbatch))
        if o.kind == "B":
            deps.append(("F", o.stage, o.microbatch))
            if o.stage < n - 1:
                deps.append(("B", o.stage + 1, o.microbatch))
        for d in deps:
            assert end[d] <= o.start_s, f"{o} started before its dependency {d} ended at {end[d]}"
    for s in range(n):
        mine = sorted((o for o in t.ops if o.stage == s), key=lambda o: (o.start_s, o.end_s))
        assert [(o.kind, o.microbatch) for o in mine] == stage_op_order(schedule, n, s, m)
        for a, b in zip(mine, mine[1:]):
            assert b.start_s >= a.end_s, f"stage {s} runs {a} and {b} at once"
        assert close(t.busy_s[s] + t.idle_s[s], t.makespan_s) and t.idle_s[s] >= -REL * t.makespan_s


# (c) where the closed form approximates: the documented bounds

@PROPS
@given(pipelines(max_stages=8, max_mb=20))
def test_1f1b_simulation_lies_within_documented_bounds_of_closed_form(
        case: tuple[list[float], list[float], int]) -> None:
    fwd, bwd, m = case
    sim = simulate_pipeline(fwd, bwd, m).makespan_s
    lo, hi = closed_form_bounds_s(fwd, bwd, m)
    assert lo * (1 - REL) <= sim <= hi * (1 + REL), (fwd, bwd, m, lo, sim, hi)
    closed = pipeline_time_s("1f1b", fwd, bwd, m)
    totals = [f + b for f, b in zip(fwd, bwd)]
    k = totals.index(max(totals))
    overlap = min(sum(totals[k + 1:]), (min(len(fwd) - k, m) - 1) * fwd[k])
    assert closed - sim <= overlap * (1 + REL) + 1e-12, "pessimism exceeds the bottleneck's warm-up overlap"
    uniform_worst = (m + len(fwd) - 1) * (max(fwd) + max(bwd))
    assert sim <= uniform_worst * (1 + REL), "slower than every stage at the slowest F and B"


def test_closed_form_is_wrong_both_ways_on_some_pipelines() -> None:
    """The bounds above are not vacuous: an early bottleneck makes the closed form pessimistic; slow
    upstream forwards make it optimistic, even with the last stage as bottleneck."""
    early = simulate_pipeline([2.0, 0.5, 0.5, 0.5], [4.0, 1.0, 1.0, 1.0], 8)
    assert early.makespan_s < early.closed_form_s * (1 - 1e-3)
    late = simulate_pipeline([0.43, 2.04, 2.63, 0.16, 0.23, 0.66], [3.2, 1.09, 0.98, 0.88, 0.73, 1.73], 5)
    assert late.makespan_s > late.closed_form_s * (1 + 1e-3)
    # the last stage is the bottleneck, yet stage 0's slow warm-up forwards delay stage 1's backwards
    starved = simulate_pipeline([18.9, 1.08, 0.02, 0.02, 0.0001, 2.99, 2.37],
                                [0.14, 27.9, 2.15, 3.15, 0.12, 15.4, 27.5], 7)
    assert not closed_form_is_exact(starved.fwd_s, starved.bwd_s, 7)
    assert starved.makespan_s > starved.closed_form_s * (1 + 1e-2)


# (d) activations held

@PROPS
@given(pipelines(max_stages=9, max_mb=20), hst.sampled_from(["1f1b", "gpipe"]))
def test_peak_in_flight_matches_costmodel(case: tuple[list[float], list[float], int], schedule: str) -> None:
    fwd, bwd, m = case
    n = len(fwd)
    t = simulate_pipeline(fwd, bwd, m, schedule)
    expected = [in_flight(schedule, n, s, m) for s in range(n)]
    assert list(t.peak_in_flight) == expected
    for s in range(n):  # recount from the timeline: forwards ended minus backwards ended, at each end
        events = sorted((o.end_s, o.kind == "F") for o in t.ops if o.stage == s)
        held = peak = 0
        for _, is_fwd in events:
            held += 1 if is_fwd else -1
            peak = max(peak, held)
        assert peak == expected[s], (s, peak, expected[s])


# inputs and rendering

@pytest.mark.parametrize("kwargs, field", [
    ({"fwd_s": [1.0], "bwd_s": [1.0, 2.0], "microbatches": 2}, "fwd_s"),
    ({"fwd_s": [1.0], "bwd_s": [-1.0], "microbatches": 2}, "bwd_s"),
    ({"fwd_s": [1.0], "bwd_s": [1.0], "microbatches": 0}, "microbatches"),
    ({"fwd_s": [1.0], "bwd_s": [1.0], "microbatches": 2, "schedule": "interleaved:2"}, "schedule"),
])
def test_bad_input_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(HetplanError) as err:
        simulate_pipeline(**kwargs)
    assert err.value.field == field


def test_text_gantt_has_one_row_per_stage_and_shows_every_microbatch() -> None:
    t = simulate_pipeline([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 4)
    rows = render_timeline_text(t, width=54).splitlines()
    assert len(rows) == 4 and all(len(r) == len(rows[0]) for r in rows[:3])
    for s in range(3):
        assert set("0123abcd") <= set(rows[s]), rows[s]
    assert rows[0].startswith("stage  0 |0") and rows[2].split("|")[1].startswith("......")
