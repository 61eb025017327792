"""Emit targets, registered by name: each turns a valid plan into {relative file name: text}.

Adding an engine is one entry in `EMITTERS`, never a branch in the CLI (torchtitan's habit).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

from planner.emit import flagscale, megatron, rankmap
from planner.emit.deepspeed import deepspeed_files
from planner.emit.slurm import slurm_files
from planner.emit.torchtitan import torchtitan_files
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec

Files = dict[str, str]


def megatron_files(plan: Plan, cluster: ClusterSpec) -> Files:
    out = {"megatron/args.txt": shlex.join(megatron.megatron_args(plan, cluster)) + "\n"}
    for node, script in megatron.launch_scripts(plan, cluster).items():
        out[f"megatron/launch_{node}.sh"] = script
    return out


def flagscale_files(plan: Plan, cluster: ClusterSpec) -> Files:
    return {"flagscale/config.yaml": flagscale.flagscale_yaml(plan, cluster),
            "flagscale/hostfile": flagscale.hostfile(plan, cluster)}


def rankmap_files(plan: Plan, cluster: ClusterSpec) -> Files:
    return {"rankmap.json": rankmap.rank_map_json(plan, cluster)}


EMITTERS: dict[str, Callable[[Plan, ClusterSpec], Files]] = {
    "megatron": megatron_files,
    "flagscale": flagscale_files,
    "rankmap": rankmap_files,
    "torchtitan": torchtitan_files,
    "deepspeed": deepspeed_files,
    "slurm": slurm_files,
}


@dataclass(frozen=True)
class Emitted:
    """Files of every engine that can run the plan, and why the others refused."""

    files: dict[str, Files]
    refused: dict[str, str]


def emit(plan: Plan, cluster: ClusterSpec, target: str = "any") -> Emitted:
    """Launch files for one target (its refusal raises HetplanError) or, with "any", for every
    registered engine that can express the plan, with the reasons of those that cannot."""
    from planner.errors import HetplanError

    if target != "any" and target not in EMITTERS:
        raise HetplanError("target", f"unknown target '{target}' ({', '.join([*EMITTERS, 'any'])})")
    names = list(EMITTERS) if target == "any" else [target]
    files: dict[str, Files] = {}
    refused: dict[str, str] = {}
    for name in names:
        try:
            files[name] = EMITTERS[name](plan, cluster)
        except HetplanError as exc:
            if target != "any":
                raise
            refused[name] = exc.reason
    return Emitted(files, refused)
