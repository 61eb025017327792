"""Per-layer counts that depend only on the model shape: parameters, FLOPs, activation bytes.

Pure functions with units in their names. `b` is sequences per microbatch, `s` tokens per sequence.
Activation bytes follow Korthikanti et al. 2022 (34·s·b·h + 5·a·s²·b per GPT layer, 2-byte tensors),
generalised to GQA, SwiGLU and models without dropout.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.specs.models import ModelSpec


def _mlp_params(model: ModelSpec) -> int:
    h, f = model.hidden, model.ffn_hidden
    per_expert = 3 * h * f if model.activation == "swiglu" else 2 * h * f + (f + h if model.dropout else 0)
    if model.num_experts:
        return model.num_experts * per_expert + h * model.num_experts
    return per_expert


def _norm_params(model: ModelSpec) -> int:
    return 2 * model.hidden if model.norm == "layernorm" else model.hidden


def layer_params(model: ModelSpec, kind: str) -> int:
    """Parameters of one layer of the given kind (head counts its own LM-head matrix)."""
    h = model.hidden
    if kind == "embedding":
        return model.vocab * h + (model.seq_len * h if model.learned_positions else 0)
    if kind == "head":
        return model.vocab * h + _norm_params(model)
    bias = (2 * model.kv_dim + 2 * h) if model.norm == "layernorm" else 0
    attn = h * (h + 2 * model.kv_dim) + h * h + bias
    return attn + _mlp_params(model) + 2 * _norm_params(model)


def layer_replicated_params(model: ModelSpec, kind: str) -> int:
    """Parameters that TP does not shard (norms)."""
    if kind == "embedding":
        return model.seq_len * model.hidden if model.learned_positions else 0
    if kind == "head":
        return _norm_params(model)
    return 2 * _norm_params(model)


@dataclass(frozen=True, slots=True)
class LayerFlops:
    """Forward FLOPs of one layer for b sequences of s tokens, whole layer (unsharded)."""

    gemm: float
    attn_full: float  # attention core counted without the causal saving (the MFU convention)
    attn_causal: float  # attention core actually executed by a causal flash kernel


def layer_fwd_flops(model: ModelSpec, kind: str, b: int, s: int) -> LayerFlops:
    h = model.hidden
    tokens = b * s
    if kind == "embedding":
        return LayerFlops(0.0, 0.0, 0.0)
    if kind == "head":
        return LayerFlops(2.0 * tokens * h * model.vocab, 0.0, 0.0)
    f = model.ffn_hidden
    qkv_proj = 2.0 * tokens * h * (h + 2 * model.kv_dim) + 2.0 * tokens * h * h
    mlp_one = (6.0 if model.activation == "swiglu" else 4.0) * tokens * h * f
    if model.num_experts:
        mlp = model.moe_top_k * mlp_one + 2.0 * tokens * h * model.num_experts
    else:
        mlp = mlp_one
    attn_full = 4.0 * b * s * s * h
    return LayerFlops(qkv_proj + mlp, attn_full, attn_full / 2.0)


def model_flops_per_sequence(model: ModelSpec, s: int) -> float:
    """Training FLOPs per sequence by the usual MFU convention: 3 x forward, full attention."""
    total = 0.0
    for layer in model.layers():
        fl = layer_fwd_flops(model, layer.kind, 1, s)
        total += fl.gemm + fl.attn_full
    return 3.0 * total


@dataclass(frozen=True, slots=True)
class ActivationBytes:
    """Per-token activation bytes stashed by one decoder layer, split by how they shard."""

    seq_sharded: float  # sharded across TP only with sequence parallelism (norm inputs, masks, ...)
    tp_sharded: float  # sharded across TP always (q, k, v, attention output, MLP inner)
    act_fn_out: float  # MLP activation output (dropped by selective recompute), TP-sharded
    quadratic_per_seq: float  # naive attention only: bytes per token per token of sequence (5·a)


def decoder_activation_bytes(model: ModelSpec) -> ActivationBytes:
    h, f, kvd = model.hidden, model.ffn_hidden, model.kv_dim
    mask = 2 * h if model.dropout else 0  # two dropout masks of 1 byte per element
    seq_sharded = 2 * 2 * h + 2 * h + 2 * h + mask  # 2 norm inputs, QKV input, fc1 input
    attn = 2 * h + 4 * kvd + 2 * h  # q, k and v, attention output
    if model.activation == "swiglu":
        mlp, act_out = 4 * f, 2 * f  # gate and up outputs; SiLU*up output
    else:
        mlp, act_out = 2 * f, 2 * f  # fc1 output; GeLU output
    if model.num_experts:
        mlp, act_out = mlp * model.moe_top_k, act_out * model.moe_top_k
    quad = (5 if model.dropout else 4) * model.num_heads
    return ActivationBytes(float(seq_sharded), float(attn + mlp), float(act_out), float(quad))
