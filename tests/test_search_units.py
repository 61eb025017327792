"""One unit of the search on the blocks coverage (`units.solve_unit`): when it builds plan templates,
and how a wide replica class's plan is re-solved at the pipeline count it chose."""

from __future__ import annotations

import time

import pytest

from planner.costmodel.analytic import AnalyticCostModel
from planner.search.providers import BlocksProvider
from planner.search.space import block_types, resource_classes, stage_shapes
from planner.search.units import RESOLVES, Unit, UnitContext, solve_unit
from planner.specs import ClusterSpec, ModelSpec, NodeGroup, TrainingSpec
from solvers.assign import SolverStats

COST = AnalyticCostModel()
MODEL = ModelSpec(name="unit-model", num_layers=6, hidden=1024, ffn_hidden=4096, num_heads=8, num_kv_heads=8,
                  vocab=32000, activation="swiglu", norm="rmsnorm", learned_positions=False)
CLUSTER = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=2, gpus_per_node=8),
                             NodeGroup(gpu="V100-SXM2-16GB", nodes=1, gpus_per_node=8)])
TRAINING = TrainingSpec(global_batch=64, seq_len=2048)
CLASSES = resource_classes(CLUSTER)
AVAIL = tuple(rc.gpus for rc in CLASSES)


def _provider(b: int) -> tuple[BlocksProvider, list[int]]:
    """A provider whose `plan_templates` calls are recorded (the pipeline counts asked for)."""
    shapes = {rc.index: stage_shapes(MODEL, TRAINING, rc, b) for rc in CLASSES}
    provider = BlocksProvider(COST, MODEL, TRAINING, CLASSES, block_types(shapes), AVAIL, b, CLUSTER.single_node)
    calls: list[int] = []
    build = provider.plan_templates

    def recorded(replicas: int) -> list:
        calls.append(replicas)
        return build(replicas)

    provider.plan_templates = recorded  # type: ignore[method-assign]
    return provider, calls


def _solve(provider: BlocksProvider, lo: int, hi: int, incumbent_s: float | None = None) -> UnitContext:
    ctx = UnitContext(MODEL, TRAINING, CLUSTER, CLASSES, COST, AVAIL, [], [], set(), SolverStats(),
                      {"assignments": 0})
    b = provider.micro_batch
    solve_unit(Unit(b, provider, lo, hi, TRAINING.global_batch // b), ctx, "cpsat", time.perf_counter(), None,
               incumbent_s)
    return ctx


@pytest.mark.parametrize("b, replicas", [(1, 3), (2, 4)])
def test_a_unit_the_incumbent_rules_out_builds_no_plan_templates(b: int, replicas: int) -> None:
    """Below its bound the incumbent leaves nothing to find: only the bound templates are built,
    and that bound still holds for the unit's own plan. Above its plan the plan templates are built."""
    provider, calls = _provider(b)
    free = _solve(provider, replicas, replicas)
    assert calls == [replicas] and free.candidates and free.solved
    plan_s, bound_s = free.candidates[0].step_s, free.solved[0].bound_s
    assert bound_s <= plan_s

    calls.clear()
    ruled_out = _solve(provider, replicas, replicas, incumbent_s=0.99 * bound_s)
    assert calls == [] and not ruled_out.candidates
    assert 0.99 * bound_s / (1 + 1e-3) <= ruled_out.solved[0].bound_s <= plan_s

    calls.clear()
    open_unit = _solve(provider, replicas, replicas, incumbent_s=1.01 * plan_s)
    assert calls == [replicas] and open_unit.candidates
    assert open_unit.candidates[0].step_s == pytest.approx(plan_s)


@pytest.mark.parametrize("b, lo, hi, resolves, faster", [(1, 2, 12, 1, True), (2, 5, 24, 2, False)])
def test_a_wide_class_is_re_solved_at_the_pipeline_count_it_chose(b: int, lo: int, hi: int, resolves: int,
                                                                  faster: bool) -> None:
    """Tails are first costed for the class's lowest count; each re-solve costs them for the count
    the previous plan chose, until a count repeats. On [2, 12] that finds a faster plan; on [5, 24]
    the count moves twice (16, then 15)."""
    provider, calls = _provider(b)
    ctx = _solve(provider, lo, hi)
    counts = [len(c.plan.pipelines) for c in ctx.candidates]
    assert calls[0] == lo and len(calls) == 1 + resolves  # re-solved: the test has something to check
    assert calls[1:] == counts[:len(calls) - 1]
    assert counts[-1] in calls or len(calls) == RESOLVES + 1  # the last plan was costed for its own count
    assert all(lo <= k <= hi for k in counts)
    if faster:  # the re-solve at the count chosen found a faster plan than the first solve
        assert min(c.step_s for c in ctx.candidates) < ctx.candidates[0].step_s
    assert ctx.solved[0].bound_s <= min(c.step_s for c in ctx.candidates)


@pytest.mark.parametrize("b,lo,hi", [(1, 2, 3), (2, 2, 2), (2, 4, 6)])
def test_bound_sets_are_the_pruned_bound_protos_as_columns(b: int, lo: int, hi: int) -> None:
    """`BlocksProvider.bound_set` builds its columns without template objects: equal, column by
    column, to `PackedTemplates.of` the templates made one by one from the bound protos (each
    with its skeleton's least tail, the unfit dropped) and pruned by `pareto_indices`."""
    import math

    from planner.search.templates import PackedTemplates, Template, pareto_indices

    provider, _ = _provider(b)
    got = provider.bound_set(lo, hi)
    e = provider._lb_tails(provider._tail_options(lo, hi if TRAINING.zero else lo)).tolist()
    _, _, usage = provider._lb_index()
    protos = provider.lb_protos
    live = [k for k in range(len(protos)) if math.isfinite(e[k])]
    keys = provider._lb_keys.tolist()
    keep = pareto_indices([keys[k] for k in live], [protos[k].a_s for k in live], [protos[k].c_s for k in live],
                          [e[k] for k in live])
    want = PackedTemplates.of([Template(usage[k], protos[k].a_s, protos[k].c_s, e[k], None, (), protos[k].skeleton)
                               for k in (live[i] for i in keep)])
    assert len(got) > 0 and len(got) <= len(protos)
    for name in ("usage", "times", "max_microbatches", "proto", "skeleton"):
        assert getattr(got, name).dtype == getattr(want, name).dtype
        assert getattr(got, name).tobytes() == getattr(want, name).tobytes(), name
    assert got.skeletons == want.skeletons and got.stages is want.stages is None
    assert provider.bound_templates(lo, hi) == want.unpack()


@pytest.mark.parametrize("b", [1, 2])
def test_zero_tail_templates_are_the_pruned_bound_protos_without_tails(b: int) -> None:
    """`BlocksProvider.zero_tail_templates` (columns) equals `PackedTemplates.of` the templates
    made one by one from the bound protos with tail 0, pruned by GPU usage (`prune_templates`)."""
    from planner.search.templates import PackedTemplates, Template, prune_templates

    provider, _ = _provider(b)
    got = provider.zero_tail_templates()
    _, _, usage = provider._lb_index()
    want = PackedTemplates.of(prune_templates([Template(u, p.a_s, p.c_s, 0.0, None, ())
                                               for p, u in zip(provider.lb_protos, usage)]))
    assert 0 < len(got) < len(provider.lb_protos)
    for name in ("usage", "times", "max_microbatches", "proto", "skeleton"):
        assert getattr(got, name).tobytes() == getattr(want, name).tobytes(), name
    assert got.skeletons == want.skeletons == [] and got.stages is want.stages is None


def test_packed_templates_unpack_to_equal_templates() -> None:
    """Bound templates travel between processes as columns (`templates.PackedTemplates`); what
    comes out must be the same templates, floats bit for bit, skeletons and stages included."""
    import pickle

    from planner.search.templates import PackedTemplates

    provider, _ = _provider(2)
    _, lb_set = provider.templates(2, 3)
    plan_set = [provider.resolved(t) for t in provider.plan_templates(2)[:5]]
    assert lb_set and all(t.skeleton is not None for t in lb_set) and all(t.stages for t in plan_set)
    from planner.search.units import problem_of

    capped = [lb_set[0]._replace(max_microbatches=5), lb_set[1]._replace(max_microbatches=0)]
    for templates in (lb_set, plan_set, lb_set[:1] + plan_set[:1], capped, []):
        back = pickle.loads(pickle.dumps(PackedTemplates.of(templates))).unpack()
        assert back == templates
        assert [type(t.usage[0]) for t in back] == [int] * len(back)
        # the assignment problem read from the columns is the one built from the templates, bit for bit
        args = ((4, 4), 32, (2, 3))
        want, got = problem_of(templates, *args), problem_of(PackedTemplates.of(templates), *args)
        for name in ("a_s", "c_s", "e_s", "max_microbatches", "usage", "avail"):
            assert getattr(got, name).dtype == getattr(want, name).dtype
            assert getattr(got, name).shape == getattr(want, name).shape
            assert getattr(got, name).tobytes() == getattr(want, name).tobytes(), name
        assert (got.microbatches, got.replicas) == (want.microbatches, want.replicas)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("levels", [16, 0])
def test_pareto_indices_keep_exactly_the_undominated_templates(seed: int, levels: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`templates.pareto_indices` against its definition: per key, in order of (C, A, E), a
    template is kept iff no earlier one has A and E no larger; keys in sorted order. Values are
    drawn from a few levels, so ties in every field are common. Both ways `pareto_keep` has:
    a running minimum per distinct E of a key, and (`PARETO_LEVELS` 0) the staircase."""
    import random

    import planner.search.templates as templates
    from planner.search.templates import pareto_indices

    monkeypatch.setattr(templates, "PARETO_LEVELS", levels)

    rng = random.Random(seed)
    n = rng.randint(1, 400)
    usage = [(rng.randint(0, 2), rng.randint(0, 3)) for _ in range(n)]
    a, c, e = ([float(rng.randint(0, 12)) for _ in range(n)] for _ in range(3))
    want: list[int] = []
    for key in sorted(set(usage)):
        members = sorted((i for i in range(n) if usage[i] == key), key=lambda i: (c[i], a[i], e[i]))
        for k, i in enumerate(members):
            if not any(a[j] <= a[i] and e[j] <= e[i] for j in members[:k]):
                want.append(i)
    assert pareto_indices(usage, a, c, e) == want


def test_refinement_merges_new_group_templates_as_a_full_prune_would() -> None:
    """`units.refine_unit` replaces the covered groups' bound templates with tighter ones: it prunes
    only the new templates and merges them by key into the rest, which must equal pruning the
    whole set again (the bound set is a fixed point of the prune, ordered by `bound_key`)."""
    import heapq
    import random

    from planner.search.templates import PackedTemplates, bound_key, prune_templates, skeleton_group

    provider, _ = _provider(2)
    _, lb_set = provider.templates(2, 3)
    assert prune_templates(lb_set, bound_key) == lb_set
    groups = sorted({skeleton_group(t.skeleton) for t in lb_set})
    assert len(groups) >= 2
    rng = random.Random(3)
    for covered in (set(groups[::2]), set(groups[1::2]), {groups[0]}):
        # tighter templates for the covered groups: tails raised, some A and C as well, duplicates
        new = [t._replace(a_s=t.a_s * rng.choice([1.0, 1.01]), c_s=t.c_s * rng.choice([1.0, 1.02]),
                          e_s=t.e_s + rng.random() * 0.01)
               for t in lb_set if skeleton_group(t.skeleton) in covered for _ in range(rng.randint(1, 2))]
        kept = [t for t in lb_set if skeleton_group(t.skeleton) not in covered]
        merged = list(heapq.merge(kept, prune_templates(new, bound_key), key=bound_key))
        assert merged == prune_templates(kept + new, bound_key)
        # the refinement merges columns (`PackedTemplates.replaced`): the same templates in the same order
        packed = PackedTemplates.of(lb_set).replaced(covered, PackedTemplates.of(prune_templates(new, bound_key)))
        assert packed.unpack() == merged
        assert len(packed.skeletons) == len({t.skeleton for t in merged})  # no skeleton left unused
    # a set with some templates of no skeleton, replaced by nothing: those stay, in order
    odd = [lb_set[0]._replace(skeleton=None)] + lb_set[1:]
    assert PackedTemplates.of(odd).replaced({groups[0]}, PackedTemplates.of([])).unpack() == [
        t for t in odd if t.skeleton is None or skeleton_group(t.skeleton) != groups[0]]


def test_node_packing_is_first_fit_in_file_order() -> None:
    """`placement._NodePool` resumes its scan per group size; the GPUs it hands out must be exactly
    those of a plain first-fit scan from the first node, on mixed node sizes and random requests."""
    import random

    from planner.errors import HetplanError
    from planner.search.placement import _NodePool

    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=3, gpus_per_node=8),
                                 NodeGroup(gpu="A100-SXM4-40GB", nodes=2, gpus_per_node=4),
                                 NodeGroup(gpu="A100-SXM4-40GB", nodes=1, gpus_per_node=8)])
    rc = resource_classes(cluster)
    assert len(rc) == 2  # node sizes differ: two classes
    for seed in range(20):
        rng = random.Random(seed)
        for klass in rc:
            pool = _NodePool(cluster, klass)
            free = [(n.name, [True] * n.gpus) for n in pool.nodes]
            sizes = [rng.choice([1, 2, 4, 8]) for _ in range(12)]  # any order, not only largest first
            for size in sizes:
                want = None
                for name, slots in free:  # the reference: first fit from the first node, every time
                    starts = [s for s in range(0, len(slots) - size + 1, size) if all(slots[s:s + size])]
                    if starts:
                        slots[starts[0]:starts[0] + size] = [False] * size
                        want = [(name, k) for k in range(starts[0], starts[0] + size)]
                        break
                if want is None:
                    with pytest.raises(HetplanError):
                        pool.take(size)
                    continue
                assert pool.take(size) == want


def _runs(skeleton: tuple) -> int:
    return sum(1 for k, bt in enumerate(skeleton) if k == 0 or skeleton[k - 1] != bt)


@pytest.mark.parametrize("seed", range(6))
def test_run_counts_and_mixed_lengths_match_the_listed_skeletons(seed: int) -> None:
    """`count_run_skeletons` counts what `block_skeletons` lists, per number of runs, and
    `mixed_lengths` picks the longest lengths within each limit."""
    import numpy as np

    from planner.search.space import BlockType
    from planner.search.templates import block_skeletons, count_run_skeletons
    from planner.search.units import mixed_lengths

    rng = np.random.default_rng(seed)
    n_cls = int(rng.integers(2, 5))
    avail = tuple(int(rng.integers(1, 9)) for _ in range(n_cls))
    types = sorted({BlockType(int(c), int(g)) for c in range(n_cls) for g in (1, 2, 4)
                    if g <= avail[c] and rng.random() < 0.8})
    max_len = int(rng.integers(3, 9))
    for length in range(1, max_len + 1):
        listed = block_skeletons(types, avail, max_len, 3, {2: length, 3: length})
        for runs in (2, 3):
            assert sum(1 for sk in listed if _runs(sk) == runs) == count_run_skeletons(types, avail, length, runs)
    limits = (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
    lens = mixed_lengths(types, avail, max_len, limits, 3)
    for runs, length in lens.items():
        assert count_run_skeletons(types, avail, length, runs) <= limits[runs - 2]
        assert length == max_len or count_run_skeletons(types, avail, length + 1, runs) > limits[runs - 2]
    assert 3 not in lens or 2 in lens


def test_three_run_pipelines_are_searched_on_small_pools() -> None:
    """On the 8-GPU ladder pool (4 A100, 2 H100, 2 V100; Llama-2 13B) one V100 -> A100 -> H100
    pipeline is about 5 % faster than any plan of two-run pipelines (53.95 s): the search finds it
    (as fast as the FlagScale chain search, within the LP's 0.1 % tolerance) and says so in its
    coverage. Without the mesh-chain candidate, the two-run search's answer is the best Megatron
    grid (52.56 s, an A100 -> H100 -> V100 pipeline it adds as a candidate, outside its coverage),
    still 2.4 % slower; with it, the same three-run pipeline as a chain (51.23 s; with 64 partition
    DPs instead of `CHAIN_MAX_DP` = 128 the candidate stopped at a chain 0.5 % slower)."""
    from benchmarks.search_scale import ladder_cluster
    from planner.search import search
    from planner.specs.models import get_model

    model, cluster = get_model("llama2-13b"), ladder_cluster(8)
    training = TrainingSpec(global_batch=256, seq_len=model.seq_len)
    two = search(model, cluster, training, cost=COST, max_blocks=2, chains="never")
    two_chains = search(model, cluster, training, cost=COST, max_blocks=2)
    three = search(model, cluster, training, cost=COST)
    assert two_chains.stats["chain_added"] == 1 and three.stats["chain_added"] == 0
    assert three.prediction.step_s <= two_chains.prediction.step_s < two.prediction.step_s * 0.985
    chain = search(model, cluster, training, cost=COST, target="flagscale")
    assert three.coverage == "blocks<=3" and two.coverage == "blocks<=2"
    assert three.prediction.step_s < two.prediction.step_s * 0.985
    assert two.gap == 0 and any("runs of stage groups" in line for line in two.explanation)
    # the two-run space's own bound stays reported (53.74 s), above the grid plan it is beaten by
    assert two.coverage_bound_s > two.prediction.step_s == two.lower_bound_s
    assert any(f"{two.coverage_bound_s:.4f} s, above this plan's step" in line for line in two.explanation)
    assert three.coverage_bound_s == three.lower_bound_s
    assert three.prediction.step_s <= chain.prediction.step_s * 1.002
    assert three.lower_bound_s <= chain.prediction.step_s
    gpus = [[s.gpu for s in p.stages] for p in three.plan.pipelines]
    assert any(len({g: None for g in stages}) == 3 for stages in gpus)
    # within blocks<=3 the explanation has nothing to flag; against a two-run bound it would
    from planner.search.explain import outside_coverage

    assert not any("runs of stage groups" in line for line in three.explanation)
    assert outside_coverage(three.plan, "blocks<=3") == []
    assert len(outside_coverage(three.plan, "blocks<=2")) == len(three.plan.pipelines) == 1


def test_pipelines_longer_than_the_mixed_limit_lie_outside_the_coverage() -> None:
    """Under blocks<=2,mixed<=K two-run pipelines of more than K stages are not in the bound's
    space (a Megatron grid may hold one); homogeneous ones of any length are."""
    from types import SimpleNamespace

    from planner.search.explain import outside_coverage

    def plan(*pipelines: list[tuple[str, int]]) -> SimpleNamespace:
        return SimpleNamespace(pipelines=[SimpleNamespace(stages=[SimpleNamespace(gpu=g, num_gpus=n) for g, n in p])
                                          for p in pipelines])

    mixed = [("A100", 2)] * 3 + [("H100", 2)] * 2
    assert outside_coverage(plan(mixed), "blocks<=2,mixed<=5") == []
    assert len(outside_coverage(plan(mixed), "blocks<=2,mixed<=4")) == 1
    assert outside_coverage(plan([("A100", 2)] * 9), "blocks<=2,mixed<=4") == []
    assert len(outside_coverage(plan(mixed, mixed, [("A100", 1)] + mixed), "blocks<=2,mixed<=4")) == 3


def test_capped_three_run_pipelines_are_plan_candidates_outside_the_bound() -> None:
    """When three-run pipelines are capped in length (more than `triple_limit` in all), they are
    plan templates only: the bound protos and the coverage are those of two runs, so the bound is
    the two-run search's, and the plan is never slower than it."""
    from benchmarks.search_scale import ladder_cluster
    from planner.search import search
    from planner.specs.models import get_model

    model, cluster = get_model("llama2-13b"), ladder_cluster(16)
    training = TrainingSpec(global_batch=256, seq_len=model.seq_len, micro_batches=(1,))
    two = search(model, cluster, training, cost=COST, max_blocks=2, refine_gap=None)
    three = search(model, cluster, training, cost=COST, refine_gap=None)
    assert two.coverage == three.coverage == "blocks<=2"
    assert three.lower_bound_s == two.lower_bound_s
    assert three.prediction.step_s <= two.prediction.step_s

    classes = resource_classes(cluster)
    avail = tuple(rc.gpus for rc in classes)
    shapes = {rc.index: stage_shapes(model, training, rc, 1) for rc in classes}
    provider = BlocksProvider(COST, model, training, classes, block_types(shapes), avail, 1, cluster.single_node,
                              max_blocks=3, mixed_lens={3: 3}, bound_blocks=2)
    runs = {len(provider.skeleton_group(p.skeleton)) for p in provider.plan_protos}
    assert runs == {1, 2, 3}
    assert {len(provider.skeleton_group(p.skeleton)) for p in provider.lb_protos} == {1, 2}
    assert provider.coverage == "blocks<=2"


def test_groups_span_whole_nodes_only_when_the_cluster_allows_it() -> None:
    """Stage shapes: tp*cp*hp groups larger than a node only with `allow_cross_node_tp`, then a
    power of two of whole nodes (none on node sizes that are not powers of two). Packing: groups
    of whole nodes, largest first, with smaller ones after, never share a GPU and fill whole free
    nodes in file order."""
    import random

    from planner.search.placement import _NodePool

    training = TrainingSpec(global_batch=8, seq_len=4096, max_cp=16)
    for allow in (False, True):
        cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=4, gpus_per_node=2),
                                     NodeGroup(gpu="V100-SXM2-16GB", nodes=2, gpus_per_node=3)],
                              allow_cross_node_tp=allow)
        a100, v100 = resource_classes(cluster)
        groups = {s.group_size for s in stage_shapes(MODEL, training, a100, 1, allow)}
        assert groups == ({1, 2, 4, 8} if allow else {1, 2})
        assert max(s.group_size for s in stage_shapes(MODEL, training, v100, 1, allow)) == 1  # 3-GPU nodes
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="A100-SXM4-40GB", nodes=8, gpus_per_node=4)], allow_cross_node_tp=True)
    (rc,) = resource_classes(cluster)
    for seed in range(20):
        rng = random.Random(seed)
        sizes, left = [], rc.gpus
        while left:
            size = rng.choice([s for s in (1, 2, 4, 8, 16) if s <= left])
            sizes.append(size)
            left -= size
        pool = _NodePool(cluster, rc)
        taken: list[tuple[str, int]] = []
        for size in sorted(sizes, reverse=True):
            got = pool.take(size)
            assert len(got) == size
            if size > 4:  # whole nodes
                nodes = sorted({name for name, _ in got})
                assert len(nodes) == size // 4 and all(sum(1 for n, _ in got if n == name) == 4 for name in nodes)
            taken += got
        assert len(set(taken)) == rc.gpus


def test_search_phases_times_each_phase_and_leaves_the_search_as_it_was(capsys, monkeypatch) -> None:
    """`benchmarks/search_phases.py` on the 8-GPU ladder rung: one row whose phase calls do not
    overlap and lie within the search's time (the polish may run twice, around refinement), with
    the plan the unwrapped search returns; afterwards each module holds its own phases again."""
    import sys

    from benchmarks import search_phases
    from benchmarks.search_scale import ladder_cluster
    from planner.search import api
    from planner.specs.models import get_model

    originals = {(module, name): getattr(module, name) for module, name in search_phases.PHASES}
    monkeypatch.setattr(sys, "argv", ["search_phases.py", "--gpus", "8", "--workers", "1"])
    search_phases.main()
    cells = [c.strip() for c in capsys.readouterr().out.splitlines()[-1].strip("|").split("|")]
    assert cells[0] == "8"
    assert float(cells[2]) > 0  # processor seconds of the search (one worker: no children)
    phase_cells = cells[3:3 + len(search_phases.PHASES)]
    assert phase_cells[0] != "-" and phase_cells[1] != "-"  # the frontiers and the best-first units
    spans = sorted(tuple(map(float, span.split("-"))) for c in phase_cells if c != "-" for span in c.split(", "))
    ends = [0.0] + [end for _, end in spans]
    assert all(prev <= start <= end for prev, (start, end) in zip(ends, spans))
    assert spans[-1][1] <= float(cells[1])
    assert all(getattr(module, name) is fn for (module, name), fn in originals.items())
    model = get_model("llama2-13b")
    plain = api.search(model, ladder_cluster(8), TrainingSpec(global_batch=256, seq_len=model.seq_len),
                       cost=AnalyticCostModel())
    assert cells[-2] == f"{plain.prediction.step_s:.4f}"


def test_random_search_rows_are_the_searches_own(capsys, monkeypatch, tmp_path) -> None:
    """`benchmarks/random_search.py`: one row per pool of `chain_check.py`'s draws, whose step and
    gap are what the search returns on that pool, and the same rows in the CSV."""
    import csv
    import random
    import sys

    from benchmarks import random_search
    from benchmarks.chain_check import draw
    from planner.search import api

    out = tmp_path / "rows.csv"
    monkeypatch.setattr(sys, "argv", ["random_search.py", "--seed", "32", "--count", "1", "--csv", str(out)])
    random_search.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0 |")]
    assert len(lines) == 1
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    name, model, cluster, training = draw(random.Random(32))
    res = api.search(model, cluster, training, cost=AnalyticCostModel())
    assert cells[1] == name and cells[5] == f"{res.prediction.step_s:.5f}" and cells[7] == f"{100 * res.gap:.2f}"
    rows = list(csv.reader(out.open()))
    assert rows[0] == random_search.HEAD and rows[1] == cells
