"""Process groups for any plan (planner.runtime): pure membership rules, then real gloo groups on CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planner import load_cluster, load_plan, search
from planner.emit.placement import RankInfo, rank_order
from planner.errors import HetplanError
from planner.plan import Pipeline, Plan, Stage
from planner.runtime import group_layout, rank_groups
from planner.runtime.groups import SHARD_KINDS, cluster_from_plan, p2p_pairs
from planner.specs import get_model
from planner.validate import validate

REPO = Path(__file__).resolve().parents[1]
TINY_CLUSTER = REPO / "examples" / "tiny_cluster.yaml"
A100, V100 = "A100-SXM4-80GB", "V100-SXM2-32GB"


def differing_plan() -> Plan:
    """Two replicas that differ in stage count, split and shapes, with tp groups that match on the
    first layers (so a gradient group spans both replicas) and intra-stage dp on pipeline 1."""
    base = load_plan(REPO / "examples" / "plan_tiny.json")
    pipes = [
        Pipeline(microbatches=6, stages=[
            Stage(layers=(0, 2), gpu=A100, devices=["node0:0-1"], tp=2),
            Stage(layers=(3, 5), gpu=V100, devices=["node1:0-1"], tp=2)]),
        Pipeline(microbatches=10, stages=[
            Stage(layers=(0, 1), gpu=A100, devices=["node0:2-3"], tp=2),
            Stage(layers=(2, 5), gpu=V100, devices=["node1:2-3"], tp=1, dp=2, recompute="selective")]),
    ]
    return base.model_copy(update={"pipelines": pipes, "predicted": None})


def shard_plan() -> Plan:
    """cp, hp, tp and stage dp all above 1 somewhere, pipelines of different depth."""
    base = load_plan(REPO / "examples" / "plan_tiny.json")
    pipes = [
        Pipeline(microbatches=8, stages=[
            Stage(layers=(0, 5), gpu=A100, devices=["node0:0-3"], tp=2, cp=2)]),
        Pipeline(microbatches=8, stages=[
            Stage(layers=(0, 2), gpu=V100, devices=["node1:0-1"], hp=2),
            Stage(layers=(3, 5), gpu=V100, devices=["node1:2-3"], dp=2)]),
    ]
    return base.model_copy(update={"pipelines": pipes, "predicted": None})


def search_plan() -> Plan:
    training = load_plan(REPO / "examples" / "plan_tiny.json").training.model_copy(update={"micro_batches": (2,)})
    return search(get_model("tiny"), load_cluster(TINY_CLUSTER), training).plan


PLANS = {"example": lambda: load_plan(REPO / "examples" / "plan_tiny.json"), "differing": differing_plan,
         "shards": shard_plan}


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    cluster = load_cluster(TINY_CLUSTER)
    out = {name: make() for name, make in PLANS.items()}
    out["search"] = search_plan()
    for plan in out.values():
        validate(plan, cluster)
    return out


def _stage(plan: Plan, r: RankInfo) -> Stage:
    return plan.pipelines[r.pipeline].stages[r.stage]


def test_every_shard_kind_partitions_the_ranks(plans: dict[str, Plan]) -> None:
    cluster = load_cluster(TINY_CLUSTER)
    for name, plan in plans.items():
        layout = group_layout(plan, cluster)
        for kind in SHARD_KINDS:
            seen = sorted(r for g in layout.groups if g.kind == kind for r in g.ranks)
            assert seen == list(range(plan.num_gpus)), f"{name}: {kind} groups do not partition the ranks"


def test_each_rank_has_one_tp_group_inside_its_stage_of_size_tp(plans: dict[str, Plan]) -> None:
    cluster = load_cluster(TINY_CLUSTER)
    for name, plan in plans.items():
        layout = group_layout(plan, cluster)
        ranks = rank_order(plan, cluster)
        for r in ranks:
            mine = rank_groups(layout, r.rank)
            stage = _stage(plan, r)
            for kind, degree, coord in (("tp", stage.tp, "tp_rank"), ("cp", stage.cp, "cp_rank"),
                                        ("hp", stage.hp, "hp_rank"), ("stage_dp", stage.dp, "dp_rank")):
                members = [ranks[m] for m in getattr(mine, kind).ranks]
                assert len(members) == degree, f"{name} rank {r.rank}: {kind} group size {len(members)} != {degree}"
                assert {(m.pipeline, m.stage) for m in members} == {(r.pipeline, r.stage)}, \
                    f"{name} rank {r.rank}: {kind} group leaves its stage"
                assert sorted(getattr(m, coord) for m in members) == list(range(degree)), \
                    f"{name} rank {r.rank}: {kind} group does not hold every {coord}"


def test_p2p_pairs_join_consecutive_stages_of_one_pipeline(plans: dict[str, Plan]) -> None:
    cluster = load_cluster(TINY_CLUSTER)
    for name, plan in plans.items():
        layout = group_layout(plan, cluster)
        ranks = rank_order(plan, cluster)
        for a, b in layout.p2p:
            assert ranks[a].pipeline == ranks[b].pipeline and ranks[b].stage == ranks[a].stage + 1, \
                f"{name}: p2p pair {a}->{b} is not stage s -> s+1 of one pipeline"
        for r in ranks:
            mine = rank_groups(layout, r.rank)
            depth = len(plan.pipelines[r.pipeline].stages)
            assert bool(mine.prev_ranks) == (r.stage > 0), f"{name} rank {r.rank}: previous-stage neighbours"
            assert bool(mine.next_ranks) == (r.stage < depth - 1), f"{name} rank {r.rank}: next-stage neighbours"


def test_p2p_pairs_are_one_to_one_between_equal_shapes_and_cover_both_stages() -> None:
    assert p2p_pairs([0, 1], [4, 5]) == [(0, 4), (1, 5)]
    for a, b in (([0], [1, 2, 3]), ([0, 1, 2], [3, 4]), ([0, 1, 2, 3], [9])):
        pairs = p2p_pairs(a, b)
        assert {x for x, _ in pairs} == set(a) and {y for _, y in pairs} == set(b), (a, b, pairs)
        assert len(set(pairs)) == len(pairs) == max(len(a), len(b))


def test_gradient_groups_join_every_copy_of_a_layer_with_the_same_tp_shard(plans: dict[str, Plan]) -> None:
    cluster = load_cluster(TINY_CLUSTER)
    for name, plan in plans.items():
        layout = group_layout(plan, cluster)
        ranks = rank_order(plan, cluster)
        for layer in range(plan.model.num_layer_slots):
            holders = [r for r in ranks if r.layers[0] <= layer <= r.layers[1]]
            assert holders, f"{name}: nobody holds layer {layer}"
            for r in holders:
                found = [g for (lo, hi), g in rank_groups(layout, r.rank).dp if lo <= layer <= hi]
                assert len(found) == 1, f"{name}: rank {r.rank} has {len(found)} gradient groups for layer {layer}"
                want = sorted(h.rank for h in holders
                              if _stage(plan, h).tp == _stage(plan, r).tp and h.tp_rank == r.tp_rank)
                assert list(found[0].ranks) == want, f"{name} layer {layer} rank {r.rank}: {found[0].ranks} != {want}"


def test_gradient_groups_span_replicas_that_differ(plans: dict[str, Plan]) -> None:
    plan = plans["differing"]
    ranks = rank_order(plan, load_cluster(TINY_CLUSTER))
    layout = group_layout(plan)
    spanning = [g for g in layout.groups if g.kind == "dp" and len({ranks[m].pipeline for m in g.ranks}) > 1]
    assert spanning, "no gradient group joins the two replicas although both hold layers 0-1 with tp 2"
    assert all(len({ranks[m].stage for m in g.ranks}) == 1 for g in spanning)


def test_groups_are_listed_once_in_one_order_for_every_rank(plans: dict[str, Plan]) -> None:
    cluster = load_cluster(TINY_CLUSTER)
    for name, plan in plans.items():
        layout = group_layout(plan, cluster)
        assert layout == group_layout(plan, cluster), f"{name}: group order is not deterministic"
        dp_members = [g.ranks for g in layout.groups if g.kind == "dp"]
        assert len(dp_members) == len(set(dp_members)), f"{name}: a gradient group would be created twice"
        assert layout == group_layout(plan), f"{name}: the stand-in cluster changed the groups"


def test_stand_in_cluster_has_the_nodes_the_plan_names() -> None:
    cluster = cluster_from_plan(shard_plan())
    assert [(n.name, n.gpu, n.gpus) for n in cluster.node_list] == [("node0", A100, 4), ("node1", V100, 4)]


def test_rank_outside_the_world_is_an_error() -> None:
    layout = group_layout(shard_plan())
    with pytest.raises(HetplanError) as exc:
        rank_groups(layout, layout.world_size)
    assert exc.value.field == "rank"


def test_importing_the_runtime_does_not_import_torch() -> None:
    code = "import sys, planner, planner.runtime; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr


WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from planner import load_plan
    from planner.runtime import check_groups, process_groups

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = process_groups(load_plan(sys.argv[1]), rank)
    sums = {}
    for name, handle in [("tp", groups.tp), ("stage_dp", groups.stage_dp)] + \\
            [(f"dp{lo}-{hi}", h) for (lo, hi), h in groups.dp]:
        t = torch.tensor([1.0, float(rank)], dtype=torch.float64)
        dist.all_reduce(t, group=handle)
        sums[name] = t.tolist()
    problems = check_groups(groups)
    dist.barrier()
    dist.destroy_process_group()
    with open(sys.argv[2], "w") as f:
        json.dump({"rank": rank, "sums": sums, "problems": problems}, f)
""")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gloo_groups_all_reduce_over_the_expected_members(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    plan = differing_plan()
    cluster = load_cluster(TINY_CLUSTER)
    validate(plan, cluster)
    world = plan.num_gpus
    assert world <= 12
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(world),
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(worker), str(plan_file), str(tmp_path / f"out{r}.json")],
                              env={**env, "RANK": str(r)}, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
    ranks = rank_order(plan, cluster)
    for r in ranks:
        got = json.loads((tmp_path / f"out{r.rank}.json").read_text())
        assert got["problems"] == [], got["problems"]
        stage = _stage(plan, r)
        # expected members from the rank coordinates alone (not from the group lists under test)
        tp = [q.rank for q in ranks if (q.pipeline, q.stage, q.cp_rank, q.hp_rank, q.dp_rank)
              == (r.pipeline, r.stage, r.cp_rank, r.hp_rank, r.dp_rank)]
        assert got["sums"]["tp"] == [len(tp), sum(tp)], f"rank {r.rank} tp all_reduce"
        assert len(tp) == stage.tp
        sdp = [q.rank for q in ranks if (q.pipeline, q.stage, q.tp_rank) == (r.pipeline, r.stage, r.tp_rank)]
        assert got["sums"]["stage_dp"] == [len(sdp), sum(sdp)], f"rank {r.rank} stage dp all_reduce"
        for key, value in got["sums"].items():
            if not key.startswith("dp"):
                continue
            lo, hi = map(int, key[2:].split("-"))
            holders = [q.rank for q in ranks if q.layers[0] <= lo and hi <= q.layers[1]
                       and _stage(plan, q).tp == stage.tp and q.tp_rank == r.tp_rank]
            assert value == [len(holders), sum(holders)], f"rank {r.rank} gradient all_reduce on layers {key}"
    cross = json.loads((tmp_path / "out0.json").read_text())["sums"]["dp0-1"]
    assert cross[0] == 2, "layers 0-1 gradients should be reduced across both replicas"


def test_process_groups_need_a_world_of_the_plans_size(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    from planner.runtime import check_groups, process_groups

    one = differing_plan()
    one = one.model_copy(update={"pipelines": [Pipeline(microbatches=16, stages=[
        Stage(layers=(0, 5), gpu=A100, devices=["node0:0"])])]})
    with pytest.raises(HetplanError) as exc:
        process_groups(one, 0)
    assert exc.value.field == "torch.distributed"
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with pytest.raises(HetplanError) as exc:
            process_groups(differing_plan(), 0)
        assert exc.value.field == "world_size" and "8 ranks" in exc.value.reason
        groups = process_groups(one, 0, load_cluster(TINY_CLUSTER))
        assert groups.members.tp.ranks == (0,) and groups.prev_ranks == groups.next_ranks == ()
        assert [layers for layers, _ in groups.dp] == [(0, 5)]
        assert check_groups(groups) == []
    finally:
        dist.destroy_process_group()
