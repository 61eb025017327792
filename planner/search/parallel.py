"""Split frontiers of several microbatch sizes computed in worker processes.

The frontiers of one microbatch size do not depend on another's, and on large pools they are a
large part of the search; with `workers > 1` they are computed in forked processes (each inherits
the providers, returns its frontiers) and handed back before the units are solved. The results are
the same as computing them in turn, so plans and bounds do not depend on `workers`. Platforms
without fork, and daemon processes (pool workers), compute them in turn.
"""

from __future__ import annotations

import multiprocessing as mp

_PROVIDERS: list = []  # read by forked workers (inherited memory, nothing pickled on the way in)


def _frontiers_of(index: int) -> tuple:
    return _PROVIDERS[index].frontier_state()


def prefetch_frontiers(providers: list, workers: int) -> None:
    """Fill the providers' frontiers using up to `workers` processes (no-op for one worker or
    fewer than two providers that need them)."""
    global _PROVIDERS
    todo = [p for p in providers if getattr(p, "needs_frontiers", False)]
    if workers <= 1 or len(todo) <= 1 or "fork" not in mp.get_all_start_methods() or mp.current_process().daemon:
        return  # (a daemon process, e.g. a pool worker, may not start processes of its own)
    _PROVIDERS = todo
    try:
        with mp.get_context("fork").Pool(min(workers, len(todo))) as pool:
            states = pool.map(_frontiers_of, range(len(todo)), chunksize=1)
    finally:
        _PROVIDERS = []
    for provider, state in zip(todo, states):
        provider.adopt_frontier_state(state)
