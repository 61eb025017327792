"""What `search` says when it found no plan: the time limit ran out, the model fits nowhere, or
(not the same) no plan of the space it searched fits; and the result of its second run on the
exact coverage, where that found one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from planner.costmodel import stage as st
from planner.costmodel.base import CostModel
from planner.errors import HetplanError, InfeasibleError
from planner.search.space import ResourceClass
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

if TYPE_CHECKING:
    from planner.search.api import SearchResult


def raise_no_plan(model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass], cost: CostModel,
                  timed_out: bool, coverage: str | None, chains: bool, proof: Callable[[], bool]) -> None:
    """No plan: the time limit, or the model fits nowhere, or (`coverage`, the narrowest one
    searched where not every plan was; `chains`: the mesh chains were searched too) none of the
    searched space fits: then the pool's memory may still hold a plan outside it, and the message
    says so rather than "fits nowhere", unless `proof` (`fit_proof.fits_nowhere`) shows that no
    pipeline of any shape or order fits."""
    if timed_out:
        raise HetplanError("time_limit", "the time limit ran out before any plan was found; raise --time-limit")
    need = model.params_count() * st.bytes_per_param(training.zero, 1)
    pool = sum(st.memory_capacity_bytes(cost.knobs, rc.dev) * rc.gpus for rc in classes)
    largest = max(st.memory_capacity_bytes(cost.knobs, rc.dev) for rc in classes)
    sizes = (f"its model states alone need {need / 2**30:.1f} GiB (before activations), the pool offers "
             f"{pool / 2**30:.1f} GiB in all and at most {largest / 2**30:.1f} GiB per GPU")
    if coverage is None or need > pool:
        raise InfeasibleError("model", f"{model.name} fits nowhere on this cluster: {sizes}")
    if proof():
        raise InfeasibleError("model", f"{model.name} fits nowhere on this cluster: at no microbatch size does "
                              f"any pipeline of its GPUs (any stage groups, shapes and order) hold all "
                              f"{model.num_layer_slots} layer slots within memory, neither one running every "
                              f"microbatch nor two at one microbatch each; {sizes}")
    space = f"{coverage} pipelines" + (" and every FlagScale mesh chain" if chains else "")
    raise InfeasibleError("model", f"no plan of the searched space ({space}) fits {model.name} on this cluster: "
                          f"{sizes}; pipelines outside it, e.g. ones that return to a GPU type (A -> B -> A), "
                          "are not searched")


def after_exact_fallback(result: SearchResult, first: str, first_s: float, limit: int) -> SearchResult:
    """`result` of the search run again on the exact coverage, with the first run's seconds added
    and the explanation saying why it ran."""
    result.explanation.append(f"no plan of the {first} coverage fits: searched again on the exact coverage (up to "
                              f"{limit} ordered group sequences per microbatch size)")
    result.stats["search_s"] += first_s
    result.history = [replace(m, seconds=m.seconds + first_s) for m in result.history]
    return result
