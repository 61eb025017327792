"""When a search found its plans and how far its bound had come: the milestones a person reads to
pick a time limit (a limit past the last plan milestone returns the same plan; the gap then only
says how well it is proven).

On pools of many GPU types the best plan can come late: `benchmarks/many_types.py --seed 17`
pool 11 (OPT-350M on 163 GPUs of four types) kept a 0.4322 s plan from 6 s to 33 s of a 35 s
search (at the start of session 37; 25 s since, the same plan), most of it refinement raising
bounds toward that plan, and its 0.4191 s plan came from a lift's witness in the last two seconds.
A search's own counts cannot show that; this does.

A milestone is taken in the search's process, between batches of work whose order does not depend
on the worker count, so the phases, steps and bounds are the same for the same input; only the
seconds vary from run to run (`deterministic` leaves them out).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Milestone:
    """The best plan and the lower bound after a step of the search that changed either."""

    phase: str  # what found the plan or raised the bound: units, megatron_grid, chain, polish, ...
    step_s: float  # the best plan's step then
    lower_bound_s: float | None  # a bound valid for the covered space then; None while units are unbounded
    seconds: float  # from the start of the search

    def deterministic(self) -> dict[str, Any]:
        """The milestone without its wall-clock time (the same for the same input)."""
        return {"phase": self.phase, "step_s": self.step_s, "lower_bound_s": self.lower_bound_s}


class _Searching(Protocol):
    """What `mark` reads of a search in progress (`units.UnitContext`)."""

    candidates: list
    solved: list
    bounds: list[float]
    unsolved_sizes: set[int]
    history: list[Milestone]
    timeline: dict[str, float]


def lowest_bound(ctx: _Searching) -> float | None:
    """The least bound over the solved units and the bounded ones, capped by the best plan (as the
    result's), once every unit is one or the other (`timeline["bounded"]` set); None before that,
    and where a microbatch size went unsolved (its fluid bound is taken only at the end)."""
    if "bounded" not in ctx.timeline or ctx.unsolved_sizes:
        return None
    found = [su.bound_s for su in ctx.solved] + list(ctx.bounds)
    if not found or not ctx.candidates:
        return None
    return min(min(found), min(c.step_s for c in ctx.candidates))


def mark(ctx: _Searching, phase: str) -> None:
    """Add a milestone when the best plan is faster than at the last one, or the bound higher."""
    if not ctx.candidates:
        return
    best = min(c.step_s for c in ctx.candidates)
    bound = lowest_bound(ctx)
    last = ctx.history[-1] if ctx.history else None
    faster = last is None or best < last.step_s
    higher = bound is not None and (last is None or last.lower_bound_s is None or bound > last.lower_bound_s)
    if faster or higher:
        ctx.history.append(Milestone(phase, best, bound, time.perf_counter() - ctx.timeline["start"]))


def close(history: list[Milestone], step_s: float, lower_bound_s: float, seconds: float) -> None:
    """End the history with the result's plan and bound where its last milestone differs (the fluid
    bound of a microbatch size left unsolved is only counted at the end)."""
    last = history[-1] if history else None
    if last is None or (last.step_s, last.lower_bound_s) != (step_s, lower_bound_s):
        history.append(Milestone("end", step_s, lower_bound_s, seconds))


def plan_found(history: list[Milestone]) -> Milestone | None:
    """The milestone at which the final plan was first the best (the first with the last step)."""
    if not history:
        return None
    final = history[-1].step_s
    return next(m for m in history if m.step_s == final)
