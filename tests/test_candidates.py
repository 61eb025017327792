"""Engine-restricted plans added to the full search's candidates (`planner.search.candidates`):
the mesh-chain candidate, for pipelines of more runs than the blocks coverage holds."""

from __future__ import annotations

import pytest

from benchmarks.baselines.megatron_uniform import best_uniform_plan
from planner.costmodel.analytic import AnalyticCostModel
from planner.emit.targets import emit
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.search import search
from planner.search.api import micro_batch_sizes
from planner.search.candidates import wants_chains
from planner.search.megatron_grid import best_megatron_plan, best_single_type_plan
from planner.search.space import resource_classes
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model
from planner.validate import violations

COST = AnalyticCostModel()


def _t4_3090_v100() -> ClusterSpec:
    return ClusterSpec(nodes=[NodeGroup(gpu="T4", nodes=2, gpus_per_node=4),
                              NodeGroup(gpu="RTX-3090", nodes=2, gpus_per_node=1),
                              NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=4)])


def test_single_type_grids_match_the_baseline_on_types_no_prefix_holds() -> None:
    """The V100 node comes last, so no prefix of the node list holds it alone: the whole-pool
    grids' best is 0.3239 s, the V100 node alone (tp 4) runs 0.2947 s. `best_single_type_plan`
    finds the baseline's best single-type grid, named on the whole pool's nodes; under a cutoff
    below it, nothing."""
    cluster, model = _t4_3090_v100(), get_model("opt-350m")
    training = TrainingSpec(global_batch=8, seq_len=1024)
    sizes = micro_batch_sizes(training)
    found = best_single_type_plan(model, cluster, training, COST, sizes)
    base = best_uniform_plan(model, cluster, training, COST, single_type="each")
    whole = best_megatron_plan(model, cluster, training, COST, sizes)
    assert found is not None and base is not None and whole is not None
    plan, pred = found
    assert pred.step_s == pytest.approx(base[1].step_s, rel=1e-9)
    assert pred.step_s < whole[1].step_s / 1.09
    assert not violations(plan, cluster, COST)
    assert evaluate(plan, cluster, COST).step_s == pred.step_s
    assert {d for p in plan.pipelines for s in p.stages for d in s.devices} == {"node4:0-3"}
    assert best_single_type_plan(model, cluster, training, COST, sizes, cutoff_s=0.99 * pred.step_s) is None


def test_search_is_never_slower_than_a_grid_on_one_gpu_type_alone() -> None:
    """Random pool of `benchmarks/grid_check.py --seed 21`: the search returned 0.2961 s (gap
    1.45 %), 0.47 % slower than the V100 node alone; the Megatron-grid candidate now searches
    single-type pools too and its plan is the answer."""
    cluster, model = _t4_3090_v100(), get_model("opt-350m")
    training = TrainingSpec(global_batch=8, seq_len=1024)
    res = search(model, cluster, training, cost=COST)
    base = best_uniform_plan(model, cluster, training, COST, single_type="each")
    assert base is not None
    assert res.prediction.step_s <= base[1].step_s * (1 + 1e-9)
    assert res.stats["megatron_grid_added"] == 1
    assert res.lower_bound_s <= res.prediction.step_s
    assert not violations(res.plan, cluster, COST)


def test_chain_candidate_uses_every_gpu_type_in_one_pipeline() -> None:
    """Llama-2 7B, global batch 32, on 4 A10 + 3 single RTX-4090 + 12 L4 (random pool 25 of
    `benchmarks/chain_check.py --seed 11`): the two-run coverage's best is two L4 -> A10 pipelines
    at 3.333 s with the RTX-4090s idle; one chain 3 x RTX-4090 -> 2 x A10 (tp 2) -> 3 x L4 (tp 4)
    runs 3.150 s, 5.5 % faster, as `--target flagscale` finds. The bound of the covered space stays
    reported, and the plan is named as lying outside it. The chain runs before refinement
    (`unit_loop.run_engines`): with it as the goal, no unit needs refining, so the covered space's
    bound is the unrefined one, below the refined bound of the search without chains."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A10", nodes=1, gpus_per_node=4),
                                 NodeGroup(gpu="RTX-4090", nodes=3, gpus_per_node=1),
                                 NodeGroup(gpu="L4", nodes=3, gpus_per_node=4)])
    model = get_model("llama2-7b")
    training = TrainingSpec(global_batch=32, seq_len=2048, zero=1, micro_batches=(1,))
    res = search(model, cluster, training, cost=COST)
    without = search(model, cluster, training, cost=COST, chains="never")
    chain = search(model, cluster, training, cost=COST, target="flagscale")
    assert res.coverage == without.coverage == "blocks<=2"
    assert res.stats["chain_added"] == 1 and without.stats["chain_added"] == 0
    assert res.prediction.step_s <= chain.prediction.step_s * (1 + 1e-9)
    assert res.prediction.step_s < without.prediction.step_s / 1.05
    assert res.idle_gpus == {} and without.idle_gpus == {"RTX-4090": 3}
    # the covered space's bound, unrefined, is below the no-chain search's refined one
    assert res.stats["units_refined"] == 0 < without.stats["units_refined"]
    assert res.coverage_bound_s < without.lower_bound_s
    assert res.coverage_bound_s <= without.prediction.step_s  # still below every covered plan
    assert res.lower_bound_s == min(res.coverage_bound_s, res.prediction.step_s)
    assert any("runs of stage groups" in line for line in res.explanation)
    assert without.lower_bound_s <= without.prediction.step_s


def test_chains_run_only_where_the_coverage_leaves_pipelines_out() -> None:
    """"auto": on pools of at most 64 GPUs when the pool has more GPU classes than the coverage's
    runs, or mixed pipelines are capped in length, or the gap is above the refinement target;
    never on the exact coverage; an unknown mode is refused."""
    three = resource_classes(ClusterSpec(nodes=[NodeGroup(gpu=g, nodes=1, gpus_per_node=2)
                                                for g in ("A10", "L4", "T4")]))
    assert wants_chains("auto", {"blocks<=2"}, three)
    assert not wants_chains("auto", {"blocks<=3"}, three)
    assert wants_chains("auto", {"blocks<=3", "blocks<=2,mixed<=7"}, three)
    assert not wants_chains("auto", {"blocks<=2"}, three[:2])
    assert wants_chains("auto", {"blocks<=2,mixed<=9"}, three[:2])
    assert wants_chains("always", {"blocks<=2"}, three[:2])
    assert not wants_chains("never", {"blocks<=1"}, three)
    assert not wants_chains("always", {"exact"}, three)
    big = resource_classes(ClusterSpec(nodes=[NodeGroup(gpu=g, nodes=3, gpus_per_node=8)
                                              for g in ("A10", "L4", "T4")]))  # 72 GPUs
    assert not wants_chains("auto", {"blocks<=2"}, big) and wants_chains("always", {"blocks<=2"}, big)
    # a gap left above the refinement target opens "auto" on small pools whatever the coverage
    assert wants_chains("auto", {"blocks<=2"}, three[:2], gap_open=True)
    assert not wants_chains("auto", {"blocks<=2"}, big, gap_open=True)
    assert not wants_chains("never", {"blocks<=2"}, three[:2], gap_open=True)
    model = get_model("opt-350m")
    with pytest.raises(HetplanError, match="chains"):
        search(model, ClusterSpec(nodes=[NodeGroup(gpu="A10", nodes=1, gpus_per_node=2)]),
               TrainingSpec(global_batch=8, seq_len=1024), cost=COST, chains="sometimes")


def test_a_looser_cutoff_finds_the_same_engine_plans() -> None:
    """The engine candidates run alongside the polish with the best step before it as their cutoff
    (`unit_loop.finish`), and are taken only when faster than the final best: a looser cutoff must
    not lose a plan a tighter one finds. The chain search takes chains in order of bounds that only
    grow, so the plan under the tight cutoff (the pool above, where the best two-run plan is
    3.333 s) is the plan under looser ones; so is the best Megatron grid, searched exactly."""
    from planner.search.api import micro_batch_sizes
    from planner.search.candidates import chain_candidate, megatron_grid_candidate
    from planner.search.units import UnitContext
    from solvers.assign import SolverStats

    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A10", nodes=1, gpus_per_node=4),
                                 NodeGroup(gpu="RTX-4090", nodes=3, gpus_per_node=1),
                                 NodeGroup(gpu="L4", nodes=3, gpus_per_node=4)])
    model = get_model("llama2-7b")
    training = TrainingSpec(global_batch=32, seq_len=2048, zero=1, micro_batches=(1,))
    classes = resource_classes(cluster)
    ctx = UnitContext(model, training, cluster, classes, COST, tuple(rc.gpus for rc in classes), [], [], set(),
                      SolverStats(), {})
    sizes = micro_batch_sizes(training)
    tight = 3.333
    chains = [chain_candidate(ctx, sizes, cut) for cut in (tight, tight * 1.02, float("inf"))]
    assert chains[0] is not None and chains[0][1].step_s < tight
    assert all(c is not None and c[0].to_json() == chains[0][0].to_json() for c in chains)
    grids = [megatron_grid_candidate(ctx, sizes, cut) for cut in (float("inf"), 100.0)]
    assert grids[0] is not None and grids[1] is not None and grids[0][0].to_json() == grids[1][0].to_json()
    assert megatron_grid_candidate(ctx, sizes, grids[0][1].step_s * 0.999) is None


def test_chains_run_where_the_gap_stays_open() -> None:
    """Llama-2 7B, global batch 128, ZeRO 1, on one node of 2 H100 + two nodes of 4 RTX-3090
    (random pool 28 of `benchmarks/chain_check.py --seed 11`): two GPU types, so the blocks<=2
    coverage leaves no pipeline out, but refinement ends at a gap of 2.1 % (18.129 s against a
    bound of 17.750 s). Two copies of RTX-3090 (tp 2) -> RTX-3090 (tp 2) -> H100, inside the
    coverage, run 18.107 s, with half the exposed tail: the split frontiers are costed without
    tails, the chains with them. With the chains run on an open gap the search finds it, as
    `--target flagscale` does; `chains="never"` shows the plan it had. The plan polish off: it
    now also re-solves the units the best plan came from, and one of them holds this plan too."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="H100-SXM5-80GB", nodes=1, gpus_per_node=2),
                                 NodeGroup(gpu="RTX-3090", nodes=2, gpus_per_node=4)])
    model = get_model("llama2-7b")
    training = TrainingSpec(global_batch=128, seq_len=4096, zero=1)
    res = search(model, cluster, training, cost=COST, polish="never")
    without = search(model, cluster, training, cost=COST, chains="never", polish="never")
    chain = search(model, cluster, training, cost=COST, target="flagscale")
    assert res.coverage == without.coverage == "blocks<=2"
    assert without.gap > 0.015  # the refinement target
    assert res.stats["chain_added"] == 1
    assert res.prediction.step_s <= chain.prediction.step_s * (1 + 1e-9) < without.prediction.step_s
    assert res.lower_bound_s == without.lower_bound_s <= res.prediction.step_s


def test_engine_grid_targets_take_a_single_gpu_type_alone() -> None:
    """`--target megatron` on 2x4 T4 + 2x1 RTX-3090 + 1x4 V100: the V100 node alone (tp 4, 0.2947 s)
    beats every grid on a prefix of the node list (0.3239 s), and Megatron's launch files name only
    that node."""
    cluster, model = _t4_3090_v100(), get_model("opt-350m")
    training = TrainingSpec(global_batch=8, seq_len=1024)
    res = search(model, cluster, training, cost=COST, target="megatron")
    base = best_uniform_plan(model, cluster, training, COST, single_type="each")
    assert base is not None and res.coverage == "megatron-grid"
    assert res.prediction.step_s == pytest.approx(base[1].step_s, rel=1e-9)
    assert res.idle_gpus == {"T4": 8, "RTX-3090": 2}
    files = emit(res.plan, cluster, "megatron").files["megatron"]
    text = "\n".join(files.values())
    assert "node4" in text and "node0" not in text


def test_chains_search_deeper_where_sync_tails_weigh() -> None:
    """Llama-2 7B, global batch 64, on 2x8 V100-16 + 2 single A100-40 + 4 RTX-4090 (`chain_check.py
    --seed 23`, pool 22): the best plan before the engine candidates runs two pipelines with an
    exposed sync and optimizer tail of 8 % of the step (4.650 s). One V100 (tp 8) x 2 -> A100 x 2
    -> RTX-4090 (tp 4) chain, no replica to sync with, runs 4.544 s; the chain search's queue,
    whose bounds count only the least tail any split can have, reaches it only past 128 DPs. With
    tails at least 5 % of the step the candidate runs 512, and the default search matches
    `--target flagscale`."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="V100-SXM2-16GB", nodes=2, gpus_per_node=8),
                                 NodeGroup(gpu="A100-SXM4-40GB", nodes=2, gpus_per_node=1),
                                 NodeGroup(gpu="RTX-4090", nodes=1, gpus_per_node=4)])
    model, training = get_model("llama2-7b"), TrainingSpec(global_batch=64, seq_len=2048)
    res = search(model, cluster, training, cost=COST)
    chain = search(model, cluster, training, cost=COST, target="flagscale")
    without = search(model, cluster, training, cost=COST, chains="never")
    assert without.prediction.tail_s >= 0.05 * without.prediction.step_s
    assert res.stats["chain_added"] == 1
    assert res.prediction.step_s <= chain.prediction.step_s * (1 + 1e-9)
    assert res.prediction.step_s < without.prediction.step_s / 1.02
    assert any("runs of stage groups" in line for line in res.explanation)


def test_chain_queue_counts_the_tail_every_split_pays() -> None:
    """GPT-Neo 2.7B, global batch 16, on 2 L4 + 2x4 V100-16 + 3x2 A10 (`chain_check.py --seed 24`,
    pool 27): the best FlagScale chain is one pipeline A10 (tp 2) x 3 -> L4 (tp 2) -> V100 (tp 4) x 2
    with no replica to sync (0.7040 s). Queued by bounds without tails, the chains of two replicas
    came first and 128 partition DPs ended at 0.7790 s; with each chain's least largest tail in its
    bound the candidate's budget reaches the best chain, and the default search returns it."""
    from planner.search.candidates import CHAIN_MAX_DP
    from planner.search.flagscale_grid import best_flagscale_plan

    cluster = ClusterSpec(nodes=[NodeGroup(gpu="L4", nodes=1, gpus_per_node=2),
                                 NodeGroup(gpu="V100-SXM2-16GB", nodes=2, gpus_per_node=4),
                                 NodeGroup(gpu="A10", nodes=3, gpus_per_node=2)])
    model, training = get_model("gpt-neo-2.7b"), TrainingSpec(global_batch=16, seq_len=1024)
    sizes = micro_batch_sizes(training)
    full = best_flagscale_plan(model, cluster, training, COST, sizes, grid=False)
    capped = best_flagscale_plan(model, cluster, training, COST, sizes, max_dp=CHAIN_MAX_DP, grid=False)
    assert full is not None and capped is not None
    assert capped[1].step_s == full[1].step_s and len(full[0].pipelines) == 1
    res = search(model, cluster, training, cost=COST)
    assert res.prediction.step_s <= full[1].step_s * (1 + 1e-9)
