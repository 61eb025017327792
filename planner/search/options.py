"""Per-block-type cost arrays for the partition solver, built from the cost model's layer tables.

For every shape of a block type and every layer range [i, j) this computes exactly what the
evaluator will compute for a stage covering those layers: F+B with boundary receives, tail
(exposed gradient sync + optimizer), fixed memory and activation memory per in-flight microbatch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from planner.costmodel import stage as st
from planner.costmodel.base import CostModel, Shard
from planner.search.space import BlockType, ResourceClass, StageShape
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.partition import StageOptions, subset_options, undominated_options
from solvers.uniform_layers import kind_cells


@dataclass(frozen=True, slots=True)
class OptionContext:
    model: ModelSpec
    training: TrainingSpec
    micro_batch: int
    replicas_sync: int  # pipelines assumed when costing gradient sync (fewer = cheaper)
    replicas_mem: int  # pipelines assumed when sharding optimizer states and steps (more = cheaper)
    single_node: bool


def _range_matrix(cum: np.ndarray) -> np.ndarray:
    """M[i, j] = cum[j] - cum[i] (sum over layers i..j-1)."""
    return cum[None, :] - cum[:, None]


def _range_max(values: np.ndarray, i_idx: np.ndarray, j_idx: np.ndarray) -> np.ndarray:
    """max(values[i:j]) for each cell (i, j), j > i: row i of a running maximum over the windows
    values[i:], all rows at once (a loop over rows was a quarter of the bases' time)."""
    n = len(values)
    windows = np.concatenate([values, [-np.inf]])[_window_index(n)]  # row i: values[i:], then -inf
    return np.maximum.accumulate(windows, axis=1)[i_idx, j_idx - i_idx - 1]


@functools.lru_cache(maxsize=64)
def _window_index(n: int) -> np.ndarray:
    """(n, n) index of values[i + k] into values with one -inf appended (index n past the end)."""
    at = np.arange(n)[:, None] + np.arange(n)[None, :]
    return np.minimum(at, n)


@dataclass(frozen=True, slots=True)
class _ShapeBasis:
    """What a shape's stage costs over every layer range [i, j) (upper-triangle cells) are made of,
    apart from the replica counts: F+B with receives, the backward that hides gradient sync, the
    parameters (distinct values and where they go), memory other than optimizer states, activations."""

    fb: np.ndarray
    hidden: np.ndarray  # dp_overlap * B: the part of the sync the stage's own backward hides
    params: np.ndarray
    uniq: np.ndarray  # distinct parameter counts
    inverse: np.ndarray  # params == uniq[inverse]
    work: np.ndarray  # largest working buffer
    act: np.ndarray


def _shape_basis(cost: CostModel, rc: ResourceClass, shape: StageShape, ctx: OptionContext,
                 i_idx: np.ndarray, j_idx: np.ndarray) -> _ShapeBasis:
    knobs = cost.knobs
    n = ctx.model.num_layer_slots
    shard = Shard(shape.tp, shape.cp, shape.hp, ctx.micro_batch // shape.dp, shape.recompute, ctx.training.seq_len)
    table = cost.layer_table(rc.dev, shard, ctx.model, ctx.training)
    sums = st.StageSums.of(table)
    recv = st.recv_s(knobs, rc.dev, table, ctx.single_node)
    f = _range_matrix(sums.fwd_cum)[i_idx, j_idx] + recv * (i_idx > 0)
    b = _range_matrix(sums.bwd_cum)[i_idx, j_idx] + recv * (j_idx < n)
    params, uniq, inverse = _param_ranges(np.ascontiguousarray(sums.params_cum, dtype=float).tobytes())
    work = _work_ranges(np.ascontiguousarray(table.work_bytes, dtype=float).tobytes())
    return _ShapeBasis(f + b, knobs.dp_overlap * b, params, uniq, inverse, work,
                       _range_matrix(sums.act_cum)[i_idx, j_idx])


# Parameters and working buffers per layer take a handful of distinct values over a search's
# shapes (3-4 parameter layouts over 870-1,940 shapes on the 16-64 GPU ladder pools): their range
# arrays are computed once per distinct layout (read-only, shared) instead of once per shape,
# which was half of the bases' time (`np.unique` alone a third).
@functools.lru_cache(maxsize=256)
def _param_ranges(cum: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parameters of every layer range [i, j) (upper-triangle cells) from the cumulative counts,
    their distinct values, and where each cell's value is among them."""
    values = np.frombuffer(cum, dtype=float)
    i_idx, j_idx = _cells(len(values))
    params = _range_matrix(values)[i_idx, j_idx]
    uniq, inverse = np.unique(params, return_inverse=True)
    return _frozen(params), _frozen(uniq), _frozen(inverse)


@functools.lru_cache(maxsize=256)
def _work_ranges(work: bytes) -> np.ndarray:
    """Largest working buffer of every layer range [i, j) (upper-triangle cells)."""
    values = np.frombuffer(work, dtype=float)
    return _frozen(_range_max(values, *_cells(len(values) + 1)))


@functools.lru_cache(maxsize=64)
def _cells(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the strict upper triangle of a (size, size) table."""
    return np.triu_indices(size, k=1)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def shared_bases(bases: dict[BlockType, list[_ShapeBasis]]) -> dict[BlockType, list[_ShapeBasis]]:
    """`bases` with equal arrays made one object, so that pickling them (a frontier worker hands
    them to the parent, `BlocksProvider.frontier_part`) sends each once: of a 1,024-GPU ladder
    pool's 480 shapes per microbatch size, only the F+B arrays differ much (417 distinct); the
    hidden backward, parameters, working buffers and activations have 1-15 distinct values each,
    so 21 MB become about 3 MB, and the pipe carried about 100-200 MB/s. Same values."""
    seen: dict[tuple, np.ndarray] = {}

    def one(a: np.ndarray) -> np.ndarray:
        return seen.setdefault((a.dtype.str, a.shape, a.tobytes()), a)

    return {bt: [_ShapeBasis(*(one(getattr(b, f)) for f in _ShapeBasis.__slots__)) for b in lst]
            for bt, lst in bases.items()}


class OptionCosting:
    """Stage options of one block type's shapes for any replica counts. The parts that do not
    depend on them (`_ShapeBasis`) are computed once: a unit's solve, re-solves, refinement and
    polish each re-cost the tails for their own pipeline counts, and rebuilding everything each
    time was about 4 % of a 64-GPU search."""

    def __init__(self, cost: CostModel, rc: ResourceClass, shapes: list[StageShape], ctx: OptionContext,
                 basis: list[_ShapeBasis] | None = None) -> None:
        """`basis`: the shapes' bases as another process computed them (`basis` of an
        `OptionCosting` of the same arguments), taken instead of computing them again."""
        self.cost, self.rc, self.shapes = cost, rc, shapes
        self.model, self.training, self.single_node = ctx.model, ctx.training, ctx.single_node
        n = ctx.model.num_layer_slots
        self.shape3 = (len(shapes), n + 1, n + 1)
        self.i_idx, self.j_idx = np.triu_indices(n + 1, k=1)
        if basis is not None and len(basis) != len(shapes):
            raise ValueError(f"{len(basis)} shape bases for {len(shapes)} shapes")
        self.basis = basis if basis is not None else [_shape_basis(cost, rc, shape, ctx, self.i_idx, self.j_idx)
                                                      for shape in shapes]

    def options(self, replicas_sync: int, replicas_mem: int, tails_only: bool = False) -> StageOptions:
        """Every option with gradient sync costed for `replicas_sync` pipelines and optimizer
        states sharded over `replicas_mem`; `tails_only`: only `tail` filled (the rest is a
        read-only +inf view, no memory spent on it)."""
        knobs, zero = self.cost.knobs, self.training.zero
        i_idx, j_idx = self.i_idx, self.j_idx
        tail = np.full(self.shape3, math.inf)
        if tails_only:
            fb = mem = act = np.broadcast_to(math.inf, self.shape3)
        else:
            fb, mem, act = (np.full(self.shape3, math.inf) for _ in range(3))
        tail_parts: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        for o, (shape, basis) in enumerate(zip(self.shapes, self.basis)):
            copies_sync = st.weight_copies(replicas_sync, shape.dp, shape.cp, shape.hp)
            copies_mem = st.weight_copies(replicas_mem, shape.dp, shape.cp, shape.hp)
            key = (shape.tp, copies_sync, copies_mem)
            if key not in tail_parts:  # shapes differing only in recompute or cp/dp split share these
                sync_u = np.asarray(st.grad_sync_s(knobs, self.rc.dev, basis.uniq, shape.tp, copies_sync,
                                                   zero, self.single_node))
                opt_u = np.asarray(st.optimizer_s(knobs, self.rc.dev, basis.uniq, zero, copies_mem))
                tail_parts[key] = (sync_u[basis.inverse], opt_u[basis.inverse])
            sync, opt = tail_parts[key]
            tail[o, i_idx, j_idx] = np.maximum(0.0, sync - basis.hidden) + opt
            if tails_only:
                continue
            fb[o, i_idx, j_idx] = basis.fb
            mem[o, i_idx, j_idx] = basis.params * st.bytes_per_param(zero, copies_mem) + basis.work
            act[o, i_idx, j_idx] = basis.act
        return StageOptions(fb, tail, mem, act, float(st.memory_capacity_bytes(knobs, self.rc.dev)))


def build_options(cost: CostModel, rc: ResourceClass, shapes: list[StageShape],
                  ctx: OptionContext, tails_only: bool = False) -> StageOptions:
    """Every option of `shapes` on `rc` for the replica counts of `ctx` (`OptionCosting`, once)."""
    return OptionCosting(cost, rc, shapes, ctx).options(ctx.replicas_sync, ctx.replicas_mem, tails_only)


PrunedOptions = tuple[dict[BlockType, StageOptions], dict[BlockType, list[StageShape]], dict[BlockType, list[int]]]


def pruned_options(opts: dict[BlockType, StageOptions], shapes: dict[BlockType, list[StageShape]],
                   use_tail: bool, uniform: dict[BlockType, bool] | None = None) -> PrunedOptions:
    """Each block type's undominated options (`solvers.partition.undominated_options`), their
    shapes, and their indices into the unpruned lists. Block types marked in `uniform` (identical
    layers) are compared on the ranges their stage kinds read only (same answer, ~15x fewer cells)."""
    out_o, out_s, out_k = {}, {}, {}
    for bt, o in opts.items():
        cells = kind_cells(o.num_layers) if uniform and uniform.get(bt) else None
        keep = undominated_options(o, use_tail, cells)
        out_o[bt] = subset_options(o, keep)
        out_s[bt] = [shapes[bt][k] for k in keep]
        out_k[bt] = keep
    return out_o, out_s, out_k
