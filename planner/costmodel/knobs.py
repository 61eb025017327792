"""The analytic model's tunable constants ("knobs"), loadable from a small JSON file.

Every knob has a physical meaning and a unit; `hetplan calibrate` fits a few of them to measured runs and
writes a knob file (`hetplan.knobs/v1`). The packaged default `planner/data/knobs.json` was fitted on
`shared/data/calibration_measurements.csv` by `benchmarks/accuracy.py --fit`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class GPUKnobs(BaseModel):
    """Per-GPU-type efficiencies (fractions of the datasheet peak)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_eff_max: float = Field(default=0.72, gt=0, le=1, description="GEMM FLOP/s at large shapes / peak")
    attn_eff_max: float = Field(default=0.55, gt=0, le=1, description="attention-core FLOP/s / peak")
    mem_eff: float = Field(default=0.7, gt=0, le=1, description="achieved / datasheet HBM bandwidth")


class Knobs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str = "hetplan.knobs/v1"
    default_gpu: GPUKnobs = Field(default_factory=GPUKnobs)
    gpu: dict[str, GPUKnobs] = Field(default_factory=dict, description="overrides by canonical GPU name")
    gemm_half_flops: float = Field(default=1.5e9, gt=0, description="per-GPU GEMM FLOPs per layer at which "
                                   "efficiency is half of its maximum (small shapes run slower)")
    elementwise_bytes_per_token: float = Field(default=34.0, ge=0, description="HBM bytes per token per "
                                               "hidden unit moved by norms, activations, residuals (fwd)")
    fp8_gemm_speedup: float = Field(default=1.5, ge=1, le=2, description="fp8 / bf16 GEMM throughput "
                                    "achieved in fp8 training (capped by the GPU's fp8 / bf16 peak ratio)")
    bwd_over_fwd: float = Field(default=2.0, gt=0, description="backward / forward time of GEMMs")
    attn_bwd_over_fwd: float = Field(default=2.5, gt=0, description="backward / forward of flash attention")
    coll_eff_max: float = Field(default=0.8, gt=0, le=1, description="bus bandwidth / link bandwidth, large messages")
    coll_half_bytes: float = Field(default=6e6, gt=0, description="message size at half the max efficiency")
    nic_eff: float = Field(default=0.85, gt=0, le=1, description="achieved / nominal NIC bandwidth")
    alpha_intra_s: float = Field(default=8e-6, ge=0, description="per-hop latency inside a node")
    alpha_inter_s: float = Field(default=2e-5, ge=0, description="per-hop latency across nodes")
    tp_exposed: float = Field(default=1.0, ge=0, le=1, description="share of TP/SP collectives not overlapped")
    cp_overlap: float = Field(default=1.0, ge=0, le=1, description="share of attention compute that hides ring KV")
    dp_overlap: float = Field(default=0.0, ge=0, le=1, description="share of the backward of earlier "
                              "stages that hides a stage's gradient sync (0 = Megatron default, no overlap)")
    optimizer_bytes_per_param: float = Field(default=30.0, gt=0, description="Adam HBM traffic per parameter")
    step_overhead_s: float = Field(default=0.05, ge=0, description="fixed per-step cost (launch, logging, sync)")
    mem_reserved_bytes: float = Field(default=2.0 * 2**30, ge=0, description="CUDA context, NCCL buffers")
    mem_usable_fraction: float = Field(default=0.96, gt=0, le=1, description="allocator fragmentation headroom")

    def for_gpu(self, name: str) -> GPUKnobs:
        return self.gpu.get(name, self.default_gpu)


def load_knobs(path: str | Path) -> Knobs:
    from planner.specs.loading import load_document, parse_model

    return parse_model(Knobs, load_document(Path(path), "knobs"), "knobs")


@lru_cache(maxsize=1)
def default_knobs() -> Knobs:
    """Packaged calibrated knobs, or the built-in constants when none are packaged."""
    res = resources.files("planner.data").joinpath("knobs.json")
    if res.is_file():
        return Knobs.model_validate(json.loads(res.read_text(encoding="utf-8")))
    return Knobs()
