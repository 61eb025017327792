"""The cost-model interface: per-layer tables for one (device class, shard shape).

Every cost source (analytic, measured profile, a merge of both) returns a `LayerTable`; the evaluator
and the search only ever read tables, never the source, so a plan is scored the same way whichever
source produced its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from planner.costmodel.comm import Link
from planner.costmodel.knobs import Knobs
from planner.specs.gpus import GPUType
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

if TYPE_CHECKING:
    from planner.specs.cluster import NodeGroup


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """Interchangeable GPUs: one type in nodes of one size with the same links."""

    gpu: GPUType
    gpus_per_node: int
    intra_gbs: float
    nic_gbs: float

    @property
    def key(self) -> str:
        return f"{self.gpu.name}/{self.gpus_per_node}/{self.intra_gbs:g}/{self.nic_gbs:g}"

    def intra_link(self, knobs: Knobs) -> Link:
        return Link(self.intra_gbs, knobs.alpha_intra_s, inter=False)

    def nic_link(self, knobs: Knobs) -> Link:
        return Link(self.nic_gbs, knobs.alpha_inter_s, inter=True)

    def group_link(self, knobs: Knobs, group_gpus: int) -> Link:
        """The link a TP/CP/head group of this many GPUs runs on."""
        return self.intra_link(knobs) if group_gpus <= self.gpus_per_node else self.nic_link(knobs)


@dataclass(frozen=True, slots=True)
class Shard:
    """How a stage runs each layer: degrees, sequences per shard, recompute mode."""

    tp: int
    cp: int
    hp: int
    micro_batch: int  # sequences each shard group processes per microbatch (plan micro_batch / dp)
    recompute: str
    seq_len: int


@dataclass(frozen=True, slots=True)
class LayerTable:
    """Per-layer costs over the model's layer list, for one GPU of the stage."""

    fwd_s: np.ndarray  # forward time incl. exposed TP/CP/head-parallel communication
    bwd_s: np.ndarray  # backward time incl. recompute and exposed communication
    params_per_gpu: np.ndarray  # parameters held by one GPU
    act_bytes: np.ndarray  # activation bytes stashed per in-flight microbatch
    work_bytes: np.ndarray  # transient bytes while the layer runs backward (recompute working set)
    measured: np.ndarray  # bool: the times came from a measurement
    boundary_bytes: float  # activation bytes one GPU sends to the next stage per microbatch


class CostModel(Protocol):
    """A source of per-layer tables. `knobs` also drives communication and memory terms."""

    knobs: Knobs

    def layer_table(self, dev: DeviceClass, shard: Shard, model: ModelSpec,
                    training: TrainingSpec) -> LayerTable: ...


def device_class_of(group: "NodeGroup") -> DeviceClass:
    """The device class of a cluster node group."""
    return DeviceClass(group.gpu_type, group.node_gpus, group.intra_bw_gbs, group.nic_gbs)
