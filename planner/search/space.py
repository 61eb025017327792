"""What the search may choose: device classes (interchangeable GPUs), stage shapes and block types.

Nodes whose GPUs, node size and links are identical collapse into one device class, so the search
works on GPU counts per class rather than GPU ids. A stage's tensor/context/head group is a power
of two that divides the node size (so any mix of groups packs into nodes exactly), or, when the
cluster allows groups across nodes and the node size is a power of two, a power of two of whole
nodes (taken first, so the rest still packs); intra-stage data parallelism repeats that group `dp`
times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from planner.costmodel.base import CostModel, DeviceClass, LayerTable, Shard, device_class_of
from planner.errors import HetplanError
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec


@dataclass(frozen=True, slots=True)
class ResourceClass:
    """All GPUs of one device class: `nodes` nodes of `dev.gpus_per_node` GPUs."""

    index: int
    dev: DeviceClass
    nodes: int
    groups: tuple[int, ...]  # indices into ClusterSpec.nodes that belong to this class

    @property
    def gpus(self) -> int:
        return self.nodes * self.dev.gpus_per_node

    @property
    def name(self) -> str:
        return self.dev.gpu.name


@dataclass(frozen=True, slots=True, order=True)
class StageShape:
    tp: int
    cp: int
    hp: int
    dp: int
    recompute: str

    @property
    def group_size(self) -> int:
        return self.tp * self.cp * self.hp

    @property
    def gpus(self) -> int:
        return self.group_size * self.dp


class BlockType(NamedTuple):
    """A stage device group: `gpus` GPUs of resource class `cls`; its shapes are the options.
    A named tuple: skeletons are long tuples of these, hashed and compared in the inner loops."""

    cls: int
    gpus: int


def resource_classes(cluster: ClusterSpec) -> list[ResourceClass]:
    """Collapse node groups with identical device classes; order = first appearance in the file."""
    by_key: dict[str, tuple[DeviceClass, int, list[int]]] = {}
    for gi, group in enumerate(cluster.nodes):
        dev = device_class_of(group)
        if dev.key in by_key:
            d, n, gs = by_key[dev.key]
            by_key[dev.key] = (d, n + group.nodes, [*gs, gi])
        else:
            by_key[dev.key] = (dev, group.nodes, [gi])
    return [ResourceClass(i, d, n, tuple(gs)) for i, (d, n, gs) in enumerate(by_key.values())]


def powers_of_two_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to n: the degrees a node-local group can take."""
    out, p = [], 1
    while p <= n:
        out.append(p)
        p *= 2
    return out


def group_span(rc: ResourceClass, cross_node: bool) -> int:
    """The largest tp*cp*hp group on this class: the node, or with groups across nodes allowed
    (and a power-of-two node size, so groups of whole nodes pack with the rest) the largest power
    of two of whole nodes the class has."""
    node = rc.dev.gpus_per_node
    if not cross_node or node & (node - 1):
        return node
    return max(powers_of_two_upto(rc.gpus))


def stage_shapes(model: ModelSpec, training: TrainingSpec, rc: ResourceClass,
                 micro_batch: int, cross_node: bool = False) -> list[StageShape]:
    """Every legal shape on this class for this microbatch size, sorted. `cross_node`: the cluster
    lets tp*cp*hp groups span nodes (`ClusterSpec.allow_cross_node_tp`)."""
    node = rc.dev.gpus_per_node
    span = group_span(rc, cross_node)
    seq = training.seq_len
    out = []
    for tp in powers_of_two_upto(min(training.max_tp, span)):
        if model.kv_heads % tp or model.ffn_hidden % tp or model.num_heads % tp:
            continue
        for cp in powers_of_two_upto(min(training.max_cp, span // tp)):
            for hp in powers_of_two_upto(min(training.max_hp, span // (tp * cp))):
                group = tp * cp * hp
                if (node % group if group <= node else group % node) or model.num_heads % (tp * hp) \
                        or seq % (cp * hp):
                    continue
                for dp in range(1, training.max_stage_dp + 1):
                    if micro_batch % dp or group * dp > rc.gpus:
                        continue
                    for rc_mode in training.recompute:
                        out.append(StageShape(tp, cp, hp, dp, rc_mode))
    return sorted(out)


def costable_table(cost: CostModel, dev: DeviceClass, shard: Shard, model: ModelSpec,
                   training: TrainingSpec) -> LayerTable | None:
    """The layer table of `shard` on `dev`, or None where the cost model cannot cost it: a strict
    measured-profile model raises for points it has not measured, and every search (the units, the
    Megatron grids, the mesh chains) leaves those out rather than guessing them."""
    try:
        return cost.layer_table(dev, shard, model, training)
    except HetplanError:
        return None


def costable_shapes(cost: CostModel, model: ModelSpec, training: TrainingSpec, rc: ResourceClass,
                    micro_batch: int, cross_node: bool = False) -> list[StageShape]:
    """`stage_shapes` the cost model can cost (`costable_table`)."""
    return [shape for shape in stage_shapes(model, training, rc, micro_batch, cross_node)
            if costable_table(cost, rc.dev, Shard(shape.tp, shape.cp, shape.hp, micro_batch // shape.dp,
                                                  shape.recompute, training.seq_len), model, training) is not None]


def block_types(shapes_by_class: dict[int, list[StageShape]]) -> dict[BlockType, list[StageShape]]:
    """Group shapes by (class, GPU count): the DP picks the best shape per stage of a block."""
    out: dict[BlockType, list[StageShape]] = {}
    for cls, shapes in sorted(shapes_by_class.items()):
        for shape in shapes:
            out.setdefault(BlockType(cls, shape.gpus), []).append(shape)
    return dict(sorted(out.items()))


def skeleton_usage(skeleton: tuple[BlockType, ...], num_classes: int) -> tuple[int, ...]:
    """GPUs of each resource class a pipeline of these stage groups uses."""
    usage = [0] * num_classes
    for bt in skeleton:
        usage[bt.cls] += bt.gpus
    return tuple(usage)
