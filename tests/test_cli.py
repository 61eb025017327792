"""The `hetplan` CLI: JSON on stdout only, tables on stderr, one-line errors with exit status 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner.cli.main import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
TINY_PLAN = EXAMPLES / "plan_tiny.json"
TINY_CLUSTER = EXAMPLES / "tiny_cluster.yaml"

ESTIMATE_KEYS = {"step_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_memory_gb", "fits"}
GPT3_175B = ["estimate", "--model", "gpt3-175b", "--gpu", "A100-SXM4-80GB", "--gpus", "1024", "--tp", "8",
             "--pp", "16", "--mbs", "1", "--global-batch", "1536", "--seq", "2048", "--recompute", "full",
             "--json"]
LLAMA_8B = ["estimate", "--model", "llama3-8b", "--gpu", "H100-SXM5-80GB", "--gpus", "8", "--tp", "1",
            "--pp", "1", "--global-batch", "64", "--seq", "8192"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run(capsys, *args)
    assert code == 0, err
    return json.loads(out)


def assert_one_line_error(result: tuple[int, str, str], field: str, *words: str) -> str:
    code, out, err = result
    assert code == 2, f"exit {code}, stderr: {err!r}"
    assert out == "", f"stdout must stay empty on error, got {out!r}"
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {lines!r}"
    line = lines[0]
    assert line.startswith("error: ") and field in line, line
    for w in words:
        assert w in line, line
    assert "Traceback" not in err
    return line


def plan_data() -> dict[str, Any]:
    return json.loads(TINY_PLAN.read_text(encoding="utf-8"))


def write_plan(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


# -- catalogs ---------------------------------------------------------------------------------------

def test_models_json_parses_and_lists_catalog_models(capsys: pytest.CaptureFixture[str]) -> None:
    models = {m["name"]: m for m in run_json(capsys, "models", "--json")}
    assert {"gpt3-175b", "llama3-8b", "tiny"} <= set(models)
    for m in models.values():
        assert m["num_layers"] > 0 and m["hidden"] > 0 and m["params"] > 0
    assert 7.5e9 < models["llama3-8b"]["params"] < 8.5e9
    assert 170e9 < models["gpt3-175b"]["params"] < 180e9


def test_gpus_json_parses_and_lists_catalog_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = {g["name"]: g for g in run_json(capsys, "gpus", "--json")}
    assert {"A100-SXM4-80GB", "H100-SXM5-80GB", "V100-SXM2-32GB"} <= set(gpus)
    for g in gpus.values():
        assert g["bf16_tflops"] > 0 and g["memory_gib"] > 0
    assert gpus["H100-SXM5-80GB"]["bf16_tflops"] > gpus["A100-SXM4-80GB"]["bf16_tflops"]
    assert gpus["A100-SXM4-80GB"]["memory_gib"] == 2 * gpus["A100-SXM4-40GB"]["memory_gib"]


def test_human_tables_go_to_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["models"], ["gpus"], LLAMA_8B,
                 ["evaluate", str(TINY_PLAN), "--cluster", str(TINY_CLUSTER)]):
        code, out, err = run(capsys, *args)
        assert code == 0, err
        assert out == "", f"{args[0]} wrote to stdout without --json"
        assert err.strip(), f"{args[0]} printed nothing"


# -- estimate ---------------------------------------------------------------------------------------

def test_estimate_json_has_the_documented_keys_and_consistent_units(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, *LLAMA_8B, "--json")
    assert ESTIMATE_KEYS <= set(r)
    assert r["dp"] == 8 and isinstance(r["fits"], bool)
    assert r["tokens_per_s"] == pytest.approx(64 * 8192 / r["step_s"])
    assert 0 < r["mfu"] < 1
    assert r["tflops_per_gpu"] == pytest.approx(r["mfu"] * 989.0, rel=1e-6)  # H100 dense BF16 peak
    assert r["peak_memory_gb"] > 8e9 * 2 / 1e9  # at least the bf16 weights of an 8B model


def test_estimate_fit_follows_memory(capsys: pytest.CaptureFixture[str]) -> None:
    # Plain DP without recompute cannot hold llama3-8b at seq 8192 in 80 GB; sharded optimizer states
    # plus full recompute need less memory than that.
    plain = run_json(capsys, *LLAMA_8B, "--json")
    lean = run_json(capsys, *LLAMA_8B, "--zero", "1", "--recompute", "full", "--json")
    assert lean["peak_memory_gb"] < plain["peak_memory_gb"]
    assert plain["fits"] is (plain["peak_memory_gib"] <= plain["memory_capacity_gib"])
    assert lean["fits"] is (lean["peak_memory_gib"] <= lean["memory_capacity_gib"])


def test_estimate_counts_recompute_flops(capsys: pytest.CaptureFixture[str]) -> None:
    full = run_json(capsys, *LLAMA_8B, "--recompute", "full", "--json")
    sel = run_json(capsys, *LLAMA_8B, "--recompute", "selective", "--json")
    none = run_json(capsys, *LLAMA_8B, "--json")
    assert none["hw_tflops_per_gpu"] == pytest.approx(none["tflops_per_gpu"])
    # full recompute adds one forward of the decoder blocks: just under 4/3 (the LM head is not redone)
    assert 1.2 < full["hw_tflops_per_gpu"] / full["tflops_per_gpu"] <= 4 / 3
    assert 1.0 < sel["hw_tflops_per_gpu"] / sel["tflops_per_gpu"] < full["hw_tflops_per_gpu"] / full["tflops_per_gpu"]


def test_estimate_gpt3_175b_matches_megatron_sc21_step_time(capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-LM README's GPT-3 175B example (1024 A100-80GB, tp 8, pp 16, batch 1536, full
    recompute): 'each iteration takes around 32 seconds' (calibration_measurements.csv)."""
    r = run_json(capsys, *GPT3_175B)
    assert ESTIMATE_KEYS <= set(r)
    assert r["dp"] == 8 and r["fits"] is True
    assert abs(r["step_s"] - 32.0) <= 0.15 * 32.0, f"step_s {r['step_s']:.2f} s, published ~32 s"


def test_estimate_accepts_a_model_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = {"name": "my-model", "num_layers": 8, "hidden": 1024, "ffn_hidden": 4096, "num_heads": 16,
            "vocab": 32000, "seq_len": 1024}
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    r = run_json(capsys, "estimate", "--model", str(path), "--gpu", "A100", "--gpus", "2", "--tp", "2",
                 "--global-batch", "8", "--json")
    assert r["model"] == "my-model" and r["seq_len"] == 1024 and r["step_s"] > 0


# -- evaluate / validate ----------------------------------------------------------------------------

def test_evaluate_json_scores_the_example_plan(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "evaluate", str(TINY_PLAN), "--cluster", str(TINY_CLUSTER), "--json")
    plan = plan_data()
    assert len(r["per_stage"]) == sum(len(p["stages"]) for p in plan["pipelines"])
    assert r["step_s"] >= max(r["pipeline_s"])
    assert r["tokens_per_s"] == pytest.approx(32 * 128 / r["step_s"])
    assert all(s["memory_bytes"] <= s["memory_capacity_bytes"] for s in r["per_stage"])


def test_validate_accepts_the_example_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "validate", str(TINY_PLAN), "--cluster", str(TINY_CLUSTER))
    assert code == 0 and out == "" and "ok" in err


def test_validate_lists_every_violation(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = plan_data()
    data["pipelines"][1]["stages"][0]["devices"] = ["node0:0"]  # double-booked
    data["pipelines"][0]["stages"][1]["layers"] = [4, 5]  # skips layer 3
    code, out, err = run(capsys, "validate", write_plan(tmp_path, data), "--cluster", str(TINY_CLUSTER))
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines), lines
    assert any("[device-double-booked]" in line for line in lines)
    assert any("[layer-coverage]" in line for line in lines)
    code, out, _ = run(capsys, "validate", write_plan(tmp_path, data), "--cluster", str(TINY_CLUSTER), "--json")
    assert code == 2 and {v["rule"] for v in json.loads(out)} == {"device-double-booked", "layer-coverage"}


def test_profiles_without_a_matching_profile_score_like_the_analytic_model(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["evaluate", str(TINY_PLAN), "--cluster", str(TINY_CLUSTER), "--json"]
    with_profiles = run(capsys, *args, "--profiles", str(tmp_path))
    if importlib.util.find_spec("planner.costmodel.profile") is None:
        assert_one_line_error(with_profiles, "--profiles")
        return
    code, out, err = with_profiles
    assert code == 0, err
    assert out == run(capsys, *args)[1], "an empty profile folder must fall back to the analytic numbers"
    assert err and all(line.startswith("warning: profile fallback") for line in err.splitlines()), err


# -- bad input: exit 2, one line on stderr naming the field, nothing on stdout ----------------------

def test_malformed_cluster_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes:\n  - gpu: A100\n   nodes: [1\n", encoding="utf-8")
    assert_one_line_error(run(capsys, "evaluate", str(TINY_PLAN), "--cluster", str(bad)),
                          str(bad), "malformed YAML")


def test_malformed_model_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "model.yaml"
    bad.write_text("name: x\nhidden: [1, 2\n", encoding="utf-8")
    assert_one_line_error(run(capsys, "estimate", "--model", str(bad), "--gpu", "A100", "--gpus", "1",
                              "--global-batch", "1"), str(bad), "malformed YAML")


def test_unknown_field_in_cluster(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes:\n  - gpu: A100\n    gpus_per_nod: 4\n", encoding="utf-8")
    assert_one_line_error(run(capsys, "evaluate", str(TINY_PLAN), "--cluster", str(bad)),
                          "gpus_per_nod", "unknown field")


def test_unknown_model_suggests_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(run(capsys, "estimate", "--model", "llama3-9b", "--gpu", "A100", "--gpus", "8",
                              "--global-batch", "8"), "--model", "llama3-9b", "did you mean", "llama3-8b")


def test_unknown_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(run(capsys, "estimate", "--model", "llama3-8b", "--gpu", "Z900", "--gpus", "8",
                              "--global-batch", "8"), "--gpu", "Z900")


@pytest.mark.parametrize("option,value", [("--gpus", "0"), ("--gpus", "-8"), ("--tp", "0"), ("--pp", "-1"),
                                          ("--global-batch", "0"), ("--mbs", "0"), ("--seq", "-5")])
def test_zero_or_negative_counts(capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    args = {"--model": "llama3-8b", "--gpu": "A100", "--gpus": "8", "--global-batch": "8", option: value}
    argv = ["estimate"] + [x for kv in args.items() for x in kv]
    assert_one_line_error(run(capsys, *argv), option)


def test_tp_not_dividing_heads(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(run(capsys, "estimate", "--model", "llama3-8b", "--gpu", "H100", "--gpus", "6",
                              "--tp", "3", "--global-batch", "6"), "--tp", "heads")


def test_missing_required_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(run(capsys, "estimate", "--model", "llama3-8b", "--gpu", "H100", "--gpus", "8"),
                          "--global-batch")


def test_missing_plan_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(run(capsys, "evaluate", "--cluster", str(TINY_CLUSTER)), "PLAN.json")


def test_plan_double_booking_a_gpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = plan_data()
    data["pipelines"][1]["stages"][0]["devices"] = ["node0:1"]
    assert_one_line_error(run(capsys, "evaluate", write_plan(tmp_path, data), "--cluster", str(TINY_CLUSTER)),
                          "pipelines[1].stages[0].devices", "node0:1", "device-double-booked")


def test_plan_skipping_a_layer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = plan_data()
    data["pipelines"][0]["stages"][1]["layers"] = [4, 5]
    assert_one_line_error(run(capsys, "evaluate", write_plan(tmp_path, data), "--cluster", str(TINY_CLUSTER)),
                          "pipelines[0].stages[1].layers", "layer-coverage")


def test_plan_that_does_not_fit_memory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = plan_data()
    data["model"].update(hidden=16384, ffn_hidden=65536)  # ~4e9 parameters per decoder block
    line = assert_one_line_error(run(capsys, "evaluate", write_plan(tmp_path, data), "--cluster",
                                     str(TINY_CLUSTER)), "pipelines[", "[memory]", "GiB")
    assert "A100-SXM4-80GB" in line or "V100-SXM2-32GB" in line


# -- determinism and the real entry point ----------------------------------------------------------

def test_json_output_is_byte_identical_across_runs(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (GPT3_175B, ["evaluate", str(TINY_PLAN), "--cluster", str(TINY_CLUSTER), "--json"],
                 ["models", "--json"]):
        first = run(capsys, *args)
        second = run(capsys, *args)
        assert first[0] == 0 and first[1] == second[1]


def _module_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "planner.cli.main", *args], cwd=REPO, capture_output=True,
                          timeout=120, check=False)


def test_entry_point_json_is_byte_identical_across_processes() -> None:
    args = [*LLAMA_8B, "--json"]
    a, b = _module_cli(*args), _module_cli(*args)
    assert a.returncode == 0, a.stderr.decode()
    assert a.stdout == b.stdout and a.stderr == b"" and json.loads(a.stdout)["step_s"] > 0


def test_entry_point_error_has_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes: [\n", encoding="utf-8")
    r = _module_cli("validate", str(TINY_PLAN), "--cluster", str(bad))
    err = r.stderr.decode()
    assert r.returncode == 2 and r.stdout == b""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
