"""What a search result says besides its plan: the alternatives after the best plan, the lines
explaining it (bottleneck, memory headroom, idle GPUs) and the pipelines that lie outside the
lower bound's coverage. Reads plans and candidates only."""

from __future__ import annotations

from planner.plan import Plan, Prediction
from planner.search.units import Candidate, coverage_rank


def alternatives_of(candidates: list[Candidate], top_k: int) -> list[Plan]:
    """The next `top_k` distinct plans after the best (which may have been found more than once).
    Plans are told apart by their compact JSON without any prediction block: the pretty
    `Plan.to_json` of a 16,384-GPU plan took 0.1-0.5 s, and this runs after the search, in the
    parent."""
    def key(plan: Plan) -> str:
        return plan.model_copy(update={"predicted": None}).model_dump_json()

    seen: set[str] = {key(candidates[0].plan)} if candidates else set()
    out = []
    for c in candidates[1:]:
        k = key(c.plan)
        if k in seen:
            continue
        seen.add(k)
        out.append(c.plan.model_copy(update={"predicted": c.prediction}))
        if len(out) >= top_k:
            break
    return out


def outside_coverage(plan: Plan, coverage: str) -> list[str]:
    """A line per pipeline the bound's coverage does not hold: more runs of stage groups than it
    has (a three-run plan candidate, `providers.BlocksProvider(bound_blocks=...)`, or a Megatron
    grid), or two runs in more stages than its `mixed<=K` (a grid)."""
    if coverage == "exact":
        return []
    blocks, mixed = coverage_rank(coverage)
    out = []
    for k, pipe in enumerate(plan.pipelines):
        groups = [(s.gpu, s.num_gpus) for s in pipe.stages]
        runs = sum(1 for i, g in enumerate(groups) if i == 0 or g != groups[i - 1])
        if runs > blocks:
            out.append(f"pipeline {k} has {runs} runs of stage groups, more than the lower bound's coverage "
                       f"({coverage}) holds: the bound is for plans of that space, this one is a candidate "
                       "from outside it")
        elif runs == 2 and len(groups) > mixed:
            out.append(f"pipeline {k} mixes stage groups over {len(groups)} stages, more than the lower "
                       f"bound's coverage ({coverage}) holds: the bound is for plans of that space, this one "
                       "is a candidate from outside it")
    return out


def explain(plan: Plan, pred: Prediction, idle: dict[str, int], coverage: str,
            engines_only: bool = False) -> list[str]:
    """Bottleneck, memory headroom per stage, and why GPUs are idle: no plan of the searched space
    (`coverage`) that uses them is faster; a time limit or a narrower coverage leaves that open.
    `engines_only`: no plan of the coverage fits and the plan is an engine candidate's (a mesh chain
    or a Megatron grid, `api.search`), so those searched are what the idle GPUs are weighed against."""
    lines = [f"bottleneck: {pred.bottleneck}"]
    for sp in pred.per_stage:
        head = sp.memory_capacity_bytes - sp.memory_bytes
        lines.append(f"pipeline {sp.pipeline} stage {sp.stage} ({sp.gpu}): memory headroom "
                     f"{head / 2**30:.1f} GiB of {sp.memory_capacity_bytes / 2**30:.1f} GiB")
    against = (f"no plan of the searched space ({coverage}) fits, and no mesh chain or Megatron grid searched "
               "that also uses them is faster" if engines_only else
               f"no plan of the searched space ({coverage}) that also uses them is faster")
    for gpu, n in sorted(idle.items()):
        lines.append(f"idle: {n} x {gpu} - {against} under the cost model (they would lengthen gradient sync or "
                     "could not take a balanced share of the batch)")
    return lines
