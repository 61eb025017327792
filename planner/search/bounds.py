"""A cheap lower bound on the pipeline time that holds for every plan: used when a time limit stops
the search before every (microbatch size, replica count) has been solved, and to leave out of the
split frontiers the splits no plan at such a time gains from (`solvers.horizon.Horizon`).

Fluid bound: every layer must run M·b sequences forward and backward somewhere; a GPU of class c
spends at least w[l, c] GPU-seconds per microbatch of layer l (its best shape, times the shape's GPU
count, communication included but no boundary receives). A stage's F+B is the sum of its layers'
plus receives, and a pipeline of m microbatches keeps each stage's GPUs busy m·(F+B) within its
pipeline time, so minimising T subject to the class capacities N_c·T is an LP whose optimum no plan
can beat (the search adds the fixed per-step overhead for a bound on the step).

Memory bounds (`memory_bound_s`, `solvers.memory_bound`): the fluid bound lets a GPU work on any
layer; a stage runs only the layers it holds, at most as many as fit its memory. Where few fit
(Llama-2 70B at 64k tokens on 86 GPUs of six types, whose one plan is a pipeline of five runs
that no bound of the coverage speaks for) they lift the bound from 82.9 s to 226 s, and to 294 s
with each stage's microbatches in flight (`solvers.flight_bound`, where one pipeline is the only plan).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from planner.costmodel import stage as st
from planner.costmodel.base import CostModel, LayerTable, Shard
from planner.search.space import ResourceClass, StageShape
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.flight_bound import FlightLimits, one_pipeline_flights_s
from solvers.memory_bound import ShapeLimits, capped_fluid_s, one_pipeline_s

FLUID_MARGIN = 1e-9  # bounds are shrunk by this much (relative) against rounding


def fluid_work(cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
               shapes: Iterable[tuple[int, StageShape]], micro_batch: int) -> np.ndarray:
    """(layer slots, classes) least GPU-seconds per microbatch of each layer on each class over
    the (class index, shape) pairs given (inf where none), without boundary receives."""
    work = np.full((model.num_layer_slots, len(classes)), np.inf)
    for cls, shape in shapes:
        table = cost.layer_table(classes[cls].dev, Shard(shape.tp, shape.cp, shape.hp, micro_batch // shape.dp,
                                                         shape.recompute, training.seq_len), model, training)
        work[:, cls] = np.minimum(work[:, cls], (table.fwd_s + table.bwd_s) * shape.gpus)
    return work


def fluid_bound_s(work: np.ndarray, gpus: np.ndarray, microbatches: int) -> float:
    """work: (layers, classes) GPU-seconds per microbatch (inf = cannot run); gpus: (classes,)."""
    import pulp

    n_layers, n_classes = work.shape
    prob = pulp.LpProblem("fluid", pulp.LpMinimize)
    t = pulp.LpVariable("t", 0)
    y = {(l, c): pulp.LpVariable(f"y_{l}_{c}", 0) for l in range(n_layers) for c in range(n_classes)
         if np.isfinite(work[l, c])}
    prob += t
    for l in range(n_layers):
        prob += pulp.lpSum(y[(l, c)] for c in range(n_classes) if (l, c) in y) == microbatches
    for c in range(n_classes):
        prob += pulp.lpSum(float(work[l, c]) * y[(l, c)] for l in range(n_layers) if (l, c) in y) <= float(gpus[c]) * t
    prob.solve(pulp.PULP_CBC_CMD(msg=False))
    if prob.sol_status != pulp.LpSolutionOptimal:
        return 0.0
    return max(0.0, float(t.value() or 0.0) * (1 - 1e-9))


def weighted_work_bound_s(work: np.ndarray, gpus: np.ndarray, microbatches: int) -> float:
    """A lower bound on `fluid_bound_s` without an LP solver: for any class weights v >= 0 with
    sum_c N_c·v_c = 1, summing the capacity rows times v gives T >= M·sum_l min_c v_c·w[l, c]
    (weak duality). Weights proportional to each class's speed (1 / its total work over the
    layers it can run) make this the fluid bound itself when the classes' costs are proportional;
    it is the search's frontier horizon (`solvers.horizon.Horizon`), where a slightly lower bound
    costs little and an LP solver's import (0.1 s) would cost more."""
    finite = np.isfinite(work)
    if not np.all(finite.any(axis=1)):
        return 0.0  # some layer runs nowhere
    total = np.where(finite, work, 0.0).sum(axis=0)
    speed = np.where(finite.any(axis=0) & (total > 0), 1.0 / np.where(total > 0, total, 1.0), 0.0)
    scale = float(np.dot(gpus, speed))
    if scale <= 0:
        return 0.0
    weighted = np.where(finite, work * (speed / scale)[None, :], np.inf)
    return max(0.0, float(microbatches * weighted.min(axis=1).sum()) * (1 - FLUID_MARGIN))


def _shape_rows(cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
                shapes: Iterable[tuple[int, StageShape]], micro_batch: int
                ) -> Iterator[tuple[int, int, float, LayerTable, float, float]]:
    """Per (class index, shape) pair: class, GPUs, least decoder F+B per microbatch (one GPU's
    time, which is the stage's), its layer table, bytes per parameter (optimizer states sharded as
    over every GPU of the pool, the most any plan shards them) and its GPUs' memory."""
    n_dec = model.num_layers
    replicas = sum(rc.gpus for rc in classes)  # no plan has more weight copies than GPUs
    for cls, shape in shapes:
        dev = classes[cls].dev
        table = cost.layer_table(dev, Shard(shape.tp, shape.cp, shape.hp, micro_batch // shape.dp, shape.recompute,
                                            training.seq_len), model, training)
        bpp = st.bytes_per_param(training.zero, st.weight_copies(replicas, shape.dp, shape.cp, shape.hp))
        yield (cls, shape.gpus, float(np.min((table.fwd_s + table.bwd_s)[1:n_dec + 1])), table, bpp,
               st.memory_capacity_bytes(cost.knobs, dev))


def shape_limits(cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
                 shapes: Iterable[tuple[int, StageShape]], micro_batch: int) -> ShapeLimits:
    """Per (class index, shape) pair: its GPUs, its least decoder F+B per microbatch and the most
    decoder layers it holds with one microbatch in flight (`stage.most_decoders`), for
    `solvers.memory_bound`."""
    n_dec = model.num_layers
    rows = [(cls, gpus, t, st.most_decoders(table, n_dec, bpp, capacity))
            for cls, gpus, t, table, bpp, capacity in _shape_rows(cost, model, training, classes, shapes, micro_batch)]
    cols = list(zip(*rows)) if rows else [(), (), (), ()]
    return ShapeLimits.of(*(np.array(c) for c in cols))


def plan_positions(model: ModelSpec, classes: list[ResourceClass]) -> int:
    """The most stages a pipeline can have: each holds a layer slot and a GPU."""
    return min(model.num_layer_slots, sum(rc.gpus for rc in classes))


def flight_limits(cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
                  shapes: Iterable[tuple[int, StageShape]], micro_batch: int) -> FlightLimits:
    """`shape_limits` with the most decoders held at every in-flight count a one-pipeline plan's
    stages can have (1 to min(stages, microbatches); `stage.most_decoders_by_flight`), for
    `solvers.flight_bound`."""
    n_dec = model.num_layers
    flights = max(1, min(plan_positions(model, classes), training.global_batch // micro_batch))
    rows = [(cls, gpus, t, st.most_decoders_by_flight(table, n_dec, bpp, capacity, flights))
            for cls, gpus, t, table, bpp, capacity in _shape_rows(cost, model, training, classes, shapes, micro_batch)]
    if not rows:
        return FlightLimits.of(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros((0, flights)))
    cls, gpus, t, d = zip(*rows)
    return FlightLimits.of(np.array(cls), np.array(gpus), np.array(t), np.array(d))


def memory_bound_s(limits: ShapeLimits, gpus: np.ndarray, n_dec: int, microbatches: int,
                   flights: Callable[[], FlightLimits] | None = None, positions: int = 0) -> float:
    """A bound on every plan's pipeline time at this microbatch size from decoder speed and memory
    (`solvers.memory_bound`: the capped fluid bound, and the one-pipeline bound where memory holds
    fewer than two copies of the decoders, there also with each stage's in-flight microbatches,
    `solvers.flight_bound`, when `flights` gives their limits and `positions` the most stages);
    inf where not even one copy fits."""
    if n_dec <= 0:
        return 0.0
    capped = capped_fluid_s(limits, gpus, n_dec, microbatches)
    single = one_pipeline_s(limits, gpus, n_dec, microbatches)
    if single is None:
        return capped
    if flights is not None and math.isfinite(single) and positions > 0:
        single = max(single, one_pipeline_flights_s(flights(), gpus, n_dec, microbatches, positions))
    return max(capped, single)
