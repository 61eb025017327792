"""Benchmark scenarios: one YAML file names a cluster, a model and the training setup of one sweep cell.

A scenario file is validated at the edge (`Scenario`, extra fields forbidden) and resolved into plain
specs (`ResolvedScenario`): the cluster is inline or a file next to the scenario, the model a catalog
name, the cost model analytic (packaged or given knobs) or measured profiles with optional analytic
fallback. Every bad input becomes one HetplanError naming the scenario field, with the file in the
reason. The resolved scenario carries everything a worker needs (profiles are loaded here, not in the
worker), so a task can run on a machine that does not have the files.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import CostModel
from planner.costmodel.knobs import Knobs, default_knobs, load_knobs
from planner.costmodel.profile import (
    MeasuredCostModel,
    Profile,
    dump_profile,
    load_profiles,
)
from planner.errors import HetplanError
from planner.specs.cluster import ClusterSpec
from planner.specs.loading import load_document, parse_model
from planner.specs.models import ModelSpec, get_model
from planner.specs.training import TrainingSpec

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
SUFFIXES = (".yaml", ".yml", ".json")
_TOP_LEVEL = ("global_batch", "seq_len")


class Scenario(BaseModel):
    """One scenario file as written (paths still relative to the file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$", description="unique label used in reports")
    description: str = Field(default="", description="one line for people reading the report")
    cluster: dict[str, Any] | str = Field(description="inline ClusterSpec mapping, or a path relative to this file")
    model: str = Field(description="model catalog name (hetplan catalog models)")
    global_batch: int = Field(gt=0, description="sequences per optimizer step")
    seq_len: int = Field(gt=0, description="tokens per sequence")
    training: dict[str, Any] = Field(default_factory=dict, description="other TrainingSpec fields (zero, recompute, ...)")
    profiles: str | None = Field(default=None, description="folder of measured profiles, relative to this file")
    measured_only: bool = Field(default=False, description="with profiles: no analytic fallback")
    knobs: str | None = Field(default=None, description="knob file for the analytic model (default: packaged)")
    time_limit_s: float | None = Field(default=60.0, gt=0, description="search time limit handed to planners")


@dataclass(frozen=True)
class ResolvedScenario:
    """A scenario as plain specs: what a worker needs to plan and score it (picklable)."""

    name: str
    description: str
    source: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    profiles: tuple[Profile, ...]
    measured_only: bool
    knobs: Knobs
    time_limit_s: float | None

    @property
    def cost_name(self) -> str:
        if not self.profiles:
            return "analytic"
        return "measured-only" if self.measured_only else "measured+analytic"

    def cost_model(self) -> CostModel:
        """A fresh cost model (its caches are per process; build one per task)."""
        analytic = AnalyticCostModel(self.knobs)
        if not self.profiles:
            return analytic
        return MeasuredCostModel(list(self.profiles), fallback=None if self.measured_only else analytic,
                                 knobs=self.knobs)

    def content(self) -> dict[str, Any]:
        """Everything that decides a task's result, as JSON-able data (hashed into the task key)."""
        digest = hashlib.sha256()
        for text in sorted(dump_profile(p) for p in self.profiles):
            digest.update(text.encode("utf-8"))
        return {"name": self.name, "model": self.model.model_dump(mode="json"),
                "cluster": self.cluster.model_dump(mode="json"), "training": self.training.model_dump(mode="json"),
                "profiles_sha256": digest.hexdigest() if self.profiles else None,
                "measured_only": self.measured_only, "knobs": self.knobs.model_dump(mode="json"),
                "time_limit_s": self.time_limit_s}


def _refield(exc: HetplanError, field: str, where: Path) -> HetplanError:
    # a validator's own HetplanError arrives as "gpu: unknown GPU ..."; the field is named once
    reason = exc.reason.removeprefix(f"{field.rsplit('.', 1)[-1]}: ")
    return HetplanError(field, f"{reason} (in {where})")


def _relative(base: Path, text: str) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else base / path


def _cluster(sc: Scenario, base: Path, source: Path) -> ClusterSpec:
    if isinstance(sc.cluster, str):
        path = _relative(base, sc.cluster)
        if not path.is_file():
            raise HetplanError("scenario.cluster", f"file not found: {path} (in {source})")
        try:
            data = load_document(path, "scenario.cluster")
        except HetplanError as exc:
            raise _refield(exc, "scenario.cluster", source) from None
        where = path
    else:
        data, where = sc.cluster, source
    try:
        return parse_model(ClusterSpec, data if data is not None else {}, "scenario.cluster")
    except HetplanError as exc:
        raise _refield(exc, exc.field, where) from None


def _training(sc: Scenario, source: Path) -> TrainingSpec:
    for key in _TOP_LEVEL:
        if key in sc.training:
            raise HetplanError(f"scenario.training.{key}", f"set {key} at the top level of the scenario (in {source})")
    try:
        return parse_model(TrainingSpec, {"global_batch": sc.global_batch, "seq_len": sc.seq_len, **sc.training},
                           "scenario.training")
    except HetplanError as exc:
        raise _refield(exc, exc.field, source) from None


def _profiles(sc: Scenario, base: Path, source: Path) -> tuple[Profile, ...]:
    if sc.profiles is None:
        if sc.measured_only:
            raise HetplanError("scenario.measured_only", f"needs a profiles folder (in {source})")
        return ()
    path = _relative(base, sc.profiles)
    if not path.exists():
        raise HetplanError("scenario.profiles", f"no such file or directory: {path} (in {source})")
    try:
        found = load_profiles(path)
    except HetplanError as exc:
        raise HetplanError("scenario.profiles", f"{exc} (in {source})") from None
    if not found:
        raise HetplanError("scenario.profiles", f"no *.json profiles under {path} (in {source})")
    return tuple(sorted(found, key=lambda p: (p.gpu, p.model)))


def _knobs(sc: Scenario, base: Path, source: Path) -> Knobs:
    if sc.knobs is None:
        return default_knobs()
    try:
        return load_knobs(_relative(base, sc.knobs))
    except HetplanError as exc:
        raise HetplanError("scenario.knobs", f"{exc} (in {source})") from None


def resolve(sc: Scenario, base: Path, source: Path) -> ResolvedScenario:
    """Turn a validated scenario into specs; relative paths are taken from `base` (the file's folder)."""
    try:
        model = get_model(sc.model, "scenario.model")
    except HetplanError as exc:
        raise _refield(exc, "scenario.model", source) from None
    return ResolvedScenario(
        name=sc.name, description=sc.description, source=str(source), model=model,
        cluster=_cluster(sc, base, source), training=_training(sc, source), profiles=_profiles(sc, base, source),
        measured_only=sc.measured_only, knobs=_knobs(sc, base, source), time_limit_s=sc.time_limit_s)


def load_scenario(path: str | Path) -> ResolvedScenario:
    """Read, validate and resolve one scenario file."""
    p = Path(path)
    data = load_document(p, "scenario")
    try:
        sc = parse_model(Scenario, data, "scenario")
    except HetplanError as exc:
        raise _refield(exc, exc.field, p) from None
    return resolve(sc, p.resolve().parent, p)


def _natural_key(path: Path) -> list[Any]:
    """'ladder-64' before 'ladder-1024': digits compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def scenario_files(args: Sequence[str] = ()) -> list[Path]:
    """Files named by `args` (files, folders, or names of packaged scenarios), in the order given;
    a folder contributes its scenario files in natural order. No args: every packaged scenario."""
    out: list[Path] = []
    for arg in args or [str(SCENARIO_DIR)]:
        path = Path(arg)
        if path.is_dir():
            found = [f for f in path.iterdir() if f.is_file() and f.suffix.lower() in SUFFIXES]
            if not found:
                raise HetplanError("SCENARIOS", f"no scenario files (*.yaml, *.json) in {path}")
            out.extend(sorted(found, key=_natural_key))
        elif path.is_file():
            out.append(path)
        else:
            packaged = [SCENARIO_DIR / f"{arg}{s}" for s in SUFFIXES if (SCENARIO_DIR / f"{arg}{s}").is_file()]
            if not packaged:
                names = sorted(f.stem for f in SCENARIO_DIR.glob("*.yaml"))
                from planner.errors import suggest

                raise HetplanError("SCENARIOS", f"'{arg}' is neither a file, a folder nor a packaged scenario"
                                   + suggest(arg, names))
            out.append(packaged[0])
    unique: dict[Path, Path] = {}
    for f in out:
        unique.setdefault(f.resolve(), f)
    return list(unique.values())


def load_scenarios(args: Iterable[str] = ()) -> list[ResolvedScenario]:
    """Resolve every scenario named by `args`; scenario names must be unique."""
    seen: dict[str, str] = {}
    out = []
    for f in scenario_files(list(args)):
        sc = load_scenario(f)
        if sc.name in seen:
            raise HetplanError("scenario.name", f"'{sc.name}' is used by {seen[sc.name]} and {f}")
        seen[sc.name] = str(f)
        out.append(sc)
    return out
