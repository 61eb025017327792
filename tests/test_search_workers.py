"""The search's worker processes and what they hand between them: the same answer with any number
of workers, how frontier work is cut into tasks, the option costing the frontier workers hand back
(and that unit workers then inherit), and the search call's own hygiene (garbage collection
deferred while it runs, `planner.search` both callable and a package).
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.search import search
from planner.search.space import resource_classes, stage_shapes
from planner.specs import ClusterSpec
from tests.test_search_refine import (BIG_CLUSTER, BIG_MODEL, BIG_TRAINING, CLUSTER, COST, MODEL, TRAINING,
                                      _provider)


@pytest.mark.parametrize("micro_batches,zero,one_type", [(None, 0, False), ((2,), 0, False), (None, 1, False),
                                                         (None, 0, True)])
def test_worker_processes_do_not_change_the_answer(micro_batches: tuple[int, ...] | None, zero: int,
                                                   one_type: bool) -> None:
    """Five microbatch sizes on two workers (each frontier whole) and one size (split in two)
    alike (`frontier_workers.frontier_parts`). With ZeRO (split frontiers with memory for
    the bound, computed ahead for every size in worker processes, for the plans only as a unit
    asks in one process) and on one GPU type (no frontier computed ahead) the counts had
    differed: the templates were counted where frontiers were built (27 % more, or none at all)."""
    training = BIG_TRAINING.model_copy(update={"micro_batches": micro_batches, "zero": zero})
    cluster = ClusterSpec(nodes=BIG_CLUSTER.nodes[:1]) if one_type else BIG_CLUSTER
    one = search(BIG_MODEL, cluster, training, cost=COST, workers=1)
    two = search(BIG_MODEL, cluster, training, cost=COST, workers=2)
    assert two.plan.to_json() == one.plan.to_json()
    assert two.lower_bound_s == one.lower_bound_s
    assert two.counts() == one.counts() and one.counts()["templates"] > 0


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_frontier_parts_keep_sizes_whole_unless_workers_would_idle(workers: int) -> None:
    """As many sizes as workers or more: one task per size. Fewer: the last sizes are split until
    every worker has as many tasks."""
    from planner.search.frontier_workers import frontier_parts

    assert frontier_parts(0, workers) == []
    for sizes in range(1, 8):
        parts = frontier_parts(sizes, workers)
        assert len(parts) == sizes and min(parts) >= 1
        if sizes >= workers:
            assert parts == [1] * sizes
        else:
            assert sum(parts) % workers == 0 and sum(parts) < sizes + workers  # fewest extra parts
            assert parts == sorted(parts)  # the extra parts go to the last sizes
    assert frontier_parts(5, 2) == [1, 1, 1, 1, 1] and frontier_parts(1, 2) == [2] and frontier_parts(2, 3) == [1, 2]


def test_search_is_callable_and_stays_a_package() -> None:
    """`from planner import search; search(...)` runs the search, and `import planner.search.units as m`
    still finds the submodule (a function bound to `planner.search` used to hide it)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import planner, planner.search.units as u, planner.search.api as a; from planner import search; "
            "print(u.__name__, callable(search), search.SearchResult is a.SearchResult)")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.split() == ["planner.search.units", "True", "True"]
    import planner

    result = planner.search(MODEL, CLUSTER, TRAINING, cost=COST)
    assert result.lower_bound_s <= result.prediction.step_s


def test_collections_are_deferred_while_a_search_runs_and_restored_after() -> None:
    import gc

    from planner.errors import HetplanError
    from planner.search.api import GC_GEN0_THRESHOLD

    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    search(MODEL, CLUSTER, TRAINING, cost=COST, progress=lambda *_: seen.append(gc.get_threshold()))
    assert seen and all(t[0] >= GC_GEN0_THRESHOLD and t[1:] == before[1:] for t in seen)
    assert gc.get_threshold() == before
    with pytest.raises(HetplanError):
        search(MODEL, CLUSTER, TRAINING.model_copy(update={"schedule": "gpipe"}), cost=COST)
    assert gc.get_threshold() == before  # restored on errors too


@pytest.mark.parametrize("zero", [0, 1])
def test_option_costing_recosts_any_replica_counts_as_a_fresh_build(zero: int) -> None:
    """`OptionCosting` keeps the replica-independent parts of every shape's costs and re-costs tails
    (and, with a distributed optimizer, memory) for each pipeline count asked: after serving other
    counts it gives exactly what a fresh costing gives, and its tails-only options carry the same
    tails as its full ones."""
    import numpy as np

    from planner.search.options import OptionContext, OptionCosting

    training = BIG_TRAINING.model_copy(update={"zero": zero})
    rc = resource_classes(BIG_CLUSTER)[0]
    shapes = stage_shapes(BIG_MODEL, training, rc, 2)
    ctx = OptionContext(BIG_MODEL, training, 2, 1, 1, False)
    kept = OptionCosting(COST, rc, shapes, ctx)
    for r_sync, r_mem in ((1, 1), (2, 8), (4, 4), (8, 8), (2, 8)):
        again = kept.options(r_sync, r_mem)
        fresh = OptionCosting(COST, rc, shapes, ctx).options(r_sync, r_mem)
        for name in ("fb", "tail", "mem_fixed", "act"):
            assert np.array_equal(getattr(again, name), getattr(fresh, name)), name
        assert np.array_equal(kept.options(r_sync, r_mem, tails_only=True).tail, fresh.tail)
    # the counts matter: more pipelines, more sync; with ZeRO, less optimizer state per GPU
    one, eight = kept.options(1, 1), kept.options(8, 8)
    finite = np.isfinite(one.tail)
    assert np.all(eight.tail[finite] >= one.tail[finite]) and np.any(eight.tail[finite] > one.tail[finite])
    if zero:
        assert np.any(eight.mem_fixed[finite] < one.mem_fixed[finite])


def test_frontier_workers_hand_back_the_option_costing() -> None:
    """The frontier workers (`frontier_workers.prefetch_frontiers`) return each size's option costing with
    its frontiers, so the unit workers forked later inherit it instead of each rebuilding it; the
    options built from the handed-back bases equal those of a provider that computed its own."""
    from planner.search.frontier_workers import prefetch_frontiers

    providers = [_provider(1), _provider(2)]
    assert all(p.needs_frontiers and p._costing is None for p in providers)
    prefetch_frontiers(providers, 2)
    for p, b in zip(providers, (1, 2)):
        assert p._costing is not None
        mine, fresh = p._options(3, 3), _provider(b)._options(3, 3)
        assert mine.keys() == fresh.keys()
        for bt in mine:
            assert type(mine[bt]) is type(fresh[bt])
            for f in ("fb", "tail", "mem_fixed", "act"):
                assert np.array_equal(getattr(mine[bt], f), getattr(fresh[bt], f))


def test_handed_back_bases_send_each_equal_array_once() -> None:
    """`options.shared_bases`: equal arrays of the bases become one object (same values), so the
    pickle a frontier worker sends holds each once and is smaller: the parameter layouts and
    working buffers, a handful over a size's shapes."""
    import pickle

    from planner.search.options import shared_bases

    p = _provider(1)
    p._options(1, 1)
    assert p._costing is not None
    bases = {bt: c.basis for bt, c in p._costing.items()}
    shared = shared_bases(bases)
    fields = ("fwd_cum", "bwd_cum", "act_cum", "params_cum", "work", "recv", "uniform")
    for bt in bases:
        for b, s in zip(bases[bt], shared[bt]):
            assert all(np.array_equal(getattr(b, f), getattr(s, f)) for f in fields)
    for f in ("params_cum", "work"):
        values = {getattr(s, f).tobytes() for lst in shared.values() for s in lst}
        objects = {id(getattr(s, f)) for lst in shared.values() for s in lst}
        assert len(objects) == len(values) < sum(len(lst) for lst in shared.values()) / 4
    assert len(pickle.dumps(shared)) < len(pickle.dumps(bases))


def test_range_max_is_the_largest_value_of_each_layer_range() -> None:
    """`options._range_max`: max(values[i:j]) for every cell j > i, checked against a direct loop."""
    from planner.search.options import _range_max

    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 42):
        values = rng.random(n) * 1e9
        i_idx, j_idx = np.triu_indices(n + 1, k=1)
        want = [values[i:j].max() for i, j in zip(i_idx.tolist(), j_idx.tolist())]
        assert _range_max(values, i_idx, j_idx).tolist() == want


def _raise_input_error(field: str) -> None:
    from planner.errors import InfeasibleError

    raise InfeasibleError(field, "no measurement for this point")


def test_an_error_raised_in_a_worker_process_reaches_the_parent() -> None:
    """A `HetplanError` raised in a forked worker travels back pickled; rebuilt from its message alone
    it failed in the pool's result thread, which died and left the parent waiting forever (a
    measured-only search on an H200 pool hung that way when the Megatron grid met an unmeasured
    microbatch size)."""
    import multiprocessing as mp

    from planner.errors import InfeasibleError

    with mp.get_context("fork").Pool(1) as pool:
        pending = pool.apply_async(_raise_input_error, ("profile",))
        with pytest.raises(InfeasibleError) as err:
            pending.get(timeout=60)
    assert (err.value.field, err.value.reason) == ("profile", "no measurement for this point")


def test_early_solves_are_taken_and_leave_the_answer_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next batch's first unit, started while a batch's slower unit still runs
    (`early_tasks.EarlyTasks`), is taken when the next batch asks for it with the same arguments:
    on the 64-GPU ladder rung with a stop gap several are, and the plan, the bound and every count
    are those of one worker (which starts nothing early) and of two workers that start nothing
    early either."""
    from benchmarks.search_scale import ladder_cluster
    from planner.search import early_tasks
    from planner.specs import TrainingSpec
    from planner.specs.models import get_model

    model = get_model("llama2-13b")
    training = TrainingSpec(global_batch=256, seq_len=model.seq_len)
    seen: list[early_tasks.EarlyTasks] = []
    run = early_tasks.EarlyTasks.run

    def watched(self, pool, tasks, best, ahead):
        seen.append(self)
        return run(self, pool, tasks, best, ahead)
    monkeypatch.setattr(early_tasks.EarlyTasks, "run", watched)
    two = search(model, ladder_cluster(64), training, cost=COST, workers=2, stop_gap=0.02)
    assert seen and seen[-1].taken >= 2
    monkeypatch.setattr(early_tasks.EarlyTasks, "run", lambda self, pool, tasks, best, ahead: run(
        self, pool, tasks, best, None))
    plain = search(model, ladder_cluster(64), training, cost=COST, workers=2, stop_gap=0.02)
    one = search(model, ladder_cluster(64), training, cost=COST, workers=1, stop_gap=0.02)
    for other in (plain, one):
        assert two.plan.to_json() == other.plan.to_json() and two.lower_bound_s == other.lower_bound_s
        assert two.counts() == other.counts()


def test_unit_workers_left_to_stop_exit_on_their_own() -> None:
    """With nothing left running, the unit pool is closed rather than terminated at the end of a
    search (`UnitPool.__exit__`: no wait for the workers on the way out); they exit on their own."""
    import multiprocessing as mp
    import time

    from planner.search import parallel

    parallel._RETIRED.clear()  # an earlier search's pool must not stand in for this one's
    res = search(BIG_MODEL, BIG_CLUSTER, BIG_TRAINING, cost=COST, workers=2, stop_gap=0.02)
    assert res.gap <= 0.02 and parallel._RETIRED
    deadline = time.monotonic() + 10
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not mp.active_children()
