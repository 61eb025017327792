"""Step bounds from each stage shape's decoder speed and memory, valid for every plan at one
microbatch size. The fluid bound (`planner.search.bounds`) spreads every layer's work over every
GPU and ignores memory; where a 70B model at 64k tokens fits only a few layers on each small GPU,
that left a 282 % gap on a plan of one long pipeline. These add what memory implies.

Inputs are plain arrays: per stage-group shape s (a GPU class, a tp/cp/hp/dp/recompute choice;
`ShapeLimits`) its GPU class, its GPUs (`size`), `t` the least forward plus backward time of one
decoder layer per microbatch on it and `d` the most decoder layers it can hold with one
microbatch in flight (a stage holds at least one); `class_gpus` the GPUs per class (N_k); `n_dec`
decoder layers; `m` the microbatches of the global batch (M). A stage of shape s holding x decoders has F+B >= x·t and
x <= d, and uses `size` GPUs of its class, which no other stage uses.

* Capped fluid (`capped_fluid_s`): a stage runs each layer it holds for the microbatches of its
  pipeline (at most M) and is busy at most its pipeline time T, so it does at most
  min(T / t, d·M) decoder-microbatches; the stages together must do n_dec·M. Relaxing group
  counts to fractions, class k does at most N_k · max_s min(T / t_s, d_s·M) / size_s, and the
  least T whose sum reaches n_dec·M bounds every pipeline time.
* One pipeline (`one_pipeline_s`): where the pool's memory holds fewer than two copies of the
  decoders (`most_copies`), a plan has one pipeline, running all M microbatches:
  T = A + (M - 1)·C, with C its largest stage F+B and A the sum. Every stage's x then satisfies
  x <= min(d, C / t), and A >= sum of x·t; the least such sum over fractional group counts,
  A*(C), is a linear program whose dual is one variable (`_least_fill`), so any dual value
  bounds it. A*(C) does not grow with C, so over C in [C_i, C_i+1] a plan takes at least
  A*(C_i+1) + (M - 1)·C_i; the bound is the least of these over a geometric grid of C from the
  least C whose stages hold every decoder to the C past which no shape holds more.

Neither counts embedding, head, receives, tails or the step overhead (all >= 0).
`tests/test_memory_bound.py` checks both against every plan of small pools (brute force).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MARGIN = 1e-9  # bounds are shrunk by this much (relative) against rounding
# stage capacities under a time are taken this much (relative) larger: C / t rounds below d at
# C = d·t (one RTX-3090 holding all three layers of an `oracle_fuzz.py --seed 61` draw was
# judged not to fit), and larger capacities only lower the bounds
ROOM = 1 + 1e-9
GRID_RATIO = 1.01  # C grid step of `one_pipeline_s`: its bound loses at most this factor on the (M - 1)·C term
_GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class ShapeLimits:
    """Per stage-group shape: GPU class, GPUs, least decoder F+B per microbatch, most decoders
    held (module doc); sorted by class, shapes holding no decoder and dominated ones left out."""

    cls: np.ndarray
    size: np.ndarray
    t: np.ndarray
    d: np.ndarray

    @classmethod
    def of(cls, classes: np.ndarray, size: np.ndarray, t: np.ndarray, d: np.ndarray) -> ShapeLimits:
        """The shapes given, less those another shape of the class beats: no slower a decoder,
        no fewer decoders per GPU and no more GPU-seconds per decoder-microbatch hold at least as
        many decoders per GPU at every bottleneck and cost no more per decoder, so they change no
        bound here."""
        classes, size = np.asarray(classes, dtype=np.int64), np.asarray(size, dtype=float)
        t, d = np.asarray(t, dtype=float), np.asarray(d, dtype=float)
        live = np.flatnonzero((d > 0) & np.isfinite(t) & (t > 0))
        order = live[np.lexsort((t[live], classes[live]))]
        keep = []
        for i in order.tolist():
            if not any(classes[j] == classes[i] and t[j] <= t[i] and d[j] / size[j] >= d[i] / size[i]
                       and t[j] * size[j] <= t[i] * size[i] for j in keep):
                keep.append(i)
        at = np.asarray(keep, dtype=np.int64)
        return cls(classes[at], size[at], t[at], d[at])


def most_copies(lim: ShapeLimits, class_gpus: np.ndarray, n_dec: int) -> float:
    """At most how many copies of the decoders the pool's memory holds (fractional): every
    pipeline holds each decoder once, on GPUs no other pipeline uses."""
    return float(np.dot(class_gpus, _class_max(lim.cls, lim.d / lim.size, len(class_gpus)))) / n_dec


def capped_fluid_s(lim: ShapeLimits, class_gpus: np.ndarray, n_dec: int, m: int) -> float:
    """Least pipeline time at which the stages can do every decoder-microbatch, each stage at most
    T / t of them in time and d·M of them by memory (module doc); inf where no time suffices."""
    need = n_dec * m

    def supply(time_s: float) -> float:
        per_gpu = _class_max(lim.cls, np.minimum(time_s * ROOM / lim.t, lim.d * m) / lim.size, len(class_gpus))
        return float(np.dot(class_gpus, per_gpu))

    if not len(lim.t) or supply(math.inf) < need:
        return math.inf
    lo, hi = 0.0, float(np.max(lim.t)) * need  # one stage of the slowest shape doing all of it
    while supply(hi) < need:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        lo, hi = (lo, mid) if supply(mid) >= need else (mid, hi)
    return lo * (1 - MARGIN)  # below every time that suffices


def one_pipeline_s(lim: ShapeLimits, class_gpus: np.ndarray, n_dec: int, m: int) -> float | None:
    """The one-pipeline bound on its pipeline time (module doc), inf where not even one copy of
    the decoders fits; None where memory allows two pipelines or more (the bound does not apply)."""
    copies = most_copies(lim, class_gpus, n_dec) if len(lim.t) else 0.0
    if copies >= 2:
        return None
    if copies < 1:
        return math.inf
    top = float(np.max(lim.d * lim.t))  # past this C no shape holds more: A*(C) stays A*(top)
    lo, hi = 0.0, top
    for _ in range(200):  # the least C at which the stages hold every decoder lies in (lo, hi]
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        lo, hi = (lo, mid) if _capacity(lim, class_gpus, mid) >= n_dec else (mid, hi)
    if lo > 0:
        grid = lo * GRID_RATIO ** np.arange(max(1, math.ceil(math.log(top / lo) / math.log(GRID_RATIO))) + 1)
    else:
        grid = np.array([0.0, top])
    grid[-1] = top
    fill = _least_fill(lim, class_gpus, n_dec, grid)
    # a plan's C lies in some [grid[i], grid[i + 1]] (C > lo), or at or above top
    starts = np.append(grid[:-1], top)
    ends = np.append(fill[1:], fill[-1])
    return float(np.min(ends + (m - 1) * starts)) * (1 - MARGIN)


def _class_max(cls: np.ndarray, values: np.ndarray, n_classes: int) -> np.ndarray:
    """Per class, the largest of its shapes' values along the last axis, and 0 at least (and with
    no shape). `cls` is sorted (`ShapeLimits`)."""
    out = np.zeros(values.shape[:-1] + (n_classes,))
    if not len(cls):
        return out
    starts = np.flatnonzero(np.r_[True, cls[1:] != cls[:-1]])
    out[..., cls[starts]] = np.maximum(np.maximum.reduceat(values, starts, axis=-1), 0.0)
    return out


def _capacity(lim: ShapeLimits, class_gpus: np.ndarray, c: float) -> float:
    """Decoders the pool's stages can hold with every stage's F+B at most c (fractional groups)."""
    per_gpu = _class_max(lim.cls, np.minimum(lim.d, c * ROOM / lim.t) / lim.size, len(class_gpus))
    return float(np.dot(class_gpus, per_gpu))


def _least_fill(lim: ShapeLimits, class_gpus: np.ndarray, n_dec: int, grid: np.ndarray) -> np.ndarray:
    """A lower bound on A*(C) at each C of `grid` (inf where the stages cannot hold every decoder).

    A*(C) = min sum_s t_s·r_s·u_s over GPUs u_s >= 0 given to shape s, subject to
    sum_s r_s·u_s >= n_dec and sum of u_s over class k <= N_k, with r_s = min(d_s, C / t_s) / size_s
    decoders per GPU. Its dual is max over lam >= 0 of
    g(lam) = n_dec·lam - sum_k N_k·max(0, max_s in k r_s·(lam - t_s)), concave, and every g(lam)
    is at most A*(C) (weak duality): lam is found by golden-section search, per C at once, and
    the best g evaluated is kept."""
    n_classes = len(class_gpus)
    r = np.minimum(lim.d[None, :], grid[:, None] * ROOM / lim.t[None, :]) / lim.size[None, :]  # (G, S)
    feasible = np.dot(_class_max(lim.cls, r, n_classes), class_gpus) >= n_dec

    def g(lam: np.ndarray) -> np.ndarray:
        return n_dec * lam - np.dot(_class_max(lim.cls, r * (lam[:, None] - lim.t[None, :]), n_classes), class_gpus)

    a = np.zeros(len(grid))
    b = np.full(len(grid), 4.0 * float(np.max(lim.t)) * max(1.0, float(np.max(lim.d))))
    x1, x2 = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    g1, g2 = g(x1), g(x2)
    best = np.maximum(np.maximum(g(a), g1), g2)
    for _ in range(80):
        left = g1 >= g2  # the maximum lies in [a, x2], else in [x1, b]
        a, b = np.where(left, a, x1), np.where(left, x2, b)
        x1, x2 = np.where(left, b - _GOLDEN * (b - a), x2), np.where(left, x1, a + _GOLDEN * (b - a))
        fresh = g(np.where(left, x1, x2))
        g1, g2 = np.where(left, fresh, g2), np.where(left, g1, fresh)
        best = np.maximum(best, fresh)
    return np.where(feasible, np.maximum(best, 0.0), math.inf)
