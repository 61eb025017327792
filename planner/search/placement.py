"""From template counts to concrete GPUs: pack every stage group into nodes.

Group sizes (tp*cp*hp) are powers of two dividing the node size, or (groups across nodes allowed)
whole nodes, so largest-first, first-fit, aligned packing never fails while counts fit: groups of
whole nodes go first, onto whole free nodes. Copies of the same stage are packed next to each
other, so their gradient reduction runs over NVLink first (what the cost model assumes).
"""

from __future__ import annotations

from planner.errors import HetplanError
from planner.plan import Pipeline, Plan, Stage, compress_devices
from planner.search.space import ResourceClass
from planner.search.templates import Template
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec


class _NodePool:
    """First-fit packing over one class's nodes, in file order. GPUs are only ever taken, so a
    node with no free aligned block of a size never gets one again: per size, the scan resumes at
    the first node that may still have one (same placement as scanning from the start; 16,384
    GPUs: 1.0 s -> 0.03 s per plan)."""

    def __init__(self, cluster: ClusterSpec, rc: ResourceClass) -> None:
        self.nodes = [n for n in cluster.node_list if n.group in rc.groups]
        self.free = [[True] * n.gpus for n in self.nodes]
        self._first: dict[int, int] = {}  # size -> no node before this one has a free aligned block
        self._span = cluster.allow_cross_node_tp  # groups may take several whole nodes

    def take(self, size: int) -> list[tuple[str, int]]:
        if self._span and self.nodes and size > self.nodes[0].gpus:
            return self._take_nodes(size)
        i = self._first.get(size, 0)
        while i < len(self.nodes):
            free = self.free[i]
            for start in range(0, len(free) - size + 1, size):
                if all(free[start:start + size]):
                    for k in range(start, start + size):
                        free[k] = False
                    self._first[size] = i
                    return [(self.nodes[i].name, k) for k in range(start, start + size)]
            i += 1
        self._first[size] = i
        raise HetplanError("placement", f"no room for a group of {size} GPUs (internal packing error)")

    def _take_nodes(self, size: int) -> list[tuple[str, int]]:
        """A group spanning whole nodes: the first free ones in file order."""
        want = size // self.nodes[0].gpus
        free = [i for i, f in enumerate(self.free) if all(f)][:want]
        if len(free) < want or want * self.nodes[0].gpus != size:
            raise HetplanError("placement", f"no room for a group of {size} GPUs (internal packing error)")
        out = []
        for i in free:
            self.free[i] = [False] * len(self.free[i])
            out.extend((self.nodes[i].name, k) for k in range(self.nodes[i].gpus))
        return out


def build_plan(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, classes: list[ResourceClass],
               micro_batch: int, chosen: list[tuple[Template, tuple[int, ...]]]) -> Plan:
    """`chosen`: (template, microbatches of each copy). Pipelines keep that order."""
    pools = {rc.index: _NodePool(cluster, rc) for rc in classes}
    # (-group size, template order, stage, pipeline, dp copy): largest groups first, then copies of
    # the same stage of the same template next to each other.
    requests: list[tuple[int, int, int, int, int]] = []
    pipes: list[tuple[Template, int]] = []
    for k, (template, copies) in enumerate(chosen):
        for m in copies:
            p = len(pipes)
            pipes.append((template, m))
            for s, ts in enumerate(template.stages):
                for d in range(ts.shape.dp):
                    requests.append((-ts.shape.group_size, k, s, p, d))
    requests.sort()
    got: dict[tuple[int, int, int], list[tuple[str, int]]] = {}
    for neg_size, _, s, p, d in requests:
        template = pipes[p][0]
        got[(p, s, d)] = pools[template.stages[s].cls].take(-neg_size)
    pipelines = []
    for p, (template, m) in enumerate(pipes):
        stages = []
        for s, ts in enumerate(template.stages):
            devs = [x for d in range(ts.shape.dp) for x in got[(p, s, d)]]
            stages.append(Stage(layers=(ts.first, ts.last), gpu=classes[ts.cls].name,
                                devices=compress_devices(devs), tp=ts.shape.tp, cp=ts.shape.cp,
                                hp=ts.shape.hp, dp=ts.shape.dp, recompute=ts.shape.recompute))
        pipelines.append(Pipeline(microbatches=m, stages=stages))
    return Plan(model=model, training=training, micro_batch=micro_batch, schedule=training.schedule,
                pipelines=pipelines)
