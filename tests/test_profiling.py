"""Profiling with PyTorch: `hetplan profile` writes valid, physically sensible profiles that the measured
cost model and the search use; unstable timings are refused; `profile-links` times collectives over
gloo; `hetplan profiles` tells measured from modelled; the analytic export is reproducible."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import planner.cli.main as cli_main
from planner.costmodel.profile import MeasuredCostModel, load_profile
from planner.costmodel.shapes import layer_params, layer_replicated_params
from planner.profiling.analytic_export import analytic_profile, export
from planner.profiling.build import catalog_gpu_for
from planner.profiling.timing import spread
from planner.specs.cluster import ClusterSpec
from planner.specs.gpus import get_gpu, gpu_catalog
from planner.specs.models import get_model

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
TINY = get_model("tiny")
SEQ = 64
MODULES = cli_main.COMMAND_MODULES + ("planner.cli.profile_cmd",)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str] | None = None) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli_main, "COMMAND_MODULES", MODULES)
        code = cli_main.main(argv)
    if capsys is None:
        return code, "", ""
    out, err = capsys.readouterr()
    return code, out, err


def _profile_args(out: Path, *extra: str) -> list[str]:
    return ["profile", "--model", "tiny", "--tp", "1,2", "--mbs", "1,8", "--seq", str(SEQ), "--device", "cpu",
            "--dtype", "bf16", "--warmup", "1", "--reps", "3", "--threads", "1", "--gpu-name", "A100-40",
            "--out", str(out), *extra]


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CPU profile of `tiny`, shared by the tests (CPU timings on a busy machine: no spread limit)."""
    path = tmp_path_factory.mktemp("prof") / "tiny__A100.json"
    code, _, _ = _cli(_profile_args(path, "--max-spread", "1000"))
    assert code == 0 and path.is_file()
    return path


def _entry(path: Path, layer: str, tp: int, mb: int, recompute: str = "none"):
    prof = load_profile(path)
    hits = [e for e in prof.entries if (e.layer, e.tp, e.micro_batch, e.recompute) == (layer, tp, mb, recompute)]
    assert len(hits) == 1, f"no single {layer} tp {tp} mb {mb} {recompute} entry"
    return hits[0]


# -- the profile file -------------------------------------------------------------------------------
def test_cpu_profile_validates_and_records_its_provenance(tiny_profile: Path) -> None:
    prof = load_profile(tiny_profile)  # the pydantic model of hetplan.profile/v1 validates it
    assert (prof.format, prof.source, prof.gpu, prof.model, prof.dtype) == (
        "hetplan.profile/v1", "measured", "A100-SXM4-40GB", "tiny", "bf16")
    for key in ("date", "device", "torch", "python", "spread", "recompute", "labelled_as"):
        assert key in prof.meta, f"meta lacks {key}"
    assert prof.meta["torch"] == torch.__version__ and "not measured" in prof.meta["memory"]
    kinds = {(e.layer, e.recompute) for e in prof.entries}
    assert kinds == {("embedding", "none"), ("decoder", "none"), ("decoder", "selective"), ("decoder", "full"),
                     ("head", "none")}
    assert {(e.tp, e.micro_batch, e.seq_len) for e in prof.entries} == {(t, m, SEQ) for t in (1, 2) for m in (1, 8)}


def test_param_bytes_are_the_catalog_shape_sharded_by_tp(tiny_profile: Path) -> None:
    for kind in ("embedding", "decoder", "head"):
        for tp in (1, 2):
            want = ((layer_params(TINY, kind) - layer_replicated_params(TINY, kind)) / tp
                    + layer_replicated_params(TINY, kind)) * 2  # bf16
            got = _entry(tiny_profile, kind, tp, 1).param_bytes
            assert got == pytest.approx(want, rel=0.02), f"{kind} tp {tp}: {got} bytes, shape says {want}"


def test_more_tokens_take_longer_and_stash_more(tiny_profile: Path) -> None:
    for kind in ("decoder", "head"):
        for tp in (1, 2):
            small, big = _entry(tiny_profile, kind, tp, 1), _entry(tiny_profile, kind, tp, 8)
            assert big.fwd_ms + big.bwd_ms > small.fwd_ms + small.bwd_ms, f"{kind} tp {tp}: mb 8 not slower"
            assert big.act_bytes == pytest.approx(8 * small.act_bytes, rel=0.05), f"{kind} tp {tp}"


def test_backward_is_slower_than_forward(tiny_profile: Path) -> None:
    fwd = sum(_entry(tiny_profile, "decoder", tp, 8).fwd_ms for tp in (1, 2))
    bwd = sum(_entry(tiny_profile, "decoder", tp, 8).bwd_ms for tp in (1, 2))
    assert bwd > fwd, f"decoder backward {bwd:.3f} ms not slower than forward {fwd:.3f} ms"


def test_full_recompute_stashes_only_the_block_input(tiny_profile: Path) -> None:
    for tp in (1, 2):
        none, full = _entry(tiny_profile, "decoder", tp, 8), _entry(tiny_profile, "decoder", tp, 8, "full")
        assert full.act_bytes == 8 * SEQ * TINY.hidden * 2
        assert full.act_bytes < none.act_bytes / 4
        # the analytic activation formula (flash, no SP) and the saved tensors agree within 2x
        per_token = 8 * TINY.hidden + (4 * TINY.hidden + 4 * TINY.kv_dim + 6 * TINY.ffn_hidden) / tp
        ratio = none.act_bytes / (per_token * 8 * SEQ)
        assert 0.5 < ratio < 2.0, f"tp {tp}: saved bytes {ratio:.2f}x the analytic formula"


def test_selective_recompute_drops_the_mlp_activation_output(tiny_profile: Path) -> None:
    """With flash attention `selective` recomputes the MLP activation function: it stashes exactly one
    activation-wide tensor less than no recompute (the analytic model's `act_fn_out`, one bf16 value
    per token and ffn / tp column), far more than `full`."""
    from planner.costmodel.shapes import decoder_activation_bytes

    per_token = decoder_activation_bytes(TINY).act_fn_out
    for tp in (1, 2):
        none, sel, full = (_entry(tiny_profile, "decoder", tp, 8, m) for m in ("none", "selective", "full"))
        assert none.act_bytes - sel.act_bytes == 8 * SEQ * per_token / tp
        assert sel.act_bytes > 4 * full.act_bytes


def test_selective_recompute_with_naive_attention_drops_the_score_matrix(tmp_path: Path) -> None:
    """With naive attention `selective` recomputes the attention core instead (Korthikanti et al.):
    the bf16 softmax probabilities, one seq x seq matrix per head, are no longer stashed."""
    out = tmp_path / "naive.json"
    code, _, _ = _cli(["profile", "--model", "tiny", "--tp", "1", "--mbs", "2", "--seq", "32", "--device", "cpu",
                       "--attention", "naive", "--warmup", "0", "--reps", "1", "--threads", "1", "--gpu-name",
                       "A100-40", "--max-spread", "1000", "--out", str(out)])
    assert code == 0
    none, sel, full = (_entry(out, "decoder", 1, 2, m) for m in ("none", "selective", "full"))
    assert none.act_bytes - sel.act_bytes >= 2 * TINY.num_heads * 32 * 32 * 2
    assert sel.act_bytes > full.act_bytes


def test_profile_serves_the_measured_cost_model_and_the_search(tiny_profile: Path) -> None:
    from planner import search
    from planner.specs.training import TrainingSpec

    cost = MeasuredCostModel([load_profile(tiny_profile)])  # no fallback: every number must be measured
    cluster = ClusterSpec.model_validate({"nodes": [{"gpu": "A100-40", "gpus_per_node": 2}]})
    training = TrainingSpec(global_batch=8, seq_len=SEQ, dtype="bf16", max_tp=2, max_cp=1, max_hp=1,
                            micro_batches=(1, 8), recompute=("none", "full"))
    result = search(TINY, cluster, training, cost=cost, time_limit=30)
    assert result.prediction.step_s > 0
    assert result.prediction.cost_sources == {"A100-SXM4-40GB": "measured"}
    assert cost.fallbacks == []


# -- spread -----------------------------------------------------------------------------------------
class _FakeClock:
    """Runs the call and reports scripted times: alternating fast/slow, or steady."""

    name = "fake"

    def __init__(self, times_ms: list[float]) -> None:
        self.times, self.i = times_ms, 0

    def time(self, fn):  # noqa: ANN001, ANN202 - Clock protocol
        out = fn()
        self.i += 1
        return out, self.times[self.i % len(self.times)]


def test_spread_is_max_minus_min_over_median() -> None:
    assert spread([1.0, 1.0, 1.0]) == 0.0
    assert spread([1.0, 2.0, 4.0]) == pytest.approx(1.5)


@pytest.mark.parametrize("times,limit,code", [([1.0, 2.0, 4.0], 0.2, 2), ([1.0], 0.2, 0)])
def test_unstable_timings_are_refused_and_nothing_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        times: list[float], limit: float, code: int) -> None:
    import planner.profiling.build as build

    monkeypatch.setattr(build, "make_clock", lambda torch, device: _FakeClock(times))
    out = tmp_path / "p.json"
    argv = ["profile", "--model", "tiny", "--tp", "1", "--mbs", "1", "--seq", "16", "--device", "cpu",
            "--warmup", "0", "--reps", "3", "--recompute", "none", "--gpu-name", "V100-16",
            "--max-spread", str(limit), "--out", str(out)]
    got, stdout, err = _cli(argv, capsys)
    assert got == code, err
    if code:
        assert stdout == "" and not out.exists()
        assert err.strip().splitlines()[-1].startswith("error: --max-spread:"), err
    else:
        assert load_profile(out).meta["spread"]["max"] == 0.0


def test_profile_without_torch_says_install_the_extra(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import planner, planner.profiling.build, planner.profiling.links, planner.profiling.listing\n"
            "import planner.profiling.analytic_export, planner.cli.profile_cmd\n"
            "import planner.cli.main as m\n"
            "m.COMMAND_MODULES += ('planner.cli.profile_cmd',)\n"
            f"rc = m.main(['profiles', '{REPO / 'profiles'}', '--json'])\n"
            "assert rc == 0, rc\n"
            f"sys.exit(m.main(['profile', '--model', 'tiny', '--device', 'cpu', '--gpu-name', 'T4', "
            f"'--out', '{tmp_path / 'x.json'}']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "`profile` extra" in last and last.startswith("error: profile:"), proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_cpu_profile_needs_a_gpu_label(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(["profile", "--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "p.json")], capsys)
    assert code == 2 and "--gpu-name" in err


def test_cuda_device_names_map_to_catalog_types() -> None:
    gib = 2**30
    assert catalog_gpu_for("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert catalog_gpu_for("Tesla V100-SXM2-16GB") == "V100-SXM2-16GB"
    assert catalog_gpu_for("NVIDIA H100 80GB HBM3", 80 * gib) == "H100-SXM5-80GB"
    assert catalog_gpu_for("NVIDIA H100 PCIe", 80 * gib) == "H100-PCIe-80GB"
    assert catalog_gpu_for("NVIDIA GeForce RTX 3090") == "RTX-3090"
    assert catalog_gpu_for("Some New Accelerator") is None


# -- collectives ------------------------------------------------------------------------------------
def test_profile_links_over_gloo_gives_sane_tables(tiny_profile: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from planner.profiling.links import OPS, load_links

    prof = tmp_path / "with_links.json"
    prof.write_text(tiny_profile.read_text())
    out = tmp_path / "links.json"
    code, _, err = _cli(["profile-links", "--backend", "gloo", "--nproc", "2", "--sizes", "1K,8M", "--warmup", "1",
                         "--reps", "3", "--out", str(out), "--into", str(prof), "--json"], capsys)
    assert code == 0, err
    doc = load_links(out)
    assert sorted(c.op for c in doc.collectives) == sorted(OPS)
    small = large = 0.0
    for c in doc.collectives:
        assert c.link == "intra" and c.ranks == 2 and len(c.bytes) == 2 and c.bytes[0] >= 1024
        small, large = small + c.time_ms[0], large + c.time_ms[-1]
    assert large > small, f"8 MiB messages ({large:.3f} ms in all) not slower than 1 KiB ({small:.3f} ms)"
    merged = load_profile(prof)
    assert {(c.op, c.ranks) for c in merged.collectives} == {(c.op, c.ranks) for c in doc.collectives}
    assert merged.entries == load_profile(tiny_profile).entries


# -- listing and the analytic export ----------------------------------------------------------------
def test_profiles_lists_measured_and_modelled(tiny_profile: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "tiny.json").write_text(tiny_profile.read_text())
    (folder / "broken.json").write_text("{\"format\": \"hetplan.profile/v1\"}")
    export(["tiny"], folder / "analytic")
    code, out, err = _cli(["profiles", str(folder), "--no-shipped", "--json"], capsys)
    assert code == 0, err
    rows = {Path(r["path"]).relative_to(folder).as_posix(): r for r in json.loads(out)}
    assert rows["tiny.json"]["source"] == "measured" and rows["tiny.json"]["tp"] == [1, 2]
    assert rows["tiny.json"]["micro_batch"] == [1, 8] and rows["tiny.json"]["date"][:2] == "20"
    modelled = [r for name, r in rows.items() if name.startswith("analytic/")]
    assert len(modelled) == len(gpu_catalog()) and all(r["source"] == "modelled" for r in modelled)
    assert rows["broken.json"]["kind"] == "invalid" and "broken.json" in err
    code, out, _ = _cli(["profiles", "--json"], capsys)  # default: the repository's shipped profiles
    shipped = json.loads(out)
    assert {r["source"] for r in shipped} == {"measured", "modelled"}
    assert any("sailor" in r["path"] and r["gpu"] == "V100-SXM2-16GB" for r in shipped)


def test_analytic_profile_is_marked_modelled_and_matches_the_model() -> None:
    from planner.costmodel.analytic import AnalyticCostModel
    from planner.costmodel.base import DeviceClass, Shard
    from planner.specs.training import TrainingSpec

    gpu = get_gpu("A100-80")
    prof = analytic_profile(get_model("llama2-7b"), gpu)
    assert prof.source == "modelled" and prof.dtype == "bf16"
    model = get_model("llama2-7b")
    dev = DeviceClass(gpu, gpu.gpus_per_node, gpu.intra_bw_gbs, gpu.nic_gbps / 8)
    training = TrainingSpec(global_batch=4, seq_len=model.seq_len)
    want = AnalyticCostModel().layer_table(dev, Shard(2, 1, 1, 4, "selective", model.seq_len), model, training)
    got = MeasuredCostModel([prof]).layer_table(dev, Shard(2, 1, 1, 4, "selective", model.seq_len), model, training)
    assert got.fwd_s[1] == pytest.approx(want.fwd_s[1], rel=1e-5)
    assert got.bwd_s[1] == pytest.approx(want.bwd_s[1], rel=1e-5)
    assert analytic_profile(get_model("opt-350m"), get_gpu("V100-16")).dtype == "fp16"


SHIPPED_ANALYTIC = REPO / "profiles" / "analytic"


@pytest.mark.skipif(not SHIPPED_ANALYTIC.is_dir(), reason="profiles/analytic not generated")
def test_shipped_analytic_profiles_equal_a_fresh_export(tmp_path: Path) -> None:
    fresh = export(["llama2-7b", "gpt3-1.3b"], tmp_path)
    shipped = sorted(SHIPPED_ANALYTIC.glob("*.json"))
    assert [p.name for p in shipped] == [p.name for p in fresh]
    for a, b in zip(shipped, fresh):
        assert a.read_text() == b.read_text(), f"{a.name}: rerun python -m planner.profiling.analytic_export"
    assert sum(p.stat().st_size for p in shipped) < 2e6


def test_tp_collectives_are_added_to_profiles_that_did_not_run_them(tiny_profile: Path) -> None:
    """A `hetplan profile` file times one TP rank without communication: at tp 2 its layers get the
    analytic TP collective time; at tp 1, or when the profile says communication ran, nothing."""
    from planner.costmodel.analytic import AnalyticCostModel
    from planner.costmodel.base import Shard, device_class_of
    from planner.specs.cluster import NodeGroup
    from planner.specs.training import TrainingSpec

    prof = load_profile(tiny_profile)
    assert str(prof.meta["tp_communication"]).startswith("not executed")
    with_comm = prof.model_copy(update={"meta": {**prof.meta, "tp_communication": "included"}})
    dev = device_class_of(NodeGroup(gpu="A100-40", gpus_per_node=2))
    training = TrainingSpec(global_batch=8, seq_len=SEQ, dtype="bf16")
    extra = AnalyticCostModel().tp_collective_s(dev, Shard(2, 1, 1, 8, "none", SEQ), TINY, training)
    assert extra > 0
    for tp in (1, 2):
        shard = Shard(tp, 1, 1, 8, "none", SEQ)
        added = MeasuredCostModel([prof]).layer_table(dev, shard, TINY, training)
        as_is = MeasuredCostModel([with_comm]).layer_table(dev, shard, TINY, training)
        decoder = 1  # slot 1 is the first decoder block
        expect = extra if tp == 2 else 0.0
        assert added.fwd_s[decoder] - as_is.fwd_s[decoder] == pytest.approx(expect, rel=1e-9, abs=1e-15)
        assert added.fwd_s[0] - as_is.fwd_s[0] == pytest.approx(expect / 4, rel=1e-9, abs=1e-15)
