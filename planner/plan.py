"""The public plan format `hetplan.plan/v1`: what to run, not how it was found.

A plan is produced by the search, by baselines or by hand and is scored by one evaluator
(`planner.evaluate`). Field meanings follow docs/plan_format.md; `validate` checks the rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.specs.models import ModelSpec
from planner.specs.training import Recompute, TrainingSpec

PLAN_FORMAT = "hetplan.plan/v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Stage(_Strict):
    layers: tuple[int, int] = Field(description="first and last layer index, inclusive")
    gpu: str = Field(description="GPU type of every device in this stage")
    devices: list[str] = Field(description="'nodeK:i' or 'nodeK:i-j' ranges; size = tp*cp*hp*dp")
    tp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    hp: int = Field(default=1, ge=1, description="head (Ulysses) parallel degree")
    dp: int = Field(default=1, ge=1, description="intra-stage data parallel: splits each microbatch")
    recompute: Recompute = "none"

    @property
    def group_size(self) -> int:
        """GPUs that hold one shard set of the stage: tp*cp*hp."""
        return self.tp * self.cp * self.hp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.hp * self.dp


class Pipeline(_Strict):
    microbatches: int = Field(ge=1, description="this replica's share of the global batch, in microbatches")
    stages: list[Stage] = Field(min_length=1)


class StagePrediction(_Strict):
    pipeline: int
    stage: int
    gpu: str
    fwd_s: float
    bwd_s: float
    memory_bytes: int
    memory_capacity_bytes: int
    grad_sync_s: float
    measured: bool = Field(description="layer times came from a measured profile")


class Prediction(_Strict):
    step_s: float
    tokens_per_s: float
    mfu: float
    tflops_per_gpu: float
    pipeline_s: list[float]
    grad_sync_s: float = Field(description="largest gradient sync of any stage (before overlap)")
    tail_s: float = Field(description="largest exposed gradient sync + optimizer step after a pipeline")
    overhead_s: float
    per_stage: list[StagePrediction]
    bottleneck: str
    cost_sources: dict[str, str] = Field(default_factory=dict, description="gpu -> measured|modelled|mixed")
    lower_bound_s: float | None = None
    gap: float | None = None


class Plan(_Strict):
    format: Literal["hetplan.plan/v1"] = PLAN_FORMAT
    model: ModelSpec
    training: TrainingSpec
    micro_batch: int = Field(ge=1)
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    pipelines: list[Pipeline] = Field(default_factory=list)
    predicted: Prediction | None = None

    @property
    def num_gpus(self) -> int:
        return sum(s.num_gpus for p in self.pipelines for s in p.stages)

    def to_json(self) -> str:
        """Deterministic JSON text (sorted by field order, 2-space indent, trailing newline)."""
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"


def load_plan(path: str | Path) -> Plan:
    from planner.specs.loading import load_document, parse_model

    return parse_model(Plan, load_document(Path(path), "plan"), "plan")


def expand_devices(entries: list[str]) -> list[tuple[str, int]]:
    """'node3:0-3' -> [('node3', 0), ..., ('node3', 3)]; order kept."""
    from planner.errors import HetplanError

    out: list[tuple[str, int]] = []
    for entry in entries:
        node, sep, rng = entry.partition(":")
        if not sep or not node:
            raise HetplanError("devices", f"'{entry}' is not of the form nodeK:i or nodeK:i-j")
        lo, dash, hi = rng.partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise HetplanError("devices", f"'{entry}' has a non-integer GPU index") from None
        if first < 0 or last < first:
            raise HetplanError("devices", f"'{entry}' is an empty or negative range")
        out.extend((node, i) for i in range(first, last + 1))
    return out


def compress_devices(devices: list[tuple[str, int]]) -> list[str]:
    """Inverse of expand_devices: consecutive GPUs on a node become one 'nodeK:i-j' range."""
    out: list[str] = []
    i = 0
    while i < len(devices):
        node, first = devices[i]
        last = first
        while i + 1 < len(devices) and devices[i + 1] == (node, last + 1):
            i += 1
            last += 1
        out.append(f"{node}:{first}" if first == last else f"{node}:{first}-{last}")
        i += 1
    return out
