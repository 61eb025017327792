"""Split frontiers computed in worker processes before any unit is solved, with the same answer.

The split frontiers of one skeleton do not depend on another's; with `workers > 1` each microbatch
size's frontier is one task (its skeleton rows split into parts only where there are fewer sizes
than workers, `frontier_parts`: every part repeats the stage options and pruning, and most of a
sweep's rounds) computed in forked processes (each inherits the providers and returns its
frontiers, and the first part of a size the option costing's bases); the parent puts them back in
one fixed order. Platforms without fork, and daemon processes (pool workers, which may not start
processes), leave the frontiers to be computed in turn when first asked for.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable

_JOB: Callable[[tuple[int, float]], object] | None = None  # read by forked workers (inherited, not pickled)
INF = float("inf")


def _run(arg: tuple[int, float]) -> object:
    """Task `arg[0]` (-1: the pilot) with the cap on A its provider takes first (`arg[1]`)."""
    assert _JOB is not None
    return _JOB(arg)


def can_fork(workers: int, tasks: int) -> bool:
    """Whether `tasks` tasks go to forked worker processes (else they run in turn, here)."""
    return (workers > 1 and tasks > 1 and "fork" in mp.get_all_start_methods()
            and not mp.current_process().daemon)


def frontier_parts(sizes: int, workers: int) -> list[int]:
    """Parts each microbatch size's frontier work is split into: whole sizes when there are at
    least as many as workers, else extra parts for the last sizes until the task count is a
    multiple of `workers` (one size on two workers: 2). A part sweeps every `parts`-th row, but a
    sweep's rounds are batched over its rows, so half the rows take most of the rounds' time, and
    every part repeats the stage options and their pruning: the 64-GPU ladder pool's size 16 took
    0.25 s whole and 0.28 + 0.32 s in halves. Five whole sizes on two workers, against 1, 1, 1, 1, 2
    (fresh processes, alternating): 32 GPUs 2.04-2.39 s against 2.44-2.58 s in four pairs, but
    1.08 / 2.39 / 3.33 s against 1.13 / 2.43 / 3.41 s at 16 / 32 / 64 GPUs as medians of three
    rounds (`benchmarks/ab_check.py`, with the session's other changes): a small gain."""
    parts = [1] * sizes
    if sizes >= workers:
        return parts
    for i in range((workers - sizes % workers) % workers if sizes else 0):
        parts[-1 - i % sizes] += 1
    return parts


Pilot = Callable[[], tuple[object, float]]  # a task run before the frontiers: (its out, a cap on A)
BESIDE_PILOT = 2  # the smallest microbatch sizes, whose frontiers are swept beside the pilot, uncapped


def prefetch_frontiers(providers: list, workers: int, pilot: Pilot | None = None,
                       bound_rounds: int | None = None) -> object:
    """Fill the providers' frontiers using up to `workers` processes (no-op for one worker or
    a single task). Tasks go out largest microbatch size first (`providers` come smallest
    first): those frontiers tend to take longest (fewer microbatches per pipeline, so the horizon
    keeps more of each row's frontier; size 1 was the quickest on every pool timed), so the
    last task to end is a short one. A size is adopted as soon as all its parts are back, while
    the workers go on with the others (before, the parent adopted all five sizes of the 64-GPU
    rung after the last part, 0.09 s with both workers idle).

    With a `pilot` (`api.search`: the best Megatron grid) it runs first, in a worker beside the
    tasks of the `BESIDE_PILOT` smallest sizes, and the cap on A it returns goes to every other
    provider (`BlocksProvider.cap_pipeline_time`) before their tasks go out: the larger sizes,
    whose frontiers it cuts most. Which sizes are capped does not depend on `workers`, so neither
    does the answer. With `bound_rounds` (a search with a stop gap) the capped sizes but the
    smallest sweep for the bound only, that many rounds (`BlocksProvider.sweep_bound_first`),
    their plans' frontiers left to the first unit that asks. Returns the pilot's out (None
    without one); with one worker the pilot runs here and the frontiers are left to be computed
    when first asked for."""
    global _JOB
    todo = [p for p in providers if getattr(p, "needs_frontiers", False)]
    beside = todo[:BESIDE_PILOT] if pilot is not None else []
    capped = [p for p in providers if all(p is not q for q in beside)]
    # the smallest capped size sweeps whole: its units are the likeliest of them to be solved for plans
    bound_first = todo[BESIDE_PILOT + 1:] if pilot is not None and bound_rounds is not None else []
    parts = frontier_parts(len(todo), workers)
    tasks = [(p, k, n) for p, n in zip(todo, parts) for k in range(n)]
    early = [t for t in tasks if any(t[0] is q for q in beside)]
    late = [t for t in tasks if all(t[0] is not q for q in beside)][::-1]
    if not can_fork(workers, len(tasks)):
        return _cap(capped, pilot(), bound_first, bound_rounds) if pilot is not None else None
    order = early + late

    def job(arg: tuple[int, float]) -> object:
        i, a_max = arg
        if i < 0:
            assert pilot is not None
            return pilot()
        provider, k, n = order[i]
        if i >= len(early):  # the parent capped it after this worker was forked (at inf: no grid plan)
            _cap([provider], (None, a_max), bound_first, bound_rounds)
        return provider.frontier_part(k, n)
    _JOB = job
    back: dict[int, dict[int, tuple]] = {}  # per provider, its parts' states by part
    out = None
    try:
        with mp.get_context("fork").Pool(min(workers, len(tasks) + (pilot is not None))) as pool:
            first = pool.apply_async(_run, ((-1, INF),)) if pilot is not None else None
            sent = [pool.apply_async(_run, ((i, INF),)) for i in range(len(early))]
            a_max = INF
            if first is not None:
                got_pilot = first.get()
                out, a_max = _cap(capped, got_pilot, bound_first, bound_rounds), got_pilot[1]
            sent += [pool.apply_async(_run, ((len(early) + i, a_max),)) for i in range(len(late))]
            for (provider, k, n), result in zip(order, sent):
                got = back.setdefault(id(provider), {})
                got[k] = result.get()
                if len(got) == n:
                    provider.adopt_frontier_parts([got[i] for i in range(n)])
    finally:
        _JOB = None
    return out


def _cap(providers: list, pilot_out: tuple[object, float], bound_first: list | None = None,
         bound_rounds: int | None = None) -> object:
    """Cap the providers' frontiers at the pilot's A (`BlocksProvider.cap_pipeline_time`), those of
    `bound_first` swept for the bound first (`BlocksProvider.sweep_bound_first`, `bound_rounds`
    rounds); the pilot's out."""
    out, a_max = pilot_out
    for provider in providers:
        if hasattr(provider, "cap_pipeline_time"):
            provider.cap_pipeline_time(a_max)
            if bound_rounds is not None and any(provider is p for p in bound_first or []):
                provider.sweep_bound_first(bound_rounds)
    return out
