"""Cluster spec: groups of identical nodes, their links, and zones.

Defaults come from the GPU catalog, so a group can be as short as `{gpu: V100-SXM2-32GB, nodes: 2}`.
Nodes are named `node0, node1, ...` in file order; a device is `nodeK:i`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.errors import HetplanError
from planner.specs.gpus import GPUType, get_gpu, resolve_gpu_name


class NodeGroup(BaseModel):
    """`nodes` identical nodes with `gpus_per_node` GPUs of one type each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str = Field(description="GPU type (catalog name or alias)")
    nodes: int = Field(default=1, ge=1, description="number of nodes in this group")
    gpus_per_node: int | None = Field(default=None, ge=1, description="default: catalog typical")
    intra_gbs: float | None = Field(default=None, gt=0, description="per-GPU unidirectional GB/s inside a node")
    nic_gbps: float | None = Field(default=None, gt=0, description="inter-node Gb/s per GPU")
    zone: str = Field(default="default", description="zone / datacentre label")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        return resolve_gpu_name(value)

    @property
    def gpu_type(self) -> GPUType:
        return get_gpu(self.gpu)

    @property
    def node_gpus(self) -> int:
        return self.gpus_per_node or self.gpu_type.gpus_per_node

    @property
    def intra_bw_gbs(self) -> float:
        return self.intra_gbs or self.gpu_type.intra_bw_gbs

    @property
    def nic_gbs(self) -> float:
        """Inter-node bandwidth per GPU in GB/s (the file says Gb/s)."""
        return (self.nic_gbps or self.gpu_type.nic_gbps) / 8.0


class ZoneLink(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    a: str
    b: str
    gbps: float = Field(gt=0, description="bandwidth between the zones, Gb/s (per GPU pair)")


@dataclass(frozen=True, slots=True)
class Node:
    """One physical node; `group` indexes ClusterSpec.nodes."""

    name: str
    group: int
    gpu: str
    gpus: int
    zone: str


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: list[NodeGroup] = Field(default_factory=list)
    zone_links: list[ZoneLink] = Field(default_factory=list)
    allow_cross_node_tp: bool = Field(default=False, description="let TP/CP/head groups span nodes")

    @model_validator(mode="after")
    def _zones_known(self) -> "ClusterSpec":
        zones = {g.zone for g in self.nodes}
        for i, link in enumerate(self.zone_links):
            for end in (link.a, link.b):
                if end not in zones:
                    raise ValueError(f"zone_links[{i}] names unknown zone '{end}'")
        return self

    @cached_property
    def node_list(self) -> tuple[Node, ...]:
        out: list[Node] = []
        for gi, group in enumerate(self.nodes):
            for _ in range(group.nodes):
                out.append(Node(f"node{len(out)}", gi, group.gpu, group.node_gpus, group.zone))
        return tuple(out)

    @property
    def num_gpus(self) -> int:
        return sum(g.nodes * g.node_gpus for g in self.nodes)

    @property
    def single_node(self) -> bool:
        return len(self.node_list) == 1

    @cached_property
    def _node_by_name(self) -> dict[str, Node]:
        return {node.name: node for node in self.node_list}

    def node(self, name: str) -> Node:
        if name in self._node_by_name:
            return self._node_by_name[name]
        raise HetplanError("devices", f"unknown node '{name}' (cluster has node0..node{len(self.node_list) - 1})")

    def zone_gbs(self, a: str, b: str) -> float | None:
        """GB/s between two zones when the file gives it; None = the NICs are the limit."""
        if a == b:
            return None
        for link in self.zone_links:
            if {link.a, link.b} == {a, b}:
                return link.gbps / 8.0
        return None

    def counts_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.nodes:
            out[g.gpu] = out.get(g.gpu, 0) + g.nodes * g.node_gpus
        return out


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster YAML/JSON file; errors name the field."""
    from planner.specs.loading import load_document, parse_model

    p = Path(path)
    data = load_document(p, "cluster")
    if data is None:
        data = {}
    return parse_model(ClusterSpec, data, "cluster")
