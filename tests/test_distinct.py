"""`solvers.distinct.distinct`: `np.unique`'s values without its masked-array check, which imports
`numpy.ma` in each worker process on first use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from solvers.distinct import distinct


def test_distinct_is_np_unique_on_floats_and_ints() -> None:
    rng = np.random.default_rng(3)
    for _ in range(500):
        x = rng.choice([0.5, 1.0, np.inf, 2.0, float(rng.random())], size=int(rng.integers(0, 30)))
        y = rng.integers(0, 5, size=int(rng.integers(0, 20)))
        for v in (x, y, x.reshape(-1, 1) if len(x) else x):
            got, want = distinct(v), np.unique(v)
            assert np.array_equal(got, want) and got.dtype == want.dtype


def test_a_search_does_not_import_numpy_ma() -> None:
    """No search code path calls the `np.unique` form that imports `numpy.ma` (6.5 ms per worker
    process, on the first batch's critical path)."""
    code = ("import sys\n"
            "from planner.search import search\n"
            "from tests.test_search_refine import BIG_CLUSTER, BIG_MODEL, BIG_TRAINING, COST\n"
            "search(BIG_MODEL, BIG_CLUSTER, BIG_TRAINING, cost=COST, workers=1, stop_gap=0.02)\n"
            "print('numpy.ma' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip().splitlines()[-1] == "False"
