"""Per-block-type cost arrays for the partition solver, built from the cost model's layer tables.

For every shape of a block type and every layer range [i, j) this computes exactly what the
evaluator will compute for a stage covering those layers: F+B with boundary receives, tail
(exposed gradient sync + optimizer), fixed memory and activation memory per in-flight microbatch.
Where every decoder layer costs the same (`OptionCosting.uniform`), the sweeps over identical layers
read only the ranges the stage kinds stand for (`uniform_layers.kind_cells`, about 3n of the n²/2):
`OptionCosting.kind_options` costs those alone, the same values cell for cell.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from planner.costmodel import stage as st
from planner.costmodel.base import CostModel, DeviceClass, Shard
from planner.search.space import BlockType, ResourceClass, StageShape
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.partition import StageOptions, subset_options, undominated_options
from solvers.uniform_layers import KindCellOptions, kind_cells


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
    """What a shape's stage costs over any layer range [i, j) are made of, apart from the replica
    counts: prefix sums of forward, backward and activations (`st.StageSums`), the receive time,
    the parameters' prefix sums and each layer's working buffer (a handful of distinct layouts,
    whose range tables are computed once: `_param_ranges`, `_work_ranges`), and whether every
    decoder layer costs the same in each of them (then a middle range costs what [1, 1 + d) of
    its length does: `OptionCosting.uniform`)."""

    fwd_cum: np.ndarray
    bwd_cum: np.ndarray
    act_cum: np.ndarray
    params_cum: np.ndarray
    work: np.ndarray  # per layer
    recv: float
    uniform: bool


def _shape_basis(cost: CostModel, rc: ResourceClass, shape: StageShape, ctx: OptionContext) -> _ShapeBasis:
    shard = Shard(shape.tp, shape.cp, shape.hp, ctx.micro_batch // shape.dp, shape.recompute, ctx.training.seq_len)
    return _shard_basis(cost, rc.dev, shard, ctx.model, ctx.training, ctx.single_node)


# a frontier worker costs several microbatch sizes, whose shapes share shards (size 2 with dp 2
# runs size 1's shard): each shard's basis is computed once per process
@functools.lru_cache(maxsize=4096)
def _shard_basis(cost: CostModel, dev: DeviceClass, shard: Shard, model: ModelSpec, training: TrainingSpec,
                 single_node: bool) -> _ShapeBasis:
    n = model.num_layer_slots
    table = cost.layer_table(dev, shard, model, training)
    sums = st.StageSums.of(table)
    recv = st.recv_s(cost.knobs, dev, table, single_node)
    per_layer = np.array([table.fwd_s, table.bwd_s, table.params_per_gpu, table.act_bytes, table.work_bytes],
                         dtype=float)
    uniform = n >= 3 and bool(np.all(per_layer[:, 1:n - 1] == per_layer[:, 1:2]))
    return _ShapeBasis(sums.fwd_cum, sums.bwd_cum, sums.act_cum, np.ascontiguousarray(sums.params_cum, dtype=float),
                       np.ascontiguousarray(table.work_bytes, dtype=float), float(recv), uniform)


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
    them to the parent, `BlocksProvider.frontier_part`) sends each once (parameter layouts and
    working buffers have a handful of distinct values over a search's shapes). Same values."""
    seen: dict[tuple, np.ndarray] = {}

    def one(a: object) -> object:
        if not isinstance(a, np.ndarray):
            return a
        return seen.setdefault((a.dtype.str, a.shape, a.tobytes()), a)

    return {bt: [_ShapeBasis(*(one(getattr(b, f)) for f in _ShapeBasis.__slots__)) for b in lst]
            for bt, lst in bases.items()}


@dataclass(frozen=True, slots=True)
class _Stacked:
    """`OptionCosting`'s bases stacked over its shapes (O of them)."""

    fwd_cum: np.ndarray  # (O, L+1)
    bwd_cum: np.ndarray
    act_cum: np.ndarray
    recv: np.ndarray  # (O,)
    params: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # per parameter layout: `_param_ranges`
    params_of: np.ndarray  # (O,) each shape's layout
    work: list[np.ndarray]  # per working-buffer layout: `_work_ranges`
    work_of: np.ndarray  # (O,)
    firsts: list[int]  # the first shape of each distinct (tp, weight copies per replica)
    row_of: np.ndarray  # (O,) each shape's among them


@dataclass(frozen=True, slots=True)
class _CellValues:
    """What the options cost on some layer ranges, apart from the replica counts: (O, cells)."""

    fb: np.ndarray
    hidden: np.ndarray  # dp_overlap * B: the part of the sync the stage's own backward hides
    act: np.ndarray
    params: np.ndarray
    inverse: np.ndarray  # each cell's parameters among its layout's distinct values (`_param_ranges`)
    work: np.ndarray  # largest working buffer


def _layouts(arrays: list[np.ndarray]) -> tuple[list[bytes], np.ndarray]:
    """The distinct arrays (as bytes, first-seen order) and each one's among them."""
    at: dict[bytes, int] = {}
    of = [at.setdefault(a.tobytes(), len(at)) for a in arrays]
    return list(at), np.array(of, dtype=np.int64)


def _share_groups(shapes: list[StageShape]) -> tuple[list[int], np.ndarray]:
    """Shapes whose tails' parts are the same at every replica count: those with the same tp
    (parameters per GPU) and the same weight copies per replica (`st.weight_copies`, which
    multiplies the replicas by them). The first shape of each, and each shape's group."""
    at: dict[tuple[int, int], int] = {}
    firsts: list[int] = []
    row_of = []
    for o, s in enumerate(shapes):
        key = (s.tp, st.weight_copies(1, s.dp, s.cp, s.hp))
        if key not in at:
            at[key] = len(firsts)
            firsts.append(o)
        row_of.append(at[key])
    return firsts, np.array(row_of, dtype=np.int64)


class OptionCosting:
    """Stage options of one block type's shapes for any replica counts. The parts that do not
    depend on them (`_ShapeBasis`) are computed once: a unit's solve, re-solves, refinement and
    polish each re-cost the tails for their own pipeline counts, and rebuilding everything each
    time was about 4 % of a 64-GPU search. Every shape at once: one array operation per field
    over the stacked bases (`_Stacked`), on the ranges asked for (`_values_at`)."""

    def __init__(self, cost: CostModel, rc: ResourceClass, shapes: list[StageShape], ctx: OptionContext,
                 basis: list[_ShapeBasis] | None = None) -> None:
        """`basis`: the shapes' bases as another process computed them (`basis` of an
        `OptionCosting` of the same arguments), taken instead of computing them again."""
        self.cost, self.rc, self.shapes = cost, rc, shapes
        self.model, self.training, self.single_node = ctx.model, ctx.training, ctx.single_node
        n = ctx.model.num_layer_slots
        self.n = n
        self.shape3 = (len(shapes), n + 1, n + 1)
        if basis is not None and len(basis) != len(shapes):
            raise ValueError(f"{len(basis)} shape bases for {len(shapes)} shapes")
        self.basis = basis if basis is not None else [_shape_basis(cost, rc, shape, ctx) for shape in shapes]
        # every decoder layer the same in every shape: a middle range costs what [1, 1 + d) does
        self.uniform = n >= 3 and all(b.uniform for b in self.basis)
        self._stacked: _Stacked | None = None
        self._values: dict[object, _CellValues] = {}
        self._full: tuple[np.ndarray, np.ndarray] | None = None  # F+B and activations, (O, L+1, L+1)

    def options(self, replicas_sync: int, replicas_mem: int, tails_only: bool = False) -> StageOptions:
        """Every option with gradient sync costed for `replicas_sync` pipelines and optimizer
        states sharded over `replicas_mem`; `tails_only`: only `tail` filled (the rest is a
        read-only +inf view, no memory spent on it). F+B and activations do not depend on the
        replica counts: every call shares one read-only copy of each."""
        values = self._values_at("all")
        tail, mem = self._tail_mem(values, replicas_sync, replicas_mem, tails_only)
        capacity = float(st.memory_capacity_bytes(self.cost.knobs, self.rc.dev))
        if tails_only:
            none = np.broadcast_to(math.inf, self.shape3)
            return StageOptions(none, self._spread(tail), none, none, capacity)
        if self._full is None:
            fb, act = self._spread(values.fb), self._spread(values.act)
            fb.flags.writeable = act.flags.writeable = False
            self._full = (fb, act)
        assert mem is not None
        return StageOptions(self._full[0], self._spread(tail), self._spread(mem), self._full[1], capacity)

    def kind_options(self, replicas_sync: int, replicas_mem: int, tails_only: bool = False) -> KindCellOptions:
        """`options` on the kind cells only (`uniform_layers.kind_cells`), for identical layers
        (`uniform`): what the batched sweeps read, the same values; `expand` gives `options`."""
        if not self.uniform:
            raise ValueError("kind options need identical decoder layers")
        values = self._values_at("kind")
        tail, mem = self._tail_mem(values, replicas_sync, replicas_mem, tails_only)
        capacity = float(st.memory_capacity_bytes(self.cost.knobs, self.rc.dev))
        expand = partial(self.options, replicas_sync, replicas_mem, tails_only)
        if tails_only:
            none = np.broadcast_to(math.inf, tail.shape)
            return KindCellOptions(none, tail, none, none, capacity, self.n, expand)
        assert mem is not None
        return KindCellOptions(values.fb, tail, mem, values.act, capacity, self.n, expand)

    def tails_at(self, replicas_sync: int, replicas_mem: int, key: object, first: np.ndarray,
                 end: np.ndarray) -> np.ndarray:
        """Tails of every option on the ranges [first, end) (the cells `key` names, for reuse):
        (O, cells), as `options` costs them there."""
        values = self._values_at(key, first, end)
        return self._tail_mem(values, replicas_sync, replicas_mem, True)[0]

    def _tail_mem(self, values: _CellValues, replicas_sync: int, replicas_mem: int,
                  tails_only: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Tails and fixed memory (None with `tails_only`) on the cells of `values`."""
        knobs, zero = self.cost.knobs, self.training.zero
        if replicas_sync < 1 or replicas_mem < 1:
            raise ValueError(f"replica counts must be at least 1, got {replicas_sync} and {replicas_mem}")
        stacked = self._stack()
        sync_rows, opt_rows, bpp = [], [], []
        for o in stacked.firsts:  # each part shared by the shapes of one (tp, weight copies): costed once
            shape, uniq = self.shapes[o], stacked.params[stacked.params_of[o]][1]
            copies_sync = st.weight_copies(replicas_sync, shape.dp, shape.cp, shape.hp)
            copies_mem = st.weight_copies(replicas_mem, shape.dp, shape.cp, shape.hp)
            sync_u = np.asarray(st.grad_sync_s(knobs, self.rc.dev, uniq, shape.tp, copies_sync, zero, self.single_node))
            opt_u = np.asarray(st.optimizer_s(knobs, self.rc.dev, uniq, zero, copies_mem))
            sync_rows.append(sync_u[values.inverse[o]])
            opt_rows.append(opt_u[values.inverse[o]])
            bpp.append(st.bytes_per_param(zero, copies_mem))
        row_of, cells = stacked.row_of, values.hidden.shape[1]
        sync, opt = _per_shape(sync_rows, row_of, cells), _per_shape(opt_rows, row_of, cells)
        tail = np.maximum(0.0, sync - values.hidden) + opt
        if tails_only:
            return tail, None
        return tail, values.params * np.array(bpp)[row_of][:, None] + values.work

    def _values_at(self, key: object, first: np.ndarray | None = None, end: np.ndarray | None = None) -> _CellValues:
        """`_CellValues` on the cells `key` names: "all" (the upper triangle, row by row), "kind"
        (`kind_cells`), else [first, end) (computed once per key)."""
        if key not in self._values:
            n = self.n
            if key == "all":
                first, end = _cells(n + 1)
            elif key == "kind":
                first, end = kind_cells(n)
            assert first is not None and end is not None
            s = self._stack()
            at = _cell_index(n + 1)[first, end]  # the cells' places in the upper triangle
            recv = s.recv[:, None]
            f = (s.fwd_cum[:, end] - s.fwd_cum[:, first]) + recv * (first > 0)
            b = (s.bwd_cum[:, end] - s.bwd_cum[:, first]) + recv * (end < n)
            params, inverse, work = (_per_shape([x[at] for x in xs], of, len(at)) for xs, of in (
                ([p[0] for p in s.params], s.params_of), ([p[2] for p in s.params], s.params_of), (s.work, s.work_of)))
            values = _CellValues(f + b, self.cost.knobs.dp_overlap * b, s.act_cum[:, end] - s.act_cum[:, first],
                                 params, inverse, work)
            for a in (values.fb, values.hidden, values.act, values.params, values.inverse, values.work):
                a.flags.writeable = False  # shared: `kind_options` hands out its F+B and activations
            self._values[key] = values
        return self._values[key]

    def _spread(self, cells: np.ndarray) -> np.ndarray:
        """(O, cells) values on the upper-triangle cells as (O, L+1, L+1), +inf elsewhere."""
        out = np.full(self.shape3, math.inf)
        i, j = _cells(self.n + 1)
        out.reshape(self.shape3[0], -1)[:, i * (self.n + 1) + j] = cells
        return out

    def _stack(self) -> _Stacked:
        """The shapes' bases stacked (computed once)."""
        if self._stacked is None:
            basis, n = self.basis, self.n

            def rows(field: str) -> np.ndarray:
                return np.array([getattr(b, field) for b in basis], dtype=float).reshape(len(basis), n + 1)
            params, params_of = _layouts([b.params_cum for b in basis])
            work, work_of = _layouts([b.work for b in basis])
            self._stacked = _Stacked(rows("fwd_cum"), rows("bwd_cum"), rows("act_cum"),
                                     np.array([b.recv for b in basis], dtype=float),
                                     [_param_ranges(p) for p in params], params_of,
                                     [_work_ranges(w) for w in work], work_of, *_share_groups(self.shapes))
        return self._stacked


def _per_shape(rows: list[np.ndarray], of: np.ndarray, cells: int) -> np.ndarray:
    """(O, cells): row `of[o]` of `rows` for each shape o (no shape: an empty array)."""
    return np.stack(rows)[of] if rows else np.zeros((0, cells))


@functools.lru_cache(maxsize=64)
def _cell_index(size: int) -> np.ndarray:
    """(size, size): each upper-triangle cell's place in `_cells(size)` order (-1 elsewhere)."""
    out = np.full((size, size), -1, dtype=np.int64)
    i, j = _cells(size)
    out[i, j] = np.arange(len(i))
    return out


def build_options(cost: CostModel, rc: ResourceClass, shapes: list[StageShape],
                  ctx: OptionContext, tails_only: bool = False) -> StageOptions:
    """Every option of `shapes` on `rc` for the replica counts of `ctx` (`OptionCosting`, once)."""
    return OptionCosting(cost, rc, shapes, ctx).options(ctx.replicas_sync, ctx.replicas_mem, tails_only)


PrunedOptions = tuple[dict[BlockType, StageOptions | KindCellOptions], dict[BlockType, list[StageShape]],
                      dict[BlockType, list[int]]]


def pruned_options(opts: dict[BlockType, StageOptions | KindCellOptions], shapes: dict[BlockType, list[StageShape]],
                   use_tail: bool, uniform: dict[BlockType, bool] | None = None) -> PrunedOptions:
    """Each block type's undominated options (`solvers.partition.undominated_options`), their
    shapes, and their indices into the unpruned lists. Block types marked in `uniform` (identical
    layers) are compared on the ranges their stage kinds read only (same answer, ~15x fewer
    cells): all a `KindCellOptions` holds."""
    out_o, out_s, out_k = {}, {}, {}
    for bt, o in opts.items():
        kinds = uniform and uniform.get(bt) and isinstance(o, StageOptions)
        keep = undominated_options(o, use_tail, kind_cells(o.num_layers) if kinds else None)
        out_o[bt] = subset_options(o, keep)
        out_s[bt] = [shapes[bt][k] for k in keep]
        out_k[bt] = keep
    return out_o, out_s, out_k
