"""The search against the brute-force oracle (`benchmarks.brute_force`) on random small instances.

    python benchmarks/oracle_fuzz.py [--seed 1] [--count 100] [--minutes M]

Draws the issue's small instances: one to three GPU types on nodes of 1, 2 or 4 GPUs, up to 8 GPUs
with 1-2 decoder layers, up to 4 GPUs with up to 8 layers, or up to 6 GPUs with up to 4 layers;
global batches 1-8, several microbatch sizes (or the search's default ones); random limits on
tp / cp / head / stage-dp degrees, recompute modes and ZeRO stages; widths 256-8,192 and
512-8,192 tokens (some draws fit nowhere); a fifth of the pools let groups span nodes. Each is
searched by default, on the blocks coverage with a stop gap (`STOP_GAP`) and, where its
enumeration stays small, with the exact coverage forced, and `check` lists what is wrong: a plan
the validator rejects or whose step the evaluator does not reproduce, a plan faster than the oracle's optimum (the oracle would be wrong), a plan slower than
it on the exact coverage, a stop-gap plan more than `STOP_GAP` slower than an optimum its
coverage holds, a bound above the optimum where the optimum's plan lies in the coverage
(`in_coverage`), a disagreement on whether any plan fits, `fit_proof.fits_nowhere` proving
that nothing fits where the oracle has a plan, or the bound every plan of a microbatch size takes
(the fluid or memory bound, `api._fluid`) above the optimum at that size. The last line counts instances, problems,
how often the default search returned the optimum itself, and its coverages.
`tests/test_search_bruteforce.py` runs a few seeded draws.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.brute_force import Found, as_plan, brute_force
from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import device_class_of
from planner.errors import InfeasibleError
from planner.evaluate import evaluate
from planner.search import search
from planner.search.api import _fluid, micro_batch_sizes
from planner.search.fit_proof import fits_nowhere
from planner.search.space import block_types, costable_shapes, resource_classes
from planner.search.units import coverage_rank
from planner.specs import ClusterSpec, ModelSpec, NodeGroup, TrainingSpec
from planner.validate import violations

GPUS = ("A100-SXM4-40GB", "A100-SXM4-80GB", "V100-SXM2-16GB", "V100-SXM2-32GB", "H100-SXM5-80GB", "T4", "RTX-3090",
        "RTX-2080Ti")
SIZES = ((8, 2), (4, 8), (6, 4))  # (most GPUs, most decoder layers): the oracle's enumeration stays small
EXACT_FORCED = 5  # force the exact coverage where GPUs and layer slots are both at most this
STOP_GAP = 0.05  # the "stop" mode's `search(stop_gap=...)`, on the blocks coverage (exact_limit=0)
REL = 1e-9
COST = AnalyticCostModel()


@dataclass(frozen=True)
class Instance:
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec

    def describe(self) -> str:
        pool = " + ".join(f"{g.nodes}x{g.gpus_per_node} {g.gpu}" for g in self.cluster.nodes)
        t = self.training
        return (f"{pool}{' (groups span nodes)' if self.cluster.allow_cross_node_tp else ''}; "
                f"{self.model.num_layers} layers, hidden {self.model.hidden}; gb {t.global_batch}, seq {t.seq_len}, "
                f"micro {t.micro_batches}, tp<={t.max_tp} cp<={t.max_cp} hp<={t.max_hp} dp<={t.max_stage_dp}, "
                f"recompute {t.recompute}, zero {t.zero}")


def draw(rng: random.Random) -> Instance:
    """One random instance (see the module docstring)."""
    most_gpus, most_layers = rng.choice(SIZES)
    types = rng.sample(GPUS, rng.randint(1, 3))
    groups, left = [], most_gpus
    for k, gpu in enumerate(types):
        room = left - (len(types) - k - 1)  # at least one GPU for each later group
        per_node = rng.choice([p for p in (1, 2, 4) if p <= room])
        nodes = rng.randint(1, max(1, min(2, room // per_node)))
        groups.append(NodeGroup(gpu=gpu, nodes=nodes, gpus_per_node=per_node))
        left -= nodes * per_node
    cluster = ClusterSpec(nodes=groups, allow_cross_node_tp=rng.random() < 0.2)
    gb = rng.choice((1, 2, 4, 6, 8))
    micro = sorted({b for b in rng.sample((1, 2, 4), rng.randint(1, 3)) if gb % b == 0} or {1})
    training = TrainingSpec(global_batch=gb, seq_len=rng.choice((512, 2048, 4096, 8192)),
                            micro_batches=tuple(micro) if rng.random() < 0.8 else None,
                            max_tp=rng.choice((1, 2, 4)), max_cp=rng.choice((1, 2)), max_hp=rng.choice((1, 2)),
                            max_stage_dp=rng.choice((1, 2)), zero=rng.choice((0, 0, 1, 3)),
                            recompute=tuple(rng.sample(("none", "selective", "full"), rng.randint(1, 2))))
    heads = rng.choice((4, 8))
    hidden = rng.choice((256, 512, 1024, 4096, 8192))
    swiglu = rng.random() < 0.5
    model = ModelSpec(name="fuzz-model", num_layers=rng.randint(1, most_layers), hidden=hidden, ffn_hidden=4 * hidden,
                      num_heads=heads, num_kv_heads=rng.choice([d for d in (1, 2, 4) if heads % d == 0]),
                      vocab=rng.choice((4096, 32000)), seq_len=training.seq_len,
                      activation="swiglu" if swiglu else "gelu", norm="rmsnorm" if swiglu else "layernorm",
                      learned_positions=not swiglu)
    return Instance(model, cluster, training)


def in_coverage(found: Found, coverage: str, cluster: ClusterSpec) -> bool:
    """Whether the oracle's plan lies in the coverage: exact holds every plan; "blocks<=B" every
    pipeline of at most B runs (consecutive stages of one device class and GPU count) on pairwise
    different device classes, with ",mixed<=K" those of two runs at most K stages long, each
    running at least as many microbatches as it has stages (the blocks provider's memory
    assumption: a pipeline of fewer holds fewer in flight, `providers`)."""
    if coverage == "exact":
        return True
    most_runs, mixed_cap = coverage_rank(coverage)
    key = [device_class_of(g).key for g in cluster.nodes]
    for stages, microbatches in found.pipelines:
        if microbatches < len(stages):
            return False
        blocks = [(key[c.group], c.gpus) for c, _, _ in stages]
        runs = [b for k, b in enumerate(blocks) if k == 0 or b != blocks[k - 1]]
        classes = [cls for cls, _ in runs]
        if len(runs) > most_runs or len(set(classes)) < len(classes) or (len(runs) == 2 and len(stages) > mixed_cap):
            return False
    return True


@dataclass
class Outcome:
    problems: list[str]
    optimum_s: float | None
    default_s: float | None  # the default search's step
    coverage: str | None  # the default search's coverage
    proven: bool  # `fit_proof.fits_nowhere` showed that no plan fits


def proves_nothing_fits(inst: Instance) -> bool:
    """`fit_proof.fits_nowhere` on the instance, with the block types and shapes the search costs."""
    classes = resource_classes(inst.cluster)
    sets = {b: block_types({rc.index: costable_shapes(COST, inst.model, inst.training, rc, b,
                                                      inst.cluster.allow_cross_node_tp)
                            for rc in classes}) for b in micro_batch_sizes(inst.training)}
    return fits_nowhere(COST, inst.model, inst.training, classes, sets, inst.cluster.single_node)


def pool_bound_problems(inst: Instance) -> list[str]:
    """The bound every plan of a microbatch size takes (`api._fluid`: the fluid bound or, where
    larger, the memory bounds of `solvers.memory_bound`) against the oracle's optimum at that size."""
    classes = resource_classes(inst.cluster)
    out = []
    for b in micro_batch_sizes(inst.training):
        bound = _fluid(COST, inst.model, inst.training, classes, b, inst.cluster.allow_cross_node_tp)
        at_b = brute_force(inst.model, inst.cluster, inst.training.model_copy(update={"micro_batches": (b,)}), COST)
        optimum = math.inf if at_b is None else at_b.step_s
        if bound > optimum * (1 + REL):
            out.append(f"pool bound {bound:.9f} s above the optimum {optimum:.9f} s at microbatch {b}")
    return out


def check(inst: Instance) -> Outcome:
    """Search `inst` (default, and exact where small) and compare with the oracle."""
    found = brute_force(inst.model, inst.cluster, inst.training, COST)
    problems: list[str] = []
    if found is not None:
        plan = as_plan(found, inst.model, inst.cluster, inst.training)
        broken = violations(plan, inst.cluster, COST)
        if broken or abs(evaluate(plan, inst.cluster, COST).step_s - found.step_s) > REL * found.step_s:
            problems.append(f"oracle plan invalid or mis-scored: {broken[:1]}")
    problems += pool_bound_problems(inst)
    proven = proves_nothing_fits(inst)
    if proven and found is not None:
        problems.append(f"the fit proof says no plan fits, but the oracle has {found.step_s:.6f} s")
    small = max(inst.cluster.num_gpus, inst.model.num_layer_slots) <= EXACT_FORCED
    modes = {"default": {}, "stop": dict(exact_limit=0, stop_gap=STOP_GAP),
             **({"exact": dict(exact_limit=10**6, exact_max_layers=99)} if small else {})}
    default_s = coverage = None
    for mode, kw in modes.items():
        try:
            result = search(inst.model, inst.cluster, inst.training, cost=COST, **kw)
        except InfeasibleError as e:
            if found is not None:
                problems.append(f"{mode}: infeasible ({e}) but the oracle has {found.step_s:.6f} s")
            continue
        step = result.prediction.step_s
        if mode == "default":
            default_s, coverage = step, result.coverage
        if found is None:
            problems.append(f"{mode}: plan of {step:.6f} s where the oracle has none")
            continue
        broken = violations(result.plan, inst.cluster, COST)
        if broken or abs(evaluate(result.plan, inst.cluster, COST).step_s - step) > REL * step:
            problems.append(f"{mode}: plan invalid or mis-scored: {broken[:1]}")
        if step < found.step_s * (1 - REL):
            problems.append(f"{mode}: {step:.9f} s beats the oracle's {found.step_s:.9f} s")
        if result.coverage == "exact" and step > found.step_s * (1 + REL):
            problems.append(f"{mode}: exact coverage but {step:.9f} s against the optimum {found.step_s:.9f} s")
        held = in_coverage(found, result.coverage, inst.cluster)
        if held and result.lower_bound_s > found.step_s * (1 + REL):
            problems.append(f"{mode}: bound {result.lower_bound_s:.9f} s above the optimum {found.step_s:.9f} s "
                            f"({result.coverage})")
        if mode == "stop" and held and step > found.step_s * (1 + STOP_GAP) * (1 + REL):
            problems.append(f"stop: {step:.9f} s, more than {STOP_GAP:.0%} above the optimum {found.step_s:.9f} s "
                            f"({result.coverage})")
        if result.lower_bound_s > step * (1 + REL):
            problems.append(f"{mode}: bound {result.lower_bound_s:.9f} s above its own plan {step:.9f} s")
    return Outcome(problems, None if found is None else found.step_s, default_s, coverage, proven)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100, help="instances (fewer if --minutes runs out first)")
    ap.add_argument("--minutes", type=float, default=None, help="stop drawing after this long")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    start = time.perf_counter()
    done = bad = fit = optimal = proven = 0
    coverages: Counter[str] = Counter()
    for k in range(args.count):
        if args.minutes is not None and time.perf_counter() - start > 60 * args.minutes:
            break
        inst = draw(rng)
        out = check(inst)
        done += 1
        fit += out.optimum_s is not None
        proven += out.proven
        coverages[out.coverage or "none"] += 1
        optimal += out.optimum_s is not None and out.default_s is not None \
            and out.default_s <= out.optimum_s * (1 + REL)
        if out.problems:
            bad += 1
            print(f"instance {k}: {inst.describe()}", flush=True)
            for p in out.problems:
                print(f"  {p}", flush=True)
    print(f"seed {args.seed}: {done} instances, {fit} with a plan, {bad} with problems; the default search "
          f"returned the optimum on {optimal} of {fit}; {time.perf_counter() - start:.0f} s")
    print(f"the fit proof (planner.search.fit_proof) showed it for {proven} of the {done - fit} without a plan")
    print("default coverage: " + ", ".join(f"{name} {n}" for name, n in sorted(coverages.items())))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
