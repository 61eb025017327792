"""Model specs and the built-in catalog.

A model is an ordered list of layers: embedding, N decoder blocks, then final norm + LM head. Costs and
plans index this list (`Layer.index`), so a stage's `layers: [first, last]` is unambiguous.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.errors import HetplanError, suggest


class ModelSpec(BaseModel):
    """Shape of a decoder-only transformer; MoE fields are optional (0 experts = dense)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="catalog or user name")
    num_layers: int = Field(gt=0, description="decoder blocks")
    hidden: int = Field(gt=0, description="model width h")
    ffn_hidden: int = Field(gt=0, description="MLP inner width (per expert for MoE)")
    num_heads: int = Field(gt=0, description="attention (query) heads")
    num_kv_heads: int | None = Field(default=None, gt=0, description="KV heads (GQA); default = num_heads")
    vocab: int = Field(gt=0, description="vocabulary size (as padded by the engine)")
    seq_len: int = Field(default=2048, gt=0, description="default training sequence length")
    activation: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    tied_embeddings: bool = False
    learned_positions: bool = Field(default=True, description="learned absolute position table (GPT/OPT)")
    dropout: bool = Field(default=True, description="dropout masks are stored for backward")
    num_experts: int = Field(default=0, ge=0, description="MoE experts per layer (0 = dense)")
    moe_top_k: int = Field(default=0, ge=0, description="experts each token visits")

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.hidden % self.num_heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.kv_heads}")
        if self.num_experts and not 0 < self.moe_top_k <= self.num_experts:
            raise ValueError("moe_top_k must be in 1..num_experts when num_experts > 0")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def num_layer_slots(self) -> int:
        """Length of the layer list: embedding + blocks + head."""
        return self.num_layers + 2

    def layers(self) -> tuple["Layer", ...]:
        return layer_list(self)

    def params_count(self) -> int:
        """Parameters of the whole model (tied embeddings counted once)."""
        from planner.costmodel.shapes import layer_params

        total = sum(layer_params(self, layer.kind) for layer in self.layers())
        if self.tied_embeddings:
            total -= self.vocab * self.hidden
        return total


@dataclass(frozen=True, slots=True)
class Layer:
    index: int
    kind: Literal["embedding", "decoder", "head"]


@lru_cache(maxsize=64)
def layer_list(model: ModelSpec) -> tuple[Layer, ...]:
    blocks = tuple(Layer(i + 1, "decoder") for i in range(model.num_layers))
    return (Layer(0, "embedding"), *blocks, Layer(model.num_layers + 1, "head"))


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden=hidden, ffn_hidden=4 * hidden,
                     num_heads=heads, vocab=vocab, seq_len=seq)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden=hidden, ffn_hidden=ffn, num_heads=heads,
                     num_kv_heads=kv, vocab=vocab, seq_len=seq, activation="swiglu", norm="rmsnorm",
                     learned_positions=False, dropout=False)


@lru_cache(maxsize=1)
def model_catalog() -> dict[str, ModelSpec]:
    """Built-in models by name. GPT shapes follow the GPT-3 paper / Megatron SC'21 Table 1."""
    models = [
        _gpt("gpt3-1.3b", 24, 2048, 16), _gpt("gpt3-2.7b", 32, 2560, 32),
        _gpt("gpt3-6.7b", 32, 4096, 32), _gpt("gpt3-13b", 40, 5120, 40),
        _gpt("gpt3-175b", 96, 12288, 96),
        _gpt("megatron-1.7b", 24, 2304, 24), _gpt("megatron-3.6b", 30, 3072, 32),
        _gpt("megatron-7.5b", 36, 4096, 32), _gpt("megatron-18.4b", 40, 6144, 48),
        _gpt("megatron-22b", 48, 6144, 64), _gpt("megatron-39.1b", 48, 8192, 64),
        _gpt("megatron-76.1b", 60, 10240, 80), _gpt("megatron-145.6b", 80, 12288, 96),
        _gpt("megatron-310.1b", 96, 16384, 128), _gpt("megatron-529.6b", 105, 20480, 128),
        _gpt("mt-nlg-530b", 105, 20480, 128), _gpt("megatron-1t", 128, 25600, 160),
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        ModelSpec(name="opt-350m", num_layers=24, hidden=1024, ffn_hidden=4096, num_heads=16,
                  vocab=50272, seq_len=2048, tied_embeddings=True),
        ModelSpec(name="opt-30b", num_layers=48, hidden=7168, ffn_hidden=28672, num_heads=56,
                  vocab=50272, seq_len=2048, tied_embeddings=True),
        ModelSpec(name="gpt-neo-2.7b", num_layers=32, hidden=2560, ffn_hidden=10240, num_heads=20,
                  vocab=50257, seq_len=2048, tied_embeddings=True),
        ModelSpec(name="tiny", num_layers=4, hidden=256, ffn_hidden=1024, num_heads=8, num_kv_heads=4,
                  vocab=1024, seq_len=128, activation="swiglu", norm="rmsnorm",
                  learned_positions=False, dropout=False),
    ]
    return {m.name: m for m in models}


_MODEL_ALIASES = {"llama-3-8b": "llama3-8b", "llama3.1-8b": "llama3-8b", "llama-2-7b": "llama2-7b",
                  "llama-2-13b": "llama2-13b", "llama-2-70b": "llama2-70b", "opt-350": "opt-350m",
                  "opt-30": "opt-30b", "gpt-neo-2.7": "gpt-neo-2.7b", "gpt3-175b-megatron": "gpt3-175b"}


def get_model(name: str, field: str = "model") -> ModelSpec:
    """A catalog model by (case-insensitive) name or alias."""
    catalog = model_catalog()
    key = name.strip().lower()
    key = _MODEL_ALIASES.get(key, key)
    if key not in catalog:
        raise HetplanError(field, f"unknown model '{name}'" + suggest(name, catalog))
    return catalog[key]


def load_model(name_or_path: str | Path, field: str = "model") -> ModelSpec:
    """A catalog name, or a YAML/JSON file holding a ModelSpec."""
    path = Path(name_or_path)
    if path.suffix.lower() in {".yaml", ".yml", ".json"}:
        from planner.specs.loading import load_document, parse_model

        return parse_model(ModelSpec, load_document(path, field), str(path))
    return get_model(str(name_or_path), field)
