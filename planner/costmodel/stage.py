"""Stage-level costs built from layer tables: the one place where a stage's time, memory, gradient
sync and optimizer step are defined. The evaluator and the search both call these functions, so the
search optimises exactly what the evaluator reports.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from planner.costmodel import comm
from planner.costmodel.base import DeviceClass, LayerTable
from planner.costmodel.knobs import Knobs

GRAD_BYTES = 4  # fp32 main gradients (Megatron's accounting: 2 weight + 4 grad + 12 optimizer)


def bytes_per_param(zero: int, dp_total: int) -> float:
    """Weights + grads + Adam states per parameter: 18 B plain, 6 + 12/DP with a distributed optimizer."""
    d = max(1, dp_total)
    if zero == 0:
        return 18.0
    if zero == 1:
        return 6.0 + 12.0 / d
    if zero == 2:
        return 2.0 + 16.0 / d
    return 18.0 / d


def memory_capacity_bytes(knobs: Knobs, dev: DeviceClass) -> int:
    """What a training process can allocate on one GPU."""
    return int(dev.gpu.mem_bytes * knobs.mem_usable_fraction - knobs.mem_reserved_bytes)


@dataclass(frozen=True, slots=True)
class StageSums:
    """Prefix sums over a layer table, so any contiguous range costs O(1)."""

    fwd_cum: np.ndarray
    bwd_cum: np.ndarray
    params_cum: np.ndarray
    act_cum: np.ndarray

    @staticmethod
    def of(table: LayerTable) -> "StageSums":
        z = np.zeros(1)
        return StageSums(np.concatenate([z, np.cumsum(table.fwd_s)]),
                         np.concatenate([z, np.cumsum(table.bwd_s)]),
                         np.concatenate([z, np.cumsum(table.params_per_gpu)]),
                         np.concatenate([z, np.cumsum(table.act_bytes)]))

    def fwd_s(self, first: int, last: int) -> float:
        return float(self.fwd_cum[last + 1] - self.fwd_cum[first])

    def bwd_s(self, first: int, last: int) -> float:
        return float(self.bwd_cum[last + 1] - self.bwd_cum[first])

    def params(self, first: int, last: int) -> float:
        return float(self.params_cum[last + 1] - self.params_cum[first])

    def act_bytes(self, first: int, last: int) -> float:
        return float(self.act_cum[last + 1] - self.act_cum[first])


def recv_link(knobs: Knobs, dev: DeviceClass, single_node: bool) -> comm.Link:
    """Stage-to-stage traffic arrives over NVLink on a one-node cluster, else over the receiving
    GPU's own NIC (the planner assumes consecutive stages may sit on different nodes)."""
    return dev.intra_link(knobs) if single_node else dev.nic_link(knobs)


def recv_s(knobs: Knobs, dev: DeviceClass, table: LayerTable, single_node: bool) -> float:
    """One microbatch's activations (forward) or gradients (backward) received by one GPU of the stage.

    Receiver-bound: each GPU receives its own share (`boundary_bytes`) over its own link, so the cost
    belongs to the receiving stage alone. The first stage receives no activations, the last no
    gradients."""
    return comm.p2p_s(knobs, table.boundary_bytes, recv_link(knobs, dev, single_node))


def stage_memory_bytes(table: LayerTable, sums: StageSums, first: int, last: int, in_flight: int,
                       zero: int, dp_total: int) -> float:
    """Peak bytes on one GPU of the stage: model states + stashed activations + working set."""
    states = sums.params(first, last) * bytes_per_param(zero, dp_total)
    acts = sums.act_bytes(first, last) * in_flight
    work = float(np.max(table.work_bytes[first:last + 1])) if last >= first else 0.0
    return states + acts + work


def most_decoders(table: LayerTable, n_dec: int, bytes_per_param: float, capacity: float) -> int:
    """Largest k such that some run of k decoder layers (slots 1..n_dec) fits `capacity` with one
    microbatch in flight (`stage_memory_bytes`). A longer run contains a shorter one and needs at
    least its memory, so this is the longest run that fits: every run (first, last) at once, its
    fixed bytes plus its largest working buffer (a 40x40 table, a few array operations instead of
    one pass per length)."""
    fixed = table.params_per_gpu[1:n_dec + 1] * bytes_per_param + table.act_bytes[1:n_dec + 1]
    cum = np.concatenate([[0.0], np.cumsum(fixed)])
    first, last, largest = _run_buffers(table, n_dec)
    fits = cum[last + 1] - cum[first] + largest <= capacity
    return int((last - first + 1)[fits].max()) if fits.any() else 0


def most_decoders_by_flight(table: LayerTable, n_dec: int, bytes_per_param: float, capacity: float,
                            flights: int) -> np.ndarray:
    """`most_decoders` with 1, 2, ..., `flights` microbatches in flight (each run's activations
    counted once per microbatch), one entry per count; non-increasing. For the one-pipeline bound
    with in-flight memory (`solvers.flight_bound`), where a pipeline's k-th stage from the end holds
    min(k, m) microbatches."""
    params = table.params_per_gpu[1:n_dec + 1] * bytes_per_param
    acts = np.asarray(table.act_bytes[1:n_dec + 1], dtype=float)
    first, last, largest = _run_buffers(table, n_dec)
    cum_p = np.concatenate([[0.0], np.cumsum(params)])
    cum_a = np.concatenate([[0.0], np.cumsum(acts)])
    run_p, run_a = cum_p[last + 1] - cum_p[first] + largest, cum_a[last + 1] - cum_a[first]
    # the most microbatches each run fits with (0: none; capped at `flights`), then per count the
    # longest run that fits at least that many; the room is taken 1e-9 larger, so that a division
    # rounding down at an exact fit never counts one microbatch too few (the bound it feeds must
    # not hold fewer decoders than a plan can)
    room = capacity * (1 + 1e-9) - run_p
    with np.errstate(divide="ignore", invalid="ignore"):
        most = np.where(room < 0, 0, np.where(run_a > 0, np.floor(room / np.where(run_a > 0, run_a, 1.0)), flights))
    most = np.clip(most, 0, flights).astype(np.int64)
    longest = np.zeros(flights + 1, dtype=np.int64)
    np.maximum.at(longest, most, last - first + 1)
    return np.maximum.accumulate(longest[::-1])[::-1][1:]


def _run_buffers(table: LayerTable, n_dec: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, last) of every run of decoder layers (0-based) and its largest working buffer."""
    work = np.asarray(table.work_bytes[1:n_dec + 1], dtype=float)
    first, last = _runs(n_dec)
    runs = np.full((n_dec, n_dec), -math.inf)
    runs[first, last] = work[last]
    return first, last, np.maximum.accumulate(runs, axis=1)[first, last]


@functools.lru_cache(maxsize=16)
def _runs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) of every run of n layers, first <= last."""
    return np.triu_indices(n)


def in_flight(schedule: str, num_stages: int, stage: int, microbatches: int) -> int:
    """Microbatches whose activations a stage holds at its peak (1F1B: S - s, capped by m)."""
    if schedule == "gpipe":
        return microbatches
    return min(num_stages - stage, microbatches)


def weight_copies(replicas: int, dp: int, cp: int, hp: int) -> int:
    """GPUs holding the same weight shard: every replica, every intra-stage dp copy, and every
    context / head-parallel rank (those shard activations, not weights), i.e. Megatron's
    data-parallel x context-parallel group. Gradients are reduced, and ZeRO shards, over them."""
    return replicas * dp * cp * hp


def grad_sync_s(knobs: Knobs, dev: DeviceClass, params_per_gpu: float | np.ndarray, tp: int, copies: int,
                zero: int, single_node: bool) -> float | np.ndarray:
    """Gradient reduction of one stage's TP shard over all `copies` that hold it (`weight_copies`).

    Copies of the same shard are assumed packed onto a node as far as it holds them (CP/head ranks
    share the TP group's node; the placer packs copies of a stage together), so the reduction is
    hierarchical: NVLink inside the node, then each GPU's own NIC. With a
    distributed optimizer it is a reduce-scatter of fp32 grads plus an all-gather of bf16 weights,
    3/4 of an all-reduce's traffic.
    """
    if copies <= 1:
        return 0.0 if np.ndim(params_per_gpu) == 0 else np.zeros(np.shape(params_per_gpu))
    per_node = copies if single_node else max(1, min(copies, dev.gpus_per_node // max(1, tp)))
    t = comm.hierarchical_all_reduce_s(knobs, params_per_gpu * GRAD_BYTES, copies, per_node,
                                       dev.intra_link(knobs), dev.nic_link(knobs))
    return 0.75 * t if zero >= 1 else t


def optimizer_s(knobs: Knobs, dev: DeviceClass, params_per_gpu: float | np.ndarray, zero: int,
                dp_total: int) -> float | np.ndarray:
    """Adam step: memory-bound over the parameters this GPU updates."""
    shard = params_per_gpu / max(1, dp_total) if zero >= 1 else params_per_gpu
    bw = dev.gpu.mem_bw_gbs * 1e9 * knobs.for_gpu(dev.gpu.name).mem_eff
    return shard * knobs.optimizer_bytes_per_param / bw


def pipeline_time_s(schedule: str, fwd: list[float], bwd: list[float], microbatches: int) -> float:
    """Closed form: 1F1B  sum(F+B) + (m-1)·max(F+B);  GPipe  sum(F+B) + (m-1)·(max F + max B)."""
    total = sum(fwd) + sum(bwd)
    if schedule == "gpipe":
        return total + (microbatches - 1) * (max(fwd) + max(bwd))
    return total + (microbatches - 1) * max(f + b for f, b in zip(fwd, bwd))


def pipeline_shape(schedule: str, fwd: list[float], bwd: list[float]) -> tuple[float, float]:
    """(A, C) with pipeline time A + (m-1)·C, the form the search's ILP uses."""
    a = sum(fwd) + sum(bwd)
    c = max(fwd) + max(bwd) if schedule == "gpipe" else max(f + b for f, b in zip(fwd, bwd))
    return a, c


def stage_tail_s(knobs: Knobs, bwd_s: float, sync_s: float, opt_s: float) -> float:
    """Time a stage adds after its last backward: gradient sync not hidden behind that backward
    (`dp_overlap` of it can be, as with bucketed overlapped reduction), then its optimizer step."""
    return max(0.0, sync_s - knobs.dp_overlap * bwd_s) + opt_s
