"""`hetplan bench`: sweeps record every planner's outcome, resume without rework, report deterministically,
run on a process pool and on Ray, and scenario files fail with one-line errors naming the field."""

from __future__ import annotations

import csv
import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from benchmarks.baselines.megatron_uniform import best_uniform_plan
from benchmarks.executor import LocalExecutor
from benchmarks.report import FIELDS, markdown, summary, write_report
from benchmarks.runner import (
    MARKER,
    SearchPlanner,
    Task,
    make_tasks,
    run_sweep,
    run_task,
    select_planners,
    task_key,
)
from benchmarks.scenario import SCENARIO_DIR, load_scenario, load_scenarios
from planner.cli.bench_cmd import register
from planner.cli.main import error_line
from planner.costmodel.base import CostModel
from planner.errors import HetplanError, InfeasibleError
from planner.evaluate import evaluate
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec
from planner.specs.gpus import resolve_gpu_name
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

REPO = Path(__file__).resolve().parents[1]
TINY = """\
name: tiny-mix
cluster:
  nodes:
    - {gpu: A100-80, nodes: 1, gpus_per_node: 4}
    - {gpu: V100-32, nodes: 1, gpus_per_node: 4}
model: tiny
global_batch: 8
seq_len: 128
training: {micro_batches: [1, 2]}
time_limit_s: 30
"""


# -- fake baselines (module level, so worker processes can unpickle them) --------------------------------
def uniform(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
    found = best_uniform_plan(model, cluster, training, cost)
    if found is None:
        raise InfeasibleError("cluster", "no uniform grid fits")
    return found[0]


def never(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
    raise InfeasibleError("cluster", "fake planner finds nothing")


def broken_batch(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
    """A fast-looking plan that breaks the batch rule: one more microbatch than the global batch allows."""
    plan = uniform(model, cluster, training, cost)
    pipes = list(plan.pipelines)
    pipes[0] = pipes[0].model_copy(update={"microbatches": pipes[0].microbatches + 1})
    return plan.model_copy(update={"pipelines": pipes})


def crashes(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
    raise RuntimeError("fake planner bug")


def dies(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
    os._exit(3)  # the worker process vanishes mid-task


@dataclass(frozen=True)
class Counting:
    """Leaves one file in `log_dir` per call (calls happen in other processes)."""

    log_dir: str
    inner: Any

    def __call__(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
        Path(self.log_dir, uuid.uuid4().hex).write_text("call\n")
        return self.inner(model, cluster, training, cost)


def calls(log_dir: Path) -> int:
    return len(list(log_dir.iterdir()))


@pytest.fixture(autouse=True)
def fixed_code_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Others edit planner/ while these tests run; a changing source digest would change task keys
    between two runs of one test. Keys' sensitivity to the code version is tested on its own."""
    import benchmarks.runner

    monkeypatch.setattr(benchmarks.runner, "code_version", lambda: "hetplan test")


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def registry(log_dir: Path) -> dict[str, Any]:
    return {"hetplan": Counting(str(log_dir), SearchPlanner()), "uniform": Counting(str(log_dir), uniform),
            "never": Counting(str(log_dir), never), "broken": Counting(str(log_dir), broken_batch)}


def local(workers: int = 2) -> Any:
    return lambda: LocalExecutor(run_task, workers)


def no_executor() -> Any:
    raise AssertionError("the executor was started although every task was cached")


def by_planner(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["planner"]: r for r in records}


# -- sweeps -------------------------------------------------------------------------------------------------
def test_sweep_records_every_planner_outcome_and_rescored_steps(tiny: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    sc = load_scenario(tiny)
    result = run_sweep(make_tasks([sc], registry(log)), local(2), tmp_path / "out")
    recs = by_planner(result.records)
    assert [r["planner"] for r in result.records] == ["hetplan", "uniform", "never", "broken"]
    assert result.ran == 4 and result.cached == 0 and calls(log) == 4
    assert recs["hetplan"]["status"] == "ok" and recs["uniform"]["status"] == "ok"
    assert recs["hetplan"]["gap"] is not None and recs["hetplan"]["gap"] >= 0
    assert recs["never"]["status"] == "infeasible" and "finds nothing" in recs["never"]["reason"]
    assert recs["broken"]["status"] == "invalid" and recs["broken"]["violations"], recs["broken"]
    for name in ("hetplan", "uniform"):  # the stored step is the one evaluator's score of the stored plan
        plan = Plan.model_validate(recs[name]["plan"])
        assert evaluate(plan, sc.cluster, sc.cost_model()).step_s == pytest.approx(recs[name]["step_s"], rel=1e-12)
        assert recs[name]["planning_s"] > 0
    assert len(list((tmp_path / "out" / "tasks").glob("*.json"))) == 4


def test_rerun_into_the_same_out_resumes_without_running_anything(tiny: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    tasks = make_tasks([load_scenario(tiny)], registry(log))
    first = run_sweep(tasks, local(2), tmp_path / "out")
    second = run_sweep(make_tasks([load_scenario(tiny)], registry(log)), no_executor, tmp_path / "out")
    assert calls(log) == 4, "the second run called a planner again"
    assert (second.ran, second.cached) == (0, 4)
    assert second.records == first.records


def test_force_reruns_every_task(tiny: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    planners = select_planners(registry(log), ["uniform", "never"])
    run_sweep(make_tasks([load_scenario(tiny)], planners), local(1), tmp_path / "out")
    again = run_sweep(make_tasks([load_scenario(tiny)], planners), local(1), tmp_path / "out", force=True)
    assert again.ran == 2 and calls(log) == 4


def test_a_crashing_planner_is_recorded_once_and_a_dead_worker_is_retried(tiny: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    planners = {"crashes": Counting(str(log), crashes), "dies": Counting(str(log), dies)}
    first = run_sweep(make_tasks([load_scenario(tiny)], planners), local(1), tmp_path / "out")
    recs = by_planner(first.records)
    assert recs["crashes"]["status"] == "crashed" and "fake planner bug" in recs["crashes"]["reason"]
    assert recs["dies"]["status"] == "worker-failed" and recs["dies"]["reason"]
    second = run_sweep(make_tasks([load_scenario(tiny)], planners), local(1), tmp_path / "out")
    assert second.ran == 1 and by_planner(second.records)["crashes"] == recs["crashes"]


def test_task_key_depends_on_scenario_planner_and_code(tiny: Path, tmp_path: Path) -> None:
    sc = load_scenario(tiny)
    base = task_key(sc, "uniform", "m.uniform", "v1")
    assert base == task_key(load_scenario(tiny), "uniform", "m.uniform", "v1")
    other = tmp_path / "other.yaml"
    other.write_text(TINY.replace("nodes: 1, gpus_per_node: 4}\n    - {gpu: V100", "nodes: 2, gpus_per_node: 4}\n"
                                  "    - {gpu: V100"))
    assert task_key(load_scenario(other), "uniform", "m.uniform", "v1") != base
    assert task_key(sc, "never", "m.uniform", "v1") != base
    assert task_key(sc, "uniform", "m.uniform", "v2") != base


# -- report -------------------------------------------------------------------------------------------------
def _rec(scenario: str, planner: str, status: str, step: float | None, **extra: Any) -> dict[str, Any]:
    return {"scenario": scenario, "planner": planner, "status": status, "model": "tiny", "gpus": 8, "cost": "analytic",
            "step_s": step, "tokens_per_s": None if step is None else 1000 / step, "planning_s": 0.5,
            "gap": 0.01 if planner == "hetplan" else None, "reason": extra.pop("reason", ""), "key": "k", **extra}


RECORDS = [
    _rec("s1", "hetplan", "ok", 2.0), _rec("s1", "fast-but-invalid", "invalid", 1.0, reason="memory | over"),
    _rec("s1", "megatron", "ok", 3.0), _rec("s1", "metis", "ok", 2.5),
    _rec("s2", "hetplan", "ok", 4.0), _rec("s2", "metis", "infeasible", None, reason="no plan"),
]


def test_summary_compares_with_the_fastest_valid_baseline_only() -> None:
    rows = {r["scenario"]: r for r in summary(RECORDS)}
    assert rows["s1"]["best_baseline"] == "metis"
    assert rows["s1"]["speedup_pct"] == pytest.approx(100 * (2.5 / 2.0 - 1))
    assert rows["s1"]["throughput_ratio"] == pytest.approx(2.5 / 2.0)
    assert any("fast-but-invalid: invalid" in n for n in rows["s1"]["notes"])
    assert rows["s2"]["best_baseline"] is None and rows["s2"]["speedup_pct"] is None
    assert rows["s2"]["notes"] == ["metis: infeasible (no plan)"]


def test_markdown_and_csv_hold_one_row_per_scenario_and_record(tmp_path: Path) -> None:
    text = markdown(RECORDS)
    table_rows = [line for line in text.splitlines() if line.startswith(("| s1 ", "| s2 "))]
    assert len(table_rows) == 2 + len(RECORDS)
    assert "+25.0%" in table_rows[0] and "none valid" in table_rows[1]
    assert all(line.count(" | ") == table_rows[0].count(" | ") for line in table_rows[:2]), "a '|' leaked into a cell"
    written = write_report(tmp_path, RECORDS)
    with (tmp_path / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == FIELDS
    assert [(r["scenario"], r["planner"], r["status"]) for r in rows] == [
        (r["scenario"], r["planner"], r["status"]) for r in RECORDS]
    assert {p.name for p in written} >= {"throughput_ratio.png", "search_time.png", "report.md"}
    assert all(p.stat().st_size > 0 for p in written)
    assert markdown(list(RECORDS)) == text  # same records, same bytes


# -- the command ---------------------------------------------------------------------------------------------
def cli(capsys: pytest.CaptureFixture[str], reg: dict[str, Any], *args: str) -> tuple[int, str, str]:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app, reg)

    @app.callback()
    def _root() -> None:  # a group, so that `bench` is a subcommand as in `hetplan`
        pass

    try:
        app(args=list(args), prog_name="hetplan", standalone_mode=False)
        code = 0
    except HetplanError as exc:
        print(error_line(exc), file=sys.stderr)
        code = 2
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_out_dir_and_resume(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    log.mkdir()
    out = tmp_path / "run"
    args = ("bench", str(tiny), "--planners", "hetplan,uniform", "--workers", "2", "--out", str(out), "--json")
    code, stdout, err = cli(capsys, registry(log), *args)
    assert code == 0, err
    doc = json.loads(stdout)
    assert (doc["ran"], doc["cached"]) == (2, 0)
    assert [r["status"] for r in doc["records"]] == ["ok", "ok"], doc["records"]
    assert [r["planner"] for r in doc["records"]] == ["hetplan", "uniform"]
    assert all("plan" not in r for r in doc["records"])
    for name in (MARKER, "results.csv", "results.json", "report.md", "plots/search_time.png"):
        assert (out / name).is_file(), name
    code, stdout, err = cli(capsys, registry(log), *args)
    assert code == 0 and json.loads(stdout)["ran"] == 0 and calls(log) == 2


def test_cli_refuses_a_foreign_out_dir_without_force(tiny: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me\n")
    reg = {"never": never}
    code, stdout, err = cli(capsys, reg, "bench", str(tiny), "--out", str(out))
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert "--out" in err and "--force" in err
    code, stdout, err = cli(capsys, reg, "bench", str(tiny), "--out", str(out), "--force", "--json")
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "keep me\n" and (out / MARKER).is_file()


def test_cli_rejects_unknown_planner_and_backend(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, {"never": never}, "bench", str(tiny), "--planners", "nope")
    assert code == 2 and err.startswith("error: --planners:") and "never" in err
    code, _, err = cli(capsys, {"never": never}, "bench", str(tiny), "--backend", "slurm")
    assert code == 2 and err.startswith("error: --backend:")


def test_cli_names_backend_when_ray_is_missing(tiny: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    code, stdout, err = cli(capsys, {"never": never}, "bench", str(tiny), "--backend", "ray")
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert err.startswith("error: --backend:") and "ray is not installed" in err


# -- Ray -------------------------------------------------------------------------------------------------------
def test_ray_backend_gives_the_local_results(tiny: Path, tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    from benchmarks.executor import RayExecutor

    log = tmp_path / "log"
    log.mkdir()
    planners = select_planners(registry(log), ["hetplan", "uniform", "never"])
    tasks = make_tasks([load_scenario(tiny)], planners)
    here = os.pathsep.join([str(REPO), str(Path(__file__).parent)])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": here}})
    try:
        on_ray = run_sweep(tasks, lambda: RayExecutor(run_task), tmp_path / "ray")
    finally:
        ray.shutdown()
    local_run = run_sweep(tasks, local(1), tmp_path / "local")
    assert on_ray.ran == 3 and calls(log) == 6
    for a, b in zip(on_ray.records, local_run.records, strict=True):
        assert (a["planner"], a["status"], a.get("step_s")) == (b["planner"], b["status"], b.get("step_s"))


# -- scenario files ------------------------------------------------------------------------------------------
BAD = [
    ("colour: red\n", "scenario.colour"),
    ("", "scenario.cluster.nodes.0.gpu", ),
    ("", "scenario.model"),
    ("", "scenario.global_batch"),
    ("", "scenario.training.zero"),
    ("", "scenario.training.seq_len"),
    ("profiles: nowhere\n", "scenario.profiles"),
    ("measured_only: true\n", "scenario.measured_only"),
]


def _bad_text(field: str, extra: str) -> str:
    text = TINY + extra
    if field == "scenario.cluster.nodes.0.gpu":
        text = text.replace("A100-80", "A100-81")
    elif field == "scenario.model":
        text = text.replace("model: tiny", "model: tinyy")
    elif field == "scenario.global_batch":
        text = text.replace("global_batch: 8", "global_batch: 0")
    elif field == "scenario.training.zero":
        text = text.replace("{micro_batches: [1, 2]}", "{zero: 5}")
    elif field == "scenario.training.seq_len":
        text = text.replace("{micro_batches: [1, 2]}", "{seq_len: 64}")
    return text


@pytest.mark.parametrize(("extra", "field"), BAD)
def test_scenario_errors_are_one_line_and_name_the_field(tmp_path: Path, extra: str, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(_bad_text(field, extra))
    with pytest.raises(HetplanError) as info:
        load_scenario(path)
    assert info.value.field == field, str(info.value)
    assert "\n" not in str(info.value) and "bad.yaml" in str(info.value)


def test_cluster_file_is_read_relative_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "pool.yaml").write_text("nodes:\n  - {gpu: H100, nodes: 2, gpus_per_node: 8}\n")
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ncluster: c/pool.yaml\nmodel: tiny\nglobal_batch: 8\nseq_len: 128\n")
    assert load_scenario(path).cluster.counts_by_type() == {"H100-SXM5-80GB": 16}
    path.write_text("name: s\ncluster: c/missing.yaml\nmodel: tiny\nglobal_batch: 8\nseq_len: 128\n")
    with pytest.raises(HetplanError) as info:
        load_scenario(path)
    assert info.value.field == "scenario.cluster"


def test_every_packaged_scenario_loads_with_catalog_gpus_and_usable_profiles() -> None:
    scenarios = load_scenarios()
    files = sorted(SCENARIO_DIR.glob("*.yaml"))
    assert len(scenarios) == len(files) >= 15
    assert {s.name for s in scenarios} == {f.stem for f in files}, "a scenario's name differs from its file name"
    for sc in scenarios:
        assert sc.cluster.num_gpus > 0, sc.name
        for group in sc.cluster.nodes:
            assert resolve_gpu_name(group.gpu) == group.gpu, (sc.name, group.gpu)
        if sc.profiles:  # the measured profiles apply to this model on some GPU of the pool
            assert {p.gpu for p in sc.profiles if p.model == sc.model.name} & set(sc.cluster.counts_by_type()), sc.name
    ladder = {s.cluster.num_gpus: len(s.cluster.counts_by_type()) for s in scenarios if s.name.startswith("ladder-")}
    assert ladder == {64: 4, 1024: 4, 16384: 4}
    long = [s for s in scenarios if s.training.seq_len >= 32768]
    assert {s.training.seq_len for s in long} == {32768, 65536, 131072}
    assert any(s.cluster.allow_cross_node_tp for s in long)  # context parallelism across nodes


def test_scenario_arguments_accept_files_folders_and_packaged_names(tiny: Path) -> None:
    names = [s.name for s in load_scenarios([str(tiny), "ladder-64", str(tiny)])]
    assert names == ["tiny-mix", "ladder-64"]
    with pytest.raises(HetplanError) as info:
        load_scenarios(["ladder-65"])
    assert info.value.field == "SCENARIOS" and "ladder-64" in info.value.reason


def test_task_pickles_for_worker_processes(tiny: Path) -> None:
    import pickle

    task = make_tasks([load_scenario(tiny)], {"never": never})[0]
    again = pickle.loads(pickle.dumps(task))
    assert isinstance(again, Task) and again.key == task.key and run_task(again)["status"] == "infeasible"


def test_ab_check_finds_a_checkout_identical_to_itself(tmp_path: Path) -> None:
    """`benchmarks/ab_check.py` runs each pool in fresh processes of both checkouts and compares
    their answers: this checkout against itself is identical on every pool, and answers agree
    between rounds."""
    import io

    from benchmarks.ab_check import ROOT, compare

    out = io.StringIO()
    tally = compare([("ladder", 8, 0)], ROOT, ROOT, rounds=2, workers=1, max_gpus=128, limit=60.0, out=out)
    assert tally["pools"] == 1 and tally["identical"] == 1 and tally["unstable"] == 0, out.getvalue()
    assert tally["base_s"] > 0 and tally["mine_s"] > 0
    assert out.getvalue().startswith("ladder:8:0  identical")


def test_ab_check_passes_the_stop_gap_to_the_search() -> None:
    """`--stop-gap G` reaches both versions' searches: on the 16-GPU ladder rung a 50 % stop gap
    ends the search after the best-first units, with a lower bound than the full search's."""
    from benchmarks.ab_check import ROOT, run_one

    full = run_one(ROOT, ("ladder", 16, 0), 2, 128, 60.0)
    stop = run_one(ROOT, ("ladder", 16, 0), 2, 128, 60.0, stop_gap=0.5)
    assert stop["answer"][1] < full["answer"][1] <= full["answer"][0]
    assert stop["answer"][0] <= stop["answer"][1] * 1.5


@pytest.mark.parametrize("spec", ["ladder:x", "chain:33", "many:1:2:3", "pools:1"])
def test_ab_check_rejects_malformed_pools_with_exit_2(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.ab_check import main

    with pytest.raises(SystemExit) as exc:
        main(["HEAD", "--pools", spec])
    assert exc.value.code == 2
    assert f"--pools: '{spec}'" in capsys.readouterr().err


def test_ab_check_never_measures_the_installed_planner_in_place_of_the_base(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A base directory without its own `planner` would import the installed one and compare this
    checkout with itself: `main` refuses it (exit 2), a run in it reports a crash naming where
    `planner` came from instead of an answer, and a crashed pool is never counted identical nor
    timed."""
    import io

    from benchmarks.ab_check import ROOT, compare, main

    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path), "--pools", "ladder:8"])
    assert exc.value.code == 2 and "not a hetplan checkout" in capsys.readouterr().err
    out = io.StringIO()
    tally = compare([("ladder", 8, 0)], tmp_path, ROOT, rounds=1, workers=1, max_gpus=128, limit=60.0, out=out)
    assert "base crash: planner came from" in out.getvalue() and str(tmp_path) in out.getvalue()
    assert tally["crashed"] == 1 and tally["identical"] == 0 and tally["base_s"] == tally["mine_s"] == 0.0
