"""`hetplan emit`: writes the launch files a plan's engines can run, says why the others cannot,
never overwrites silently, and fails in one line for a target that cannot express the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli.main import main
from planner.specs import TrainingSpec, get_model, load_cluster
from planner.uniform import uniform_plan

REPO = Path(__file__).resolve().parents[1]
TINY_PLAN = str(REPO / "examples" / "plan_tiny.json")
TINY_CLUSTER = str(REPO / "examples" / "tiny_cluster.yaml")
A100 = str(REPO / "examples" / "a100x8.yaml")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_any_writes_what_can_run_and_names_what_cannot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "emit", TINY_PLAN, "--cluster", TINY_CLUSTER, "--out", str(tmp_path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [Path(p).name for p in doc["written"]] == ["rankmap.json"]
    assert set(doc["refused"]) == {"megatron", "flagscale", "torchtitan", "deepspeed", "slurm"}
    assert all("pipelines differ" in reason for name, reason in doc["refused"].items() if name != "slurm")
    assert "not contiguous" in doc["refused"]["slurm"]


def test_uniform_plan_gets_megatron_and_flagscale_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = load_cluster(A100)
    plan = uniform_plan(get_model("llama3-8b"), TrainingSpec(global_batch=64, seq_len=8192), cluster,
                        tp=2, pp=2, micro_batch=1, recompute="full")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())
    code, out, err = run(capsys, "emit", str(plan_file), "--cluster", A100, "--out", str(tmp_path / "o"), "--json")
    assert code == 0, err
    names = sorted(str(Path(p).relative_to(tmp_path / "o")) for p in json.loads(out)["written"])
    assert names == ["deepspeed/ds_config.json", "deepspeed/hostfile", "deepspeed/launch.sh",
                     "deepspeed/pipeline.json", "flagscale/config.yaml", "flagscale/hostfile", "megatron/args.txt",
                     "megatron/launch_node0.sh", "rankmap.json", "slurm/job.sbatch", "slurm/node.sh",
                     "slurm/rankmap.json", "slurm/torchrun_node0.sh", "torchtitan/launch_node0.sh",
                     "torchtitan/overrides.txt"]
    args = (tmp_path / "o" / "megatron" / "args.txt").read_text().split()
    assert args[args.index("--tensor-model-parallel-size") + 1] == "2"
    assert args[args.index("--pipeline-model-parallel-size") + 1] == "2"
    code, out, err = run(capsys, "emit", str(plan_file), "--cluster", A100, "--out", str(tmp_path / "o"))
    assert code == 2 and out == "" and "--force" in err and err.count("\n") == 1


def test_a_target_that_cannot_express_the_plan_fails_in_one_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "emit", TINY_PLAN, "--cluster", TINY_CLUSTER, "--target", "megatron",
                         "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "target" in err and "pipelines differ" in err
    assert not any(tmp_path.iterdir())
