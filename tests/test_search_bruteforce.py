"""The search against an oracle that enumerates every plan of small instances.

The oracle knows nothing of templates, frontiers or ILPs: it lists every pipeline (every contiguous
split, every stage GPU class and shape), every multiset of pipelines that fits the GPU counts and
every way to deal the microbatches, and scores each with the evaluator's own stage formulas. The
best plan it finds is rebuilt as a Plan and re-scored by `evaluate` to show both agree.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest

from planner.costmodel import stage as st
from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import Shard, device_class_of
from planner.evaluate import evaluate
from planner.plan import Pipeline, Plan, Stage
from planner.search import search
from planner.specs import ClusterSpec, ModelSpec, NodeGroup, TrainingSpec

def _model(layers: int) -> ModelSpec:
    return MODEL.model_copy(update={"num_layers": layers})


MODEL = ModelSpec(name="bf-model", num_layers=3, hidden=1024, ffn_hidden=4096, num_heads=8, num_kv_heads=4,
                  vocab=8192, seq_len=512, activation="swiglu", norm="rmsnorm", learned_positions=False,
                  dropout=False)


@dataclass(frozen=True)
class StageChoice:
    group: int
    tp: int
    cp: int
    hp: int
    dp: int
    recompute: str

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.hp * self.dp


def _choices(cluster: ClusterSpec, training: TrainingSpec, micro_batch: int, model: ModelSpec) -> list[StageChoice]:
    out = []
    for gi, g in enumerate(cluster.nodes):
        for tp, cp, hp, dp in itertools.product((1, 2, 4), repeat=4):
            if tp > training.max_tp or cp > training.max_cp or hp > training.max_hp or dp > training.max_stage_dp:
                continue
            group = tp * cp * hp
            # a group inside one node, or (when the cluster allows it) a power of two of whole nodes
            spans = cluster.allow_cross_node_tp and group > g.node_gpus and group % g.node_gpus == 0 \
                and (group // g.node_gpus) & (group // g.node_gpus - 1) == 0
            if (group > g.node_gpus and not spans) or micro_batch % dp or group * dp > g.nodes * g.node_gpus:
                continue
            if model.num_heads % (tp * hp) or model.kv_heads % tp or training.seq_len % (cp * hp):
                continue
            for rc in training.recompute:
                out.append(StageChoice(gi, tp, cp, hp, dp, rc))
    return out


def _oracle(cluster: ClusterSpec, training: TrainingSpec, cost: AnalyticCostModel, model: ModelSpec):
    n = model.num_layer_slots
    avail = [g.nodes * g.node_gpus for g in cluster.nodes]
    knobs = cost.knobs
    single = cluster.single_node
    best = (math.inf, None)
    for b in training.micro_batches:
        if training.global_batch % b:
            continue
        big_m = training.global_batch // b
        choices = _choices(cluster, training, b, model)
        pipes = []  # (usage, stages(list of (choice, first, last)))
        for s in range(1, n + 1):
            for cuts in itertools.combinations(range(1, n), s - 1):
                bounds = (0, *cuts, n)
                for combo in itertools.product(choices, repeat=s):
                    usage = [0] * len(avail)
                    for c in combo:
                        usage[c.group] += c.gpus
                    if any(u > a for u, a in zip(usage, avail)):
                        continue
                    pipes.append((tuple(usage), tuple((c, bounds[k], bounds[k + 1] - 1) for k, c in enumerate(combo))))

        def metrics(stages, replicas, m):
            fwd, bwd, tails = [], [], []
            ns = len(stages)
            for k, (c, first, last) in enumerate(stages):
                dev = device_class_of(cluster.nodes[c.group])
                table = cost.layer_table(dev, Shard(c.tp, c.cp, c.hp, b // c.dp, c.recompute, training.seq_len),
                                         model, training)
                sums = st.StageSums.of(table)
                recv = st.recv_s(knobs, dev, table, single)
                f = sums.fwd_s(first, last) + (recv if k > 0 else 0.0)
                bb = sums.bwd_s(first, last) + (recv if k < ns - 1 else 0.0)
                params = sums.params(first, last)
                copies = replicas * c.dp * c.cp * c.hp
                mem = st.stage_memory_bytes(table, sums, first, last, st.in_flight("1f1b", ns, k, m),
                                            training.zero, copies)
                if mem > st.memory_capacity_bytes(knobs, dev):
                    return None
                sync = st.grad_sync_s(knobs, dev, params, c.tp, copies, training.zero, single)
                opt = st.optimizer_s(knobs, dev, params, training.zero, copies)
                fwd.append(f)
                bwd.append(bb)
                tails.append(st.stage_tail_s(knobs, bb, sync, opt))
            return st.pipeline_time_s("1f1b", fwd, bwd, m), max(tails)

        cache: dict[tuple[int, int, int], tuple[float, float] | None] = {}

        def cached(i: int, r: int, m: int):
            key = (i, r, m)
            if key not in cache:
                cache[key] = metrics(pipes[i][1], r, m)
            return cache[key]

        by_usage: dict[tuple[int, ...], list[int]] = {}
        for i, (usage, _) in enumerate(pipes):
            by_usage.setdefault(usage, []).append(i)
        usages = sorted(by_usage)
        for r in range(1, min(big_m, sum(avail)) + 1):
            # every multiset of r usage vectors that fits, then every choice of pipelines for them
            for shape in itertools.combinations_with_replacement(range(len(usages)), r):
                total = [sum(usages[u][k] for u in shape) for k in range(len(avail))]
                if any(t > a for t, a in zip(total, avail)):
                    continue
                groups = [(u, shape.count(u)) for u in sorted(set(shape))]
                per_group = [list(itertools.combinations_with_replacement(by_usage[usages[u]], n)) for u, n in groups]
                for pick in itertools.product(*per_group):
                    combo = [i for part in pick for i in part]
                    for cuts in itertools.combinations(range(1, big_m), r - 1):
                        ms = [hi - lo for lo, hi in zip((0, *cuts), (*cuts, big_m))]
                        worst_pipe, worst_tail = 0.0, 0.0
                        ok = True
                        for i, m in zip(combo, ms):
                            res = cached(i, r, m)
                            if res is None:
                                ok = False
                                break
                            worst_pipe, worst_tail = max(worst_pipe, res[0]), max(worst_tail, res[1])
                        if ok:
                            step = worst_pipe + worst_tail + knobs.step_overhead_s
                            if step < best[0] - 1e-15:
                                best = (step, (b, [(pipes[i][1], m) for i, m in zip(combo, ms)]))
    return best


def _as_plan(cluster: ClusterSpec, training: TrainingSpec, found, model: ModelSpec) -> Plan:
    b, pipes = found
    free = {}
    for node in cluster.node_list:
        free.setdefault(node.group, []).extend((node.name, i) for i in range(node.gpus))
    pipelines = []
    for stages, m in pipes:
        out = []
        for c, first, last in sorted(((c, f, l) for c, f, l in stages), key=lambda x: x[1]):
            devs = [free[c.group].pop(0) for _ in range(c.gpus)]
            out.append(Stage(layers=(first, last), gpu=cluster.nodes[c.group].gpu,
                             devices=[f"{nm}:{i}" for nm, i in devs], tp=c.tp, cp=c.cp, hp=c.hp, dp=c.dp,
                             recompute=c.recompute))
        pipelines.append(Pipeline(microbatches=m, stages=out))
    return Plan(model=model, training=training, micro_batch=b, pipelines=pipelines)


CASES = {
    "a100x2-v100x1": (ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=2),
                                         NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=1)]),
                      dict(global_batch=4, seq_len=512, micro_batches=(1, 2), max_cp=1, max_hp=1)),
    "three-types": (ClusterSpec(nodes=[NodeGroup(gpu="H100-SXM5-80GB", nodes=1, gpus_per_node=1),
                                       NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=1),
                                       NodeGroup(gpu="T4", nodes=1, gpus_per_node=1)]),
                    dict(global_batch=4, seq_len=512, micro_batches=(1, 2, 4), max_stage_dp=1)),
    "cp-and-heads": (ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=1, gpus_per_node=2),
                                        NodeGroup(gpu="RTX-3090", nodes=1, gpus_per_node=1)]),
                     dict(global_batch=2, seq_len=2048, micro_batches=(1, 2), max_stage_dp=1)),
    "four-gpus-six-slots": (ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=2),
                                               NodeGroup(gpu="V100-SXM2-16GB", nodes=2, gpus_per_node=1)]),
                            dict(global_batch=4, seq_len=512, micro_batches=(1, 2), max_stage_dp=1, max_cp=1,
                                 max_hp=1, layers=4)),
    "six-gpus-three-types": (ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-80GB", nodes=1, gpus_per_node=2),
                                                NodeGroup(gpu="V100-SXM2-32GB", nodes=2, gpus_per_node=1),
                                                NodeGroup(gpu="RTX-3090", nodes=2, gpus_per_node=1)]),
                             dict(global_batch=4, seq_len=512, micro_batches=(1, 2), max_stage_dp=1, max_cp=1,
                                  max_hp=1, max_tp=1, layers=4, exact_limit=5000)),
    # one sequence of 32k: its best plan is one stage with cp=2 over two single-GPU nodes
    "cp-across-nodes": (ClusterSpec(nodes=[NodeGroup(gpu="V100-SXM2-16GB", nodes=2, gpus_per_node=1),
                                           NodeGroup(gpu="T4", nodes=1, gpus_per_node=1)],
                                    allow_cross_node_tp=True),
                        dict(global_batch=1, seq_len=32768, micro_batches=(1,), max_stage_dp=1, max_hp=1)),
    "tight-memory": (ClusterSpec(nodes=[NodeGroup(gpu="RTX-2080Ti", nodes=2, gpus_per_node=1),
                                        NodeGroup(gpu="T4", nodes=1, gpus_per_node=1)]),
                     dict(global_batch=4, seq_len=4096, micro_batches=(1, 2), max_stage_dp=1, max_cp=1, max_hp=1)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_search_matches_brute_force_optimum(name: str) -> None:
    cluster, kw = CASES[name]
    kw = dict(kw)
    model = _model(kw.pop("layers", 3))
    exact_limit = kw.pop("exact_limit", 200)
    training = TrainingSpec(recompute=("none", "full"), **kw)
    cost = AnalyticCostModel()
    best_step, found = _oracle(cluster, training, cost, model)
    assert found is not None, "oracle found no plan"
    oracle_plan = _as_plan(cluster, training, found, model)
    assert evaluate(oracle_plan, cluster, cost).step_s == pytest.approx(best_step, rel=1e-12)
    result = search(model, cluster, training, cost=cost, exact_limit=exact_limit)
    assert result.prediction.step_s == pytest.approx(best_step, rel=1e-9), (
        f"search {result.prediction.step_s} vs brute force {best_step}")
    assert result.lower_bound_s <= best_step * (1 + 1e-9)
    assert result.coverage == "exact"
    if cluster.allow_cross_node_tp:  # the instance is one where a group spanning nodes wins
        assert any(len({d.split(":")[0] for d in s.devices}) > 1 and s.tp * s.cp * s.hp > 1
                   for p in result.plan.pipelines for s in p.stages)
