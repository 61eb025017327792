"""A cheap lower bound on the step time that holds for every plan, used when a time limit stops the
search before every (microbatch size, replica count) has been solved.

Fluid bound: every layer must run M·b sequences forward and backward somewhere; a GPU of class c
spends at least w[l, c] GPU-seconds per microbatch of layer l (its best shape, times the shape's GPU
count, communication included but no boundary receives). Minimising T subject to the class
capacities N_c·T is an LP whose optimum no plan can beat; the fixed per-step overhead is added.
"""

from __future__ import annotations

import numpy as np


def fluid_bound_s(work: np.ndarray, gpus: np.ndarray, microbatches: int) -> float:
    """work: (layers, classes) GPU-seconds per microbatch (inf = cannot run); gpus: (classes,)."""
    import pulp

    n_layers, n_classes = work.shape
    prob = pulp.LpProblem("fluid", pulp.LpMinimize)
    t = pulp.LpVariable("t", 0)
    y = {(l, c): pulp.LpVariable(f"y_{l}_{c}", 0) for l in range(n_layers) for c in range(n_classes)
         if np.isfinite(work[l, c])}
    prob += t
    for l in range(n_layers):
        prob += pulp.lpSum(y[(l, c)] for c in range(n_classes) if (l, c) in y) == microbatches
    for c in range(n_classes):
        prob += pulp.lpSum(float(work[l, c]) * y[(l, c)] for l in range(n_layers) if (l, c) in y) <= float(gpus[c]) * t
    prob.solve(pulp.PULP_CBC_CMD(msg=False))
    if prob.sol_status != pulp.LpSolutionOptimal:
        return 0.0
    return max(0.0, float(t.value() or 0.0) * (1 - 1e-9))
