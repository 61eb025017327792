"""torchtitan, DeepSpeed and Slurm/torchrun emitters without the engines: refusals name their reason,
node order and rank blocks follow the shared placement, batch numbers multiply out to the plan's."""

from __future__ import annotations

import json
import re
from itertools import pairwise

import pytest

from planner.emit.deepspeed import (
    batch_numbers,
    deepspeed_files,
    ds_config,
    hostfile,
    include_string,
    pipeline_parts,
    pipeline_spec,
)
from planner.emit.placement import node_order, rank_order
from planner.emit.slurm import (
    components,
    node_script,
    sbatch_script,
    slurm_files,
    torchrun_scripts,
)
from planner.emit.targets import EMITTERS
from planner.emit.torchtitan import model_parts, torchtitan_files, torchtitan_overrides
from planner.errors import HetplanError
from planner.plan import Pipeline, Plan, Stage
from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.models import get_model
from planner.specs.training import TrainingSpec
from planner.uniform import uniform_plan

A100, V100, H100 = "A100-SXM4-80GB", "V100-SXM2-32GB", "H100-SXM5-80GB"
NEW_TARGETS = ("torchtitan", "deepspeed", "slurm")


def cluster_of(*groups: tuple[str, int, int]) -> ClusterSpec:
    return ClusterSpec(nodes=[NodeGroup(gpu=g, nodes=n, gpus_per_node=k) for g, n, k in groups])


def mixed_cluster() -> ClusterSpec:
    return cluster_of((A100, 1, 8), (V100, 2, 8), (H100, 1, 4))


def two_type_cluster() -> ClusterSpec:
    return cluster_of((A100, 1, 4), (V100, 1, 4))


def st(layers, gpu, devices, **kw) -> Stage:
    return Stage(layers=layers, gpu=gpu, devices=devices, **kw)


def tiny_plan(pipelines: list[Pipeline], micro_batch: int = 2, **training) -> Plan:
    spec = TrainingSpec(global_batch=32, seq_len=128, **training)
    return Plan(model=get_model("tiny"), training=spec, micro_batch=micro_batch, pipelines=pipelines)


def hetero_pipeline_plan(**training) -> Plan:
    """One pipeline per replica, A100 stage then V100 stage, tp=2, uneven split (tiny: layers 0..5)."""
    return tiny_plan([
        Pipeline(microbatches=8, stages=[st((0, 1), A100, ["node0:0-1"], tp=2), st((2, 5), V100, ["node1:0-1"], tp=2)]),
        Pipeline(microbatches=8, stages=[st((0, 1), A100, ["node0:2-3"], tp=2), st((2, 5), V100, ["node1:2-3"], tp=2)]),
    ], **training)


def differing_pipelines_plan() -> Plan:
    return tiny_plan([
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), A100, ["node0:2-3"], tp=2)]),
        Pipeline(microbatches=8, stages=[st((0, 5), V100, ["node1:0-3"], tp=4)]),
    ])


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# --- registry ---------------------------------------------------------------------------------------


def test_new_targets_are_registered_and_write_under_their_own_folder() -> None:
    plan, cluster = hetero_pipeline_plan(), two_type_cluster()
    for name in NEW_TARGETS:
        files = EMITTERS[name](plan, cluster)
        assert files and all(path.startswith(f"{name}/") for path in files)
        assert all(text.endswith("\n") for text in files.values())


@pytest.mark.parametrize("name", ["torchtitan", "deepspeed"])
def test_grid_engines_refuse_differing_pipelines_with_field_target(name: str) -> None:
    with pytest.raises(HetplanError, match="pipelines differ") as info:
        EMITTERS[name](differing_pipelines_plan(), two_type_cluster())
    assert info.value.field == "target"


def test_slurm_launches_plans_whose_pipelines_differ() -> None:
    plan, cluster = tiny_plan([
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), V100, ["node1:0-1"], tp=2)]),
        Pipeline(microbatches=8, stages=[st((0, 5), A100, ["node0:2-3"], tp=2)]),
    ]), two_type_cluster()
    files = slurm_files(plan, cluster)
    ranks = json.loads(files["slurm/rankmap.json"])["ranks"]
    assert len(ranks) == plan.num_gpus


def test_emitters_are_deterministic() -> None:
    plan, cluster = hetero_pipeline_plan(), two_type_cluster()
    for name in NEW_TARGETS:
        assert EMITTERS[name](plan, cluster) == EMITTERS[name](plan, cluster)


# --- Slurm / torchrun -------------------------------------------------------------------------------


def test_het_components_follow_node_order_and_split_at_gpu_type_changes() -> None:
    cluster = mixed_cluster()
    plan = uniform_plan(get_model("llama2-13b"), TrainingSpec(global_batch=64, seq_len=4096), cluster,
                        tp=2, pp=2, group=1)
    order = [n.name for n in node_order(plan, cluster)]
    comps = components(plan, cluster)
    assert [s.name for c in comps for s in c.nodes] == order
    for c in comps:
        assert {cluster.node(s.name).gpu for s in c.nodes} == {c.gpu}
        assert c.first_node_rank == order.index(c.nodes[0].name)
    for a, b in pairwise(comps):
        assert (a.gpu, a.gpus_per_node) != (b.gpu, b.gpus_per_node)


def test_interleaved_gpu_types_get_one_component_per_run() -> None:
    cluster = cluster_of((A100, 1, 2), (V100, 1, 2), (A100, 1, 2))
    plan = tiny_plan([Pipeline(microbatches=16, stages=[
        st((0, 1), A100, ["node0:0-1"], tp=2), st((2, 3), V100, ["node1:0-1"], tp=2),
        st((4, 5), A100, ["node2:0-1"], tp=2)])])
    comps = components(plan, cluster)
    assert [c.gpu for c in comps] == [A100, V100, A100]
    script = sbatch_script(plan, cluster)
    assert script.count("#SBATCH hetjob") == len(comps) - 1
    assert [int(m) for m in re.findall(r"--het-group=(\d+)", script)] == list(range(len(comps)))


def test_sbatch_directives_precede_commands_and_request_each_component() -> None:
    plan, cluster = hetero_pipeline_plan(), two_type_cluster()
    script = sbatch_script(plan, cluster, features={A100: "a100"})
    lines = script.splitlines()
    first_cmd = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert not any(line.startswith("#SBATCH") for line in lines[first_cmd:])
    assert "#SBATCH --constraint=a100" in lines and f"#SBATCH --constraint={V100}" in lines
    nodes = [int(m) for m in re.findall(r"#SBATCH --nodes=(\d+)", script)]
    assert nodes == [len(c.nodes) for c in components(plan, cluster)]
    assert "SLURM_JOB_NODELIST_HET_GROUP_0" in script


def test_single_component_job_is_a_plain_job() -> None:
    cluster = cluster_of((A100, 2, 4))
    plan = tiny_plan([Pipeline(microbatches=16, stages=[
        st((0, 2), A100, ["node0:0-3"], tp=4), st((3, 5), A100, ["node1:0-3"], tp=4)])])
    script = sbatch_script(plan, cluster)
    assert "hetjob" not in script and "--het-group" not in script
    assert "$SLURM_JOB_NODELIST\"" in script


def test_node_script_rows_give_each_node_rank_its_node_gpus_and_count() -> None:
    plan, cluster = hetero_pipeline_plan(), two_type_cluster()
    rows = re.findall(r"^\s+(\d+)\) NAME=(\S+); GPUS=(\S+); NPROC=(\d+) ;;", node_script(plan, cluster), re.MULTILINE)
    nodes = node_order(plan, cluster)
    assert [(int(k), name, gpus, int(n)) for k, name, gpus, n in rows] == [
        (k, s.name, ",".join(map(str, s.gpus)), s.slots) for k, s in enumerate(nodes)]


def test_torchrun_scripts_give_contiguous_rank_blocks_in_node_order() -> None:
    plan, cluster = hetero_pipeline_plan(), two_type_cluster()
    ranks = rank_order(plan, cluster)
    scripts = torchrun_scripts(plan, cluster)
    assert list(scripts) == [n.name for n in node_order(plan, cluster)]
    start = 0
    for k, (name, text) in enumerate(scripts.items()):
        nproc = int(re.search(r"--nproc-per-node (\d+)", text).group(1))
        assert int(re.search(r"--node-rank (\d+)", text).group(1)) == k
        block = ranks[start:start + nproc]
        assert {r.node for r in block} == {name}
        gpus = re.search(r"CUDA_VISIBLE_DEVICES=(\S+)", text).group(1)
        assert gpus == ",".join(str(r.local_gpu) for r in block)
        start += nproc
    assert start == plan.num_gpus


def test_torchrun_refuses_a_node_whose_ranks_are_not_contiguous() -> None:
    cluster = cluster_of((A100, 2, 4))
    plan = tiny_plan([
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node0:0-1"], tp=2), st((3, 5), A100, ["node1:0-1"], tp=2)]),
        Pipeline(microbatches=8, stages=[st((0, 2), A100, ["node1:2-3"], tp=2), st((3, 5), A100, ["node0:2-3"], tp=2)]),
    ])
    for name in NEW_TARGETS:
        with pytest.raises(HetplanError, match="not contiguous"):
            EMITTERS[name](plan, cluster)


# --- torchtitan -------------------------------------------------------------------------------------


def test_torchtitan_model_parts_hold_every_module_once_in_plan_order() -> None:
    plan = hetero_pipeline_plan()
    parts = model_parts(plan)
    flat = [m for p in parts for m in p]
    n = plan.model.num_layers
    assert flat == ["tok_embeddings", *[f"layers.{i}" for i in range(n)], "norm", "lm_head"]
    for part, stage in zip(parts, plan.pipelines[0].stages):
        first, last = stage.layers
        assert sum(m.startswith("layers.") for m in part) == len(range(max(first, 1), min(last, n) + 1))


def test_torchtitan_degrees_cover_the_plan_and_batch_multiplies_out() -> None:
    for zero in (0, 1, 3):
        plan = hetero_pipeline_plan(zero=zero)
        args = torchtitan_overrides(plan)
        degrees = [int(flag(args, f"--parallelism.{k}-degree")) for k in
                   ("data-parallel-replicate", "data-parallel-shard", "tensor-parallel", "context-parallel",
                    "pipeline-parallel")]
        assert degrees[0] * degrees[1] * degrees[2] * degrees[3] * degrees[4] == plan.num_gpus
        assert (degrees[1] > 1) == (zero >= 1)
        dp = degrees[0] * degrees[1]
        local, mb = int(flag(args, "--training.local-batch-size")), int(flag(args, "--parallelism.pipeline-parallel-microbatch-size"))
        assert local // mb == plan.pipelines[0].microbatches
        assert int(flag(args, "--training.global-batch-size")) == local * dp == plan.training.global_batch
        assert args[-1].startswith("activation-checkpoint:")


def test_torchtitan_without_pipeline_accumulates_microbatches() -> None:
    cluster = two_type_cluster()
    plan = uniform_plan(get_model("tiny"), TrainingSpec(global_batch=32, seq_len=128), cluster, tp=2, pp=1,
                        micro_batch=2)
    args = torchtitan_overrides(plan)
    assert "--parallelism.module-fqns-per-model-part" not in args
    local, dp = int(flag(args, "--training.local-batch-size")), len(plan.pipelines)
    assert int(flag(args, "--training.global-batch-size")) == local * dp * plan.pipelines[0].microbatches


@pytest.mark.parametrize("second, reason", [
    ({"tp": 1, "hp": 2}, "head parallelism"),
    ({"tp": 1, "devices": ["node1:0"]}, "per-stage degrees differ"),
    ({"tp": 2, "recompute": "full"}, "recompute differs"),
])
def test_torchtitan_refuses_what_one_mesh_cannot_express(second: dict, reason: str) -> None:
    kw = {"devices": ["node1:0-1"], **second}
    plan = tiny_plan([Pipeline(microbatches=16, stages=[st((0, 2), A100, ["node0:0-1"], tp=2),
                                                         st((3, 5), V100, **kw)])])
    with pytest.raises(HetplanError, match=reason) as info:
        torchtitan_files(plan, two_type_cluster())
    assert info.value.field == "target"


def test_torchtitan_refuses_fp16_and_indivisible_stage_dp() -> None:
    with pytest.raises(HetplanError, match="fp16"):
        torchtitan_overrides(hetero_pipeline_plan(dtype="fp16"))
    plan = tiny_plan([Pipeline(microbatches=16, stages=[st((0, 5), A100, ["node0:0-1"], dp=2)])], micro_batch=3)
    with pytest.raises(HetplanError, match="does not divide micro_batch"):
        torchtitan_overrides(plan)


def test_torchtitan_launch_scripts_put_user_args_before_the_subcommand() -> None:
    files = torchtitan_files(hetero_pipeline_plan(), two_type_cluster())
    for path, text in files.items():
        if path.endswith(".sh"):
            assert text.index('"$@"') < text.index("activation-checkpoint:")
            assert text.rstrip().endswith(torchtitan_overrides(hetero_pipeline_plan())[-1])


# --- DeepSpeed --------------------------------------------------------------------------------------


def test_deepspeed_batch_numbers_multiply_to_the_global_batch() -> None:
    plan = hetero_pipeline_plan()
    numbers = batch_numbers(plan)
    dp = pipeline_spec(plan)["topology"]["num_dp"]
    assert numbers["train_batch_size"] == (numbers["train_micro_batch_size_per_gpu"]
                                           * numbers["gradient_accumulation_steps"] * dp)
    assert numbers["train_batch_size"] == plan.training.global_batch


def test_deepspeed_topology_and_parts_match_the_plan() -> None:
    plan = hetero_pipeline_plan()
    spec = pipeline_spec(plan)
    topo = spec["topology"]
    assert topo["num_pp"] * topo["num_mp"] * topo["num_dp"] == plan.num_gpus
    parts = pipeline_parts(plan)
    assert parts[0] == 0 and parts[-1] == spec["num_layer_specs"] == plan.model.num_layers + 2
    for s, stage in enumerate(plan.pipelines[0].stages):
        assert (parts[s], parts[s + 1] - 1) == tuple(stage.layers)


def test_deepspeed_hostfile_and_include_follow_node_order() -> None:
    plan, cluster = hetero_pipeline_plan(), two_type_cluster()
    nodes = node_order(plan, cluster)
    assert [line.split()[0] for line in hostfile(plan, cluster).splitlines()] == [n.name for n in nodes]
    assert include_string(plan, cluster).split("@") == [f"{n.name}:{','.join(map(str, n.gpus))}" for n in nodes]
    assert "--include" in deepspeed_files(plan, cluster)["deepspeed/launch.sh"]


def test_deepspeed_autotp_only_without_pipeline() -> None:
    cluster = two_type_cluster()
    flat = uniform_plan(get_model("tiny"), TrainingSpec(global_batch=32, seq_len=128, zero=3), cluster, tp=2,
                        pp=1, micro_batch=2)
    assert ds_config(flat)["tensor_parallel"] == {"autotp_size": 2}
    assert ds_config(flat)["zero_optimization"]["stage"] == 3  # ZeRO-3 is fine without a pipeline
    assert "tensor_parallel" not in ds_config(hetero_pipeline_plan())


@pytest.mark.parametrize("plan_fn, reason", [
    (lambda: hetero_pipeline_plan(zero=2), "ZeRO stage 2"),
    (lambda: hetero_pipeline_plan(dtype="fp8"), "fp8"),
    (lambda: tiny_plan([Pipeline(microbatches=16, stages=[st((0, 2), A100, ["node0:0-1"], tp=2),
                                                          st((3, 5), V100, ["node1:0-1"], tp=1, dp=2)])]),
     "per-stage degrees differ"),
    (lambda: tiny_plan([Pipeline(microbatches=16, stages=[st((0, 5), A100, ["node0:0-1"], cp=2)])]), "cp=2"),
    (lambda: tiny_plan([Pipeline(microbatches=16, stages=[st((0, 5), A100, ["node0:0-1"], tp=2,
                                                               recompute="selective")])]), "selective"),
    (lambda: tiny_plan([Pipeline(microbatches=16, stages=[st((0, 5), A100, ["node0:1", "node0:0"], tp=2)])]),
     "ascending"),
])
def test_deepspeed_refuses_with_reason(plan_fn, reason: str) -> None:
    with pytest.raises(HetplanError, match=reason) as info:
        deepspeed_files(plan_fn(), two_type_cluster())
    assert info.value.field == "target"
