"""Discrete-event simulator of pipeline schedules: the check on the closed form of `costmodel.stage`.

Each stage runs one op at a time, in its schedule's fixed per-stage order; an op starts at
max(stage free, dependency done): forward j on stage s after forward j on s-1, backward j on s after
backward j on s+1 (on the last stage, after its own forward j). F_s / B_s are per-microbatch times with
boundary p2p folded in, exactly as the evaluator reports them. The makespan is therefore the longest
path of a DAG, monotone in every F_s and B_s.

Closed form (`costmodel.stage.pipeline_time_s`) against this simulator; S stages, m microbatches,
P_s = F_s + B_s, L = S - 1, "exact" = equal up to float rounding (tested to 1e-9 relative). Every
claim holds for m < S as well. `closed_form_is_exact` encodes the exact cases, `closed_form_bounds_s`
the bounds.

* GPipe: exact for any F_s, B_s, m (proof). Forwards are a flow shop of identical jobs, makespan
  sum F + (m-1)·max F; the last stage is busy until then and every other stage has finished its
  forwards, so the backwards are again an identical-job flow shop (stages reversed): sum B + (m-1)·max B.
* 1F1B, m = 1: exact (one forward chain, one backward chain). Uniform stages: exact,
  (m + S - 1)(F + B), the textbook 1F1B bubble; also equal P_s split any way between F_s and B_s.
* 1F1B, last stage a bottleneck (P_L = max P): exact when S <= 2 or max_s F_s <= min_s B_s, and on
  every realistic sample tried (F_s within 3x of each other, B_s = F_s·U(1.8, 2.6)). Found by search
  over > 100000 random instances (heavy-tailed times included) and kept by property tests; not proved.
  Not exact in general: an early stage with a slow forward delivers its warm-up forwards so late
  that a backward-heavy, near-bottleneck stage behind it starts its backwards late; the test
  `test_closed_form_is_wrong_both_ways_on_some_pipelines` holds such a case (closed form 10% low).
* 1F1B, P_L < max P, m >= 2: never exact on random instances (> 10000 tried). Two effects:
  - pessimistic (usual): the bottleneck k = argmax P runs its other warm-up forwards while
    microbatch 0 makes its round trip through stages > k, so that trip is not all exposed;
  - optimistic (rarer; never seen with max F <= min B): warm-up forwards on a stage with slow F hold
    up the first backward passing through it, and the delay reaches the end of the step.
  Measured (closed - sim) / sim on seeded random samples (S <= 8): F ~ U(0.1, 3), B ~ U(0.1, 6),
  m <= 16 gives -4% .. +26% (another sample: -7% .. +29%); realistic F ~ U(0.5, 1.5), B = F·U(1.8, 2.6)
  gives 0 .. +23% at m = S, +21% at m <= 2S, +13% at m in [2S, 4S], +7% at m in [4S, 8S], never
  negative. The stage-wise lower bound below is within 6% of the simulation on the realistic sample.

Bounds, 1F1B:
  lower (proof): for every stage k, makespan >= sum_{s<k} P_s + m·P_k + max(0, X_k - w_k·F_k), with
    X_k = sum_{s>k} P_s and w_k = min(S-k, m) - 1: stage k cannot start before forward 0 reaches it,
    runs w_k + 1 forwards before backward 0, which cannot start before microbatch 0's round trip X_k
    after forward 0 leaves k; the rest of stage k is serial, and backward m-1 then walks back to
    stage 0. So the closed form exceeds the simulation by at most min(X_k, w_k·F_k) at k = argmax P.
  upper (proof, given uniform exactness): the makespan is monotone in every op time, so raising all
    stages to (max F, max B) gives makespan <= (m + S - 1)(max F + max B).
  upper (observed, not proved; no counterexample in > 50000 heavy-tailed instances): makespan <= the
    GPipe closed form sum P + (m-1)(max F + max B), so the 1F1B closed form can be low by at most
    (m-1)(max F + max B - max P).

Peak in-flight microbatches per stage (forwards done whose backward has not finished) equals
`costmodel.stage.in_flight`: min(S - s, m) for 1F1B, m for GPipe.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from planner.costmodel import stage as st
from planner.costmodel.base import CostModel
from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec

SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True, slots=True)
class Op:
    """One forward ('F') or backward ('B') of one microbatch on one stage, as it ran."""

    stage: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class PipelineTimeline:
    """What one pipeline did: every op, per-stage busy / idle time, peak activations held."""

    schedule: str
    microbatches: int
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    ops: tuple[Op, ...]
    makespan_s: float
    busy_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    peak_in_flight: tuple[int, ...]

    @property
    def num_stages(self) -> int:
        return len(self.fwd_s)

    @property
    def closed_form_s(self) -> float:
        """The evaluator's formula on the same numbers, for comparison."""
        return st.pipeline_time_s(self.schedule, list(self.fwd_s), list(self.bwd_s), self.microbatches)


@dataclass(frozen=True, slots=True)
class PlanTimeline:
    """Simulated step of a whole plan, next to the evaluator's closed-form step."""

    pipelines: tuple[PipelineTimeline, ...]
    tail_s: float
    overhead_s: float
    step_s: float
    closed_form_step_s: float


def stage_op_order(schedule: str, num_stages: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """The (kind, microbatch) sequence one stage runs.

    1F1B is the non-interleaved PipeDream-flush / Megatron order: min(S - s - 1, m) warm-up forwards,
    then alternate one forward, one backward, then the cool-down backwards. GPipe: all forwards, then
    all backwards in microbatch order."""
    m = microbatches
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warmup = min(num_stages - stage - 1, m)
    order = [("F", j) for j in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", j) for j in range(m - warmup, m)]
    return order


def dependency(kind: str, stage: int, microbatch: int, num_stages: int) -> tuple[str, int, int] | None:
    """The op (kind, stage, microbatch) that must finish before this one, besides the stage's previous op."""
    if kind == "F":
        return ("F", stage - 1, microbatch) if stage > 0 else None
    if stage < num_stages - 1:
        return ("B", stage + 1, microbatch)
    return ("F", stage, microbatch)


def _check_inputs(fwd_s: Sequence[float], bwd_s: Sequence[float], microbatches: int, schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise HetplanError("schedule", f"the simulator knows {', '.join(SCHEDULES)}, not '{schedule}'")
    if not fwd_s or len(fwd_s) != len(bwd_s):
        raise HetplanError("fwd_s", f"need one forward and one backward time per stage, got {len(fwd_s)} "
                           f"and {len(bwd_s)}")
    if microbatches < 1:
        raise HetplanError("microbatches", f"need at least one microbatch, got {microbatches}")
    for name, times in (("fwd_s", fwd_s), ("bwd_s", bwd_s)):
        for s, t in enumerate(times):
            if not t >= 0.0 or t == float("inf"):
                raise HetplanError(name, f"stage {s} time {t} is not a finite non-negative number")


def simulate_pipeline(fwd_s: Sequence[float], bwd_s: Sequence[float], microbatches: int,
                      schedule: str = "1f1b") -> PipelineTimeline:
    """Run one pipeline's schedule event by event; every op starts at max(stage free, dependency done)."""
    _check_inputs(fwd_s, bwd_s, microbatches, schedule)
    n = len(fwd_s)
    dur = {"F": [float(x) for x in fwd_s], "B": [float(x) for x in bwd_s]}
    orders = [stage_op_order(schedule, n, s, microbatches) for s in range(n)]
    nxt = [0] * n
    busy = [False] * n
    done: dict[tuple[str, int, int], float] = {}
    started: dict[tuple[str, int, int], float] = {}
    events: list[tuple[float, int, int]] = []  # (end time, sequence number, stage): ties by start order
    seq = 0

    def try_start(s: int, now: float) -> None:
        nonlocal seq
        if busy[s] or nxt[s] == len(orders[s]):
            return
        kind, j = orders[s][nxt[s]]
        dep = dependency(kind, s, j, n)
        if dep is not None and dep not in done:
            return
        busy[s] = True
        started[(kind, s, j)] = now
        heapq.heappush(events, (now + dur[kind][s], seq, s))
        seq += 1

    for s in range(n):
        try_start(s, 0.0)
    while events:
        now, _, s = heapq.heappop(events)
        kind, j = orders[s][nxt[s]]
        done[(kind, s, j)] = now
        busy[s] = False
        nxt[s] += 1
        try_start(s, now)
        waiting = s + 1 if kind == "F" else s - 1  # the stage this op may have unblocked
        if 0 <= waiting < n:
            try_start(waiting, now)
        if kind == "F" and s == n - 1:
            try_start(s, now)
    if any(nxt[s] != len(orders[s]) for s in range(n)):  # cannot happen for the two orders above
        raise RuntimeError(f"schedule {schedule} deadlocked at ops {nxt}")

    ops = sorted((Op(s, k, j, started[(k, s, j)], done[(k, s, j)]) for (k, s, j) in done),
                 key=lambda o: (o.start_s, o.stage, o.kind, o.microbatch))
    makespan = max(done.values())
    busy_s = tuple(microbatches * (dur["F"][s] + dur["B"][s]) for s in range(n))
    return PipelineTimeline(schedule, microbatches, tuple(dur["F"]), tuple(dur["B"]), tuple(ops), makespan,
                            busy_s, tuple(makespan - b for b in busy_s),
                            tuple(_peak_in_flight(order) for order in orders))


def closed_form_bounds_s(fwd_s: Sequence[float], bwd_s: Sequence[float], microbatches: int,
                         schedule: str = "1f1b") -> tuple[float, float]:
    """(lo, hi) around the simulated makespan, from the module docstring: the closed form itself
    where it is exact; else the proved stage-wise lower bound and the (observed) GPipe upper bound."""
    _check_inputs(fwd_s, bwd_s, microbatches, schedule)
    f, b, m = [float(x) for x in fwd_s], [float(x) for x in bwd_s], microbatches
    closed = st.pipeline_time_s(schedule, f, b, m)
    if closed_form_is_exact(f, b, m, schedule):
        return closed, closed
    n = len(f)
    p = [x + y for x, y in zip(f, b)]
    lo = max(sum(p[:k]) + m * p[k] + max(0.0, sum(p[k + 1:]) - (min(n - k, m) - 1) * f[k]) for k in range(n))
    return lo, st.pipeline_time_s("gpipe", f, b, m)


def closed_form_is_exact(fwd_s: Sequence[float], bwd_s: Sequence[float], microbatches: int,
                         schedule: str = "1f1b") -> bool:
    """Whether the closed form equals the simulation on these numbers, by the rules of the module
    docstring (GPipe; m = 1; equal F+B on every stage; last-stage bottleneck with S <= 2 or
    max F <= min B)."""
    _check_inputs(fwd_s, bwd_s, microbatches, schedule)
    if schedule == "gpipe" or microbatches == 1:
        return True
    p = [x + y for x, y in zip(fwd_s, bwd_s)]
    if max(p) - min(p) <= 1e-12 * max(p):  # uniform stages, or equal F+B split any way
        return True
    return p[-1] >= max(p) and (len(p) <= 2 or max(fwd_s) <= min(bwd_s))


def _peak_in_flight(order: list[tuple[str, int]]) -> int:
    """Most forwards done whose backward has not finished, over a stage's (sequential) ops."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def simulate_plan(plan: Plan, cluster: ClusterSpec, cost: CostModel | None = None, *,
                  check: bool = True) -> PlanTimeline:
    """Simulate every pipeline of a plan on the evaluator's own per-stage F/B (boundary p2p included)
    and add the evaluator's tail and overhead, so `step_s` compares with `evaluate(...).step_s`."""
    pred = evaluate(plan, cluster, cost, check=check)
    timelines = []
    for pi, pipe in enumerate(plan.pipelines):
        rows = sorted((p for p in pred.per_stage if p.pipeline == pi), key=lambda p: p.stage)
        timelines.append(simulate_pipeline([p.fwd_s for p in rows], [p.bwd_s for p in rows],
                                           pipe.microbatches, plan.schedule))
    step = max(t.makespan_s for t in timelines) + pred.tail_s + pred.overhead_s
    return PlanTimeline(tuple(timelines), pred.tail_s, pred.overhead_s, step, pred.step_s)


def render_timeline_text(timeline: PipelineTimeline, width: int = 72) -> str:
    """ASCII Gantt, one row per stage: forwards print their microbatch digit, backwards a letter
    (a = microbatch 0), idle time '.'; each column is makespan / width seconds."""
    if width < 1:
        raise HetplanError("width", f"need at least one column, got {width}")
    scale = width / timeline.makespan_s if timeline.makespan_s > 0 else 0.0
    rows = [["."] * width for _ in range(timeline.num_stages)]
    for op in timeline.ops:
        first = int(round(op.start_s * scale))
        last = max(first + 1, int(round(op.end_s * scale))) if op.end_s > op.start_s else first
        mark = str(op.microbatch % 10) if op.kind == "F" else chr(ord("a") + op.microbatch % 26)
        for c in range(first, min(last, width)):
            rows[op.stage][c] = mark
    lines = [f"stage {s:>2} |{''.join(r)}|" for s, r in enumerate(rows)]
    lines.append(f"{timeline.schedule}, m={timeline.microbatches}, makespan {timeline.makespan_s:.6g} s "
                 f"(closed form {timeline.closed_form_s:.6g} s); digits = forward, letters = backward")
    return "\n".join(lines)
