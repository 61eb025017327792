"""The order of the phases after the best-first units (`unit_loop.close_gap`): the plan polish runs
before refinement where the gap is open, so refinement works toward the polished plan's goal, and a
unit is polished again only once refined since."""

from __future__ import annotations

import random

from planner.costmodel.analytic import AnalyticCostModel
from planner.search import search, unit_loop, units
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model

COST = AnalyticCostModel()


def _finish_batches(monkeypatch) -> list[list[tuple]]:
    """What each `_finish_task` batch sent: ("engine",), ("last_step",) (of an engine candidate started
    ahead) or (kind, unit index, lo, hi) for a polish or a refinement; the engine candidates started
    at the first plan as ("started",) each."""
    from planner.search import parallel

    sent: list[list[tuple]] = []
    run, start = parallel.UnitPool._map, parallel.UnitPool._start_engines

    def watched(self, fn, args):
        if fn is parallel._finish_task:
            sent.append([a[:1] if a[0] in ("engine", "last_step") else a[:4] for a in args])
        return run(self, fn, args)

    def started(self):
        start(self)
        if self._started is not None:
            sent.append([("started",)] * len(self._started[0]))

    monkeypatch.setattr(parallel.UnitPool, "_map", watched)
    monkeypatch.setattr(parallel.UnitPool, "_start_engines", started)
    return sent


def _llama_pool() -> tuple:
    """Llama-2 7B, global batch 8, on 3 H100 + 3x2 T4 + 4 L4 (`chain_check.py --seed 34` pool 12):
    (model, cluster, training)."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="H100-SXM5-80GB", nodes=3, gpus_per_node=1),
                                 NodeGroup(gpu="T4", nodes=3, gpus_per_node=2),
                                 NodeGroup(gpu="L4", nodes=1, gpus_per_node=4)])
    return get_model("llama2-7b"), cluster, TrainingSpec(global_batch=8, seq_len=2048)


def _chain_pool(seed: int, index: int) -> tuple:
    """(model, cluster, training) of the `index`-th pool `benchmarks/chain_check.py --seed SEED` draws."""
    from benchmarks.chain_check import draw

    rng = random.Random(seed)
    for _ in range(index + 1):
        _, model, cluster, training = draw(rng)
    return model, cluster, training


def _by_workers(pool: tuple, sent: list, **options: object) -> dict[int, tuple]:
    """Per worker count (1, 2): the plan's JSON, the bound, the counts, the `_finish_task` batches
    sent (`_finish_batches`) and the result."""
    found = {}
    for workers in (1, 2):
        sent.clear()
        res = search(*pool, cost=COST, workers=workers, **options)
        found[workers] = (res.plan.to_json(), res.lower_bound_s, res.counts(), list(sent), res)
    return found


def test_polish_runs_before_refinement_where_the_gap_is_open(monkeypatch) -> None:
    """GPT-Neo 2.7B at 4,096 tokens, global batch 16, on 3x2 A10 + 3x2 RTX-4090 (`chain_check.py
    --seed 31` pool 29): the best-first units' best plan is 2.1065 s and the polish finds 2.0700 s.
    Polished after refinement, that plan came too late to lower the goal: three units were refined
    toward 2.1065 / 1.015 s. Polished first, refinement starts from 2.0700 s."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A10", nodes=3, gpus_per_node=2),
                                 NodeGroup(gpu="RTX-4090", nodes=3, gpus_per_node=2)])
    training = TrainingSpec(global_batch=16, seq_len=4096)
    at_refine: list[float] = []
    polished: list[tuple] = []
    refine, polish_unit = unit_loop.refine, units.polish_unit

    def watched_refine(ctx, *args, **kwargs):
        at_refine.append(min(c.step_s for c in ctx.candidates))
        return refine(ctx, *args, **kwargs)

    def watched_polish(su, *args, **kwargs):
        polished.append((id(su.unit), su.bound_s))
        return polish_unit(su, *args, **kwargs)

    monkeypatch.setattr(unit_loop, "refine", watched_refine)
    monkeypatch.setattr("planner.search.parallel.polish_unit", watched_polish)
    res = search(get_model("gpt-neo-2.7b"), cluster, training, cost=COST)
    assert res.prediction.step_s < 2.071
    assert at_refine == [res.prediction.step_s]  # found before refinement, by the polish
    assert res.lower_bound_s <= res.prediction.step_s <= res.lower_bound_s * 1.015
    # a unit is polished again only when refined since its last polish
    assert len(polished) == len(set(polished)) == res.stats["units_polished"] > 0


def test_polish_takes_the_other_run_orders_of_its_groups() -> None:
    """GPT-Neo 2.7B at 4,096 tokens, global batch 32, ZeRO-1, on 3x4 T4 + 2x2 RTX-4090
    (`chain_check.py --seed 34` pool 6). Polished before refinement, the bound leans on RTX-4090 ->
    T4 pipelines only (4.14382 s); the faster plan runs T4 (tp 2) x 3 -> RTX-4090 x 2, the other
    order, which the LP turns to only once the first order's tails are refined. The polish takes
    both orders of each group, as refinement does: 4.13648 s, as `--target flagscale` finds."""
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="T4", nodes=3, gpus_per_node=4),
                                 NodeGroup(gpu="RTX-4090", nodes=2, gpus_per_node=2)])
    training = TrainingSpec(global_batch=32, seq_len=4096, zero=1)
    res = search(get_model("gpt-neo-2.7b"), cluster, training, cost=COST)
    assert res.lower_bound_s <= res.prediction.step_s < 4.1370
    assert all([s.gpu for s in p.stages][0] == "T4" for p in res.plan.pipelines)


def test_the_polish_beside_the_engine_candidates_gives_the_same_answer(monkeypatch) -> None:
    """Llama-2 7B, global batch 8, on 3 H100 + 3x2 T4 + 4 L4 (`chain_check.py --seed 34` pool 12):
    the coverage leaves three-run pipelines out, so the Megatron-grid and mesh-chain candidates
    run before refinement: they start at the first plan, against it, beside the units still to
    solve (`UnitPool.start_engines_at_first_plan`). With two workers the polish batch that comes
    next runs beside them if they are still running (`UnitPool.speculate`) and, as they find
    nothing faster, is taken as it is, not run again; the plan, the bound and every count equal
    those of one worker, which runs them in turn."""
    sent = _finish_batches(monkeypatch)
    found = _by_workers(_llama_pool(), sent)
    assert found[1][:3] == found[2][:3]
    assert found[1][2]["units_polished"] > 0 and found[1][2]["chain_added"] == 0
    # the engines started, then the chains' re-split and the polish, once (in one process, in turn)
    batches = {w: [[task[0] for task in batch] for batch in found[w][3]] for w in (1, 2)}
    assert batches == {1: [["started", "started"], ["last_step"], ["polish"]],
                       2: [["started", "started"], ["last_step", "polish"]]}


def test_a_time_limited_answer_is_never_slower_than_the_best_megatron_grid() -> None:
    """Past the time limit the Megatron grid still runs, with the best plan as its cutoff
    (`candidates.FLOOR_ENGINES`). Cut short after its first units, the search had returned 1.0503 s
    per step on this pool (24 layers on 8 A100 + 4 H100 + 4 V100), where the best grid runs
    0.6861 s; it still says the limit cut it short, and the bound still holds."""
    from planner.search.api import micro_batch_sizes
    from planner.search.megatron_grid import best_megatron_plan
    from tests.test_search_refine import BIG_CLUSTER as cluster
    from tests.test_search_refine import BIG_MODEL as model
    from tests.test_search_refine import BIG_TRAINING as training

    grid = best_megatron_plan(model, cluster, training, COST, micro_batch_sizes(training))
    assert grid is not None
    for workers in (1, 2):
        res = search(model, cluster, training, cost=COST, time_limit=1e-6, workers=workers)
        assert res.timed_out
        assert res.lower_bound_s <= res.prediction.step_s <= grid[1].step_s


def test_a_stop_gap_search_takes_the_polish_it_speculated(monkeypatch) -> None:
    """OPT-350M, global batch 16, on 2x4 RTX-4090 + 8 H100 + 2x2 V100-16GB (`chain_check.py
    --seed 34` pool 5) with `stop_gap` 0.02: the polish batch speculated beside the engine
    candidates is the one `finish` then asks for (same units, bounds and gap), so it is taken, not
    run again. Speculated at `refine_gap` (0.015) rather than the 0.02 the polish then used, its
    keys never matched and both units were polished twice. Units whose bound lies within the gap
    of the best plan are not polished (pruned, as a MIP solver with a gap limit prunes nodes)."""
    sent = _finish_batches(monkeypatch)
    found = _by_workers(_chain_pool(34, 5), sent, stop_gap=0.02)
    assert found[1][:3] == found[2][:3] and found[2][2]["units_polished"] > 0
    polished = [task for batch in found[2][3] for task in batch if task[0] == "polish"]
    assert len(polished) == len(set(polished))  # none twice
    assert found[1][2]["stopped_at_gap"] == 1 and found[2][4].gap <= 0.02


def test_a_stop_gap_search_does_not_polish_units_within_the_gap(monkeypatch) -> None:
    """The Llama-2 7B pool above with `stop_gap` 0.02: the best-first units leave a gap of 0.2 %, so
    no unit's bound is more than 2 % below the best plan and nothing is polished, not even beside
    the engine candidates (before, one polish ran there and was dropped)."""
    sent = _finish_batches(monkeypatch)
    for workers in (1, 2):
        sent.clear()
        res = search(*_llama_pool(), cost=COST, workers=workers, stop_gap=0.02)
        assert sent == [[("started",), ("started",)], [("last_step",)]] and res.stats["units_polished"] == 0
        assert res.gap <= 0.02 and res.stats["stopped_at_gap"] == 1


def test_a_stop_gap_search_builds_no_plan_for_a_unit_bounded_within_the_gap(monkeypatch) -> None:
    """Llama-2 7B on 22 GPUs (`chain_check.py --seed 34` pool 9) with `stop_gap` 0.02: a unit whose
    bound comes out within 2 % of the best plan it was solved against cannot hold a plan more than
    2 % faster, so it is only bounded, as its cheap bound would have left it (before, its plan
    templates were built and rounded: only plans more than 0.1 % faster were ruled out)."""
    solved: list[tuple[float, float, bool]] = []  # (incumbent, bound, plan templates built)
    solve_lp = units._solve_lp

    def watched(*args, **kwargs):
        out = solve_lp(*args, **kwargs)
        incumbent = args[3]
        if incumbent is not None and out[2] is not None:
            solved.append((incumbent, out[2].bound_s, bool(out[0])))
        return out

    monkeypatch.setattr(units, "_solve_lp", watched)
    res = search(*_chain_pool(34, 9), cost=COST, workers=1, stop_gap=0.02)
    within = [built for incumbent, bound, built in solved if incumbent / 1.02 <= bound < incumbent / 1.001]
    assert within and not any(within)
    assert res.lower_bound_s <= res.prediction.step_s <= 1.02 * res.lower_bound_s


def test_a_stop_gap_search_refines_beside_the_engine_candidates(monkeypatch) -> None:
    """The same pool with `stop_gap` 0.02: the coverage leaves pipelines out, so the engine
    candidates run before refinement, and the gap is open after the best-first units. Beside them
    runs the refinement `refine` would start with, not a speculated polish: it closes the gap, so
    nothing is polished, and one worker or two give the same answer (the refined bound holds
    whatever the engines find). Before, a polish ran beside them and refinement after."""
    sent = _finish_batches(monkeypatch)
    found = _by_workers(_chain_pool(34, 9), sent, stop_gap=0.02)
    assert found[1][:4] == found[2][:4]
    assert [[task[0] for task in batch] for batch in found[1][3]] == [["started", "started"],
                                                                      ["last_step", "refine"]]
    assert found[1][2]["units_polished"] == 0 and found[1][2]["stopped_at_gap"] == 1
    res = found[2][4]
    assert res.lower_bound_s <= res.prediction.step_s <= 1.02 * res.lower_bound_s


def test_engine_candidates_are_not_started_past_the_time_limit(monkeypatch) -> None:
    """The Llama-2 7B pool above with a time limit that has passed by the first plan: the engine
    candidates are not started beside the units (`UnitPool.start_engines_at_first_plan`), as
    `close_gap` would leave them out too; the Megatron grid still runs last, as a floor."""
    sent = _finish_batches(monkeypatch)
    for workers in (1, 2):
        sent.clear()
        res = search(*_llama_pool(), cost=COST, workers=workers, time_limit=1e-6)
        assert res.timed_out and sent[-1] == [("engine",)]  # the grid, after the units
        assert not any(task == ("started",) for batch in sent for task in batch)
        assert res.lower_bound_s <= res.prediction.step_s


def test_chains_started_at_the_first_plan_are_re_split_against_the_best_plan_when_taken(monkeypatch) -> None:
    """The 64-GPU ladder pool (Llama-2 13B on 32 A100 + 16 H100 + 16 V100) with `stop_gap` 0.02:
    the mesh chains start at the first plan (7.080 s), but their re-split (`chain_resplit`) waits
    until they are taken, against the best plan then (6.995 s). The fastest chain's re-split does
    not beat that, so it alone is re-split; against the first plan it did, and all eight kept chains
    were re-split (0.34 s of a worker), for no faster plan."""
    from benchmarks.search_scale import ladder_cluster
    from planner.search import chain_resplit

    cutoffs: list[float] = []
    resplit = chain_resplit.resplit

    def watched(ctx, found, cutoff_s=float("inf")):
        cutoffs.append(cutoff_s)
        return resplit(ctx, found, cutoff_s)

    monkeypatch.setattr(chain_resplit, "resplit", watched)
    model = get_model("llama2-13b")
    res = search(model, ladder_cluster(64), TrainingSpec(global_batch=256, seq_len=model.seq_len), cost=COST,
                 workers=1, stop_gap=0.02)
    first = res.history[0].step_s
    assert len(cutoffs) == 1 and cutoffs[0] < first
    assert res.lower_bound_s <= res.prediction.step_s <= 1.02 * res.lower_bound_s
