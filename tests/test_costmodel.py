"""The analytic cost model against the published formulas (Megatron memory accounting, Korthikanti et al.
activation sizes, the 72/96·B·s·l·h² FLOP counts, catalog parameter counts) and basic monotonicity."""

from __future__ import annotations

import math

import pytest

from planner.costmodel import stage as st
from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import DeviceClass, Shard
from planner.costmodel.knobs import Knobs, default_knobs
from planner.costmodel.shapes import layer_fwd_flops, layer_params, model_flops_per_sequence
from planner.evaluate import evaluate
from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.gpus import get_gpu
from planner.specs.models import ModelSpec, get_model
from planner.specs.training import TrainingSpec
from planner.uniform import uniform_plan

GPT = ModelSpec(name="gpt-test", num_layers=8, hidden=1024, ffn_hidden=4096, num_heads=16, vocab=51200)


def _dev(gpu: str = "A100-SXM4-80GB") -> DeviceClass:
    g = get_gpu(gpu)
    return DeviceClass(g, 8, g.intra_bw_gbs, g.nic_gbps / 8)


def _table(model: ModelSpec, *, tp: int = 1, b: int = 1, s: int = 2048, recompute: str = "none",
           attention: str = "naive", sp: bool = True, gpu: str = "A100-SXM4-80GB", knobs: Knobs | None = None):
    training = TrainingSpec(global_batch=8, seq_len=s, attention=attention, sequence_parallel=sp)
    return AnalyticCostModel(knobs or Knobs()).layer_table(_dev(gpu), Shard(tp, 1, 1, b, recompute, s), model,
                                                          training)


# -- memory: Megatron accounting -----------------------------------------------------------------
@pytest.mark.parametrize("dp", [1, 2, 8, 64])
def test_bytes_per_param_match_megatron_accounting(dp: int) -> None:
    assert st.bytes_per_param(0, dp) == 18.0, "plain DP keeps 2 (bf16 w) + 4 (fp32 grad) + 12 (Adam) bytes"
    assert math.isclose(st.bytes_per_param(1, dp), 6 + 12 / dp), "distributed optimizer shards the 12 B"


def test_gpt_decoder_params_are_12h2_plus_13h() -> None:
    h = GPT.hidden
    assert layer_params(GPT, "decoder") == 12 * h * h + 13 * h


@pytest.mark.parametrize("b,s,a", [(1, 2048, 16), (4, 1024, 16)])
def test_activation_bytes_match_korthikanti_without_flash(b: int, s: int, a: int) -> None:
    table = _table(GPT, b=b, s=s, attention="naive")
    h = GPT.hidden
    want = 34 * s * b * h + 5 * a * s * s * b
    got = table.act_bytes[1]
    assert math.isclose(got, want, rel_tol=1e-9), f"decoder stash {got} != 34sbh + 5as²b = {want}"


def test_tensor_and_sequence_parallel_divide_activations_by_t() -> None:
    base = _table(GPT, attention="naive").act_bytes[1]
    for t in (2, 4, 8):
        got = _table(GPT, tp=t, attention="naive", sp=True).act_bytes[1]
        assert math.isclose(got, base / t, rel_tol=1e-9), f"tp={t} with SP should store 1/t: {got} vs {base / t}"


def test_full_recompute_stores_only_the_layer_input() -> None:
    b, s, h = 2, 2048, GPT.hidden
    got = _table(GPT, b=b, s=s, recompute="full", sp=False, tp=2).act_bytes[1]
    assert math.isclose(got, 2 * s * b * h), f"full recompute keeps 2sbh bytes, got {got}"


def test_stage_memory_is_states_plus_in_flight_activations() -> None:
    """A middle stage of a 1F1B pipeline: 18 B/param + (S - s) microbatches of 34sbh + 5as²b per layer."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=1)])
    training = TrainingSpec(global_batch=16, seq_len=1024, attention="naive", sequence_parallel=False)
    plan = uniform_plan(GPT, training, cluster, tp=1, pp=4, micro_batch=2, gpus=4)
    pred = evaluate(plan, cluster, AnalyticCostModel(Knobs()), check=False)
    s, b, h, a = 1024, 2, GPT.hidden, GPT.num_heads
    layers = plan.pipelines[0].stages[1].layers
    n = layers[1] - layers[0] + 1
    want = n * layer_params(GPT, "decoder") * 18 + n * (34 * s * b * h + 5 * a * s * s * b) * (4 - 1)
    got = pred.per_stage[1].memory_bytes
    assert abs(got - want) <= 1, f"stage 1 memory {got} != states + 3 in-flight microbatches {want}"


# -- FLOPs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt3-175b", "megatron-22b", "megatron-1t"])
def test_model_flops_match_72_bslh2_formula(name: str) -> None:
    m = get_model(name)
    s, l, h, v = 2048, m.num_layers, m.hidden, m.vocab
    want = 72 * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    got = model_flops_per_sequence(m, s)
    assert math.isclose(got, want, rel_tol=1e-9), f"{name}: {got:.4e} != 72slh²(...) {want:.4e}"


@pytest.mark.parametrize("name", ["gpt3-175b", "megatron-1t"])
def test_full_recompute_flops_match_96_bslh2_formula(name: str) -> None:
    """Full recompute repeats every decoder forward once: 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    m = get_model(name)
    s, l, h, v = 2048, m.num_layers, m.hidden, m.vocab
    extra = sum(layer_fwd_flops(m, "decoder", 1, s).gemm + layer_fwd_flops(m, "decoder", 1, s).attn_full
                for _ in range(l))
    got = model_flops_per_sequence(m, s) + extra
    want = 96 * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert math.isclose(got, want, rel_tol=1e-9), f"{name}: {got:.4e} != 96slh²(...) {want:.4e}"


# -- catalog parameter counts ------------------------------------------------------------------------
# Published parameter counts (GPT-3 paper; Meta model cards).
NOMINAL = {"gpt3-175b": 175.0e9, "llama2-7b": 6.74e9, "llama2-13b": 13.02e9, "llama2-70b": 68.98e9,
           "llama3-8b": 8.03e9, "llama3-70b": 70.55e9, "llama3-405b": 405.85e9}


@pytest.mark.parametrize("name", sorted(NOMINAL))
def test_catalog_parameter_counts_within_2_percent(name: str) -> None:
    got = get_model(name).params_count()
    assert abs(got / NOMINAL[name] - 1) < 0.02, f"{name}: {got / 1e9:.2f} B vs nominal {NOMINAL[name] / 1e9:.2f} B"


# -- monotonicity -----------------------------------------------------------------------------------
def _step_s(model: ModelSpec, gbs: int, seq: int, knobs: Knobs) -> float:
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=1)])
    training = TrainingSpec(global_batch=gbs, seq_len=seq)
    plan = uniform_plan(model, training, cluster, tp=2, pp=2, micro_batch=1)
    return evaluate(plan, cluster, AnalyticCostModel(knobs), check=False).step_s


@pytest.mark.parametrize("knobs", [Knobs(), default_knobs()], ids=["builtin", "packaged"])
def test_more_tokens_are_never_faster(knobs: Knobs) -> None:
    m = get_model("gpt3-1.3b")
    times = [_step_s(m, gbs, 1024, knobs) for gbs in (8, 16, 32, 64)]
    assert times == sorted(times), f"step time must grow with the global batch: {times}"
    times = [_step_s(m, 8, seq, knobs) for seq in (512, 1024, 2048, 4096)]
    assert times == sorted(times), f"step time must grow with the sequence length: {times}"


@pytest.mark.parametrize("knobs", [Knobs(), default_knobs()], ids=["builtin", "packaged"])
def test_tp2_does_less_compute_per_gpu_than_tp1(knobs: Knobs) -> None:
    m = get_model("gpt3-13b")
    one, two = _table(m, tp=1, knobs=knobs), _table(m, tp=2, knobs=knobs)
    assert two.fwd_s[1] + two.bwd_s[1] < one.fwd_s[1] + one.bwd_s[1]
    assert two.params_per_gpu[1] < one.params_per_gpu[1]


@pytest.mark.parametrize("attention", ["naive", "flash"])
def test_full_recompute_is_slower_and_stores_less(attention: str) -> None:
    m = get_model("gpt3-6.7b")
    none, full = _table(m, recompute="none", attention=attention), _table(m, recompute="full", attention=attention)
    sel = _table(m, recompute="selective", attention=attention)
    assert full.bwd_s.sum() > sel.bwd_s.sum() >= none.bwd_s.sum()
    assert full.act_bytes[1:-1].sum() < sel.act_bytes[1:-1].sum() <= none.act_bytes[1:-1].sum()


@pytest.mark.parametrize("attention", ["naive", "flash"])
def test_recompute_modes_share_one_costing_of_the_layers(attention: str) -> None:
    """The three recompute modes of a shard are costed once (`AnalyticCostModel._kind_rows`) and
    differ only where recompute acts: the decoder layers' backward and stored activations (and
    full recompute's working set); forward, parameters, the embedding and the head are the same."""
    m = get_model("gpt3-6.7b")
    cost = AnalyticCostModel()
    dev = DeviceClass(get_gpu("A100-SXM4-80GB"), 8, 600.0, 25.0)
    training = TrainingSpec(global_batch=8, seq_len=2048, attention=attention)
    tables = {mode: cost.layer_table(dev, Shard(2, 1, 1, 1, mode, 2048), m, training)
              for mode in ("none", "selective", "full")}
    assert cost._rows_cached.cache_info().misses == 1 and cost._cached.cache_info().misses == 3
    none = tables["none"]
    for mode, t in tables.items():
        assert (t.fwd_s == none.fwd_s).all() and (t.params_per_gpu == none.params_per_gpu).all()
        for a, b in ((t.bwd_s, none.bwd_s), (t.act_bytes, none.act_bytes)):
            assert a[0] == b[0] and a[-1] == b[-1]
        assert t.boundary_bytes == none.boundary_bytes
    assert (tables["full"].work_bytes[1:-1] == none.act_bytes[1:-1]).all()
    assert (tables["full"].bwd_s[1:-1] == none.bwd_s[1:-1] + none.fwd_s[1:-1]).all()


@pytest.mark.parametrize("knobs", [Knobs(), default_knobs()], ids=["builtin", "packaged"])
def test_slower_gpu_type_is_slower(knobs: Knobs) -> None:
    m = get_model("gpt3-1.3b")
    times = {g: float(_table(m, gpu=g, knobs=knobs).fwd_s.sum() + _table(m, gpu=g, knobs=knobs).bwd_s.sum())
             for g in ("V100-SXM2-32GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "B200")}
    order = sorted(times, key=times.get)
    assert order == ["B200", "H100-SXM5-80GB", "A100-SXM4-80GB", "V100-SXM2-32GB"], times


def test_fp8_runs_gemms_faster_but_attention_at_bf16_speed() -> None:
    m = get_model("llama3-8b")
    dev = _dev("H100-SXM5-80GB")
    bf = AnalyticCostModel(Knobs()).layer_table(dev, Shard(1, 1, 1, 1, "none", 8192), m,
                                                TrainingSpec(global_batch=8, seq_len=8192, dtype="bf16"))
    f8 = AnalyticCostModel(Knobs()).layer_table(dev, Shard(1, 1, 1, 1, "none", 8192), m,
                                                TrainingSpec(global_batch=8, seq_len=8192, dtype="fp8"))
    assert f8.fwd_s[1] < bf.fwd_s[1]
    assert f8.fwd_s[1] > bf.fwd_s[1] / Knobs().fp8_gemm_speedup, "only the GEMMs speed up under fp8"


def test_fp8_gives_no_speedup_on_gpus_without_fp8() -> None:
    m = get_model("gpt3-1.3b")
    dev = _dev("A100-SXM4-80GB")
    times = [AnalyticCostModel(Knobs()).layer_table(dev, Shard(1, 1, 1, 1, "none", 2048), m,
                                                    TrainingSpec(global_batch=8, seq_len=2048, dtype=d)).fwd_s[1]
             for d in ("bf16", "fp8")]
    assert times[0] == times[1]


def test_tp_group_stays_on_nvlink_when_cp_spans_nodes() -> None:
    """tp=8, cp=2 on 8-GPU nodes: TP traffic is intra-node (Megatron order), only CP crosses the NIC."""
    m = get_model("llama3-70b")
    training = TrainingSpec(global_batch=8, seq_len=8192)
    cost = AnalyticCostModel(Knobs())
    dev = _dev("H100-SXM5-80GB")
    tp_only = cost.layer_table(dev, Shard(8, 1, 1, 1, "none", 8192), m, training).fwd_s[1]
    with_cp = cost.layer_table(dev, Shard(8, 2, 1, 1, "none", 8192), m, training).fwd_s[1]
    assert with_cp < tp_only, "halving the tokens per GPU must not be eaten by TP running over the NIC"


def test_collectives_on_arrays_equal_the_scalar_formulas() -> None:
    """The search costs every layer range at once; each entry must be bit-identical to the scalar
    call the evaluator makes."""
    import numpy as np

    from planner.costmodel import comm, stage
    from planner.costmodel.base import device_class_of
    from planner.costmodel.knobs import Knobs
    from planner.specs.cluster import NodeGroup

    knobs = Knobs()
    dev = device_class_of(NodeGroup(gpu="A100-SXM4-80GB", nodes=4, gpus_per_node=8))
    sizes = np.array([0.0, 1.0, 3e3, 7.5e6, 1.3e9, 4.4e10])
    for copies in (1, 2, 6, 64):
        for zero in (0, 1):
            arr = stage.grad_sync_s(knobs, dev, sizes, 2, copies, zero, False)
            assert list(arr) == [stage.grad_sync_s(knobs, dev, float(x), 2, copies, zero, False) for x in sizes]
            assert list(stage.optimizer_s(knobs, dev, sizes, zero, copies)) == \
                [stage.optimizer_s(knobs, dev, float(x), zero, copies) for x in sizes]
    link = dev.nic_link(knobs)
    for n in (1, 2, 8):
        assert list(comm.all_gather_s(knobs, sizes, n, link)) == [comm.all_gather_s(knobs, float(x), n, link) for x in sizes]
        assert isinstance(comm.all_reduce_s(knobs, 5e6, n, link), float)
