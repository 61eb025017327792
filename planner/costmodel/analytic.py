"""Analytic cost source: roofline with calibrated efficiencies, needing nothing but specs.

Compute: GEMM FLOPs over peak x a size-dependent efficiency; attention core at its own efficiency
(causal flash kernels do half the full-attention FLOPs); element-wise work over HBM bandwidth.
Communication: Megatron TP (+SP) collectives, ring / all-gather context parallelism, Ulysses
all-to-alls, all with the alpha-beta model of `comm`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from planner.costmodel import comm
from planner.costmodel.base import DeviceClass, LayerTable, Shard
from planner.costmodel.knobs import Knobs, default_knobs
from planner.costmodel.shapes import (decoder_activation_bytes, layer_fwd_flops, layer_params,
                                      layer_replicated_params)
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

BYTES_ACT = 2  # bf16/fp16 activations


def gemm_peak_flops(knobs: Knobs, dev: DeviceClass, dtype: str) -> float:
    """Peak GEMM FLOP/s a dtype can reach: fp8 is the bf16 peak times the fp8 speedup achieved in
    training (scaling, casts and bf16 fallbacks keep it below the datasheet ratio), capped by that ratio."""
    if dtype != "fp8":
        return dev.gpu.peak_flops(dtype)
    bf16 = dev.gpu.peak_flops("bf16")
    return bf16 * min(knobs.fp8_gemm_speedup, dev.gpu.peak_flops("fp8") / bf16)


class AnalyticCostModel:
    """The default cost source. Tables are cached per (device class, shard, model, training)."""

    source = "modelled"

    def __init__(self, knobs: Knobs | None = None) -> None:
        self.knobs = knobs or default_knobs()
        self._cached = lru_cache(maxsize=4096)(self._build)
        self._rows_cached = lru_cache(maxsize=4096)(self._kind_rows)

    def layer_table(self, dev: DeviceClass, shard: Shard, model: ModelSpec,
                    training: TrainingSpec) -> LayerTable:
        return self._cached(dev, shard, model, training)

    # -- internals ---------------------------------------------------------------------------
    def _gemm_s(self, dev: DeviceClass, flops_per_gpu: float, dtype: str) -> float:
        if flops_per_gpu <= 0:
            return 0.0
        k = self.knobs
        eff = k.for_gpu(dev.gpu.name).gemm_eff_max * flops_per_gpu / (flops_per_gpu + k.gemm_half_flops)
        return flops_per_gpu / (gemm_peak_flops(k, dev, dtype) * eff)

    def _attn_s(self, dev: DeviceClass, flops_per_gpu: float, dtype: str) -> float:
        if flops_per_gpu <= 0:
            return 0.0
        k = self.knobs
        eff = k.for_gpu(dev.gpu.name).attn_eff_max * flops_per_gpu / (flops_per_gpu + k.gemm_half_flops)
        # fp8 training (Transformer Engine, torchao Float8) runs the attention core in bf16
        return flops_per_gpu / (dev.gpu.peak_flops("bf16" if dtype == "fp8" else dtype) * eff)

    def _mem_s(self, dev: DeviceClass, nbytes: float) -> float:
        bw = dev.gpu.mem_bw_gbs * 1e9 * self.knobs.for_gpu(dev.gpu.name).mem_eff
        return nbytes / bw if nbytes > 0 else 0.0

    def tp_collective_s(self, dev: DeviceClass, shard: Shard, model: ModelSpec, training: TrainingSpec) -> float:
        """Exposed TP (+SP) collective time of one decoder layer, per direction: 2 all-gathers + 2
        reduce-scatters with SP, 2 all-reduces without, on tokens_gpu x hidden activations. The
        embedding and the head each pay a quarter of it."""
        tp = shard.tp
        if tp <= 1:
            return 0.0
        k = self.knobs
        tokens_gpu = shard.micro_batch * shard.seq_len / (shard.cp * shard.hp)
        act_tensor = tokens_gpu * model.hidden * BYTES_ACT
        tp_link = dev.group_link(k, tp)
        if training.sequence_parallel:
            t = 4 * comm.all_gather_s(k, act_tensor, tp, tp_link)
        else:
            t = 2 * comm.all_reduce_s(k, act_tensor, tp, tp_link)
        return t * k.tp_exposed

    def _build(self, dev: DeviceClass, shard: Shard, model: ModelSpec, training: TrainingSpec) -> LayerTable:
        """The table of `shard`: its recompute mode applied to the rows every mode shares
        (`_kind_rows`, computed once per device and shard without it: a search asks for most
        shapes in each of the three modes)."""
        rows = self._rows_cached(dev, replace(shard, recompute="none"), model, training)
        stored, b_ = rows.decoder[3], rows.decoder[2]
        full_stash = stored
        if shard.recompute == "selective":
            stored -= rows.selective_stored_cut
            b_ += rows.selective_bwd_add
        elif shard.recompute == "full":
            stored = rows.full_stored  # the layer input only
            b_ += rows.decoder[1]  # the whole forward again, communication included
        decoder = (rows.decoder[0], rows.decoder[1], b_, stored, (full_stash if shard.recompute == "full" else 0.0))
        # one row per layer kind (decoder layers are alike), laid onto the slots in one gather
        kinds, slot_kind = _slot_kinds(model)
        by_kind = {"embedding": rows.embedding, "head": rows.head, "decoder": decoder}
        params, fwd, bwd, act_bytes, work = np.array([by_kind[kind] for kind in kinds], dtype=float)[slot_kind].T.copy()
        return LayerTable(fwd, bwd, params, act_bytes, work, np.zeros(model.num_layer_slots, dtype=bool),
                          rows.boundary)

    def _kind_rows(self, dev: DeviceClass, shard: Shard, model: ModelSpec, training: TrainingSpec) -> _KindRows:
        """Each layer kind's row without recompute, and what each recompute mode changes."""
        k = self.knobs
        tp, cp, hp, b, s = shard.tp, shard.cp, shard.hp, shard.micro_batch, shard.seq_len
        flash = training.attention == "flash"
        sp = training.sequence_parallel and tp > 1
        split = tp * cp * hp  # every GPU of the group does 1/split of the layer's work
        tokens_gpu = b * s / (cp * hp)  # tokens one GPU holds outside attention heads split
        h = model.hidden
        # Megatron rank order: TP ranks are adjacent, CP next, head-parallel outermost, so a TP group
        # stays on NVLink even when tp*cp spans nodes (CP then rides the NIC).
        cp_link = dev.group_link(k, tp * cp)
        group_link = dev.group_link(k, split)
        dtype = training.dtype

        tp_dir_s = self.tp_collective_s(dev, shard, model, training)
        # Ulysses: all-to-all of q, k, v before attention and of the output after (per direction).
        if hp > 1:
            qkvo_bytes = tokens_gpu * (2 * h + 2 * model.kv_dim) * BYTES_ACT / tp
            hp_dir_s = comm.all_to_all_s(k, qkvo_bytes, hp, group_link)
        else:
            hp_dir_s = 0.0

        act = decoder_activation_bytes(model)
        seq_div = tp if sp else 1
        elem_tokens = tokens_gpu / seq_div

        def row(kind: str) -> tuple:
            """(params, fwd, bwd, stored activations, work bytes) of the embedding or the head;
            (params, fwd, bwd, stored activations, F of memory, F of attention) of a decoder."""
            p_total = layer_params(model, kind)
            p_rep = layer_replicated_params(model, kind)
            param = (p_total - p_rep) / tp + p_rep
            fl = layer_fwd_flops(model, kind, b, s)
            gemm_f = self._gemm_s(dev, fl.gemm / split, dtype)
            if kind == "embedding":
                mem_f = self._mem_s(dev, 2 * elem_tokens * h * BYTES_ACT)
                f = mem_f + (tp_dir_s / 4 if tp > 1 else 0.0)  # one reduce(-scatter) of the lookup
                b_ = 2 * mem_f + (tp_dir_s / 4 if tp > 1 else 0.0)
                return param, f, b_, elem_tokens * h * (1 if model.dropout else 0), 0.0
            if kind == "head":
                logits_bytes = tokens_gpu * model.vocab / tp * 4  # fp32 logits for the loss
                mem_f = self._mem_s(dev, 3 * logits_bytes + 4 * elem_tokens * h * BYTES_ACT)
                f = gemm_f + mem_f + (tp_dir_s / 4 if tp > 1 else 0.0)
                b_ = k.bwd_over_fwd * gemm_f + 2 * mem_f + (tp_dir_s / 4 if tp > 1 else 0.0)
                return param, f, b_, logits_bytes + elem_tokens * h * BYTES_ACT, logits_bytes
            # decoder block
            attn_flops = (fl.attn_causal if flash else fl.attn_full) / split
            attn_f = self._attn_s(dev, attn_flops, dtype)
            mem_bytes_f = k.elementwise_bytes_per_token * elem_tokens * h
            if not flash:  # softmax, mask and dropout over the score matrix
                mem_bytes_f += 3 * BYTES_ACT * b * model.num_heads * s * s / split
            mem_f = self._mem_s(dev, mem_bytes_f)
            cp_f = cp_b = 0.0
            if cp > 1:
                kv_bytes = b * (s / cp) * 2 * model.kv_dim * BYTES_ACT / (tp * hp)
                if training.cp_comm == "ring":
                    ring = (cp - 1) * comm.p2p_s(k, kv_bytes, cp_link)
                    cp_f = max(0.0, ring - k.cp_overlap * attn_f)
                    cp_b = max(0.0, 2 * ring - k.cp_overlap * k.attn_bwd_over_fwd * attn_f)
                else:
                    cp_f = comm.all_gather_s(k, kv_bytes * cp, cp, cp_link)
                    cp_b = cp_f
            f_compute = gemm_f + attn_f + mem_f
            f = f_compute + tp_dir_s + 2 * hp_dir_s + cp_f
            b_ = (k.bwd_over_fwd * gemm_f + k.attn_bwd_over_fwd * attn_f + 2 * mem_f
                  + tp_dir_s + 2 * hp_dir_s + cp_b)
            stored = (act.seq_sharded / seq_div + act.tp_sharded / tp + act.act_fn_out / tp) * tokens_gpu
            if not flash:
                stored += act.quadratic_per_seq * tokens_gpu * (s / cp) / (tp * hp)
            return param, f, b_, stored, mem_f, attn_f

        param, f, b_, stored, mem_f, attn_f = row("decoder")
        if flash:  # selective: recompute the MLP activation function from its input
            cut, add = act.act_fn_out / tp * tokens_gpu, 0.25 * mem_f
        else:  # selective: recompute the attention core (Korthikanti et al.)
            cut, add = act.quadratic_per_seq * tokens_gpu * (s / cp) / (tp * hp), attn_f + 0.25 * mem_f
        return _KindRows(row("embedding"), row("head"), (param, f, b_, stored), cut, add, 2.0 * elem_tokens * h,
                         tokens_gpu * h * BYTES_ACT / seq_div)


@dataclass(frozen=True, slots=True)
class _KindRows:
    """A shard's rows by layer kind, without recompute: (params, fwd, bwd, stored activations,
    work bytes) of the embedding and the head, (params, fwd, bwd, stored) of a decoder layer;
    what selective recompute takes off the stored activations and adds to the backward, what full
    recompute stores; the bytes one GPU sends to the next stage per microbatch."""

    embedding: tuple
    head: tuple
    decoder: tuple
    selective_stored_cut: float
    selective_bwd_add: float
    full_stored: float
    boundary: float


@lru_cache(maxsize=64)
def _slot_kinds(model: ModelSpec) -> tuple[tuple[str, ...], np.ndarray]:
    """The model's layer kinds in order of first appearance, and each layer slot's kind index."""
    kinds = tuple(dict.fromkeys(layer.kind for layer in model.layers()))
    slot_kind = np.array([kinds.index(layer.kind) for layer in sorted(model.layers(), key=lambda x: x.index)])
    slot_kind.setflags(write=False)
    return kinds, slot_kind
