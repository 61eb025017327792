"""Clocks for one timed region, and the spread that says whether repetitions agree.

A clock times one call: on a GPU with CUDA events recorded on the current stream (the call's kernels
are asynchronous, so wall-clock time around the launch would measure the launch, not the work), on the
CPU with `time.perf_counter`. The recorded value of a measurement is the **median** of its repetitions;
its **spread** is `(max - min) / median` over the repetitions (0 = identical, 0.2 = the slowest and
fastest repetition differ by a fifth of the median). `hetplan profile` refuses to write a profile
whose worst spread exceeds `--max-spread`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    """Times one call; returns its result and the elapsed milliseconds."""

    name: str

    def time(self, fn: Callable[[], T]) -> tuple[T, float]: ...


@dataclass(frozen=True, slots=True)
class PerfCounterClock:
    """Wall clock for CPU work: the call is synchronous, so the time around it is the time of the work."""

    name: str = "time.perf_counter"

    def time(self, fn: Callable[[], T]) -> tuple[T, float]:
        t0 = time.perf_counter()
        out = fn()
        return out, (time.perf_counter() - t0) * 1e3


@dataclass(frozen=True, slots=True)
class CudaEventClock:
    """CUDA events around the call on the current stream; waits for the end event only."""

    torch: Any
    name: str = "torch.cuda.Event"

    def time(self, fn: Callable[[], T]) -> tuple[T, float]:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return out, float(start.elapsed_time(end))


def spread(samples_ms: Sequence[float]) -> float:
    """(max - min) / median of the repetitions; 0 for a single sample."""
    if not samples_ms:
        raise ValueError("no samples")
    med = statistics.median(samples_ms)
    if len(samples_ms) < 2 or med <= 0:
        return 0.0
    return (max(samples_ms) - min(samples_ms)) / med


@dataclass(frozen=True, slots=True)
class Samples:
    """Repetitions of one timed phase (forward or backward of one layer configuration)."""

    label: str
    ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.ms))

    @property
    def spread(self) -> float:
        return spread(self.ms)


def worst(samples: Sequence[Samples]) -> Samples:
    """The phase whose repetitions agree least (ties: the first label in sorted order)."""
    return max(sorted(samples, key=lambda s: s.label), key=lambda s: s.spread)
