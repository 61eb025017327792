"""`hetplan explain`, `compare` and `schedule` (planner.report, planner.cli.explain_cmd), and the runnable
Python API walkthrough in docs/example_api.md."""

from __future__ import annotations

import json
import re
import sys
from itertools import pairwise
from pathlib import Path

import pytest

import planner.cli.main as cli_main
from planner import evaluate, load_cluster, load_plan
from planner.plan import Pipeline, Plan, Stage, expand_devices
from planner.report.explain import explain, what_if_inputs, with_extra_node

REPO = Path(__file__).resolve().parents[1]
TINY_PLAN = REPO / "examples" / "plan_tiny.json"
TINY_CLUSTER = REPO / "examples" / "tiny_cluster.yaml"
A100, V100 = "A100-SXM4-80GB", "V100-SXM2-32GB"
MODULE = "planner.cli.explain_cmd"


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the real `main` (its one-line error handling included) with this module registered."""
    if MODULE not in cli_main.COMMAND_MODULES:
        monkeypatch.setattr(cli_main, "COMMAND_MODULES", (*cli_main.COMMAND_MODULES, MODULE))
    code = cli_main.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def a100_only_plan() -> Plan:
    """One tp2/cp2 pipeline on node0 only, so the four V100s of the tiny cluster sit idle."""
    base = load_plan(TINY_PLAN)
    pipe = Pipeline(microbatches=16, stages=[Stage(layers=(0, 5), gpu=A100, devices=["node0:0-3"], tp=2, cp=2)])
    return base.model_copy(update={"pipelines": [pipe], "predicted": None})


def write(plan: Plan, path: Path) -> Path:
    path.write_text(plan.to_json())
    return path


# --- explain -----------------------------------------------------------------------------------------


def test_explain_names_the_slowest_stage_of_the_slowest_pipeline(monkeypatch, capsys) -> None:
    code, out, err = run(monkeypatch, capsys, "explain", TINY_PLAN, "--cluster", TINY_CLUSTER, "--json",
                         "--time-limit", "60")
    assert code == 0, err
    doc = json.loads(out)
    plan, cluster = load_plan(TINY_PLAN), load_cluster(TINY_CLUSTER)
    pred = evaluate(plan, cluster)
    slow = max(range(len(pred.pipeline_s)), key=lambda i: pred.pipeline_s[i])
    stage = max((p for p in pred.per_stage if p.pipeline == slow), key=lambda p: p.fwd_s + p.bwd_s)
    b = doc["bottleneck"]
    assert (b["pipeline"], b["stage"]) == (slow, stage.stage)
    assert b["layers"] == list(plan.pipelines[slow].stages[stage.stage].layers)
    assert b["pipeline_s"] + b["tail_s"] + b["overhead_s"] == pytest.approx(pred.step_s, rel=1e-12)
    assert 0 < b["steady_share"] <= 1
    # memory: one row per stage, headroom = usable - used, positive for a valid plan
    assert len(doc["memory"]) == sum(len(p.stages) for p in plan.pipelines)
    for m in doc["memory"]:
        assert m["headroom_bytes"] == m["capacity_bytes"] - m["used_bytes"] > 0
    assert doc["idle_by_type"] == {} and doc["idle_devices"] == []  # the example uses all 8 GPUs
    names = [w["name"] for w in doc["what_if"]]
    assert names == ["re-search", f"+1 {A100} node", f"+1 {V100} node", "2x global batch"]
    for w in doc["what_if"]:
        assert w["error"] is None, w
        assert w["step_change"] == pytest.approx(w["step_s"] / pred.step_s - 1, rel=1e-9)
        assert w["tokens_per_s_change"] == pytest.approx(w["tokens_per_s"] / pred.tokens_per_s - 1, rel=1e-9)
    # the same call through the API gives the same numbers (deterministic what-ifs)
    again = json.loads(json.dumps(explain(plan, cluster, time_limit=60).to_dict()))
    if not any(w["timed_out"] for w in doc["what_if"] + again["what_if"]):
        assert again == doc


def test_explain_lists_the_idle_gpus_by_type_and_device(tmp_path: Path, monkeypatch, capsys) -> None:
    plan_file = write(a100_only_plan(), tmp_path / "plan.json")
    code, out, err = run(monkeypatch, capsys, "explain", plan_file, "--cluster", TINY_CLUSTER, "--no-what-if", "--json")
    assert code == 0, err
    doc = json.loads(out)
    cluster = load_cluster(TINY_CLUSTER)
    used = {d for p in a100_only_plan().pipelines for s in p.stages for d in expand_devices(s.devices)}
    free = [(n.name, i) for n in cluster.node_list for i in range(n.gpus) if (n.name, i) not in used]
    assert sorted(expand_devices(doc["idle_devices"])) == sorted(free)
    assert doc["idle_by_type"] == {V100: len(free)}
    assert doc["what_if"] == []


def test_explain_tables_go_to_stderr_only(tmp_path: Path, monkeypatch, capsys) -> None:
    plan_file = write(a100_only_plan(), tmp_path / "plan.json")
    code, out, err = run(monkeypatch, capsys, "explain", plan_file, "--cluster", TINY_CLUSTER, "--no-what-if")
    assert code == 0 and out == ""
    for word in ("bottleneck", "headroom", "idle GPUs", "4 x V100"):
        assert word in err, word


def test_what_ifs_add_one_node_per_type_and_double_the_batch() -> None:
    plan, cluster = load_plan(TINY_PLAN), load_cluster(TINY_CLUSTER)
    before = cluster.counts_by_type()
    for gpu, n in before.items():
        bigger = with_extra_node(cluster, gpu)
        group = next(g for g in cluster.nodes if g.gpu == gpu)
        assert bigger.counts_by_type() == {**before, gpu: n + group.node_gpus}
        assert len(bigger.node_list) == len(cluster.node_list) + 1
    inputs = what_if_inputs(plan, cluster)
    assert all(t.micro_batches == (plan.micro_batch,) for _, _, _, t in inputs)
    assert inputs[-1][3].global_batch == 2 * plan.training.global_batch
    assert inputs[0][2].counts_by_type() == before


def test_an_invalid_plan_is_one_line_naming_where(tmp_path: Path, monkeypatch, capsys) -> None:
    bad = a100_only_plan()
    bad = bad.model_copy(update={"pipelines": [bad.pipelines[0].model_copy(update={"microbatches": 15})]})
    plan_file = write(bad, tmp_path / "bad.json")
    for cmd in ("explain", "schedule"):
        code, out, err = run(monkeypatch, capsys, cmd, plan_file, "--cluster", TINY_CLUSTER)
        assert code == 2 and out == "" and err.count("\n") == 1 and "global-batch" in err, (cmd, err)
    code, out, err = run(monkeypatch, capsys, "explain", TINY_PLAN)
    assert code == 2 and "--cluster" in err and err.count("\n") == 1


# --- compare -----------------------------------------------------------------------------------------


def test_compare_scores_both_plans_with_the_evaluator(tmp_path: Path, monkeypatch, capsys) -> None:
    b_file = write(a100_only_plan(), tmp_path / "b.json")
    code, out, err = run(monkeypatch, capsys, "compare", TINY_PLAN, b_file, "--cluster", TINY_CLUSTER, "--json")
    assert code == 0, err
    doc = json.loads(out)
    cluster = load_cluster(TINY_CLUSTER)
    pa, pb = evaluate(load_plan(TINY_PLAN), cluster), evaluate(a100_only_plan(), cluster)
    assert doc["a"]["step_s"] == pytest.approx(pa.step_s, rel=1e-12)
    assert doc["b"]["step_s"] == pytest.approx(pb.step_s, rel=1e-12)
    assert doc["a"]["pipeline_s"] == pytest.approx(pa.pipeline_s) and doc["b"]["mfu"] == pytest.approx(pb.mfu)
    assert doc["b_vs_a"]["speedup"] == pytest.approx(pb.tokens_per_s / pa.tokens_per_s)
    assert doc["faster"] == ("b" if pb.tokens_per_s > pa.tokens_per_s else "a")
    assert (doc["a"]["num_gpus"], doc["b"]["num_gpus"]) == (8, 4)
    assert doc["b"]["gpus_by_type"] == {A100: 4}
    assert "GPUs used: 8 vs 4" in doc["differences"] and "pipelines: 2 vs 1" in doc["differences"]


def test_compare_a_plan_with_itself_is_a_tie_and_reordering_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    code, out, err = run(monkeypatch, capsys, "compare", TINY_PLAN, TINY_PLAN, "--cluster", TINY_CLUSTER, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["faster"] == "tie" and doc["differences"] == []
    plan = load_plan(TINY_PLAN)
    swapped = write(plan.model_copy(update={"pipelines": plan.pipelines[::-1]}), tmp_path / "swapped.json")
    code, out, err = run(monkeypatch, capsys, "compare", TINY_PLAN, swapped, "--cluster", TINY_CLUSTER, "--json")
    doc = json.loads(out)
    assert "same pipelines in a different order" in doc["differences"]
    assert doc["b"]["step_s"] == pytest.approx(doc["a"]["step_s"], rel=1e-12)


def test_compare_text_and_an_invalid_second_plan(tmp_path: Path, monkeypatch, capsys) -> None:
    b_file = write(a100_only_plan(), tmp_path / "b.json")
    code, out, err = run(monkeypatch, capsys, "compare", TINY_PLAN, b_file, "--cluster", TINY_CLUSTER)
    assert code == 0 and out == "" and "tokens/s" in err and "GPUs used: 8 vs 4" in err
    bad = a100_only_plan()
    bad = bad.model_copy(update={"micro_batch": 4})
    bad_file = write(bad, tmp_path / "bad.json")
    code, out, err = run(monkeypatch, capsys, "compare", TINY_PLAN, bad_file, "--cluster", TINY_CLUSTER)
    assert code == 2 and out == "" and err.count("\n") == 1 and "PLAN_B" in err


# --- schedule ----------------------------------------------------------------------------------------


def test_schedule_json_holds_every_op_without_overlap(monkeypatch, capsys) -> None:
    code, out, err = run(monkeypatch, capsys, "schedule", TINY_PLAN, "--cluster", TINY_CLUSTER, "--json")
    assert code == 0, err
    doc = json.loads(out)
    plan = load_plan(TINY_PLAN)
    assert doc["closed_form_step_s"] == pytest.approx(evaluate(plan, load_cluster(TINY_CLUSTER)).step_s, rel=1e-12)
    assert doc["png"] is None
    for pipe, tl in zip(plan.pipelines, doc["pipelines"], strict=True):
        assert len(tl["ops"]) == 2 * pipe.microbatches * len(pipe.stages)
        assert max(o["end_s"] for o in tl["ops"]) == pytest.approx(tl["makespan_s"])
        for s in range(len(pipe.stages)):
            ops = sorted((o for o in tl["ops"] if o["stage"] == s), key=lambda o: o["start_s"])
            for x, y in pairwise(ops):
                assert y["start_s"] >= x["end_s"] - 1e-12, f"stage {s} runs two ops at once"
    slowest = max(t["makespan_s"] for t in doc["pipelines"])
    assert doc["step_s"] == pytest.approx(slowest + doc["tail_s"] + doc["overhead_s"])


def test_schedule_text_has_one_row_per_stage_on_stderr(monkeypatch, capsys) -> None:
    code, out, err = run(monkeypatch, capsys, "schedule", TINY_PLAN, "--cluster", TINY_CLUSTER, "--width", "40")
    assert code == 0 and out == ""
    rows = [line for line in err.splitlines() if re.match(r"stage +\d+ \|", line)]
    assert len(rows) == sum(len(p.stages) for p in load_plan(TINY_PLAN).pipelines)
    assert all(len(r.split("|")[1]) == 40 for r in rows)


def test_schedule_png_is_written_once_unless_forced(tmp_path: Path, monkeypatch, capsys) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "out" / "step.png"
    code, out, err = run(monkeypatch, capsys, "schedule", TINY_PLAN, "--cluster", TINY_CLUSTER, "--png", png, "--json")
    assert code == 0, err
    assert json.loads(out)["png"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, err = run(monkeypatch, capsys, "schedule", TINY_PLAN, "--cluster", TINY_CLUSTER, "--png", png)
    assert code == 2 and err.count("\n") == 1 and "--png" in err and "--force" in err
    code, out, err = run(monkeypatch, capsys, "schedule", TINY_PLAN, "--cluster", TINY_CLUSTER, "--png", png,
                         "--force")
    assert code == 0 and "wrote" in err


def test_schedule_png_without_matplotlib_is_one_line_naming_png(tmp_path: Path, monkeypatch, capsys) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` raise ImportError
    png = tmp_path / "step.png"
    code, out, err = run(monkeypatch, capsys, "schedule", TINY_PLAN, "--cluster", TINY_CLUSTER, "--png", png)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: --png:") and "matplotlib" in err
    assert not png.exists()


# --- docs/example_api.md -----------------------------------------------------------------------------


def test_example_api_walkthrough_runs(monkeypatch, capsys) -> None:
    text = (REPO / "docs" / "example_api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert len(blocks) >= 6, "the walkthrough lost its code blocks"
    joined = "\n".join(blocks)
    for api in ("load_cluster", "get_model", "search(", "evaluate(", "emit(", "explain("):
        assert api in joined, f"the walkthrough no longer shows {api}"
    monkeypatch.chdir(REPO)
    namespace: dict[str, object] = {"__name__": "example_api"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/example_api.md[block {i}]", "exec"), namespace)  # noqa: S102
    assert "refused" in capsys.readouterr().out  # the hand-written plan's differing pipelines are named
