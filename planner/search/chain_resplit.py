"""A mesh chain's plan re-split with every stage's shape free: the chain candidate's polish.

A FlagScale mesh chain (`flagscale_grid`) runs one recompute mode and one context-parallel degree
in every stage, because FlagScale's hetero mode does. The full search has no such rule, so once the
chain candidate has its plan, each pipeline's stage device groups in order (GPU class and GPUs per
stage) are one ordered list of device groups, and its best contiguous layer split with each
stage's shape free among every shape of its GPU count (tp, cp, head parallel, stage dp,
recompute) is one exact partition DP (`solvers.partition.least_step_split`, memory per pipeline
position, tails costed for the plan's pipeline count as the evaluator costs them). The chain's own
split is one of that DP's, so the re-split plan is never slower under the cost model; it is taken
where it is faster, after the validator and the evaluator.

Llama-2 70B at 8,192 tokens on 206 GPUs of seven types (`tests/test_beyond_coverage.py`): the
best chain (selective recompute everywhere) ran 89.3 s per step; the re-split, with full recompute
on the T4 and A100 stages so that they hold more layers and the L4 stages fewer, runs 69.6 s.

The fastest chain is not always the one whose re-split is fastest, so where its re-split gains
and beats the best plan, every chain the chain search kept (up to 8) is re-split
(`best_resplit`), each against the fastest so far: that pool then runs 67.4 s. On the 16-64 GPU
ladder pools the fastest chain's re-split gains nothing and it alone is re-split (0.08-0.15 s of
one worker; all eight took 0.3-1.6 s there).
"""

from __future__ import annotations

import math

from planner.errors import HetplanError
from planner.evaluate import evaluate
from planner.plan import Plan, Prediction, expand_devices
from planner.search.options import OptionContext, build_options
from planner.search.placement import build_plan
from planner.search.space import BlockType, ResourceClass, StageShape, block_types, costable_shapes
from planner.search.templates import Template, TemplateStage
from planner.search.units import UnitContext
from planner.specs.cluster import ClusterSpec
from solvers.partition import Split, StageOptions, least_step_split

RESPLIT_MAX_DP = 256  # partition-DP runs per pipeline at most (the walk then keeps its best so far)


def best_resplit(ctx: UnitContext, chains: list[tuple[Plan, Prediction] | None],
                 cutoff_s: float = math.inf) -> tuple[Plan, Prediction] | None:
    """The fastest of `chains` and their re-splits (`resplit`, each against the fastest so far
    and `cutoff_s`), or None where there is none. The fastest chain is re-split; the others only
    where that re-split is faster than the chain and than `cutoff_s` (free shapes pay on this pool,
    and the chains compete with the best plan), chains of the same stage device groups once."""
    ranked = sorted((f for f in chains if f is not None), key=lambda f: f[1].step_s)
    if not ranked:
        return None
    best = resplit(ctx, ranked[0], cutoff_s)
    seen = {_groups_key(ranked[0][0])}
    if best is ranked[0]:
        return best  # no re-split below both the chain and the cutoff: the others are not tried
    for found in ranked[1:]:
        key = _groups_key(found[0])
        if key in seen:
            continue
        seen.add(key)
        if (better := resplit(ctx, found, best[1].step_s)) is not found:
            best = better
    return best


def _groups_key(plan: Plan) -> tuple:
    """What a re-split keeps of a plan: each pipeline's stage device groups and microbatches."""
    return tuple((p.microbatches, tuple((s.gpu, s.num_gpus) for s in p.stages)) for p in plan.pipelines)


def resplit(ctx: UnitContext, found: tuple[Plan, Prediction] | None,
            cutoff_s: float = math.inf) -> tuple[Plan, Prediction] | None:
    """`found` re-split (module doc) where that is faster than both `found` and `cutoff_s`,
    else `found`."""
    if found is None:
        return None
    plan, pred = found
    cluster, classes = ctx.cluster, ctx.classes
    b = plan.micro_batch
    types = block_types({rc.index: costable_shapes(ctx.cost, ctx.model, ctx.training, rc, b,
                                                   cluster.allow_cross_node_tp) for rc in classes})
    replicas = len(plan.pipelines)
    octx = OptionContext(ctx.model, ctx.training, b, replicas, replicas, cluster.single_node)
    options: dict[BlockType, StageOptions] = {}
    owner = _class_of_node(classes, cluster)
    # a pipeline's split must beat the plan's step less the fixed overhead (its own split is at
    # most that): where none does, that pipeline sets the step and the plan cannot improve
    cutoff = min(pred.step_s, cutoff_s) - ctx.cost.knobs.step_overhead_s
    solved: dict[tuple, Template | None] = {}  # identical pipelines (a chain's replicas): one DP
    chosen = []
    for pipe in plan.pipelines:
        kinds = tuple(BlockType(owner[expand_devices(s.devices)[0][0]], s.num_gpus) for s in pipe.stages)
        if any(bt not in types for bt in kinds):
            return found
        key = (kinds, pipe.microbatches)
        if key not in solved:
            for bt in kinds:
                if bt not in options:
                    options[bt] = build_options(ctx.cost, classes[bt.cls], types[bt], octx)
            m = pipe.microbatches
            split = least_step_split([options[bt] for bt in kinds], m, max_in_flight=m, max_points=RESPLIT_MAX_DP,
                                     cutoff=cutoff)
            solved[key] = None if split is None else _template(
                kinds, [types[bt][o] for bt, o in zip(kinds, split.options)], len(classes), split)
        if solved[key] is None:
            return found
        chosen.append((solved[key], (pipe.microbatches,)))
    try:
        new = build_plan(ctx.model, ctx.training, cluster, classes, b, chosen)
        new_pred = evaluate(new, cluster, ctx.cost)
    except HetplanError:  # a rule the DP does not model: keep the chain as it was
        return found
    return (new, new_pred) if new_pred.step_s < min(pred.step_s, cutoff_s) else found


def _class_of_node(classes: list[ResourceClass], cluster: ClusterSpec) -> dict[str, int]:
    """Node name -> index of its resource class."""
    by_group = {g: rc.index for rc in classes for g in rc.groups}
    return {n.name: by_group[n.group] for n in cluster.node_list if n.group in by_group}


def _template(kinds: tuple[BlockType, ...], shapes: list[StageShape], n_classes: int, split: Split) -> Template:
    """One pipeline's template: the stages' classes, shapes and layer ranges, with the split's times."""
    usage = [0] * n_classes
    for bt in kinds:
        usage[bt.cls] += bt.gpus
    stages = tuple(TemplateStage(bt.cls, shape, first, last)
                   for bt, shape, (first, last) in zip(kinds, shapes, split.ranges))
    return Template(tuple(usage), split.a_s, split.c_s, split.e_s, None, stages)
