"""Engine-neutral launch: static-rank torchrun scripts and a Slurm heterogeneous-job batch script.

torchrun gives node K the global ranks K·G.. in order, so the plan's rank order
(`planner.emit.placement`) must put each node's ranks in one consecutive block
(`require_contiguous_nodes`). Slurm allocates one job component per maximal run of consecutive nodes
(in `node_order`) with the same GPU type and node size, each launched by its own
`srun --het-group=K`; node rank = the component's first node rank + SLURM_NODEID inside the step,
so node ranks follow `node_order` exactly, whatever host names Slurm picks. Any valid plan can be
launched this way; the training code reads `rankmap.json` (HETPLAN_RANKMAP) for its process groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.emit.placement import (
    NodeSlot,
    node_order,
    rank_order,
    require_contiguous_nodes,
)
from planner.emit.rankmap import rank_map_json
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec

TARGET = "slurm"


@dataclass(frozen=True, slots=True)
class Component:
    """One Slurm het-job component: `nodes` consecutive node ranks from `first_node_rank`, one GPU type."""

    gpu: str
    gpus_per_node: int
    first_node_rank: int
    nodes: tuple[NodeSlot, ...]


def placed_nodes(plan: Plan, cluster: ClusterSpec, target: str = TARGET) -> list[NodeSlot]:
    """`node_order`, after refusing plans whose node ranks a node-by-node launcher cannot number."""
    ranks = rank_order(plan, cluster)
    require_contiguous_nodes(ranks, target)
    return node_order(plan, cluster, ranks)


def components(plan: Plan, cluster: ClusterSpec) -> list[Component]:
    """Maximal runs of consecutive nodes (node-rank order) with the same GPU type and node size."""
    nodes = placed_nodes(plan, cluster)
    out: list[Component] = []
    start = 0
    for k in range(1, len(nodes) + 1):
        key = (nodes[start].gpu, cluster.node(nodes[start].name).gpus)
        if k == len(nodes) or (nodes[k].gpu, cluster.node(nodes[k].name).gpus) != key:
            out.append(Component(key[0], key[1], start, tuple(nodes[start:k])))
            start = k
    return out


def _torchrun_line(n_nodes: int, node_rank: str, nproc: int | str) -> str:
    return (f"torchrun --nnodes {n_nodes} --node-rank {node_rank} --nproc-per-node {nproc} \\\n"
            "    --master-addr \"${MASTER_ADDR:?set MASTER_ADDR to node rank 0}\" "
            "--master-port \"${MASTER_PORT:-29500}\" \\\n")


def torchrun_scripts(plan: Plan, cluster: ClusterSpec, command: str = '"$@"', target: str = TARGET,
                     title: str = "torchrun") -> dict[str, str]:
    """One bash script per node (keyed by node name, node-rank order) running torchrun with a static
    --node-rank; CUDA_VISIBLE_DEVICES lists the node's GPUs in local-rank order. `command` is the shell
    text after torchrun's options (entry and arguments, already quoted; "$@" = the script's arguments)."""
    nodes = placed_nodes(plan, cluster, target)
    tail = f"    {command}\n"
    out: dict[str, str] = {}
    for k, slot in enumerate(nodes):
        out[slot.name] = (
            "#!/usr/bin/env bash\n"
            f"# hetplan: {title} node rank {k} of {len(nodes)} = {slot.name} ({slot.gpu}), "
            f"global ranks {slot.first_rank}..{slot.first_rank + slot.slots - 1}\n"
            "set -euo pipefail\n"
            f"export CUDA_VISIBLE_DEVICES={','.join(str(g) for g in slot.gpus)}\n"
            + _torchrun_line(len(nodes), str(k), slot.slots) + tail
        )
    return out


def node_script(plan: Plan, cluster: ClusterSpec) -> str:
    """`node.sh OFFSET ENTRY...`: run by srun on every node of one component; picks the node's row by
    node rank = OFFSET + SLURM_NODEID and starts torchrun with that static rank."""
    nodes = placed_nodes(plan, cluster)
    rows = "".join(f"    {k}) NAME={s.name}; GPUS={','.join(str(g) for g in s.gpus)}; NPROC={s.slots} ;;\n"
                   for k, s in enumerate(nodes))
    return (
        "#!/usr/bin/env bash\n"
        "# hetplan: one node of the Slurm het job; usage: node.sh COMPONENT_FIRST_NODE_RANK ENTRY [ARGS...]\n"
        "set -euo pipefail\n"
        "NODE_RANK=$(( $1 + SLURM_NODEID ))\n"
        "shift\n"
        "case \"$NODE_RANK\" in\n"
        f"{rows}"
        "    *) echo \"hetplan: no node rank $NODE_RANK in this plan\" >&2; exit 1 ;;\n"
        "esac\n"
        "export CUDA_VISIBLE_DEVICES=$GPUS HETPLAN_NODE=$NAME\n"
        + _torchrun_line(len(nodes), "\"$NODE_RANK\"", "\"$NPROC\"") + "    \"$@\"\n"
    )


def sbatch_script(plan: Plan, cluster: ClusterSpec, features: dict[str, str] | None = None,
                  job_name: str = "hetplan") -> str:
    """Het-job batch script: one `#SBATCH hetjob`-separated component per run of same-type nodes, in
    node-rank order; `features` maps GPU types to the site's --constraint names (default: the type)."""
    features = features or {}
    comps = components(plan, cluster)
    n_nodes = sum(len(c.nodes) for c in comps)
    lines = ["#!/usr/bin/env bash", (f"# hetplan: {len(comps)} het-job components, {n_nodes} nodes, "
                                     f"{plan.num_gpus} ranks; submit from this folder: sbatch job.sbatch "
                                     "ENTRY [ARGS...]")]
    for i, c in enumerate(comps):
        if i:
            lines.append("#SBATCH hetjob")
        names = ",".join(s.name for s in c.nodes)
        last = c.first_node_rank + len(c.nodes) - 1
        lines.append(f"# component {i}: node ranks {c.first_node_rank}..{last} = {names} ({c.gpu})")
        if i == 0:
            lines.append(f"#SBATCH --job-name={job_name}")
        lines += [f"#SBATCH --nodes={len(c.nodes)}", "#SBATCH --ntasks-per-node=1",
                  f"#SBATCH --gpus-per-node={c.gpus_per_node}", "#SBATCH --exclusive",
                  f"#SBATCH --constraint={features.get(c.gpu, c.gpu)}"]
    # a single component is a plain job: no het-group variables or --het-group option
    het = len(comps) > 1
    nodelist = "$SLURM_JOB_NODELIST_HET_GROUP_0" if het else "$SLURM_JOB_NODELIST"
    lines += [
        "set -euo pipefail",
        "HETPLAN_DIR=\"${HETPLAN_DIR:-$SLURM_SUBMIT_DIR}\"",
        "export HETPLAN_RANKMAP=\"$HETPLAN_DIR/rankmap.json\"",
        f"export MASTER_ADDR=\"$(scontrol show hostnames \"{nodelist}\" | head -n 1)\"",
        "export MASTER_PORT=\"${MASTER_PORT:-29500}\"",
        "pids=()",
    ]
    for i, c in enumerate(comps):
        group = f"--het-group={i} " if het else ""
        lines.append(f"srun {group}--nodes={len(c.nodes)} --ntasks-per-node=1 "
                     f"bash \"$HETPLAN_DIR/node.sh\" {c.first_node_rank} \"$@\" & pids+=($!)")
    lines += ["for pid in \"${pids[@]}\"; do wait \"$pid\"; done", ""]
    return "\n".join(lines)


def slurm_files(plan: Plan, cluster: ClusterSpec) -> dict[str, str]:
    """The `slurm` target: het-job script, its per-node launcher, static torchrun scripts, rank map."""
    out = {"slurm/job.sbatch": sbatch_script(plan, cluster), "slurm/node.sh": node_script(plan, cluster),
           "slurm/rankmap.json": rank_map_json(plan, cluster)}
    for name, script in torchrun_scripts(plan, cluster).items():
        out[f"slurm/torchrun_{name}.sh"] = script
    return out
