"""Per-block-type cost arrays for the partition solver, built from the cost model's layer tables.

For every shape of a block type and every layer range [i, j) this computes exactly what the
evaluator will compute for a stage covering those layers: F+B with boundary receives, tail
(exposed gradient sync + optimizer), fixed memory and activation memory per in-flight microbatch.
"""

from __future__ import annotations

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


def _range_max(values: np.ndarray) -> np.ndarray:
    n = len(values)
    out = np.zeros((n + 1, n + 1))
    for i in range(n):
        out[i, i + 1:] = np.maximum.accumulate(values[i:])
    return out


def build_options(cost: CostModel, rc: ResourceClass, shapes: list[StageShape],
                  ctx: OptionContext, tails_only: bool = False) -> StageOptions:
    """`tails_only`: fill only `tail` (the rest is a read-only +inf view), for re-costing tails per
    replica class."""
    knobs = cost.knobs
    n = ctx.model.num_layer_slots
    shape3 = (len(shapes), n + 1, n + 1)
    tail = np.full(shape3, math.inf)
    if tails_only:  # read-only +inf views: no memory for what is not filled
        fb = mem = act = np.broadcast_to(math.inf, shape3)
    else:
        fb, mem, act = (np.full(shape3, math.inf) for _ in range(3))
    i_idx, j_idx = np.triu_indices(n + 1, k=1)
    not_first = (i_idx > 0).astype(float)
    not_last = (j_idx < n).astype(float)
    tail_parts: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
    for o, shape in enumerate(shapes):
        shard = Shard(shape.tp, shape.cp, shape.hp, ctx.micro_batch // shape.dp, shape.recompute,
                      ctx.training.seq_len)
        table = cost.layer_table(rc.dev, shard, ctx.model, ctx.training)
        sums = st.StageSums.of(table)
        recv = st.recv_s(knobs, rc.dev, table, ctx.single_node)
        f = _range_matrix(sums.fwd_cum)[i_idx, j_idx] + recv * not_first
        b = _range_matrix(sums.bwd_cum)[i_idx, j_idx] + recv * not_last
        params = _range_matrix(sums.params_cum)[i_idx, j_idx]
        copies_sync = st.weight_copies(ctx.replicas_sync, shape.dp, shape.cp, shape.hp)
        copies_mem = st.weight_copies(ctx.replicas_mem, shape.dp, shape.cp, shape.hp)
        key = (shape.tp, copies_sync, copies_mem)
        if key not in tail_parts:  # shapes differing only in recompute or cp/dp split share these
            uniq, inverse = np.unique(params, return_inverse=True)
            sync_u = np.asarray(st.grad_sync_s(knobs, rc.dev, uniq, shape.tp, copies_sync,
                                               ctx.training.zero, ctx.single_node))
            opt_u = np.asarray(st.optimizer_s(knobs, rc.dev, uniq, ctx.training.zero, copies_mem))
            tail_parts[key] = (sync_u[inverse], opt_u[inverse])
        sync, opt = tail_parts[key]
        tail[o, i_idx, j_idx] = np.maximum(0.0, sync - knobs.dp_overlap * b) + opt
        if tails_only:
            continue
        fb[o, i_idx, j_idx] = f + b
        states = params * st.bytes_per_param(ctx.training.zero, copies_mem)
        mem[o, i_idx, j_idx] = states + _range_max(table.work_bytes)[i_idx, j_idx]
        act[o, i_idx, j_idx] = _range_matrix(sums.act_cum)[i_idx, j_idx]
    return StageOptions(fb, tail, mem, act, float(st.memory_capacity_bytes(knobs, rc.dev)))


def pruned_options(opts: dict[BlockType, StageOptions], shapes: dict[BlockType, list[StageShape]],
                   use_tail: bool, uniform: dict[BlockType, bool] | None = None
                   ) -> tuple[dict[BlockType, StageOptions], dict[BlockType, list[StageShape]], dict[BlockType, list[int]]]:
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
