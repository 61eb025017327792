"""`hetplan plan`: searches, prints JSON on stdout only, writes plan.json safely, and the written plan
re-scores to the same step time under `hetplan evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli.main import main

REPO = Path(__file__).resolve().parents[1]
CLUSTER = str(REPO / "examples" / "tiny_cluster.yaml")
PLAN = ["plan", CLUSTER, "--model", "tiny", "--global-batch", "8", "--micro-batches", "1,2"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_has_plan_bound_and_gap(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *PLAN, "--json")
    assert code == 0, err
    doc = json.loads(out)
    pred = doc["plan"]["predicted"]
    assert doc["plan"]["format"] == "hetplan.plan/v1"
    for key in ("step_s", "tokens_per_s", "mfu", "lower_bound_s", "gap"):
        assert key in pred
    assert pred["lower_bound_s"] <= pred["step_s"]
    assert pred["gap"] == pytest.approx(pred["step_s"] / pred["lower_bound_s"] - 1)
    assert doc["search"]["coverage"] in ("exact", "blocks<=2", "blocks<=3")


def test_plan_json_output_is_byte_identical_across_runs(capsys: pytest.CaptureFixture[str]) -> None:
    first = run(capsys, *PLAN, "--json")[1]
    second = run(capsys, *PLAN, "--json")[1]
    assert first == second


def test_written_plan_reevaluates_to_the_same_step_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *PLAN, "--out", str(tmp_path / "run"), "--json")
    assert code == 0, err
    planned = json.loads(out)["plan"]["predicted"]["step_s"]
    plan_file = tmp_path / "run" / "plan.json"
    assert plan_file.is_file()
    code, out, err = run(capsys, "evaluate", str(plan_file), "--cluster", CLUSTER, "--json")
    assert code == 0, err
    assert json.loads(out)["step_s"] == pytest.approx(planned, rel=1e-12)


def test_out_directory_is_not_overwritten_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    (out_dir / "plan.json").write_text("keep me\n")
    code, out, err = run(capsys, *PLAN, "--out", str(out_dir))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--out" in err and "--force" in err
    assert (out_dir / "plan.json").read_text() == "keep me\n"
    code, _, err = run(capsys, *PLAN, "--out", str(out_dir), "--force")
    assert code == 0, err
    assert json.loads((out_dir / "plan.json").read_text())["format"] == "hetplan.plan/v1"


@pytest.mark.parametrize("args, field", [
    (["--recompute", "sometimes"], "--recompute"),
    (["--solver", "gurobi"], "--solver"),
    (["--micro-batches", "3"], "global_batch"),
    (["--polish", "sometimes"], "--polish"),
    (["--chains", "sometimes"], "--chains"),
    (["--target", "nemo"], "--target"),
])
def test_plan_bad_input_is_one_line_exit_2(args: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    """One line naming the option as typed (`--solver:`, not the API's `solver:`), exit 2."""
    base = ["plan", CLUSTER, "--model", "tiny", "--global-batch", "8"]
    code, out, err = run(capsys, *base, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"{field}:" in err, err


def test_plan_for_a_model_that_fits_nowhere_says_how_much_memory(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "t4.yaml"
    cluster.write_text("nodes:\n  - {gpu: T4, nodes: 1, gpus_per_node: 1}\n")
    code, out, err = run(capsys, "plan", str(cluster), "--model", "llama3-70b", "--global-batch", "8",
                         "--seq", "1024")
    assert code == 2 and out == ""
    assert "GiB" in err and "per GPU" in err, err


def test_target_megatron_plans_a_grid_megatron_can_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--target megatron keeps pipelines identical with one tp/cp, and the launch files are written."""
    code, out, err = run(capsys, "plan", CLUSTER, "--model", "tiny", "--global-batch", "8",
                         "--micro-batches", "1,2", "--target", "megatron", "--out", str(tmp_path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    pipes = doc["plan"]["pipelines"]
    shapes = {(s["tp"], s["cp"], s["hp"], s["dp"], s["recompute"]) for p in pipes for s in p["stages"]}
    assert len(shapes) == 1 and next(iter(shapes))[2:4] == (1, 1)
    assert len({json.dumps([s["layers"] for s in p["stages"]]) for p in pipes}) == 1
    assert len({p["microbatches"] for p in pipes}) == 1
    assert (tmp_path / "megatron" / "args.txt").is_file()
    assert doc["search"]["coverage"] == "megatron-grid"
    # the unrestricted search is never slower than the best Megatron plan on the same pool
    code, out, err = run(capsys, *PLAN, "--json")
    assert json.loads(out)["plan"]["predicted"]["step_s"] <= doc["plan"]["predicted"]["step_s"] * (1 + 1e-9)


def test_refine_gap_and_workers_reach_the_search(capsys: pytest.CaptureFixture[str]) -> None:
    """On a pool the blocks coverage searches, --refine-gap 0 tightens the bound further than a
    loose target, and (its target missed) polishes the plan, which only gets faster; --workers
    does not change the output."""
    base = ["plan", str(REPO / "examples" / "sailor_mix.yaml"), "--model", "opt-350m", "--global-batch", "32",
            "--seq", "2048", "--json"]
    code, out, err = run(capsys, *base, "--refine-gap", "0", "--workers", "1")
    assert code == 0, err
    tight = json.loads(out)
    loose = json.loads(run(capsys, *base, "--refine-gap", "0.5", "--workers", "1")[1])
    assert tight["search"]["coverage"] != "exact"
    assert tight["search"]["explored"]["units_refined"] >= 1
    assert loose["search"]["explored"]["units_refined"] == 0
    assert tight["plan"]["predicted"]["step_s"] <= loose["plan"]["predicted"]["step_s"]
    assert tight["search"]["lower_bound_s"] > loose["search"]["lower_bound_s"]
    assert run(capsys, *base, "--refine-gap", "0", "--workers", "2")[1] == out


def test_the_table_view_says_when_a_pipeline_lies_outside_the_bounds_coverage(
        capsys: pytest.CaptureFixture[str]) -> None:
    """On the design's 28-GPU example the best plan's pipelines are A100 -> V100 -> H100 (three
    runs of stage groups), outside the blocks<=2 space its bound covers; the human view says so,
    as the JSON explanation does (it printed only the bottleneck and idle lines)."""
    args = ["plan", str(REPO / "examples" / "mixed.yaml"), "--model", "llama2-13b", "--global-batch", "64",
            "--micro-batches", "1"]
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    lines = [x for x in json.loads(out)["search"]["explanation"] if "runs of stage groups" in x]
    assert lines
    code, out, err = run(capsys, *args)
    assert code == 0 and out == ""
    assert err.count("runs of stage groups") == len(lines)
    assert "memory headroom" not in err  # that is in the stage table
