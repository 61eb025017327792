"""Water-filling by selection (`solvers.deal.deal`) against its definition, one microbatch at a time
with a heap (`deal_by_heap`): the same microbatches for every copy and the same pipeline time, bit for
bit, including ties between copies and between templates."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.assign import BIG_M, AssignProblem
from solvers.deal import deal, deal_by_heap


def _problem(a: list[float], c: list[float], microbatches: int) -> AssignProblem:
    t = len(a)
    return AssignProblem(a_s=np.array(a, dtype=float), c_s=np.array(c, dtype=float), e_s=np.zeros(t),
                         max_microbatches=np.full(t, BIG_M, dtype=np.int64), usage=np.ones((t, 1), dtype=np.int64),
                         avail=np.array([10**6]), microbatches=microbatches, replicas=(1, 10**6))


@pytest.mark.parametrize("seed", range(60))
def test_deal_equals_the_heap(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 7))
    if seed % 3 == 0:  # small integers: many equal increments across templates and copies
        a = rng.integers(1, 6, t).astype(float).tolist()
        c = rng.integers(1, 4, t).astype(float).tolist()
    else:
        a = rng.uniform(0.5, 3.0, t).tolist()
        c = rng.uniform(0.01, 0.5, t).tolist()
    counts = rng.integers(0, 5, t)
    counts[rng.integers(0, t)] += 1  # at least one copy
    caps = rng.integers(1, 40, t)
    room = int(counts @ caps)
    microbatches = int(rng.integers(int(counts.sum()), room + 1))
    p = _problem(a, c, microbatches)
    assert deal(p, counts, caps) == deal_by_heap(p, counts, caps)


def test_deal_on_a_large_pool_shape() -> None:
    """Hundreds of copies and tens of thousands of microbatches (the 16,384-GPU ladder's shape)."""
    p = _problem([7.1, 6.9, 7.4], [0.011, 0.013, 0.0095], 65_536)
    counts, caps = np.array([300, 200, 139]), np.array([200, 200, 200])
    per_t, pipe = deal(p, counts, caps)
    assert (per_t, pipe) == deal_by_heap(p, counts, caps)
    assert sum(sum(x) for x in per_t) == 65_536
