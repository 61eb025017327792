"""The assignment LP with a lower limit on the number of pipelines.

A replica class [lo, hi] holds plans of at least lo pipelines, each holding at least one
microbatch. The capacity LP (`assign_lp._CapacityLP`: max c·n s.t. usage·n <= avail,
sum n <= hi, n >= 0, c the microbatches a copy of each template holds by a trial time) used to
drop the lower limit, which only enlarges it: where few big pipelines fit, a unit of five or more
pipelines was bounded by two and a half copies of the fastest template. Llama-2 70B at 64k tokens
on 124 GPUs of five types (`benchmarks/many_types.py --seed 2`, pool 29): every unit from three
to 124 pipelines was bounded near 452 s, the best plan 506.7 s, gap 11.5 %.

The limit is sum_{c > 0} n >= lo: a copy that holds no microbatch by the trial time is no
pipeline of a plan there. The small simplex needs x = 0 feasible, so the row is priced rather than
added (`SmallLP.solve_priced`, the parametric simplex on c + lam·[c > 0]); every price gives a
valid bound, the least one the constrained optimum. Where no copies reach lo, no plan of the class
exists by that time: capacity 0.
"""

from __future__ import annotations

import numpy as np

from solvers.small_lp import SmallLP


def capacity_with_floor(lp: SmallLP, caps: np.ndarray, least: int,
                        need: float | None = None) -> tuple[float, np.ndarray]:
    """The most microbatches copies hold with at least `least` copies of templates that hold one
    (an upper bound, met where the pricing ends), and such copies; (0, zeros) where none reach
    `least`. With `need`, the first bound below it (all a proof asks; the copies mean nothing)."""
    found = lp.solve_priced(caps, (caps > 0).astype(float), float(least), need)
    if found is None:
        return 0.0, np.zeros(len(caps))
    return found
