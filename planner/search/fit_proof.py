"""An exact proof that no plan fits memory, for the error a model that fits nowhere gets.

`search` says "fits nowhere" only where it can show it for every plan of the plan space, not just
for the space it searched (pipelines of a few runs). The pool's memory against the model states is
one proof; on pools of up to `MAX_CELLS` GPU usages this is a sharper one. A 1F1B pipeline with m
microbatches holds min(k, m) in flight at its k-th stage from the end; a dynamic program from the
last stage backwards over (first slot covered, GPUs used of each class) finds every GPU usage with
which some sequence of stage groups -- any shape, any order, A -> B -> A included -- covers the
model's layer slots within memory (`pipeline_usages`). A plan of one pipeline runs all
M = global batch / b microbatches on it; a plan of R >= 2 has R pipelines on disjoint GPUs, each
holding at least one microbatch. And R pipelines share the M microbatches, so one of them runs at
least ceil(M / R). R >= 2 is taken in ranges [lo, hi] (each count alone up to `EXACT_COUNTS`, then
[lo, 2·lo - 1]; R at most M and the pool's GPUs): a plan of the range holds lo pipelines that fit
the pool together, one of them a usage at m = ceil(M / hi) microbatches and the others at one
(`fold_fits`); where no such lo fit, no plan of the range does. With ZeRO, optimizer states (ZeRO-2:
gradients too, ZeRO-3: weights too) are sharded over the R pipelines, so less memory per GPU the
more there are: each range's states are sharded over its hi (less memory than any of its plans', so
more usages fit). Llama-2 70B at 64k tokens with ZeRO-1 on 76 GPUs (`many_types.py --seed 20` pool
20) is shown to fit nowhere so; with the states sharded over 76 pipelines for every R, two usages
did fit and the proof had failed. The 7 `oracle_fuzz.py --seed 42` draws without a plan that ranges
of two or more counts (states sharded over 2·lo - 1, even past the pool's GPUs) had left open are
all shown now: 6 by the counts taken one by one, 1 by capping a range at the pool's GPU count. The
76-GPU pool's proof takes 1.3 s (2.7 s before, in ranges, stage count by stage count:
`pipeline_usages`).

A pool of more than `MAX_CELLS` usages is proved on classes pooled by memory per GPU
(`merged_classes`, a relaxation: weaker, never wrong). Llama-2 70B at 32k tokens on 84 GPUs of
four types (`many_types.py --seed 23` pool 17, 127,413 usages) is shown to fit nowhere with its
two 24 GB classes pooled, in about a second; `api.search` asks for the proof before the engine
candidates, which cannot fit where nothing does (at 256k tokens on 832 T4, V100-16GB and L4
GPUs the error came after 64 s, most of it the Megatron grids without a cutoff; now 1.3 s).
"""

from __future__ import annotations

import math

import numpy as np

from planner.costmodel import stage as st
from planner.costmodel.base import CostModel
from planner.search.options import OptionContext, build_options
from planner.search.space import BlockType, ResourceClass, StageShape
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

MAX_CELLS = 50_000  # usage grid cells (prod of GPUs + 1 per class) the proof is tried up to
EXACT_COUNTS = 8  # pipeline counts the proof takes one by one (above, in ranges [lo, 2 lo - 1])


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
    its block type's flight limits (`flight_limits`).

    The k-th stage from the end holds min(k, `micro`): the last `micro` - 1 stages are taken one
    count of stages at a time, every stage before them at `micro` in flight, so those are one
    pass over the slots from the back (a stage [i, j) extends every suffix from j), whatever their
    number: the proof of a 76-GPU pool took 29 of these grids, 3.6 s stage count by stage count."""
    grid = tuple(a + 1 for a in avail)
    n = next(iter(limits.values())).shape[0] - 1
    cur = [np.zeros(grid, dtype=bool) for _ in range(n + 1)]  # cur[j]: usages of k stages covering [j, n)
    cur[n][(0,) * len(avail)] = True
    found = np.zeros(grid, dtype=bool)

    def extend(suffix: np.ndarray, j: int, flight: int, into: list[np.ndarray]) -> None:
        """Add one stage [i, j) of every block type that holds `flight` there before `suffix`."""
        for bt, lim in limits.items():
            starts = np.flatnonzero(lim[:j, j] >= flight)
            if not len(starts) or bt.gpus >= grid[bt.cls]:
                continue
            shifted = np.zeros(grid, dtype=bool)
            src = [slice(None)] * len(grid)
            dst = [slice(None)] * len(grid)
            src[bt.cls] = slice(0, grid[bt.cls] - bt.gpus)
            dst[bt.cls] = slice(bt.gpus, None)
            shifted[tuple(dst)] = suffix[tuple(src)]
            if shifted.any():
                for i in starts.tolist():
                    into[i] |= shifted

    for k in range(1, min(micro, sum(avail) + 1)):  # the last micro - 1 stages, k-th from the end
        if not any(c.any() for c in cur):
            break  # no suffix of k - 1 stages fits, so none of more: each later round would be empty
        nxt = [np.zeros(grid, dtype=bool) for _ in range(n + 1)]
        for j in range(1, n + 1):
            if cur[j].any():
                extend(cur[j], j, k, nxt)
        found |= nxt[0]
        cur = nxt
    # every earlier stage holds `micro`: reach[j] gathers suffixes from j of any further length
    reach = [np.zeros(grid, dtype=bool) for _ in range(n + 1)]
    for j in range(n, 0, -1):
        suffix = cur[j] | reach[j]
        if suffix.any():
            extend(suffix, j, micro, reach)
    return found | reach[0]


def fold_fits(usages: np.ndarray, avail: tuple[int, ...], count: int, first: np.ndarray | None = None) -> bool:
    """Whether `count` usages of the grid (repeats allowed) fit the pool together (sum <= avail);
    with `first`, one of them from that grid and the other `count` - 1 from `usages`.

    Works on upward closures: `reach[v]` says some sum of k usages is <= v. Adding one more usage
    only needs the minimal usages (none other below them), each a shift of `reach`."""
    reach = (usages if first is None else first).copy()
    for axis in range(reach.ndim):
        reach = np.logical_or.accumulate(reach, axis=axis)
    closed = usages.copy()
    for axis in range(closed.ndim):
        closed = np.logical_or.accumulate(closed, axis=axis)
    above_other = np.zeros_like(closed)  # v lies above some usage other than v
    for axis in range(closed.ndim):
        src = [slice(None)] * closed.ndim
        dst = [slice(None)] * closed.ndim
        src[axis], dst[axis] = slice(0, -1), slice(1, None)
        above_other[tuple(dst)] |= closed[tuple(src)]
    minimal = [tuple(int(x) for x in u) for u in np.argwhere(usages & ~above_other)]
    for _ in range(count - 1):
        if not reach.any():
            return False
        nxt = np.zeros_like(reach)
        for u in minimal:
            src = tuple(slice(0, a + 1 - x) for a, x in zip(avail, u))
            dst = tuple(slice(x, a + 1) for a, x in zip(avail, u))
            nxt[dst] |= reach[src]
        reach = nxt
    return bool(reach[avail])


def merged_classes(capacity: list[float], gpus: list[int], max_cells: int | None = None) -> list[list[int]] | None:
    """Classes pooled into groups until the usage grid has at most `max_cells` cells (default
    `MAX_CELLS`; None where even one group would not), as lists of class indices, ascending.

    Pooling is a relaxation: a pooled class offers its members' GPUs together, and each stage
    group of a member keeps its own flight limits, so every plan of the pool is still a plan of
    the pooled one (the same stages, usages summed) and a proof that the pooled pool holds no plan
    holds for the pool. It weakens the proof only where a member's stages could take GPUs of
    another member, so the two groups whose memory per GPU is closest pool first (ties: fewer
    GPUs, then the lower index)."""
    limit = MAX_CELLS if max_cells is None else max_cells
    groups = [[i] for i in range(len(gpus))]

    def cells() -> int:
        return math.prod(sum(gpus[i] for i in g) + 1 for g in groups)

    while cells() > limit:
        if len(groups) == 1:
            return None
        pairs = [(max(capacity[i] for i in groups[x] + groups[y]) / min(capacity[i] for i in groups[x] + groups[y]),
                  sum(gpus[i] for i in groups[x] + groups[y]), x, y)
                 for x in range(len(groups)) for y in range(x + 1, len(groups))]
        _, _, x, y = min(pairs)
        groups[x] = sorted(groups[x] + groups.pop(y))
    return groups


def pooled_limits(limits: dict[BlockType, np.ndarray], group_of: list[int]) -> dict[BlockType, np.ndarray]:
    """`limits` with each block type moved to its class's group (`group_of[cls]`); two block types
    that land on one key (same group, same GPUs) hold what either holds (elementwise max)."""
    out: dict[BlockType, np.ndarray] = {}
    for bt, lim in limits.items():
        key = BlockType(group_of[bt.cls], bt.gpus)
        out[key] = lim if key not in out else np.maximum(out[key], lim)
    return out


def fits_nowhere(cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
                 types_by_size: dict[int, dict[BlockType, list[StageShape]]], single_node: bool) -> bool:
    """True when the module doc's proof shows that no plan fits; False when it does not (a plan
    may fit) or the pool is too large to try even with its classes pooled (`merged_classes`):
    a pool of more than `MAX_CELLS` usages is proved on pooled classes (a relaxation, weaker)."""
    groups = merged_classes([st.memory_capacity_bytes(cost.knobs, rc.dev) for rc in classes],
                            [rc.gpus for rc in classes])
    if groups is None:
        return False
    group_of = [0] * len(classes)
    for k, g in enumerate(groups):
        for i in g:
            group_of[i] = k
    avail = tuple(sum(classes[i].gpus for i in g) for g in groups)

    def limits_at(types: dict[BlockType, list[StageShape]], b: int, replicas: int) -> dict[BlockType, np.ndarray]:
        return pooled_limits(_limits(cost, model, training, classes, types, b, replicas, single_node), group_of)

    for b, types in sorted(types_by_size.items()):
        if not types:
            continue
        micro = training.global_batch // b
        limits = limits_at(types, b, 1)
        if pipeline_usages(limits, avail, micro).any():
            return False  # one pipeline may fit
        singles = None  # usages at one microbatch; without ZeRO memory does not depend on R
        for lo, hi in count_ranges(micro, sum(avail)):
            if training.zero:
                limits = limits_at(types, b, hi)
            if training.zero or singles is None:
                singles = pipeline_usages(limits, avail, 1)
            # lo usages at one microbatch each fit first (else no plan of the range does), then with
            # one of them at ceil(M / hi): the second grid costs a DP of its own
            if fold_fits(singles, avail, lo) and \
                    fold_fits(singles, avail, lo, first=pipeline_usages(limits, avail, -(-micro // hi))):
                return False  # lo to hi pipelines may fit
    return True


def count_ranges(micro: int, gpus: int) -> list[tuple[int, int]]:
    """The ranges [lo, hi] of pipeline counts R >= 2 the proof takes (R at most `micro`, the
    microbatches, and `gpus`): one count each up to `EXACT_COUNTS`, then [lo, 2 lo - 1]."""
    top = min(micro, gpus)
    out, lo = [], 2
    while lo <= top:
        hi = lo if lo <= EXACT_COUNTS else min(2 * lo - 1, top)
        out.append((lo, hi))
        lo = hi + 1
    return out


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
