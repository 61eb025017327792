"""Training settings: batch, sequence, precision, optimizer sharding, what the search may choose."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Recompute = Literal["none", "selective", "full"]


class TrainingSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    global_batch: int = Field(gt=0, description="sequences per optimizer step")
    seq_len: int = Field(gt=0, description="tokens per sequence")
    dtype: Literal["bf16", "fp16", "fp8"] = Field(default="bf16", description="GEMM compute precision")
    optimizer: Literal["adam"] = "adam"
    zero: Literal[0, 1, 2, 3] = Field(
        default=0, description="0 = plain DP (18 B/param), 1 = distributed optimizer (6 + 12/DP), 2, 3")
    sequence_parallel: bool = Field(default=True, description="Megatron sequence parallelism with TP > 1")
    recompute: tuple[Recompute, ...] = Field(
        default=("none", "selective", "full"), min_length=1, description="recompute modes the search may use")
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    attention: Literal["flash", "naive"] = Field(
        default="flash", description="flash: causal kernels, no score matrix stored; naive: Megatron 2021")
    cp_comm: Literal["ring", "allgather"] = Field(default="ring", description="context-parallel KV exchange")
    max_tp: int = Field(default=8, ge=1, description="largest tensor-parallel degree the search tries")
    max_cp: int = Field(default=8, ge=1, description="largest context-parallel degree the search tries")
    max_hp: int = Field(default=8, ge=1, description="largest head-parallel (Ulysses) degree tried")
    max_stage_dp: int = Field(default=2, ge=1, description="largest intra-stage data-parallel degree tried")
    micro_batches: tuple[int, ...] | None = Field(default=None, description="microbatch sizes to try")
