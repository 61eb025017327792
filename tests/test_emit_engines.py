"""Emitted launch files read back by the engines' own code (megatron-core, torchtitan, DeepSpeed).

Each test skips when its engine is not installed (the `engines` extra). FlagScale is not installable
next to this torch, so its YAML is checked against the rules of planner/emit/flagscale.py only, plus
megatron-core's layout check of the same split. Megatron-LM's own argument parser is not part of
megatron-core; the Megatron arguments are instead turned into megatron-core's TransformerConfig, whose
field names are the parser's destinations and whose __post_init__ validates them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from planner import get_model, load_cluster, search
from planner.emit.deepspeed import ds_config, pipeline_spec
from planner.emit.flagscale import flagscale_yaml, meshes
from planner.emit.megatron import layout_string, megatron_args
from planner.emit.placement import rank_order
from planner.emit.torchtitan import model_parts, torchtitan_overrides
from planner.plan import Pipeline, Plan, Stage
from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.training import TrainingSpec
from planner.uniform import uniform_plan

ROOT = Path(__file__).resolve().parents[1]
A100, V100 = "A100-SXM4-80GB", "V100-SXM2-32GB"
# Megatron flags that configure training, not the model (no TransformerConfig field)
MEGATRON_TRAINING_ONLY = {"seq_length", "max_position_embeddings", "micro_batch_size", "global_batch_size",
                          "use_distributed_optimizer", "group_query_attention"}
SEARCH_LIMIT_S = 20.0


@pytest.fixture(scope="module")
def llama_searches() -> dict[str, tuple[Plan, ClusterSpec]]:
    """examples/mixed.yaml, Llama-2 13B, global batch 64, seq 4096: the Megatron and FlagScale searches.
    Micro batch 1 only (the size the full search picks) keeps each grid search near 7 s instead of 25 s."""
    cluster = load_cluster(ROOT / "examples" / "mixed.yaml")
    training = TrainingSpec(global_batch=64, seq_len=4096, micro_batches=(1,))
    return {target: (search(get_model("llama2-13b"), cluster, training, target=target,
                            time_limit=SEARCH_LIMIT_S).plan, cluster)
            for target in ("megatron", "flagscale")}


def split_args(args: list[str]) -> dict[str, str | bool]:
    """'--a-b v' -> {'a_b': 'v'}, bare '--flag' -> True (argparse's dest naming)."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        name = args[i][2:].replace("-", "_")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[name], i = args[i + 1], i + 2
        else:
            out[name], i = True, i + 1
    return out


def transformer_config_from_args(args: list[str]):
    """megatron-core TransformerConfig from Megatron arguments, the way Megatron-LM copies parsed args
    into it (same names; dtype flags set params/pipeline dtype)."""
    torch = pytest.importorskip("torch")
    from megatron.core.transformer.transformer_config import TransformerConfig

    parsed = split_args(args)
    fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
    unknown = set(parsed) - set(fields) - MEGATRON_TRAINING_ONLY
    assert not unknown, f"flags megatron-core does not know: {sorted(unknown)}"
    kwargs = {}
    for name, value in parsed.items():
        if name not in fields:
            continue
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        kwargs[name] = value
    dtype = torch.bfloat16 if parsed.get("bf16") else torch.float16 if parsed.get("fp16") else torch.float32
    kwargs.update(params_dtype=dtype, pipeline_dtype=dtype)
    return TransformerConfig(**kwargs)


def decoders(plan: Plan, stage: Stage) -> int:
    first, last = stage.layers
    return len(range(max(first, 1), min(last, plan.model.num_layers) + 1))


# --- Megatron (megatron-core) -----------------------------------------------------------------------


def test_megatron_search_plan_is_one_uniform_grid(llama_searches) -> None:
    plan, _ = llama_searches["megatron"]
    stages = [s for p in plan.pipelines for s in p.stages]
    assert len({(s.tp, s.cp) for s in stages}) == 1
    assert len({s.gpu for s in stages}) > 1  # the grid spans GPU types: the layout carries the balance


def test_megatron_layout_is_accepted_by_megatron_core(llama_searches) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    plan, _ = llama_searches["megatron"]
    stages = plan.pipelines[0].stages
    layout = PipelineParallelLayerLayout(layout_string(plan), pipeline_model_parallel_size=len(stages))
    layout.validate_layer_layout(num_layers=plan.model.num_layers, mtp_num_layers=None)
    offset = 0
    for s, stage in enumerate(stages):
        assert layout.get_num_layers_to_build(pp_rank=s) == decoders(plan, stage)
        assert layout.get_layer_offset(pp_rank=s) == offset
        offset += decoders(plan, stage)


def test_megatron_args_build_a_valid_transformer_config(llama_searches) -> None:
    pytest.importorskip("megatron.core")
    plan, cluster = llama_searches["megatron"]
    args = megatron_args(plan, cluster)
    config = transformer_config_from_args(args)
    stage = plan.pipelines[0].stages[0]
    assert (config.tensor_model_parallel_size, config.context_parallel_size) == (stage.tp, stage.cp)
    assert config.pipeline_model_parallel_size == len(plan.pipelines[0].stages)
    assert config.num_layers == plan.model.num_layers
    if "--pipeline-model-parallel-layout" in args:
        layout = config.pipeline_model_parallel_layout
        layout.validate_layer_layout(num_layers=config.num_layers, mtp_num_layers=None)
        assert [layout.get_num_layers_to_build(pp_rank=s) for s in range(len(plan.pipelines[0].stages))] == [
            decoders(plan, st) for st in plan.pipelines[0].stages]


def test_megatron_core_rejects_a_layout_that_loses_a_layer(llama_searches) -> None:
    """The check bites: one decoder layer fewer than num_layers fails megatron-core's validation."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    plan, _ = llama_searches["megatron"]
    pp = len(plan.pipelines[0].stages)
    layout = PipelineParallelLayerLayout(layout_string(plan), pipeline_model_parallel_size=pp)
    with pytest.raises(AssertionError):
        layout.validate_layer_layout(num_layers=plan.model.num_layers + 1, mtp_num_layers=None)


def test_megatron_args_of_a_uniform_recompute_plan_build_a_config() -> None:
    pytest.importorskip("megatron.core")
    cluster = load_cluster(ROOT / "examples" / "mixed.yaml")
    plan = uniform_plan(get_model("llama2-13b"), TrainingSpec(global_batch=64, seq_len=4096), cluster,
                        tp=4, pp=3, group=1, gpus=12, recompute="full")
    config = transformer_config_from_args(megatron_args(plan, cluster))
    assert config.recompute_granularity == "full" and config.recompute_num_layers == 1
    assert config.num_query_groups in (None, plan.model.kv_heads)


# --- FlagScale (rules only; FlagScale is not installable here) --------------------------------------


def test_flagscale_search_plan_satisfies_the_hetero_rules(llama_searches) -> None:
    plan, cluster = llama_searches["flagscale"]
    hetero = yaml.safe_load(flagscale_yaml(plan, cluster))["system"]["hetero"]
    flat = hetero["hetero_process_meshes"]
    mesh_list = [flat[i:i + 5] for i in range(0, len(flat), 5)]
    assert len(mesh_list) == len(meshes(plan)) == len(hetero["hetero_device_types"])
    split = hetero["hetero_pipeline_layer_split"]
    assert sum(m[4] for m in mesh_list) == len(split) == len(plan.pipelines[0].stages)
    assert sum(split) == plan.model.num_layers and min(split) >= 1
    assert len({m[1] for m in mesh_list}) == 1 and {m[2] for m in mesh_list} == {1}  # one cp, ep = 1
    assert sum(m[0] * m[1] * m[3] * m[4] for m in mesh_list) == plan.num_gpus
    assert hetero["hetero_current_device_type"] in hetero["hetero_device_types"]


def test_flagscale_layer_split_is_a_valid_megatron_layout(llama_searches) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    plan, cluster = llama_searches["flagscale"]
    split = yaml.safe_load(flagscale_yaml(plan, cluster))["system"]["hetero"]["hetero_pipeline_layer_split"]
    parts = [("E" if s == 0 else "") + "t" * k + ("L" if s == len(split) - 1 else "") for s, k in enumerate(split)]
    layout = PipelineParallelLayerLayout("|".join(parts), pipeline_model_parallel_size=len(split))
    layout.validate_layer_layout(num_layers=plan.model.num_layers, mtp_num_layers=None)


# --- torchtitan -------------------------------------------------------------------------------------


def parse_torchtitan(args: list[str]):
    pytest.importorskip("triton")  # torchtitan's model registry imports it
    config_mod = pytest.importorskip("torchtitan.config")
    return config_mod.ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *args])


def hetero_tiny_plan(zero: int = 1) -> tuple[Plan, ClusterSpec]:
    cluster = ClusterSpec(nodes=[NodeGroup(gpu=A100, nodes=1, gpus_per_node=4),
                                 NodeGroup(gpu=V100, nodes=1, gpus_per_node=4)])
    st = lambda layers, gpu, devs: Stage(layers=layers, gpu=gpu, devices=devs, tp=2)
    plan = Plan(model=get_model("tiny"), training=TrainingSpec(global_batch=32, seq_len=128, zero=zero),
                micro_batch=2, pipelines=[
                    Pipeline(microbatches=8, stages=[st((0, 1), A100, ["node0:0-1"]), st((2, 5), V100, ["node1:0-1"])]),
                    Pipeline(microbatches=8, stages=[st((0, 1), A100, ["node0:2-3"]), st((2, 5), V100, ["node1:2-3"])])])
    return plan, cluster


def check_torchtitan_config(plan: Plan, cluster: ClusterSpec) -> None:
    config = parse_torchtitan(torchtitan_overrides(plan))
    from torch import nn
    from torch.distributed.pipelining.schedules import (
        PipelineScheduleSingle,
        get_schedule_class,
    )
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _split_module

    par, training = config.parallelism, config.training
    ref = plan.pipelines[0]
    stage = ref.stages[0]
    dims = ParallelDims.from_config(par, world_size=plan.num_gpus)  # raises unless degrees multiply out
    assert (dims.tp, dims.cp, dims.pp) == (stage.tp, stage.cp, len(ref.stages))
    assert dims.dp_replicate * dims.dp_shard == len(plan.pipelines) * stage.dp
    assert training.seq_len == plan.training.seq_len
    assert training.global_batch_size == plan.training.global_batch
    # torchtitan's mesh (pp, dp_replicate, dp_shard, cp, tp), row-major, is the shared rank order
    for r in rank_order(plan, cluster):
        data = r.pipeline * stage.dp + r.dp_rank
        assert r.rank == r.tp_rank + stage.tp * (r.cp_rank + stage.cp * (data + dims.dp_replicate * dims.dp_shard
                                                                         * r.stage))
    if len(ref.stages) > 1:
        assert training.disable_cuda_graphs
        assert par.pipeline_parallel_microbatch_size == plan.micro_batch // stage.dp
        assert training.local_batch_size // par.pipeline_parallel_microbatch_size == ref.microbatches
        assert issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
        assert par.module_fqns_per_model_part == model_parts(plan)
        # torchtitan's own splitter keeps exactly the plan's layers in each part
        n = plan.model.num_layers
        whole = nn.Module()
        whole.tok_embeddings, whole.norm, whole.lm_head = nn.Identity(), nn.Identity(), nn.Identity()
        whole.layers = nn.ModuleDict({str(i): nn.Identity() for i in range(n)})
        for names, st in zip(par.module_fqns_per_model_part, ref.stages):
            part = _split_module(whole, names)
            kept = sorted(int(k) for k in part.layers)
            assert kept == [i - 1 for i in range(max(st.layers[0], 1), min(st.layers[1], n) + 1)]
            assert (part.tok_embeddings is not None) == (st.layers[0] == 0)
            assert (part.lm_head is not None) == (st.layers[1] == n + 1)


def test_torchtitan_accepts_the_overrides_of_a_heterogeneous_pipeline_plan() -> None:
    plan, cluster = hetero_tiny_plan()
    check_torchtitan_config(plan, cluster)


def test_torchtitan_needs_the_emitted_cuda_graph_switch_for_pipelines(capsys) -> None:
    """The check bites: without --training.disable-cuda-graphs torchtitan (via tyro) exits on the pipeline."""
    args = [a for a in torchtitan_overrides(hetero_tiny_plan()[0]) if a != "--training.disable-cuda-graphs"]
    with pytest.raises(SystemExit):
        parse_torchtitan(args)
    captured = capsys.readouterr()
    assert "pipeline parallelism" in captured.out + captured.err


def test_torchtitan_accepts_the_megatron_search_plan(llama_searches) -> None:
    plan, cluster = llama_searches["megatron"]
    check_torchtitan_config(plan, cluster)


# --- DeepSpeed --------------------------------------------------------------------------------------


class _DataParallelOnly:
    """The one mpu method DeepSpeedConfig asks: the data-parallel world size of the plan's grid."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def deepspeed_config(config: dict, dp: int, monkeypatch):
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_runtime_config
    from deepspeed.runtime.config import DeepSpeedConfig

    # DeepSpeedConfig reads the rank from deepspeed.comm and falls back to world size 1 without a
    # process group; pretend rank 0 so the mpu's data-parallel size is used
    monkeypatch.setattr(ds_runtime_config.dist, "get_rank", lambda *a, **k: 0)
    return DeepSpeedConfig(config, mpu=_DataParallelOnly(dp))


@pytest.mark.parametrize("which", ["hetero", "uniform"])
def test_deepspeed_config_accepts_the_plan_batch_numbers(which: str, monkeypatch) -> None:
    if which == "hetero":
        plan, cluster = hetero_tiny_plan(zero=1)
    else:
        cluster = load_cluster(ROOT / "examples" / "mixed.yaml")
        plan = uniform_plan(get_model("llama2-13b"), TrainingSpec(global_batch=64, seq_len=4096, zero=1), cluster,
                            tp=2, pp=4, group=1)
    spec = pipeline_spec(plan)
    dp = spec["topology"]["num_dp"]
    parsed = deepspeed_config(ds_config(plan), dp, monkeypatch)
    assert parsed.world_size == dp
    assert parsed.train_batch_size == plan.training.global_batch
    assert parsed.train_micro_batch_size_per_gpu == plan.micro_batch // plan.pipelines[0].stages[0].dp
    assert parsed.gradient_accumulation_steps == plan.pipelines[0].microbatches
    assert parsed.zero_optimization_stage == plan.training.zero < 2  # PipelineEngine's requirement
    assert parsed.bfloat16_config.enabled


def test_deepspeed_config_rejects_a_wrong_data_parallel_size(monkeypatch) -> None:
    """The check bites: the same config against one replica more fails DeepSpeed's batch assertion."""
    plan, _ = hetero_tiny_plan()
    dp = pipeline_spec(plan)["topology"]["num_dp"]
    with pytest.raises(AssertionError, match="train_batch_size"):
        deepspeed_config(ds_config(plan), dp + 1, monkeypatch)


def test_deepspeed_topology_numbers_ranks_like_the_plan() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    for plan, cluster in (hetero_tiny_plan(), ):
        topo_args = pipeline_spec(plan)["topology"]
        topo = PipeModelDataParallelTopology(**topo_args)
        assert topo.world_size() == plan.num_gpus
        sdp = plan.pipelines[0].stages[0].dp
        for r in rank_order(plan, cluster):
            coord = topo.get_coord(r.rank)
            assert (coord.pipe, coord.data, coord.model) == (r.stage, r.pipeline * sdp + r.dp_rank, r.tp_rank)
