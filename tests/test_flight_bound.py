"""The one-pipeline bound with in-flight memory (`solvers.flight_bound`): never above any
one-pipeline plan on its own terms (brute force), tight where the early stages' activations bind,
and its memory limits (`stage.most_decoders_by_flight`) against every run of layers. Through
`bounds.memory_bound_s` it is checked against the oracle's plans in `tests/test_memory_bound.py`."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from solvers.flight_bound import FlightLimits, one_pipeline_flights_s


def _random_limits(rng: np.random.Generator, flights: int) -> tuple[FlightLimits, np.ndarray]:
    classes = int(rng.integers(1, 3))
    gpus = rng.integers(1, 4, classes).astype(float)
    rows = []
    for k in range(classes):
        for _ in range(int(rng.integers(1, 3))):
            held = [int(rng.integers(1, 5))]
            for _ in range(flights - 1):
                held.append(max(0, held[-1] - int(rng.integers(0, 2))))
            rows.append((k, int(rng.choice([1, 2])), float(rng.uniform(0.5, 3.0)), held))
    cls, size, t, d = zip(*rows)
    return FlightLimits.of(np.array(cls), np.array(size), np.array(t), np.array(d)), gpus


def _one_pipeline_steps(lim: FlightLimits, budget: list[int], n_dec: int, m: int, positions: int):
    """Every one-pipeline plan on the bound's terms: an ordered list of stage shapes (the k-th from
    the end holding min(k, m) microbatches, so at most d[s, min(k, m) - 1] decoders), within the
    GPUs of each class, each stage holding x >= 0 decoders, all held; its step sum(x·t) + (m - 1)·max."""
    shapes = range(len(lim.t))
    for count in range(1, positions + 1):
        for seq in itertools.product(shapes, repeat=count):  # seq[k - 1]: the stage at position k
            used = [0] * len(budget)
            for s in seq:
                used[lim.cls[s]] += int(lim.size[s])
            if any(u > b for u, b in zip(used, budget)):
                continue
            limits = [int(lim.d[s, min(min(k, m), lim.d.shape[1]) - 1]) for k, s in enumerate(seq, start=1)]
            for xs in itertools.product(*(range(h + 1) for h in limits)):
                if sum(xs) == n_dec:
                    fbs = [x * lim.t[s] for x, s in zip(xs, seq)]
                    yield sum(fbs) + (m - 1) * max(fbs)


@pytest.mark.parametrize("seed", range(40))
def test_no_one_pipeline_plan_beats_the_flight_bound(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_dec, m = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    positions = int(rng.integers(1, 5))
    lim, gpus = _random_limits(rng, min(m, positions))
    bound = one_pipeline_flights_s(lim, gpus, n_dec, m, positions)
    best = min(_one_pipeline_steps(lim, [int(g) for g in gpus], n_dec, m, positions), default=math.inf)
    assert bound <= best * (1 + 1e-9), (bound, best)
    if math.isinf(best):
        return
    assert bound > 0


def test_it_counts_the_early_stages_flights() -> None:
    """One shape of 1 GPU, t = 1, holding 4 decoders with one microbatch in flight, 2 with two and
    1 with three or more; 8 GPUs, 8 microbatches. With one microbatch in flight everywhere six
    stages of 2 would hold 12 decoders at C = 2 (12 + 7·2 = 26 s); counting flights the stages from
    the end hold at most 4, 2, 1, 1, 1, 1, 1, 1, so 12 decoders need all eight stages and C = 4:
    40 s, the best plan, and the bound reaches it. No pipeline holds 13."""
    lim = FlightLimits.of(np.array([0]), np.array([1]), np.array([1.0]), np.array([[4, 2, 1, 1, 1, 1, 1, 1]]))
    gpus = np.array([8.0])
    best = min(_one_pipeline_steps(lim, [8], 12, 8, 8))
    assert best == 40.0
    assert 40 * (1 - 1e-5) <= one_pipeline_flights_s(lim, gpus, 12, 8, 8) <= best
    assert one_pipeline_flights_s(lim, gpus, 13, 8, 8) == math.inf


@pytest.mark.parametrize("seed", range(6))
def test_most_decoders_by_flight_is_the_longest_run_that_fits(seed: int) -> None:
    """Against every run of decoder layers costed as `stage_memory_bytes` does (states, activations
    times the microbatches in flight, the largest working buffer), at capacities from nothing to
    the whole model; with one microbatch it is `most_decoders`."""
    from planner.costmodel import stage as st
    from planner.costmodel.analytic import AnalyticCostModel
    from planner.costmodel.base import Shard
    from planner.search.space import resource_classes
    from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
    from planner.specs.models import get_model

    rng = np.random.default_rng(seed)
    model = get_model(["llama2-7b", "opt-350m", "gpt-neo-2.7b"][seed % 3])
    training = TrainingSpec(global_batch=8, seq_len=int(rng.choice([2048, 8192])))
    dev = resource_classes(ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=1, gpus_per_node=8)]))[0].dev
    table = AnalyticCostModel().layer_table(dev, Shard(1, 1, 1, 1, "none", training.seq_len), model, training)
    n = model.num_layers
    bpp = float(rng.choice([2.0, 16.0]))
    states = table.params_per_gpu[1:n + 1] * bpp
    acts, work = table.act_bytes[1:n + 1], table.work_bytes[1:n + 1]
    whole = float(states.sum() + acts.sum() + work.max())
    for capacity in rng.uniform(0, 1.2 * whole, 8).tolist():
        got = st.most_decoders_by_flight(table, n, bpp, capacity, 6)
        want = [max([b - a + 1 for a in range(n) for b in range(a, n)
                     if states[a:b + 1].sum() + f * acts[a:b + 1].sum() + work[a:b + 1].max() <= capacity], default=0)
                for f in range(1, 7)]
        assert got.tolist() == want
        assert got[0] == st.most_decoders(table, n, bpp, capacity)
