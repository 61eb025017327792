"""An exact proof that no plan fits memory, for the error a model that fits nowhere gets.

`search` says "fits nowhere" only where it can show it for every plan of the plan space, not just
for the space it searched (pipelines of a few runs). The pool's memory against the model states is
one proof; on small pools this is a sharper one. A 1F1B pipeline with m microbatches holds min(k, m)
in flight at its k-th stage from the end; a dynamic program from the last stage backwards over
(first slot covered, GPUs used of each class) finds every GPU usage with which some sequence of
stage groups -- any shape, any order, A -> B -> A included -- covers the model's layer slots within
memory (`pipeline_usages`). A plan of one pipeline runs all M = global batch / b microbatches on
it; a plan of two or more has two pipelines on disjoint GPUs, each holding at least one microbatch.
So when, for every microbatch size, no usage fits at m = M and no two usages fit at one microbatch
in flight within the pool, no plan fits. With ZeRO, optimizer states are costed sharded over one
pipeline for the first test and over the most pipelines possible for the second (less memory than
any such plan's).
"""

from __future__ import annotations

import math

import numpy as np

from planner.costmodel.base import CostModel
from planner.search.options import OptionContext, build_options
from planner.search.space import BlockType, ResourceClass, StageShape
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

MAX_CELLS = 50_000  # usage grid cells (prod of GPUs + 1 per class) the proof is tried up to


def flight_limits(mem_fixed: np.ndarray, act: np.ndarray, capacity: float) -> np.ndarray:
    """Per layer range [i, j): the most microbatches in flight any option's memory allows (0: not
    even one; very many where activations take no memory), as an (L+1, L+1) array."""
    room = capacity - mem_fixed
    safe = np.where(act > 0, act, 1.0)
    flights = np.where(act > 0, np.floor(np.maximum(room, 0.0) / safe), 1e18)
    flights = np.where(room >= 0, flights, 0.0)
    return np.nan_to_num(flights, nan=0.0, posinf=0.0).max(axis=0)


def pipeline_usages(limits: dict[BlockType, np.ndarray], avail: tuple[int, ...], micro: int) -> np.ndarray:
    """Boolean grid over GPU usages (GPUs of each class, up to `avail`): True where some pipeline of
    that exact usage holds every layer slot with `micro` microbatches, each stage's range within
    its block type's flight limits (`flight_limits`)."""
    grid = tuple(a + 1 for a in avail)
    n = next(iter(limits.values())).shape[0] - 1
    cur = [np.zeros(grid, dtype=bool) for _ in range(n + 1)]  # cur[j]: usages covering [j, n)
    cur[n][(0,) * len(avail)] = True
    found = np.zeros(grid, dtype=bool)
    for k in range(1, sum(avail) + 1):  # the k-th stage from the end holds min(k, micro)
        flight = min(k, micro)
        nxt = [np.zeros(grid, dtype=bool) for _ in range(n + 1)]
        for j in range(1, n + 1):
            if not cur[j].any():
                continue
            for bt, lim in limits.items():
                starts = np.flatnonzero(lim[:j, j] >= flight)
                if not len(starts) or bt.gpus >= grid[bt.cls]:
                    continue
                shifted = np.zeros(grid, dtype=bool)
                src = [slice(None)] * len(grid)
                dst = [slice(None)] * len(grid)
                src[bt.cls] = slice(0, grid[bt.cls] - bt.gpus)
                dst[bt.cls] = slice(bt.gpus, None)
                shifted[tuple(dst)] = cur[j][tuple(src)]
                for i in starts.tolist():
                    nxt[i] |= shifted
        found |= nxt[0]
        if not any(a.any() for a in nxt[1:]):
            break
        cur = nxt
    return found


def two_fit(usages: np.ndarray, avail: tuple[int, ...]) -> bool:
    """Whether two usages of the grid fit the pool together (u1 + u2 <= avail)."""
    below = usages.copy()  # below[v]: some usage <= v
    for axis in range(below.ndim):
        below = np.logical_or.accumulate(below, axis=axis)
    rest = below[tuple(slice(None, None, -1) for _ in avail)]  # rest[u]: some usage <= avail - u
    return bool((usages & rest).any())


def fits_nowhere(cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
                 types_by_size: dict[int, dict[BlockType, list[StageShape]]], single_node: bool) -> bool:
    """True when the module doc's proof shows that no plan fits; False when it does not (a plan
    may fit) or the pool is too large to try (more than `MAX_CELLS` usages)."""
    avail = tuple(rc.gpus for rc in classes)
    if math.prod(a + 1 for a in avail) > MAX_CELLS:
        return False
    most = max(1, sum(avail))
    for b, types in sorted(types_by_size.items()):
        if not types:
            continue
        micro = training.global_batch // b
        limits = _limits(cost, model, training, classes, types, b, 1, single_node)
        if pipeline_usages(limits, avail, micro).any():
            return False  # one pipeline may fit
        if micro > 1:
            if training.zero:  # sharded states: less memory with more pipelines
                limits = _limits(cost, model, training, classes, types, b, most, single_node)
            if two_fit(pipeline_usages(limits, avail, 1), avail):
                return False  # two may
    return True


def _limits(cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
            types: dict[BlockType, list[StageShape]], micro_batch: int, replicas: int,
            single_node: bool) -> dict[BlockType, np.ndarray]:
    """Each block type's flight limits with optimizer states sharded over `replicas` pipelines."""
    ctx = OptionContext(model, training, micro_batch, 1, replicas, single_node)
    out = {}
    for bt, shapes in types.items():
        opts = build_options(cost, classes[bt.cls], shapes, ctx)
        out[bt] = flight_limits(opts.mem_fixed, opts.act, opts.capacity)
    return out
