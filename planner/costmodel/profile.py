"""Measured per-layer profiles (`hetplan.profile/v1`) and the cost source built on them.

One JSON file holds the measurements of one model on one GPU type (docs/profile_format.md). The
`MeasuredCostModel` turns them into the same `LayerTable`s the analytic model produces, so the evaluator
and the search cannot tell the sources apart except through `LayerTable.measured`. Whatever is not
measured either falls back to the analytic model, recorded in `fallbacks`, or fails loudly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import DeviceClass, LayerTable, Shard
from planner.costmodel.knobs import Knobs, default_knobs
from planner.errors import HetplanError
from planner.specs.gpus import resolve_gpu_name
from planner.specs.models import ModelSpec, get_model
from planner.specs.training import Recompute, TrainingSpec

PROFILE_FORMAT = "hetplan.profile/v1"
LayerKind = Literal["embedding", "decoder", "head"]
_KIND_ORDER = {"embedding": 0, "decoder": 1, "head": 2}
_RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
_HALF = {"bf16", "fp16"}  # same tensor-core rate on every catalog GPU: a profile serves both


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileEntry(_Strict):
    """One measured layer configuration. Times are per microbatch, on one GPU of the group."""

    layer: LayerKind
    tp: int = Field(ge=1)
    cp: int = Field(default=1, ge=1)
    hp: int = Field(default=1, ge=1)
    micro_batch: int = Field(ge=1, description="sequences per microbatch on this shard group")
    seq_len: int = Field(ge=1)
    recompute: Recompute = "none"
    fwd_ms: float = Field(gt=0, description="forward, TP/CP/HP communication of the run included")
    bwd_ms: float = Field(ge=0, description="backward incl. recompute; 0 only for the embedding")
    optimizer_ms: float | None = Field(default=None, gt=0, description="optimizer step of this layer")
    param_bytes: float | None = Field(default=None, ge=0, description="parameter bytes, one GPU, in dtype")
    act_bytes: float | None = Field(default=None, ge=0, description="stashed bytes per microbatch, one GPU")

    @model_validator(mode="after")
    def _zero_bwd(self) -> "ProfileEntry":
        if self.bwd_ms == 0 and self.layer != "embedding":
            raise ValueError(f"bwd_ms must be > 0 for a {self.layer} layer (0 is allowed for the embedding only)")
        return self

    @property
    def key(self) -> tuple[int, int, int, int, int, int, int]:
        return (_KIND_ORDER[self.layer], self.tp, self.cp, self.hp, self.micro_batch, self.seq_len,
                _RECOMPUTE_ORDER[self.recompute])


class Collective(_Strict):
    """Measured time of one collective over message sizes (bytes of the whole tensor)."""

    link: Literal["intra", "inter"]
    op: Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]
    ranks: int = Field(ge=2)
    bytes: list[float] = Field(min_length=1)
    time_ms: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _series(self) -> "Collective":
        if len(self.bytes) != len(self.time_ms):
            raise ValueError(f"bytes has {len(self.bytes)} values but time_ms has {len(self.time_ms)}")
        if any(b <= 0 for b in self.bytes) or any(t <= 0 for t in self.time_ms):
            raise ValueError("bytes and time_ms must be positive")
        if any(a >= b for a, b in zip(self.bytes, self.bytes[1:])):
            raise ValueError("bytes must be strictly increasing")
        return self


class Profile(_Strict):
    """All measurements of one model on one GPU type."""

    format: Literal["hetplan.profile/v1"] = PROFILE_FORMAT
    gpu: str = Field(description="canonical GPU catalog name (aliases are resolved)")
    model: str = Field(description="catalog model name (aliases are resolved)")
    source: Literal["measured", "modelled"]
    attribution: str = Field(min_length=1, description="who measured it, licence")
    meta: dict[str, Any] = Field(default_factory=dict, description="date, device, software, method, notes")
    dtype: Literal["fp32", "bf16", "fp16", "fp8"]
    entries: list[ProfileEntry] = Field(min_length=1)
    collectives: list[Collective] = Field(default_factory=list)

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str) -> str:
        try:
            return resolve_gpu_name(value)
        except HetplanError as exc:
            raise ValueError(exc.reason) from None

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        try:
            return get_model(value).name
        except HetplanError as exc:
            raise ValueError(exc.reason) from None

    @field_validator("entries")
    @classmethod
    def _sorted_unique(cls, entries: list[ProfileEntry]) -> list[ProfileEntry]:
        for i in range(1, len(entries)):
            a, b = entries[i - 1], entries[i]
            if a.key == b.key:
                raise ValueError(f"entries[{i}] repeats the key of entries[{i - 1}] "
                                 f"({b.layer}, tp {b.tp}, micro_batch {b.micro_batch}, {b.recompute})")
            if a.key > b.key:
                raise ValueError(f"entries[{i}] is out of order: sort by (layer, tp, cp, hp, micro_batch, "
                                 "seq_len, recompute)")
        return entries


# -- files ------------------------------------------------------------------------------------------
def dump_profile(profile: Profile) -> str:
    """Deterministic JSON text: sorted keys, indent 1, trailing newline."""
    data = profile.model_dump(mode="json", exclude_none=True)
    return json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def write_profile(profile: Profile, path: str | Path) -> None:
    Path(path).write_text(dump_profile(profile), encoding="utf-8")


def load_profile(path: str | Path) -> Profile:
    """Read one profile; errors are one-line HetplanErrors naming the file and the field."""
    from planner.specs.loading import load_document, parse_model

    p = Path(path)
    return parse_model(Profile, load_document(p, "profile"), str(p))


def _is_links_file(path: Path) -> bool:
    try:
        import json

        return json.loads(path.read_text()).get("format") == "hetplan.links/v1"
    except (OSError, ValueError, AttributeError):
        return False


def load_profiles(path: str | Path) -> list[Profile]:
    """Every *.json under a directory (recursively, sorted) or one file; one profile per (gpu, model)."""
    root = Path(path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(root.rglob("*.json"))
    else:
        raise HetplanError("profiles", f"no such file or directory: {root}")
    seen: dict[tuple[str, str], Path] = {}
    out = []
    for f in files:
        if root.is_dir() and _is_links_file(f):  # `hetplan profile-links` output: not a layer profile
            continue
        prof = load_profile(f)
        key = (prof.gpu, prof.model)
        if key in seen:
            raise HetplanError(str(f), f"a second profile for {prof.gpu} / {prof.model} (first: {seen[key]})")
        seen[key] = f
        out.append(prof)
    return out


# -- lookup -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Point:
    """One layer's measured (or interpolated) numbers for the requested shard."""

    fwd_s: float
    bwd_s: float
    param_bytes: float | None
    act_bytes: float | None


def _lerp(lo: float, hi: float, w: float) -> float:
    return lo + (hi - lo) * w


def _measured_summary(entries: Iterable[ProfileEntry]) -> str:
    groups: dict[tuple[int, int, int, int, str], list[int]] = {}
    for e in entries:
        groups.setdefault((e.tp, e.cp, e.hp, e.seq_len, e.recompute), []).append(e.micro_batch)
    if not groups:
        return "nothing"
    parts = []
    for (tp, cp, hp, s, r), mbs in sorted(groups.items()):
        parts.append(f"tp {tp} cp {cp} hp {hp} seq {s} {r}: micro_batch {','.join(map(str, sorted(mbs)))}")
    return "; ".join(parts)


def lookup_layer(profile: Profile, kind: str, shard: Shard) -> _Point | str:
    """The measured point for one layer kind, or the reason there is none.

    Micro_batch is interpolated linearly between measured neighbours, never extrapolated. Full
    recompute is derived from a 'none' entry as bwd + fwd (the forward runs again before the backward).
    Embedding and head have no recompute, so their 'none' entry serves every mode."""
    same = [e for e in profile.entries if e.layer == kind and (e.tp, e.cp, e.hp, e.seq_len)
            == (shard.tp, shard.cp, shard.hp, shard.seq_len)]
    mode, derived_full = shard.recompute, False
    rows = [e for e in same if e.recompute == mode]
    if not rows and mode != "none" and (kind != "decoder" or mode == "full"):
        rows = [e for e in same if e.recompute == "none"]
        derived_full = kind == "decoder"
    if not rows:
        return "no entry with this tp/cp/hp/seq_len/recompute"
    rows.sort(key=lambda e: e.micro_batch)
    b = shard.micro_batch
    lo = max((e for e in rows if e.micro_batch <= b), key=lambda e: e.micro_batch, default=None)
    hi = min((e for e in rows if e.micro_batch >= b), key=lambda e: e.micro_batch, default=None)
    if lo is None or hi is None:
        return f"micro_batch {b} outside the measured range {rows[0].micro_batch}-{rows[-1].micro_batch}"
    w = 0.0 if hi.micro_batch == lo.micro_batch else (b - lo.micro_batch) / (hi.micro_batch - lo.micro_batch)
    fwd = _lerp(lo.fwd_ms, hi.fwd_ms, w) / 1e3
    bwd = _lerp(lo.bwd_ms, hi.bwd_ms, w) / 1e3
    act = None
    if lo.act_bytes is not None and hi.act_bytes is not None and not derived_full:
        act = _lerp(lo.act_bytes, hi.act_bytes, w)
    if derived_full:
        bwd += fwd
    return _Point(fwd, bwd, lo.param_bytes, act)


def _dtype_ok(profile: Profile, dtype: str) -> bool:
    return profile.dtype == dtype or {profile.dtype, dtype} <= _HALF


class MeasuredCostModel:
    """Per-layer tables from measured profiles, with an optional analytic fallback.

    Layer times come from the profile of (GPU type, model); they already contain the TP/CP/HP
    communication of the measured run, so nothing is added on top. Memory and boundary sizes come from
    the analytic model unless the profile measured them. A layer without a measurement either takes
    the fallback's time (`measured` False, a line in `fallbacks`) or raises a HetplanError."""

    source = "measured"

    def __init__(self, profiles: Sequence[Profile], fallback: AnalyticCostModel | None = None,
                 knobs: Knobs | None = None) -> None:
        self.knobs = knobs or (fallback.knobs if fallback is not None else default_knobs())
        self.fallback = fallback
        self._shapes = fallback if fallback is not None else AnalyticCostModel(self.knobs)
        self._profiles: dict[tuple[str, str], Profile] = {}
        for p in profiles:
            if (p.gpu, p.model) in self._profiles:
                raise HetplanError("profiles", f"two profiles for {p.gpu} / {p.model}")
            self._profiles[(p.gpu, p.model)] = p
        self._fallbacks: set[str] = set()
        self._cached = lru_cache(maxsize=4096)(self._build)

    @classmethod
    def from_dir(cls, path: str | Path, fallback: AnalyticCostModel | None = None,
                 knobs: Knobs | None = None) -> "MeasuredCostModel":
        return cls(load_profiles(path), fallback, knobs)

    @property
    def profiles(self) -> list[Profile]:
        return [self._profiles[k] for k in sorted(self._profiles)]

    @property
    def fallbacks(self) -> list[str]:
        """Every layer whose time came from the fallback so far, one readable line each."""
        return sorted(self._fallbacks)

    def layer_table(self, dev: DeviceClass, shard: Shard, model: ModelSpec,
                    training: TrainingSpec) -> LayerTable:
        return self._cached(dev, shard, model, training)

    def _points(self, dev: DeviceClass, shard: Shard, model: ModelSpec,
                training: TrainingSpec) -> dict[str, _Point | str]:
        profile = self._profiles.get((dev.gpu.name, model.name))
        kinds = ("embedding", "decoder", "head")
        if profile is None:
            return {k: "no profile for this GPU and model" for k in kinds}
        if not _dtype_ok(profile, training.dtype):
            return {k: f"profile dtype {profile.dtype} does not serve training dtype {training.dtype}"
                    for k in kinds}
        return {k: lookup_layer(profile, k, shard) for k in kinds}

    def _missing(self, dev: DeviceClass, shard: Shard, model: ModelSpec, kind: str, reason: str) -> str:
        profile = self._profiles.get((dev.gpu.name, model.name))
        measured = _measured_summary(e for e in profile.entries if e.layer == kind) if profile else "nothing"
        return (f"{dev.gpu.name} / {model.name} / {kind} layer: tp {shard.tp} cp {shard.cp} hp {shard.hp} "
                f"micro_batch {shard.micro_batch} seq_len {shard.seq_len} recompute {shard.recompute}: "
                f"{reason} (measured: {measured})")

    def _build(self, dev: DeviceClass, shard: Shard, model: ModelSpec, training: TrainingSpec) -> LayerTable:
        base = self._shapes.layer_table(dev, shard, model, training)
        fwd, bwd = base.fwd_s.copy(), base.bwd_s.copy()
        params, act = base.params_per_gpu.copy(), base.act_bytes.copy()
        measured = np.zeros(len(fwd), dtype=bool)
        points = self._points(dev, shard, model, training)
        profile = self._profiles.get((dev.gpu.name, model.name))
        for kind, point in points.items():
            if isinstance(point, str):
                line = self._missing(dev, shard, model, kind, point)
                if self.fallback is None:
                    raise HetplanError("profile", f"no measurement for {line}")
                self._fallbacks.add(f"analytic fallback for {line}")
        tp_s = self._missing_tp_collectives_s(profile, dev, shard, model, training)
        for layer in model.layers():
            point = points[layer.kind]
            if isinstance(point, str):
                continue
            i = layer.index
            # a modelled profile (e.g. profiles/analytic) is used like a measured one but not reported as measured
            fwd[i], bwd[i], measured[i] = point.fwd_s, point.bwd_s, profile is None or profile.source == "measured"
            if point.param_bytes is not None and profile is not None:
                params[i] = point.param_bytes / DTYPE_BYTES[profile.dtype]
            if point.act_bytes is not None:
                act[i] = point.act_bytes
            if tp_s:  # one rank's compute was timed: add the TP collectives the analytic model costs
                share = 1.0 if layer.kind == "decoder" else 0.25
                fwd[i] += share * tp_s
                bwd[i] += share * tp_s * (2 if layer.kind == "decoder" and shard.recompute == "full" else 1)
        return LayerTable(fwd, bwd, params, act, base.work_bytes, measured, base.boundary_bytes)

    def _missing_tp_collectives_s(self, profile: Profile | None, dev: DeviceClass, shard: Shard,
                                  model: ModelSpec, training: TrainingSpec) -> float:
        """Profiles written by `hetplan profile` time one TP rank's shard without communication
        (meta `tp_communication: not executed ...`); their layers get the analytic TP collective time
        (the same term the analytic model adds), so tp > 1 is not predicted too fast."""
        if profile is None or shard.tp <= 1:
            return 0.0
        note = str(profile.meta.get("tp_communication", ""))
        if not note.startswith("not executed"):
            return 0.0
        analytic = self._shapes if isinstance(self._shapes, AnalyticCostModel) else AnalyticCostModel(self.knobs)
        return analytic.tp_collective_s(dev, shard, model, training)
