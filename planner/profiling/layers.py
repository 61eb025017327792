"""The catalog model's three layer kinds as torch modules, with the per-rank shapes of tensor parallelism.

One module is what one GPU of a TP group holds (Megatron-style sharding, no communication):

* embedding: a vocabulary-parallel table of `ceil(vocab / tp)` rows (+ a replicated learned position
  table for GPT/OPT models), dropout when the model has it;
* decoder block: pre-norm; column-parallel QKV projection with `heads / tp` query heads and
  `kv_heads / tp` key/value heads (GQA); causal attention; row-parallel output projection with
  `heads / tp * head_dim` inputs; pre-norm; column-parallel up projection (SwiGLU: gate and up,
  `ffn / tp` each; GELU: one) and row-parallel down projection; dropout after attention and MLP when
  the model has it; residual adds;
* head: final norm, a vocabulary-parallel LM head (`ceil(vocab / tp)` outputs) and cross-entropy in
  fp32 over that shard.

The all-reduces / all-gathers a real TP run adds are not executed: these are compute times of one rank.
Imports torch at module import: only `planner.profiling.build` imports this module, after checking torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from planner.errors import HetplanError
from planner.specs.models import ModelSpec

DROPOUT_P = 0.1  # GPT/OPT-style dropout where the model has dropout


def check_tp(model: ModelSpec, tp: int) -> None:
    """TP must split query heads, KV heads and the MLP evenly (Megatron's rule)."""
    for what, n in (("num_heads", model.num_heads), ("num_kv_heads", model.kv_heads),
                    ("ffn_hidden", model.ffn_hidden)):
        if n % tp:
            raise HetplanError("--tp", f"tp {tp} does not divide {model.name}'s {what} {n}")


def _norm(model: ModelSpec) -> nn.Module:
    return nn.LayerNorm(model.hidden) if model.norm == "layernorm" else nn.RMSNorm(model.hidden)


class Embedding(nn.Module):
    """One rank's shard of the token embedding (+ the replicated position table)."""

    def __init__(self, model: ModelSpec, tp: int, seq_len: int) -> None:
        super().__init__()
        self.vocab_shard = math.ceil(model.vocab / tp)
        self.word = nn.Embedding(self.vocab_shard, model.hidden)
        self.pos = nn.Embedding(max(seq_len, model.seq_len), model.hidden) if model.learned_positions else None
        self.drop = nn.Dropout(DROPOUT_P) if model.dropout else nn.Identity()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.word(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.drop(x)


class Decoder(nn.Module):
    """One rank's shard of a decoder block: attention with GQA, SwiGLU or GELU MLP. With `selective`
    set (per measurement) the part the cost model's selective recompute drops runs under
    `torch.utils.checkpoint`: with flash attention the MLP activation function (its output width of
    stashed bytes is recomputed in the backward), with naive attention the attention core (the
    score matrix, Korthikanti et al.)."""

    selective = False

    def __init__(self, model: ModelSpec, tp: int, attention: str) -> None:
        super().__init__()
        check_tp(model, tp)
        self.q_heads, self.kv_heads, self.head_dim = model.num_heads // tp, model.kv_heads // tp, model.head_dim
        self.naive = attention == "naive"
        self.dropout_p = DROPOUT_P if model.dropout else 0.0
        bias = model.norm == "layernorm"  # GPT/OPT projections carry biases, Llama's do not
        self.norm1, self.norm2 = _norm(model), _norm(model)
        self.qkv = nn.Linear(model.hidden, (self.q_heads + 2 * self.kv_heads) * self.head_dim, bias=bias)
        self.proj = nn.Linear(self.q_heads * self.head_dim, model.hidden, bias=bias)
        f = model.ffn_hidden // tp
        self.swiglu = model.activation == "swiglu"
        mlp_bias = not self.swiglu and model.dropout
        self.up = nn.Linear(model.hidden, 2 * f if self.swiglu else f, bias=mlp_bias)
        self.down = nn.Linear(f, model.hidden, bias=mlp_bias)
        self.drop = nn.Dropout(self.dropout_p) if self.dropout_p else nn.Identity()

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.dropout_p if self.training else 0.0
        if not self.naive:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                                  enable_gqa=self.kv_heads != self.q_heads)
        rep = self.q_heads // self.kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return F.dropout(probs, p, self.training) @ v

    def _activation(self, y: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = y.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(y)

    def _recomputed(self, fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(fn, *args, use_reentrant=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, self.q_heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([self.q_heads, self.kv_heads, self.kv_heads], dim=2))
        o = (self._recomputed(self._attention, q, k, v) if self.selective and self.naive
             else self._attention(q, k, v))
        x = x + self.drop(self.proj(o.transpose(1, 2).reshape(b, s, self.q_heads * self.head_dim)))
        y = self.up(self.norm2(x))
        y = (self._recomputed(self._activation, y) if self.selective and not self.naive
             else self._activation(y))
        return x + self.drop(self.down(y))


class Head(nn.Module):
    """Final norm, one rank's shard of the LM head, and the loss over that shard (fp32 logits)."""

    def __init__(self, model: ModelSpec, tp: int) -> None:
        super().__init__()
        self.vocab_shard = math.ceil(model.vocab / tp)
        self.norm = _norm(model)
        self.lm = nn.Linear(model.hidden, self.vocab_shard, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, self.vocab_shard), labels.view(-1))


def build_layer(kind: str, model: ModelSpec, tp: int, seq_len: int, attention: str) -> nn.Module:
    """A fresh module of one layer kind for one TP rank."""
    if kind == "embedding":
        return Embedding(model, tp, seq_len)
    if kind == "decoder":
        return Decoder(model, tp, attention)
    if kind == "head":
        return Head(model, tp)
    raise HetplanError("layer", f"unknown layer kind '{kind}' (embedding, decoder, head)")


def param_bytes(module: nn.Module) -> int:
    """Bytes of the module's parameters as allocated (its dtype)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())
