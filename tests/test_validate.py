"""Every plan rule of planner/validate.py: a valid plan, one rule broken, exactly that rule reported."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from planner.costmodel.analytic import AnalyticCostModel
from planner.errors import HetplanError
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec
from planner.specs.models import get_model
from planner.validate import validate, violations

REPO = Path(__file__).resolve().parents[1]

# node0, node1: 8 x A100-80GB each; node2: 8 x V100-32GB.
CLUSTER = ClusterSpec.model_validate({"nodes": [
    {"gpu": "A100-SXM4-80GB", "nodes": 2, "gpus_per_node": 8},
    {"gpu": "V100-SXM2-32GB", "nodes": 1, "gpus_per_node": 8},
]})


def base_plan() -> dict[str, Any]:
    """A valid two-pipeline plan for `tiny` (layers 0..5) as plain data, ready to be broken."""
    return {
        "model": get_model("tiny").model_dump(mode="json"),
        "training": {"global_batch": 16, "seq_len": 128, "dtype": "fp16"},
        "micro_batch": 2,
        "pipelines": [
            {"microbatches": 5, "stages": [
                {"layers": [0, 2], "gpu": "A100-SXM4-80GB", "devices": ["node0:0-1"], "tp": 2},
                {"layers": [3, 5], "gpu": "V100-SXM2-32GB", "devices": ["node2:0-1"], "tp": 2},
            ]},
            {"microbatches": 3, "stages": [
                {"layers": [0, 5], "gpu": "A100-SXM4-80GB", "devices": ["node0:2-3"], "tp": 2},
            ]},
        ],
    }


def broken(edit: Callable[[dict[str, Any]], None]) -> Plan:
    data = copy.deepcopy(base_plan())
    edit(data)
    return Plan.model_validate(data)


def stage(data: dict[str, Any], pi: int, si: int) -> dict[str, Any]:
    return data["pipelines"][pi]["stages"][si]


def rules(plan: Plan, cost: object | None = None) -> set[str]:
    return {v.rule for v in violations(plan, CLUSTER, cost)}


def test_base_plan_is_valid_including_memory() -> None:
    found = violations(broken(lambda d: None), CLUSTER, AnalyticCostModel())
    assert found == [], [str(v) for v in found]


def set_stage(pi: int, si: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        stage(d, pi, si).update(fields)
    return edit


def set_model(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["model"].update(fields)
    return edit


def both(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        for e in edits:
            e(d)
    return edit


def set_training(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["training"].update(fields)
    return edit


CASES: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "double_booked_gpu": ("device-double-booked", set_stage(1, 0, devices=["node0:1-2"])),
    "skipped_layer": ("layer-coverage", set_stage(0, 1, layers=[4, 5])),
    "overlapping_layer": ("layer-coverage", set_stage(0, 1, layers=[2, 5])),
    "layers_past_the_head": ("layer-coverage", set_stage(0, 1, layers=[3, 6])),
    "wrong_device_count": ("device-count", set_stage(0, 0, devices=["node0:4-6"])),
    "unknown_node": ("device-exists", set_stage(0, 0, devices=["node9:0-1"])),
    "gpu_index_out_of_range": ("device-exists", set_stage(0, 0, devices=["node0:7-8"])),
    "device_type_mismatch": ("device-type", set_stage(0, 0, devices=["node2:4-5"])),
    "unknown_gpu_type": ("gpu-known", set_stage(0, 0, gpu="A200-80GB")),
    "malformed_device": ("devices-format", set_stage(0, 0, devices=["node0/0-1"])),
    # tp*hp = 3 does not divide 8 heads; seq 96 keeps cp*hp | seq, tp = 1 keeps kv/ffn fine.
    "tp_hp_not_dividing_heads": ("heads-divisible", both(set_training(seq_len=96),
                                                         set_stage(0, 0, tp=1, hp=3, devices=["node0:4-6"]))),
    # tp 4 divides 8 heads and ffn 1024 but not 2 KV heads.
    "tp_not_dividing_kv_heads": ("kv-heads-divisible", both(set_model(num_kv_heads=2),
                                                            set_stage(0, 0, tp=4, devices=["node0:4-7"]))),
    "tp_not_dividing_ffn": ("ffn-divisible", set_model(ffn_hidden=1025)),
    "cp_hp_not_dividing_seq": ("seq-divisible", set_stage(0, 0, tp=1, cp=3, devices=["node0:4-6"])),
    "dp_not_dividing_micro_batch": ("dp-divides-microbatch", set_stage(0, 0, tp=1, dp=4, devices=["node0:4-7"])),
    "group_spanning_nodes": ("group-in-node", set_stage(0, 0, devices=["node0:7", "node1:0"])),
    "global_batch_mismatch": ("global-batch", lambda d: d["pipelines"][1].update(microbatches=4)),
    "recompute_not_allowed": ("recompute-allowed", both(set_training(recompute=["none", "selective"]),
                                                        set_stage(0, 1, recompute="full"))),
    "schedule_mismatch": ("schedule", lambda d: d.update(schedule="gpipe")),
    "no_pipelines": ("pipelines", lambda d: d.update(pipelines=[])),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_broken_rule_is_reported_alone(case: str) -> None:
    rule, edit = CASES[case]
    plan = broken(edit)
    found = violations(plan, CLUSTER)
    assert {v.rule for v in found} == {rule}, [str(v) for v in found]
    with pytest.raises(HetplanError) as exc:
        validate(plan, CLUSTER)
    assert f"[{rule}]" in str(exc.value)


def test_double_booking_names_the_gpu_and_the_first_user() -> None:
    found = violations(broken(CASES["double_booked_gpu"][1]), CLUSTER)
    assert len(found) == 1
    assert "node0:1" in found[0].reason and "pipelines[0].stages[0]" in found[0].reason
    assert found[0].where == "pipelines[1].stages[0].devices"


def test_memory_overflow_names_gpu_and_size() -> None:
    # 4 decoder blocks of ~4e9 parameters each: the V100 stage cannot hold its share.
    plan = broken(set_model(hidden=16384, ffn_hidden=65536))
    cost = AnalyticCostModel()
    assert rules(plan) == set(), "only memory may fail"
    found = violations(plan, CLUSTER, cost)
    assert found and {v.rule for v in found} == {"memory"}, [str(v) for v in found]
    v100 = [v for v in found if v.where == "pipelines[0].stages[1]"]
    assert v100, [str(v) for v in found]
    needed, usable = (float(x) for x in re.findall(r"([0-9.]+) GiB", v100[0].reason))
    assert "V100-SXM2-32GB" in v100[0].reason
    assert needed > usable and usable < 32


def test_memory_is_checked_only_with_a_cost_model() -> None:
    plan = broken(set_model(hidden=16384, ffn_hidden=65536))
    assert violations(plan, CLUSTER) == []


def test_every_rule_is_documented_and_tested() -> None:
    source = (REPO / "planner" / "validate.py").read_text(encoding="utf-8")
    names = set(re.findall(r'Violation\("([a-z-]+)"', source))
    doc = (REPO / "docs" / "plan_format.md").read_text(encoding="utf-8")
    assert names, "no rule names found in planner/validate.py"
    assert sorted(n for n in names if f"`{n}`" not in doc) == []
    tested = {rule for rule, _ in CASES.values()} | {"memory"}
    assert sorted(names - tested) == []


def test_example_plan_is_valid_and_pipelines_differ() -> None:
    from planner.plan import load_plan
    from planner.specs.cluster import load_cluster

    plan = load_plan(REPO / "examples" / "plan_tiny.json")
    cluster = load_cluster(REPO / "examples" / "tiny_cluster.yaml")
    assert violations(plan, cluster, AnalyticCostModel()) == []
    a, b = plan.pipelines
    assert len(a.stages) != len(b.stages) and a.microbatches != b.microbatches


def test_committed_json_schema_matches_a_fresh_generation() -> None:
    from planner.schema import schema_text

    committed = (REPO / "docs" / "plan.schema.json").read_text(encoding="utf-8")
    assert committed == schema_text(), "run: python -m planner.schema > docs/plan.schema.json"
    assert schema_text() == schema_text()


def test_example_plan_conforms_to_the_schema_required_fields() -> None:
    import json

    schema = json.loads((REPO / "docs" / "plan.schema.json").read_text(encoding="utf-8"))
    plan = json.loads((REPO / "examples" / "plan_tiny.json").read_text(encoding="utf-8"))
    assert set(schema["required"]) <= set(plan)
    assert set(plan) <= set(schema["properties"])


def test_evaluate_raises_the_validators_first_memory_violation() -> None:
    """`evaluate` checks memory on the numbers it scores with (not by costing every stage twice):
    the same first violation, word for word, as `validate` with the cost model."""
    from planner.evaluate import evaluate

    plan = broken(set_model(hidden=16384, ffn_hidden=65536))
    cost = AnalyticCostModel()
    with pytest.raises(HetplanError) as want:
        validate(plan, CLUSTER, cost)
    with pytest.raises(HetplanError) as got:
        evaluate(plan, CLUSTER, cost)
    assert str(got.value) == str(want.value) and "[memory]" in str(got.value)
