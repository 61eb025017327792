"""Properties of the FlagScale-restricted search (`planner.search.flagscale_grid`)."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from planner import get_model, load_cluster
from planner.costmodel.analytic import AnalyticCostModel
from planner.emit.flagscale import check_flagscale, hetero_section, meshes
from planner.errors import HetplanError
from planner.search.flagscale_grid import best_flagscale_plan
from planner.search.megatron_grid import best_megatron_plan
from planner.search.options import OptionContext, build_options
from planner.search.space import resource_classes
from planner.specs.training import TrainingSpec
from planner.validate import violations
from solvers.partition import split_frontier

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
fg = sys.modules["planner.search.flagscale_grid"]  # `planner.search` is also a function name
cb = sys.modules["planner.search.chain_bounds"]

# 2 x H100-80GB + 4 x V100-16GB: the small V100s need a wide tensor-parallel group for gpt3-2.7b
# layers, the H100s do best with a narrow one, which one Megatron grid (one tp) cannot express.
TWO_TYPE = "nodes:\n  - {gpu: H100-SXM5-80GB, nodes: 1, gpus_per_node: 2}\n" \
           "  - {gpu: V100-16, nodes: 1, gpus_per_node: 4}\n"


@pytest.fixture(scope="module")
def two_type(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("fs") / "two_type.yaml"
    path.write_text(TWO_TYPE)
    return load_cluster(path)


def _cases(two_type) -> list[tuple]:
    tiny = load_cluster(EXAMPLES / "tiny_cluster.yaml")
    return [
        (get_model("tiny"), tiny, TrainingSpec(global_batch=8, seq_len=128, micro_batches=(1, 2))),
        (get_model("gpt3-1.3b"), tiny, TrainingSpec(global_batch=16, seq_len=2048, micro_batches=(1,))),
        (get_model("gpt3-2.7b"), two_type, TrainingSpec(global_batch=16, seq_len=2048, micro_batches=(1,))),
        (get_model("gpt3-1.3b"), two_type, TrainingSpec(global_batch=8, seq_len=2048, micro_batches=(1, 2))),
    ]


def _search(model, cluster, training, cost=None):
    cost = cost or AnalyticCostModel()
    return best_flagscale_plan(model, cluster, training, cost, list(training.micro_batches))


def test_every_plan_validates_and_flagscale_accepts_it(two_type) -> None:
    cost = AnalyticCostModel()
    for model, cluster, training in _cases(two_type):
        found = _search(model, cluster, training, cost)
        assert found is not None
        plan, pred = found
        assert violations(plan, cluster, cost) == []
        check_flagscale(plan)
        hetero_section(plan, cluster)  # meshes, dp_0·mbs rule and node-contiguous ranks
        assert math.isfinite(pred.step_s) and pred.step_s > 0


def test_never_slower_than_the_megatron_grid(two_type) -> None:
    cost = AnalyticCostModel()
    compared = 0
    for model, cluster, training in _cases(two_type):
        _, pred = _search(model, cluster, training, cost)
        grid = best_megatron_plan(model, cluster, training, cost, list(training.micro_batches))
        if grid is None:
            continue
        try:
            check_flagscale(grid[0])
        except HetplanError:  # e.g. an embedding-only stage: not in FlagScale's space
            continue
        assert pred.step_s <= grid[1].step_s * (1 + 1e-9), (model.name, pred.step_s, grid[1].step_s)
        compared += 1
    assert compared == len(_cases(two_type))  # every grid here is a FlagScale plan too


def test_per_mesh_tensor_parallel_beats_one_grid_on_two_types(two_type) -> None:
    cost = AnalyticCostModel()
    model = get_model("gpt3-2.7b")
    training = TrainingSpec(global_batch=16, seq_len=2048, micro_batches=(1,))
    plan, pred = _search(model, two_type, training, cost)
    grid = best_megatron_plan(model, two_type, training, cost, [1])
    assert grid is not None
    assert len({m.tp for m in meshes(plan)}) > 1
    assert pred.step_s < grid[1].step_s


def test_same_input_same_plan(two_type) -> None:
    model, cluster, training = _cases(two_type)[3]
    first = _search(model, cluster, training)
    second = _search(model, cluster, training)
    assert first[0].to_json() == second[0].to_json()
    assert first[1].step_s == second[1].step_s


def _exhaustive_step_s(model, cluster, training, cost) -> float:
    """Every run combination and order of the same space, each split by the full frontier."""
    classes = resource_classes(cluster)
    best = math.inf
    for g in fg._groups(model, training, classes, list(training.micro_batches)):
        widths = [fg._widths(cost, model, training, rc, g, cluster.single_node) for rc in classes]
        choices, _ = fg._choices(widths, classes, g, model.num_layers)
        ctx = OptionContext(model, training, g.b, g.replicas, g.replicas, cluster.single_node)
        for combo in itertools.product(*choices):
            used = [c for c in combo if c[0] is not None]
            if not used or sum(p for _, p in used) > model.num_layers:
                continue
            for order in itertools.permutations(used):
                pos = [fg._masked(build_options(cost, classes[w.cls], list(w.shapes), ctx))
                       for w, p in order for _ in range(p)]
                front = split_frontier(pos, max_in_flight=min(g.microbatches, len(pos)))
                for sp in front:
                    best = min(best, fg._value(sp, g.microbatches) + cost.knobs.step_overhead_s)
    return best


def test_bounds_prune_nothing_better_than_the_answer() -> None:
    cost = AnalyticCostModel()
    model = get_model("tiny")
    cluster = load_cluster(EXAMPLES / "tiny_cluster.yaml")
    training = TrainingSpec(global_batch=8, seq_len=128, micro_batches=(1, 2))
    _, pred = _search(model, cluster, training, cost)
    assert pred.step_s == pytest.approx(_exhaustive_step_s(model, cluster, training, cost), rel=1e-9)


def test_mixed_pool_uses_meshes_megatron_cannot_express() -> None:
    cost = AnalyticCostModel()
    model = get_model("llama2-13b")
    cluster = load_cluster(EXAMPLES / "mixed.yaml")
    training = TrainingSpec(global_batch=64, seq_len=4096, micro_batches=(1,))
    plan, pred = _search(model, cluster, training, cost)
    assert violations(plan, cluster, cost) == []
    hetero_section(plan, cluster)
    shapes = {(m.tp, m.dp) for m in meshes(plan)}
    assert len({m.gpu for m in meshes(plan)}) > 1 and len(shapes) > 1
    grid = best_megatron_plan(model, cluster, training, cost, [1])
    assert grid is not None and pred.step_s <= grid[1].step_s * (1 + 1e-9)


def test_batched_frontiers_give_the_general_dp_plans(two_type, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run orders of identical decoder layers are split in one batched sweep of the frontier part a
    pipeline of m microbatches uses (`solvers.batched_runs.batched_step_frontiers`); with that path
    turned off (every order's whole frontier through the general partition DP) the plans are the
    same, byte for byte."""
    cost = AnalyticCostModel()
    cases = _cases(two_type)[1:] + [(get_model("llama2-13b"), load_cluster(EXAMPLES / "mixed.yaml"),
                                     TrainingSpec(global_batch=64, seq_len=4096, micro_batches=(1, 2)))]
    batched = fg.batched_step_frontiers
    sweeps = []
    monkeypatch.setattr(fg, "batched_step_frontiers", lambda *a, **k: sweeps.append(1) or batched(*a, **k))
    fast = [_search(model, cluster, training, cost) for model, cluster, training in cases]
    assert len(sweeps) > 50  # the batched path ran
    monkeypatch.setattr(fg, "uniform_view", lambda opts: None)
    slow = [_search(model, cluster, training, cost) for model, cluster, training in cases]
    for a, b in zip(fast, slow):
        assert a is not None and b is not None
        assert a[0].to_json() == b[0].to_json() and a[1].step_s == b[1].step_s


def _mesh_options(cost, classes, widths, ctx) -> dict:
    """Each mesh width's stage options as the chain search masks them, by id of the width."""
    return {id(w): fg._masked(build_options(cost, classes[w.cls], list(w.shapes), ctx)) for ws in widths for w in ws}


def test_tail_levels_bound_is_below_the_exact_frontier() -> None:
    """`chain_bounds.tail_levels_bound` never exceeds the least A + (m - 1)·C + E of the run order's full
    (A, C, E) frontier (the general DP), is finite where it applies, and is close (here within
    2 %: it is what lets most orders skip that frontier)."""
    from solvers.partition import min_max_tail
    from solvers.uniform_layers import uniform_view

    cost = AnalyticCostModel()
    model = get_model("llama2-13b")
    cluster = load_cluster(EXAMPLES / "mixed.yaml")
    training = TrainingSpec(global_batch=64, seq_len=4096, micro_batches=(1,))
    classes = resource_classes(cluster)
    checked = 0
    for g in fg._groups(model, training, classes, [1])[:4]:
        widths = [fg._widths(cost, model, training, rc, g, cluster.single_node) for rc in classes]
        ctx = OptionContext(model, training, g.b, g.replicas, g.replicas, cluster.single_node)
        opts = _mesh_options(cost, classes, widths, ctx)
        views = {k: uniform_view(o) for k, o in opts.items()}
        for ws in itertools.product(*[w[:2] for w in widths if w]):
            for counts in [(1,) * len(ws), (2,) * len(ws)]:
                order = tuple(zip(ws, counts))
                pos = [opts[id(w)] for w, p in order for _ in range(p)]
                if g.microbatches < len(pos):
                    continue
                front = split_frontier(pos, max_in_flight=len(pos))
                if not front:
                    continue
                exact = min(fg._value(sp, g.microbatches) for sp in front)
                plain = split_frontier(pos, max_in_flight=len(pos), with_tail=False)
                e_lo = min_max_tail(pos, len(pos))
                e_hi = max(sp.e_s for sp in plain)
                bound = cb.tail_levels_bound(views, order, g.microbatches, e_lo, e_hi)
                assert bound <= exact * (1 + 1e-12), (order, bound, exact)
                assert not math.isfinite(bound) or bound >= exact * (1 - 2e-2)
                assert math.isfinite(bound) or e_hi <= e_lo  # one tail level: nothing to bound
                checked += math.isfinite(bound)
    assert checked >= 8


def test_least_largest_tail_is_below_the_min_max_dp() -> None:
    """The chain queue's tail floor (`chain_bounds.least_largest_tail`: stage capacity per tail level, layers
    not kept contiguous) never exceeds the exact least largest tail of the run order (the min-max
    DP over contiguous splits), and is not trivially zero."""
    from solvers.partition import min_max_tail

    cost = AnalyticCostModel()
    model = get_model("llama2-13b")
    cluster = load_cluster(EXAMPLES / "mixed.yaml")
    training = TrainingSpec(global_batch=64, seq_len=4096, micro_batches=(1,))
    classes = resource_classes(cluster)
    floors = []
    for g in fg._groups(model, training, classes, [1])[:4]:
        widths = [fg._widths(cost, model, training, rc, g, cluster.single_node) for rc in classes]
        ctx = OptionContext(model, training, g.b, g.replicas, g.replicas, cluster.single_node)
        opts = _mesh_options(cost, classes, widths, ctx)
        by_len = {k: cb.tails_by_length(o) for k, o in opts.items()}
        for ws in itertools.product(*[w[:2] for w in widths if w]):
            for counts in [(1,) * len(ws), (2,) * len(ws), (1, 3)[:len(ws)]]:
                order = tuple(zip(ws, counts))
                pos = [opts[id(w)] for w, p in order for _ in range(p)]
                floor = cb.least_largest_tail([(by_len[id(w)], p) for w, p in order])
                exact = min_max_tail(pos, 1)
                if exact is None:  # no split fits: nothing to bound
                    continue
                assert floor <= exact * (1 + 1e-12), (order, floor, exact)
                floors.append(floor)
    assert len(floors) > 20 and min(floors) > 0


def test_integral_bound_is_below_every_order_split() -> None:
    """`chain_bounds.integral_bound` (whole layers under each candidate bottleneck, the least A
    that places them) never exceeds the least A + (m - 1)·C of any run order's splits (the
    partition DP without tails), and stays close to it: it orders the chain queue."""
    cost = AnalyticCostModel()
    model = get_model("llama2-13b")
    cluster = load_cluster(EXAMPLES / "mixed.yaml")
    training = TrainingSpec(global_batch=64, seq_len=4096, micro_batches=(1, 2))
    classes = resource_classes(cluster)
    ratios = []
    for g in fg._groups(model, training, classes, [1, 2])[::3]:
        widths = [fg._widths(cost, model, training, rc, g, cluster.single_node) for rc in classes]
        ctx = OptionContext(model, training, g.b, g.replicas, g.replicas, cluster.single_node)
        opts = _mesh_options(cost, classes, widths, ctx)
        for ws in itertools.product(*[w[:2] for w in widths if w]):
            for counts in [(1,) * len(ws), (2, 1, 3)[:len(ws)], (3, 2, 1)[:len(ws)]]:
                meshes = list(zip(ws, counts))
                bound = cb.integral_bound(meshes, model.num_layers, g.microbatches, cost.knobs.step_overhead_s)
                exact = math.inf
                for order in itertools.permutations(meshes):
                    pos = [opts[id(w)] for w, p in order for _ in range(p)]
                    for sp in split_frontier(pos, max_in_flight=min(g.microbatches, len(pos)), with_tail=False):
                        exact = min(exact, sp.a_s + (g.microbatches - 1) * sp.c_s + cost.knobs.step_overhead_s)
                assert bound <= exact * (1 + 1e-12), (meshes, bound, exact)
                if math.isfinite(exact):
                    ratios.append(bound / exact)
    ratios.sort()
    # bottleneck and A taken apart (least d for every layer past one per stage) gave a median of
    # 0.95 and a tenth percentile of 0.83 here
    assert len(ratios) > 100 and ratios[len(ratios) // 2] >= 0.97 and ratios[len(ratios) // 10] >= 0.93


def _integral_by_scan(meshes: list, n_dec: int, m: int) -> float:
    """`chain_bounds.integral_bound` by its definition, one candidate bottleneck at a time."""
    stages = sum(p for _, p in meshes)
    if stages > n_dec or sum(w.kmax * p for w, p in meshes) < n_dec:
        return math.inf
    on = 1.0 if stages > 1 else 0.0
    least = max(w.dec_s + on * w.recv_s for w, _ in meshes)
    best = math.inf
    for c in sorted({k * w.dec_s + on * w.recv_s for w, _ in meshes for k in range(1, w.kmax + 1)}):
        room = [p * min(w.kmax, max(0, math.floor((c - on * w.recv_s) / w.dec_s * (1 + 1e-12)))) for w, p in meshes]
        if c < least or sum(room) < n_dec:
            continue
        left, a_s = n_dec - stages, 2 * (stages - 1) * min(w.recv_s for w, _ in meshes)
        for i in sorted(range(len(meshes)), key=lambda i: meshes[i][0].dec_s):
            extra = min(left, room[i] - meshes[i][1])
            a_s += (meshes[i][1] + extra) * meshes[i][0].dec_s
            left -= extra
        best = min(best, max(a_s, c) + (m - 1) * c)
    return best


def test_chain_queue_bounds_equal_their_definitions() -> None:
    """The array forms of `integral_bound` and `least_largest_tail` give exactly what a scan of
    every candidate bottleneck / tail level gives, on random meshes (repeated speeds included)."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        n_dec = int(rng.integers(2, 40))
        meshes = [(cb.MeshWidth(0, 1, (), float(rng.choice([0.5, 1.0, 1.3, rng.uniform(0.2, 3)])),
                                float(rng.choice([0.0, 0.05, rng.uniform(0, 0.3)])), int(rng.integers(1, n_dec + 1))),
                   int(rng.integers(1, 5))) for _ in range(int(rng.integers(1, 5)))]
        m = int(rng.integers(1, 65))
        assert cb.integral_bound(meshes, n_dec, m, 0.25) == _integral_by_scan(meshes, n_dec, m) + 0.25
        tails = [(np.concatenate([[math.inf], np.where(rng.random(n_dec) < 0.2, math.inf,
                                                       rng.choice([0.1, 0.2, 0.7], n_dec) + rng.random(n_dec))]),
                  int(rng.integers(1, 4))) for _ in range(int(rng.integers(1, 4)))]
        levels = sorted({float(x) for t, _ in tails for x in t if math.isfinite(x)})
        held = [sum(p * max((k for k in range(len(t)) if t[k] <= e), default=0) for t, p in tails) for e in levels]
        want = next((e for e, h in zip(levels, held) if h >= n_dec), math.inf)
        assert cb.least_largest_tail(tails) == want


def _random_choices(rng: np.random.Generator) -> tuple[int, list, int]:
    """Random decoder count, per-class mesh choices (`flagscale_grid._choices`' shape) and
    microbatches per pipeline."""
    n_dec = int(rng.integers(2, 40))
    choices = []
    for cls in range(int(rng.integers(1, 4))):
        row: list = [(None, 0)]
        for _ in range(int(rng.integers(1, 4))):
            w = cb.MeshWidth(cls, 1, (), float(rng.choice([0.5, 1.0, rng.uniform(0.2, 3)])),
                             float(rng.choice([0.0, 0.05, rng.uniform(0, 0.3)])), int(rng.integers(1, n_dec + 1)))
            row.append((w, int(rng.integers(1, 6))))
        choices.append(row)
    return n_dec, choices, int(rng.integers(1, 65))


def test_fluid_bounds_stay_below_the_integral_bound() -> None:
    """`fluid_bounds` (every run combination at once) never exceeds `integral_bound` of the
    combination, whose entry it orders in the chain queue, and counts the receives: with them
    zeroed it is lower on most combinations."""
    rng = np.random.default_rng(7)
    raised = total = 0
    for _ in range(60):
        n_dec, choices, m = _random_choices(rng)
        bounds = cb.fluid_bounds(choices, n_dec, m, 0.25)
        deaf = cb.fluid_bounds([[(w and cb.MeshWidth(w.cls, 1, (), w.dec_s, 0.0, w.kmax), p) for w, p in row]
                                for row in choices], n_dec, m, 0.25)
        for picks in itertools.product(*[range(len(row)) for row in choices]):
            meshes = [choices[c][i] for c, i in enumerate(picks) if choices[c][i][0] is not None]
            exact = cb.integral_bound(meshes, n_dec, m, 0.25) if meshes else math.inf
            assert bounds[picks] <= exact, (meshes, bounds[picks], exact)
            assert math.isinf(bounds[picks]) == math.isinf(exact)
            if math.isfinite(exact):
                total += 1
                raised += bounds[picks] > deaf[picks]
    assert total > 300 and raised > total / 2, (total, raised)


def test_the_group_bound_stays_below_every_combinations_fluid_bound() -> None:
    """`group_fluid_bound` (one number per group, from each class's fastest choice) is at most
    `fluid_bounds` of every combination, and reaches their least on some groups (one class
    whose fastest choice alone holds the layers), so a group it prunes has no combination the
    queue would keep."""
    rng = np.random.default_rng(11)
    tight = 0
    for _ in range(200):
        n_dec, choices, m = _random_choices(rng)
        group = cb.group_fluid_bound(choices, n_dec, m, 0.25)
        bounds = cb.fluid_bounds(choices, n_dec, m, 0.25)
        assert group <= bounds.min(), (group, bounds.min())
        tight += group >= bounds.min() * (1 - 0.05)
    assert tight > 0


def test_a_looser_queue_bound_finds_the_same_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chain queue refines its entries in the order of `fluid_bounds`; any valid bound below
    the integral one pops the same entries in the same order, so halving every fluid bound (many
    more refinements, as before receives were counted) leaves the chains found as they were.
    (Whether the DP cap was hit may differ: a looser bound leaves more entries unrefined.)"""
    model = get_model("llama2-13b")
    cluster = load_cluster(EXAMPLES / "mixed.yaml")
    training = TrainingSpec(global_batch=64, seq_len=4096)
    cost = AnalyticCostModel()

    def chains() -> list:
        found, _ = fg.flagscale_plans(model, cluster, training, cost, [1, 2, 4], max_dp=24)
        return [(item[0].model_dump_json(), item[1].step_s) if item else None for item in found]

    tight = chains()

    def halved(*args: object) -> tuple[np.ndarray, np.ndarray]:
        keep, lb = cb.fluid_bounds_below(*args)
        return keep, lb * 0.5
    monkeypatch.setattr(fg, "fluid_bounds_below", halved)
    assert chains() == tight and len(tight) > 1


def test_the_bounds_below_a_cutoff_are_the_fluid_bounds_below_it() -> None:
    """`fluid_bounds_below` (the speed summed over every combination, the rest only where it
    leaves room under the cutoff) gives exactly the combinations, in flat order, and the bounds of
    `fluid_bounds` that are finite and below the cutoff, at cutoffs through the bounds' range."""
    rng = np.random.default_rng(13)
    screened = 0
    for _ in range(150):
        n_dec, choices, m = _random_choices(rng)
        full = cb.fluid_bounds(choices, n_dec, m, 0.25).ravel()
        finite = np.sort(full[np.isfinite(full)])
        cuts = [math.inf]
        if len(finite):
            cuts += [float(finite[0]), float(np.median(finite)), float(finite[-1]) * 1.01]
        for cut in cuts:
            keep, lb = cb.fluid_bounds_below(choices, n_dec, m, 0.25, cut)
            want = np.flatnonzero(np.isfinite(full) & (full < cut))
            assert keep.tolist() == want.tolist() and lb.tolist() == full[want].tolist()
            screened += len(keep) < np.isfinite(full).sum()
    assert screened > 50


def test_the_speed_ceiling_drops_only_groups_the_group_bound_drops() -> None:
    """The memory-free speed of a group (`_speed_ceiling`, before any width's memory limit is
    computed) is at least the speed of its choices, so its bound (`speed_bound`) is at most
    `group_fluid_bound` on every group of two pools, and equal where no width is ruled out by
    memory; and the chains found with a cutoff are the same as with the ceiling never dropping a
    group."""
    cost = AnalyticCostModel()
    training = TrainingSpec(global_batch=64, seq_len=4096)
    model = get_model("llama2-13b")
    equal = 0
    for cluster in (load_cluster(EXAMPLES / "mixed.yaml"), load_cluster(EXAMPLES / "paper_mix.yaml")):
        classes = resource_classes(cluster)
        memo: dict = {}
        for g in fg._groups(model, training, classes, [1, 2, 4]):
            widths = [fg._widths(cost, model, training, rc, g, cluster.single_node, memo) for rc in classes]
            choices, _ = fg._choices(widths, classes, g, model.num_layers)
            ceiling = fg._speed_ceiling(cost, model, training, classes, g, cluster.single_node, memo)
            loose = cb.speed_bound(ceiling, model.num_layers, g.microbatches, 0.1)
            group = cb.group_fluid_bound(choices, model.num_layers, g.microbatches, 0.1)
            assert loose <= group
            equal += loose == group
    assert equal > 0

    cluster = load_cluster(EXAMPLES / "mixed.yaml")
    first, _ = fg.flagscale_plans(model, cluster, training, cost, [1, 2, 4], max_dp=16)
    cutoff = first[0][1].step_s * 1.02

    def chains() -> list:
        found, _ = fg.flagscale_plans(model, cluster, training, cost, [1, 2, 4], cutoff_s=cutoff, max_dp=24)
        return [(item[0].model_dump_json(), item[1].step_s) if item else None for item in found]
    real, dropped = fg._speed_ceiling, []

    def counted(*args: object) -> float:
        speed = real(*args)
        g = args[4]
        dropped.append(cb.speed_bound(speed, model.num_layers, g.microbatches, cost.knobs.step_overhead_s) >= cutoff)
        return speed
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fg, "_speed_ceiling", counted)
        pruned = chains()
        assert any(dropped) and len(pruned) > 1
        mp.setattr(fg, "_speed_ceiling", lambda *args: math.inf)  # never drops a group
        assert chains() == pruned


# Llama-2 70B at 64k tokens on six GPU types (`many_types.py --seed 22` pool 24): no pipeline of
# two runs holds it; the fastest chain runs through five types, in none of the three orders tried
# beyond four classes (file order, memory descending and ascending) but one swap away
SIX_TYPE = "nodes:\n" + "".join(f"  - {{gpu: {g}, nodes: {n}, gpus_per_node: {k}}}\n" for g, n, k in (
    ("V100-SXM2-32GB", 8, 1), ("H100-SXM5-80GB", 4, 1), ("H200-SXM-141GB", 2, 1), ("A100-SXM4-80GB", 1, 8),
    ("T4", 4, 8), ("RTX-4090", 8, 4)))


def test_without_a_cutoff_neighbouring_runs_are_swapped(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "six.yaml"
    path.write_text(SIX_TYPE)
    cluster = load_cluster(path)
    model = get_model("llama2-70b")
    training = TrainingSpec(global_batch=16, seq_len=65536, micro_batches=(1,))
    cost = AnalyticCostModel()
    plan, pred = best_flagscale_plan(model, cluster, training, cost, [1], grid=False)
    assert violations(plan, cluster, cost) == []
    assert len(dict.fromkeys(s.gpu for s in plan.pipelines[0].stages)) >= 5
    orders = fg._orders
    monkeypatch.setattr(fg, "_orders", lambda meshes, classes, capacity, swaps=False: orders(meshes, classes,
                                                                                              capacity))
    unswapped = best_flagscale_plan(model, cluster, training, cost, [1], grid=False)
    assert unswapped is not None and pred.step_s < unswapped[1].step_s * (1 - 0.05)


@pytest.mark.parametrize("zero", [0, 1])
def test_widths_shared_across_replica_counts_only_without_zero(two_type, zero: int) -> None:
    """`_widths` keeps one list per class and outer choice for every replica count where the bytes
    per parameter do not depend on it (no ZeRO); with ZeRO each count gets its own. Either way
    each count's widths equal those computed afresh."""
    model, cluster, _ = _cases(two_type)[0]
    training = TrainingSpec(global_batch=16, seq_len=2048, zero=zero)
    cost = AnalyticCostModel()
    rc = resource_classes(cluster)[0]
    groups = [g for g in fg._groups(model, training, [rc], [1]) if g.cp == 1 and g.recompute == "none"]
    assert len(groups) >= 2
    memo: dict = {}
    got = [fg._widths(cost, model, training, rc, g, cluster.single_node, memo) for g in groups]
    assert all((got[0] is w) == (zero == 0) for w in got[1:])
    for g, widths in zip(groups, got):
        fresh = fg._widths(cost, model, training, rc, g, cluster.single_node)
        assert [(w.width, w.shapes, w.dec_s, w.recv_s, w.kmax) for w in widths] == \
            [(w.width, w.shapes, w.dec_s, w.recv_s, w.kmax) for w in fresh]
