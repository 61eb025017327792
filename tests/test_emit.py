"""Launch emitters: Megatron args/scripts, FlagScale hetero config/hostfile, generic rank map."""

from __future__ import annotations

import json
from pathlib import Path
import re

import pytest
import yaml

from planner.emit.flagscale import (
    flagscale_config,
    flagscale_yaml,
    hetero_section,
    hostfile,
    meshes,
)
from planner.emit.megatron import launch_scripts, layout_string, megatron_args
from planner.emit.placement import node_order, rank_order
from planner.emit.rankmap import rank_map, rank_map_json
from planner.errors import HetplanError
from planner.plan import Pipeline, Plan, Stage, expand_devices
from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.models import get_model
from planner.specs.training import TrainingSpec
from planner.uniform import uniform_plan

A100, V100, H100 = "A100-SXM4-80GB", "V100-SXM2-32GB", "H100-SXM5-80GB"


def mixed_cluster() -> ClusterSpec:
    """examples/mixed.yaml in code: node0 = 8 A100, node1-2 = 8 V100 each, node3 = 4 H100."""
    return ClusterSpec(nodes=[NodeGroup(gpu=A100, nodes=1, gpus_per_node=8),
                              NodeGroup(gpu=V100, nodes=2, gpus_per_node=8),
                              NodeGroup(gpu=H100, nodes=1, gpus_per_node=4)])


def tiny_cluster() -> ClusterSpec:
    return ClusterSpec(nodes=[NodeGroup(gpu=A100, nodes=1, gpus_per_node=4),
                              NodeGroup(gpu=V100, nodes=1, gpus_per_node=4)])


def a100_pair() -> ClusterSpec:
    return ClusterSpec(nodes=[NodeGroup(gpu=A100, nodes=2, gpus_per_node=4)])


def tiny_training(global_batch: int = 32) -> TrainingSpec:
    return TrainingSpec(global_batch=global_batch, seq_len=128)


def hand_plan(pipelines: list[Pipeline], micro_batch: int = 2) -> Plan:
    return Plan(model=get_model("tiny"), training=tiny_training(), micro_batch=micro_batch, pipelines=pipelines)


def st(layers, gpu, devices, **kw) -> Stage:
    return Stage(layers=layers, gpu=gpu, devices=devices, **kw)


def with_layers(plan: Plan, split: list[tuple[int, int]]) -> Plan:
    """The same plan with another layer split in every pipeline."""
    pipes = [p.model_copy(update={"stages": [s.model_copy(update={"layers": split[i]}) for i, s in
                                             enumerate(p.stages)]}) for p in plan.pipelines]
    return plan.model_copy(update={"pipelines": pipes})


def arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def expand_layout(layout: str) -> list[list[str]]:
    """Independent reading of Megatron's layout syntax: 'x*n' repeats x, '|' separates stages."""
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout.replace(",", ""))
    return [list(part) for part in text.split("|")]


def llama_uniform(tp: int = 2, pp: int = 4) -> tuple[Plan, ClusterSpec]:
    cluster = mixed_cluster()
    return uniform_plan(get_model("llama2-13b"), TrainingSpec(global_batch=64, seq_len=4096), cluster,
                        tp=tp, pp=pp, group=1), cluster


# --- shared placement -----------------------------------------------------------------------------


def test_rank_order_is_megatron_order_on_uniform_plans() -> None:
    """tp fastest, then cp, dp, pp outermost: rank r sits where uniform_plan put grid cell r."""
    cluster = mixed_cluster()
    plan = uniform_plan(get_model("llama2-13b"), TrainingSpec(global_batch=64, seq_len=4096), cluster,
                        tp=2, cp=2, pp=2, group=1)
    tp, cp, dp, pp = 2, 2, len(plan.pipelines), 2
    assert dp == 2
    v100_nodes = [n.name for n in cluster.node_list if n.gpu == V100]
    for r in rank_order(plan, cluster):
        assert r.rank == r.tp_rank + tp * (r.cp_rank + cp * (r.pipeline + dp * r.stage))
        assert (r.node, r.local_gpu) == (v100_nodes[r.rank // 8], r.rank % 8)
        assert r.layers == plan.pipelines[r.pipeline].stages[r.stage].layers
    assert tp * cp * dp * pp == len(rank_order(plan, cluster))


def test_node_order_follows_first_rank_and_covers_all_devices() -> None:
    plan, cluster = llama_uniform()
    nodes = node_order(plan, cluster)
    assert [n.first_rank for n in nodes] == sorted(n.first_rank for n in nodes)
    assert sum(n.slots for n in nodes) == plan.num_gpus


def test_rank_order_rejects_double_booked_device() -> None:
    plan = hand_plan([Pipeline(microbatches=16, stages=[st((0, 2), A100, ["node0:0"]),
                                                        st((3, 5), A100, ["node0:0"])])])
    with pytest.raises(HetplanError, match="already used"):
        rank_order(plan, tiny_cluster())


# --- Megatron ---------------------------------------------------------------------------------------


def test_megatron_args_carry_the_plan_degrees_and_batch() -> None:
    plan, cluster = llama_uniform(tp=2, pp=4)
    args = megatron_args(plan, cluster)
    assert arg(args, "--tensor-model-parallel-size") == "2"
    assert arg(args, "--pipeline-model-parallel-size") == "4"
    assert arg(args, "--context-parallel-size") == "1"
    assert arg(args, "--num-layers") == str(plan.model.num_layers)
    assert arg(args, "--seq-length") == "4096"
    assert arg(args, "--micro-batch-size") == str(plan.micro_batch)
    assert int(arg(args, "--global-batch-size")) == plan.training.global_batch
    assert "--sequence-parallel" in args
    assert "--pipeline-model-parallel-layout" not in args  # 40 layers / 4 stages is Megatron's default


@pytest.mark.parametrize("pp", [3, 6])
def test_uneven_split_gets_a_layout_covering_every_layer_once_in_order(pp: int) -> None:
    cluster = mixed_cluster()
    plan = uniform_plan(get_model("llama2-13b"), TrainingSpec(global_batch=64, seq_len=4096), cluster,
                        tp=1, pp=pp, group=1, gpus=12)
    assert plan.model.num_layers % pp  # 40 layers do not split evenly
    args = megatron_args(plan, cluster)
    stages = expand_layout(arg(args, "--pipeline-model-parallel-layout"))
    assert len(stages) == pp
    flat = [c for stage in stages for c in stage]
    assert flat[0] == "E" and flat[-1] == "L"
    assert flat.count("E") == 1 and flat.count("L") == 1
    assert flat.count("t") == plan.model.num_layers
    for stage, held in zip(stages, plan.pipelines[0].stages):
        assert stage.count("t") == len([i for i in range(held.layers[0], held.layers[1] + 1)
                                        if 1 <= i <= plan.model.num_layers])


def test_hand_moved_boundary_yields_layout_matching_the_split() -> None:
    cluster = tiny_cluster()
    plan = uniform_plan(get_model("tiny"), tiny_training(), cluster, tp=2, pp=2)
    moved = with_layers(plan, [(0, 1), (2, 5)])
    layout = arg(megatron_args(moved, cluster), "--pipeline-model-parallel-layout")
    assert expand_layout(layout) == [["E", "t"], ["t", "t", "t", "L"]]
    assert layout == layout_string(moved)


def test_heterogeneous_plan_with_differing_pipelines_is_refused_with_reason() -> None:
    plan = hand_plan([
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), A100, ["node0:2-3"], tp=2)]),
        Pipeline(microbatches=8, stages=[st((0, 5), V100, ["node1:0-3"], tp=4)]),
    ])
    with pytest.raises(HetplanError, match="pipelines differ") as info:
        megatron_args(plan, tiny_cluster())
    assert info.value.field == "target"


@pytest.mark.parametrize("stage_kw, reason", [
    ({"hp": 2}, "head parallelism"),
    ({"dp": 2}, "intra-stage dp"),
    ({"tp": 1, "dp": 2, "recompute": "none"}, "intra-stage dp"),
])
def test_megatron_refuses_stage_features_it_lacks(stage_kw: dict, reason: str) -> None:
    second = {"tp": 1, **stage_kw}
    plan = hand_plan([Pipeline(microbatches=16, stages=[
        st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), V100, ["node1:0-1"], **second)])])
    with pytest.raises(HetplanError, match=reason):
        megatron_args(plan, tiny_cluster())


def test_megatron_refuses_per_stage_tp_and_recompute_differences() -> None:
    tp_plan = hand_plan([Pipeline(microbatches=16, stages=[
        st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), V100, ["node1:0-3"], tp=4)])])
    with pytest.raises(HetplanError, match="tp/cp differ"):
        megatron_args(tp_plan, tiny_cluster())
    rc_plan = hand_plan([Pipeline(microbatches=16, stages=[
        st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), V100, ["node1:0-1"], tp=2, recompute="full")])])
    with pytest.raises(HetplanError, match="recompute differs"):
        megatron_args(rc_plan, tiny_cluster())


def test_megatron_refuses_a_node_whose_ranks_are_not_contiguous() -> None:
    plan = hand_plan([
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), A100, ["node1:0-1"], tp=2)]),
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node1:2-3"], tp=2), st((3, 5), A100, ["node0:2-3"], tp=2)]),
    ])
    with pytest.raises(HetplanError, match="not contiguous"):
        megatron_args(plan, a100_pair())


def test_launch_scripts_one_per_node_with_static_ranks_covering_all_gpus() -> None:
    plan, cluster = llama_uniform(tp=2, pp=4)
    scripts = launch_scripts(plan, cluster)
    nodes = node_order(plan, cluster)
    assert list(scripts) == [n.name for n in nodes]
    total = 0
    for k, (name, text) in enumerate(scripts.items()):
        assert f"--nnodes {len(nodes)} --node-rank {k} " in text
        total += int(re.search(r"--nproc-per-node (\d+)", text).group(1))
        assert "--pipeline-model-parallel-size 4" in text
    assert total == plan.num_gpus


# --- FlagScale ----------------------------------------------------------------------------------------


def hetero_two_types() -> Plan:
    """Two replicas; stage 0 on A100 tp2, stage 1 on V100 tp1 with stage dp 2."""
    return hand_plan([
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), V100, ["node1:0-1"], dp=2)]),
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node0:2-3"], tp=2), st((3, 5), V100, ["node1:2-3"], dp=2)]),
    ])


def mesh_products(flat: list[int]) -> list[int]:
    return [flat[i] * flat[i + 1] * flat[i + 3] * flat[i + 4] for i in range(0, len(flat), 5)]


@pytest.mark.parametrize("build", ["hetero", "uniform"])
def test_flagscale_meshes_multiply_out_and_split_sums_to_layers(build: str) -> None:
    if build == "hetero":
        plan, cluster = hetero_two_types(), tiny_cluster()
    else:
        plan, cluster = llama_uniform(tp=2, pp=4)
    section = hetero_section(plan, cluster)
    flat = section["hetero_process_meshes"]
    assert len(flat) % 5 == 0
    assert sum(mesh_products(flat)) == plan.num_gpus
    assert sum(section["hetero_pipeline_layer_split"]) == plan.model.num_layers
    assert len(section["hetero_pipeline_layer_split"]) == sum(flat[4::5]) == len(plan.pipelines[0].stages)
    assert len(section["hetero_device_types"]) == len(flat) // 5
    assert section["hetero_current_device_type"] in section["hetero_device_types"]
    assert len(set(flat[1::5])) == 1  # one cp for all meshes
    mbs = flagscale_config(plan, cluster)["model"]["micro_batch_size"]
    assert all(flat[3] * mbs % dp == 0 for dp in flat[3::5])
    lines = hostfile(plan, cluster).splitlines()
    assert sum(int(re.search(r"slots=(\d+)", line).group(1)) for line in lines) == plan.num_gpus
    assert all(re.fullmatch(r"\S+ slots=\d+ type=\S+", line) for line in lines)


def test_flagscale_mesh_boundaries_follow_gpu_type_changes() -> None:
    plan = hetero_two_types()
    found = meshes(plan)
    assert [(m.gpu, m.tp, m.dp, m.pp) for m in found] == [(A100, 2, 2, 1), (V100, 1, 4, 1)]
    assert yaml.safe_load(flagscale_yaml(plan, tiny_cluster()))["system"]["hetero"]["enable_hetero"] is True


def test_flagscale_refuses_differing_cp_hp_and_pipelines() -> None:
    cp_plan = hand_plan([Pipeline(microbatches=16, stages=[
        st((0, 2), A100, ["node0:0-1"], cp=2), st((3, 5), V100, ["node1:0"])])])
    with pytest.raises(HetplanError, match="cp differs"):
        hetero_section(cp_plan, tiny_cluster())
    hp_plan = hand_plan([Pipeline(microbatches=16, stages=[
        st((0, 2), A100, ["node0:0-1"], hp=2), st((3, 5), V100, ["node1:0-1"], hp=2)])])
    with pytest.raises(HetplanError, match="head parallelism"):
        hetero_section(hp_plan, tiny_cluster())
    mixed = hand_plan([
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), A100, ["node0:2-3"], tp=2)]),
        Pipeline(microbatches=8, stages=[st((0, 5), V100, ["node1:0-3"], tp=4)]),
    ])
    with pytest.raises(HetplanError, match="pipelines differ") as info:
        hostfile(mixed, tiny_cluster())
    assert info.value.field == "target"


# --- generic rank map ---------------------------------------------------------------------------------


def differing_pipelines() -> Plan:
    return hand_plan([
        Pipeline(microbatches=6, stages=[st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), A100, ["node0:2-3"], tp=2)]),
        Pipeline(microbatches=10, stages=[st((0, 1), V100, ["node1:0-1"], cp=2),
                                          st((2, 5), V100, ["node1:2-3"], hp=2)]),
    ])


PLANS = {
    "differing": (differing_pipelines, tiny_cluster),
    "stage_dp": (hetero_two_types, tiny_cluster),
    "uniform": (lambda: llama_uniform(tp=2, pp=4)[0], mixed_cluster),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_rank_map_covers_every_device_once_and_groups_partition_ranks(name: str) -> None:
    build, cl = PLANS[name]
    plan, cluster = build(), cl()
    rm = rank_map(plan, cluster)
    devices = sorted((n, i) for p in plan.pipelines for s in p.stages for n, i in expand_devices(s.devices))
    placed = sorted((r["node"], r["local_gpu"]) for r in rm["ranks"])
    assert placed == devices and len(set(placed)) == len(placed)
    assert [r["rank"] for r in rm["ranks"]] == list(range(rm["world_size"]))
    ranks = rm["ranks"]
    for kind, size in (("tp", "tp"), ("cp", "cp"), ("hp", "hp"), ("stage_dp", "dp")):
        groups = rm["groups"][kind]
        members = sorted(r for g in groups for r in g)
        assert members == list(range(len(ranks))), kind  # each rank in exactly one group
        for g in groups:
            stage = plan.pipelines[ranks[g[0]]["pipeline"]].stages[ranks[g[0]]["stage"]]
            assert len(g) == getattr(stage, size), kind
            assert len({(ranks[r]["pipeline"], ranks[r]["stage"]) for r in g}) == 1
    holders: dict[tuple, list[int]] = {}
    for g in rm["groups"]["dp"]:
        holders.setdefault(tuple(g["layers"]), []).extend(g["ranks"])
    covered = sorted(i for a, b in holders for i in range(a, b + 1))
    assert covered == list(range(plan.model.num_layers + 2))
    for (a, b), members in holders.items():
        expect = [r["rank"] for r in ranks if r["layers"][0] <= a and b <= r["layers"][1]]
        assert sorted(members) == expect
    pp_ranks = sorted(r for g in rm["groups"]["pp"] for s in g["stages"] for r in s)
    assert pp_ranks == list(range(len(ranks)))


def test_rank_map_is_json_ready_and_deterministic() -> None:
    plan, cluster = differing_pipelines(), tiny_cluster()
    text = rank_map_json(plan, cluster)
    assert text == rank_map_json(plan.model_copy(deep=True), tiny_cluster())
    assert json.loads(text) == rank_map(plan, cluster)


def test_python_api_emit_matches_the_registry() -> None:
    """`from planner import emit` gives the function; any = every engine that can run, reasons for the rest."""
    from planner import emit
    from planner.emit.targets import EMITTERS
    from planner.errors import HetplanError
    from planner.plan import load_plan
    from planner.specs import load_cluster

    root = Path(__file__).resolve().parents[1]
    plan = load_plan(root / "examples" / "plan_tiny.json")
    cluster = load_cluster(root / "examples" / "tiny_cluster.yaml")
    out = emit(plan, cluster, "any")
    assert set(out.files) | set(out.refused) == set(EMITTERS)
    assert out.files["rankmap"] == EMITTERS["rankmap"](plan, cluster)
    with pytest.raises(HetplanError):
        emit(plan, cluster, "megatron")


def test_emit_stays_a_package_for_submodule_imports() -> None:
    """The callable `planner.emit` must not hide its submodules from `import planner.emit.x as y`."""
    import importlib
    import subprocess
    import sys

    code = "import planner, planner.emit.megatron as m, planner.emit.targets as t; print(m.__name__, t.__name__)"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.split() == ["planner.emit.megatron", "planner.emit.targets"]
    assert importlib.import_module("planner.emit").megatron.__name__ == "planner.emit.megatron"
