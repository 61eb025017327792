"""Fitting the analytic model's knobs to measured step times (`hetplan calibrate`).

A handful of knobs shared by the whole measurement file (never one per row, which would be overfitting)
are moved to minimise the mean squared log error of predicted vs measured step time, with a
deterministic numpy-only coordinate descent (golden section per knob). Rows come from
`planner.calibrate`, which also predicts them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from planner.calibrate import KNOBS_FORMAT, Measurement, predict_step_s
from planner.costmodel.knobs import Knobs
from planner.errors import HetplanError

# -- fitting --------------------------------------------------------------------------------------
# Bounds of the knobs a fit may move; per-GPU knobs are named 'gpu.<NAME>.<field>'.
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_eff_max": (0.2, 1.0), "attn_eff_max": (0.1, 1.0), "mem_eff": (0.3, 1.0),
    "coll_eff_max": (0.3, 1.0), "nic_eff": (0.3, 1.0), "step_overhead_s": (0.0, 2.0),
    "gemm_half_flops": (1e7, 2e11), "coll_half_bytes": (1e5, 1e8), "tp_exposed": (0.0, 1.0),
    "dp_overlap": (0.0, 1.0), "elementwise_bytes_per_token": (5.0, 120.0), "bwd_over_fwd": (1.5, 3.0),
    "attn_bwd_over_fwd": (1.5, 3.5), "fp8_gemm_speedup": (1.0, 2.0),
}
_LOG_KNOBS = {"gemm_half_flops", "coll_half_bytes"}
PER_GPU = ("gemm_eff_max", "attn_eff_max", "mem_eff")


def expand_fit(fit: tuple[str, ...] | list[str], measurements: list[Measurement]) -> list[str]:
    """Knob paths: 'X per GPU type' becomes 'gpu.<NAME>.X' for every GPU type in the measurements."""
    counts: dict[str, int] = {}
    for m in measurements:
        counts[m.gpu] = counts.get(m.gpu, 0) + 1
    gpus = sorted(g for g, c in counts.items() if c >= 2)  # one row cannot pin a knob of its own
    out: list[str] = []
    for item in fit:
        name = item.replace(" per GPU type", "").strip()
        if item.endswith("per GPU type"):
            if name not in PER_GPU:
                raise HetplanError("fit", f"'{name}' is not a per-GPU knob ({', '.join(PER_GPU)})")
            out += [f"gpu.{g}.{name}" for g in gpus]
        else:
            leaf = name.split(".")[-1]
            if leaf not in BOUNDS or (name.startswith("gpu.") and leaf not in PER_GPU):
                raise HetplanError("fit", f"unknown or unfittable knob '{name}'")
            out.append(name)
    return out


def get_knob(knobs: Knobs, path: str) -> float:
    if path.startswith("gpu."):
        gpu, leaf = path[4:].rsplit(".", 1)
        return float(getattr(knobs.for_gpu(gpu), leaf))
    if path in PER_GPU:
        return float(getattr(knobs.default_gpu, path))
    return float(getattr(knobs, path))


def set_knob(knobs: Knobs, path: str, value: float) -> Knobs:
    """A copy of `knobs` with one knob changed (validated)."""
    data = knobs.model_dump()
    if path.startswith("gpu."):
        gpu, leaf = path[4:].rsplit(".", 1)
        entry = knobs.for_gpu(gpu).model_dump()
        entry[leaf] = value
        data["gpu"][gpu] = entry
    elif path in PER_GPU:  # one value shared by every GPU type
        data["default_gpu"][path] = value
        for entry in data["gpu"].values():
            entry[path] = value
    else:
        data[path] = value
    return Knobs.model_validate(data)


def msle(measurements: list[Measurement], knobs: Knobs, weights: list[float] | None = None) -> float:
    """Mean squared log error of predicted vs measured step time."""
    w = np.asarray(weights if weights is not None else [1.0] * len(measurements), dtype=float)
    errs = np.array([math.log(predict_step_s(m, knobs) / m.step_s) for m in measurements])
    return float(np.sum(w * errs**2) / np.sum(w))


def golden_section(f: Callable[[float], float], lo: float, hi: float, x0: float,
                   iters: int) -> tuple[float, float]:
    """Minimise f on [lo, hi] by golden-section search; keeps x0 unless something is better."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    best = (c, fc) if fc <= fd else (d, fd)
    f0 = f(x0)
    return best if best[1] < f0 else (x0, f0)


def fit_knobs(measurements: list[Measurement], start: Knobs,
              fit: tuple[str, ...] | list[str] = ("gemm_eff_max per GPU type", "coll_eff_max", "step_overhead_s"),
              *, sweeps: int = 3, iters: int = 18, weights: list[float] | None = None) -> Knobs:
    """Knobs minimising the mean squared log error of step time over all measurements.

    Coordinate descent: each knob in turn is set by golden-section search within its bounds (log scale
    for size knobs), `sweeps` times over the list. Deterministic; numpy only.
    """
    if not measurements:
        raise HetplanError("measurements", "nothing to fit: no usable measurement rows")
    paths = expand_fit(fit, measurements)
    knobs = start
    for _ in range(sweeps):
        for path in paths:
            leaf = path.split(".")[-1]
            lo, hi = BOUNDS[leaf]
            log = leaf in _LOG_KNOBS
            to_x = (lambda v: math.log(v)) if log else (lambda v: v)
            from_x = (lambda x: math.exp(x)) if log else (lambda x: x)
            subset = measurements
            if path.startswith("gpu."):
                subset = [m for m in measurements if m.gpu == path[4:].rsplit(".", 1)[0]]
                sub_w = None if weights is None else [w for w, m in zip(weights, measurements) if m in subset]
            else:
                sub_w = weights

            def loss(x: float, path: str = path, subset: list[Measurement] = subset) -> float:
                return msle(subset, set_knob(knobs, path, from_x(x)), sub_w)

            x, _ = golden_section(loss, to_x(lo), to_x(hi), to_x(get_knob(knobs, path)), iters)
            knobs = set_knob(knobs, path, float(f"{from_x(x):.4g}"))
    return knobs


def write_knobs(knobs: Knobs, path: str | Path) -> None:
    """Write a `hetplan.knobs/v1` JSON file with deterministic bytes (sorted keys, rounded floats)."""
    data = knobs.model_dump()
    data["format"] = KNOBS_FORMAT
    data["gpu"] = {k: data["gpu"][k] for k in sorted(data["gpu"])}

    def clean(v):
        if isinstance(v, float) and v != int(v):
            return float(f"{v:.6g}")
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return v

    Path(path).write_text(json.dumps(clean(data), indent=2, sort_keys=True) + "\n", encoding="utf-8")
