"""Megatron-style uniform plans: one GPU type, one (tp, cp, pp, dp) grid, even layer split.

Used by `hetplan estimate`, by the search as its uniform baseline, and by tests. Rank order is
Megatron's: tp fastest, then cp, dp, and pp outermost; rank r sits on node r // gpus_per_node.
"""

from __future__ import annotations

from planner.errors import HetplanError
from planner.plan import Pipeline, Plan, Stage, compress_devices
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec


def even_layer_split(model: ModelSpec, pp: int) -> list[tuple[int, int]]:
    """Decoder blocks split as evenly as possible (earlier stages take the remainder); the
    embedding joins the first stage and the LM head the last."""
    n = model.num_layers
    if pp > n:
        raise HetplanError("pp", f"pp {pp} exceeds the model's {n} decoder layers")
    base, extra = divmod(n, pp)
    out, start = [], 1
    for s in range(pp):
        count = base + (1 if s < extra else 0)
        first, last = start, start + count - 1
        if s == 0:
            first = 0
        if s == pp - 1:
            last = n + 1
        out.append((first, last))
        start += count
    return out


def uniform_plan(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, *, tp: int, pp: int,
                 cp: int = 1, hp: int = 1, micro_batch: int = 1, recompute: str = "none",
                 group: int = 0, gpus: int | None = None) -> Plan:
    """A Megatron grid on the first `gpus` GPUs of node group `group` (default: all of them)."""
    if not cluster.nodes:
        raise HetplanError("cluster", "the cluster has no GPUs")
    g = cluster.nodes[group]
    nodes = [n for n in cluster.node_list if n.group == group]
    total = gpus if gpus is not None else g.nodes * g.node_gpus
    width = tp * cp * hp
    if total % (width * pp):
        raise HetplanError("gpus", f"{total} GPUs are not divisible by tp*cp*hp*pp = {width * pp}")
    dp = total // (width * pp)
    if training.global_batch % (micro_batch * dp):
        raise HetplanError("global_batch", f"global batch {training.global_batch} is not divisible by "
                           f"micro_batch x dp = {micro_batch} x {dp}")
    per_replica = training.global_batch // (micro_batch * dp)
    split = even_layer_split(model, pp)
    pipelines = []
    for d in range(dp):
        stages = []
        for p, layers in enumerate(split):
            first_rank = p * dp * width + d * width
            devs = [(nodes[r // g.node_gpus].name, r % g.node_gpus) for r in range(first_rank, first_rank + width)]
            stages.append(Stage(layers=layers, gpu=g.gpu, devices=compress_devices(devs), tp=tp, cp=cp,
                                hp=hp, recompute=recompute))
        pipelines.append(Pipeline(microbatches=per_replica, stages=stages))
    return Plan(model=model, training=training, micro_batch=micro_batch, schedule=training.schedule,
                pipelines=pipelines)
