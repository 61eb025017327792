"""Baseline planners: each returns a `hetplan.plan/v1` Plan scored by the one evaluator.

`BASELINES[name](model, cluster, training, cost)` returns the baseline's best valid plan with its
`predicted` field set by `planner.evaluate`, or raises `InfeasibleError` (field = the baseline's
name) saying why none was found. Every baseline is deterministic; each module's docstring says
which published system it follows and how its search space is bounded.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.baselines.amp import amp_plan
from benchmarks.baselines.flashflex import flashflex_plan
from benchmarks.baselines.megatron_uniform import best_uniform_plan
from benchmarks.baselines.metis import metis_plan
from benchmarks.baselines.sailor import sailor_plan
from planner.costmodel.base import CostModel
from planner.errors import InfeasibleError
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec
from planner.specs.gpus import get_gpu
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

Baseline = Callable[[ModelSpec, ClusterSpec, TrainingSpec, CostModel], Plan]


def largest_type(cluster: ClusterSpec, training: TrainingSpec) -> str | None:
    """The GPU type with the most GPUs (ties: more peak FLOP/s in all, then the name)."""
    counts = cluster.counts_by_type()
    if not counts:
        return None
    return min(counts, key=lambda g: (-counts[g], -counts[g] * get_gpu(g).peak_flops(training.dtype), g))


def megatron_uniform_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                          cost: CostModel) -> Plan:
    """The best Megatron grid laid over the whole pool in rank order (see megatron_uniform)."""
    found = best_uniform_plan(model, cluster, training, cost)
    if found is None:
        raise InfeasibleError("megatron-uniform", "no Megatron grid over the pool fits in memory and "
                              "divides the global batch")
    return found[0]


def megatron_largest_type_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                               cost: CostModel) -> Plan:
    """The best Megatron grid on the largest single-type part of the pool (the rest idles): what a
    user who refuses to mix GPU types runs."""
    gpu = largest_type(cluster, training)
    found = None if gpu is None else best_uniform_plan(model, cluster, training, cost, single_type=gpu)
    if found is None:
        raise InfeasibleError("megatron-largest-type", f"no Megatron grid on the {gpu} GPUs fits in "
                              "memory and divides the global batch")
    return found[0]


BASELINES: dict[str, Baseline] = {
    "megatron-uniform": megatron_uniform_plan,
    "megatron-largest-type": megatron_largest_type_plan,
    "metis": metis_plan,
    "sailor": sailor_plan,
    "amp": amp_plan,
    "flashflex": flashflex_plan,
}

__all__ = ["BASELINES", "Baseline", "best_uniform_plan", "largest_type"]
