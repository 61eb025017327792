"""Pipeline templates: an ordered sequence of stage device groups with an exact layer split.

A skeleton is the ordered list of block types (class, GPUs) of one pipeline. For each skeleton the
partition solver returns every non-dominated (A, C, E) split, where the pipeline time with m
microbatches is A + (m - 1)·C and E is its tail; each becomes a template. Skeletons are enumerated
completely when that is small ("exact" coverage: every ordered sequence of groups), otherwise as
sequences of at most `max_blocks` runs of identical groups ("blocks" coverage).
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from planner.search.space import BlockType, StageShape
from solvers.partition import StageOptions, split_frontier


@dataclass(frozen=True, slots=True)
class TemplateStage:
    cls: int
    shape: StageShape
    first: int
    last: int


class Template(NamedTuple):
    """One pipeline template. A named tuple: searches on mid-size pools build hundreds of thousands
    of them (every unit's bound and plan templates), and tuples are built several times faster
    than frozen dataclasses."""

    usage: tuple[int, ...]  # GPUs of each resource class
    a_s: float  # sum over stages of F+B per microbatch
    c_s: float  # bottleneck F+B
    e_s: float  # tail: exposed gradient sync + optimizer
    max_microbatches: int | None  # memory holds only up to this many microbatches (None: any)
    stages: tuple[TemplateStage, ...]
    skeleton: tuple | None = None  # bound templates: the skeleton they stand for (for refinement)
    proto: int | None = None  # plan templates of large pools: stages left empty, built from this
    #                           proto of their provider only when a plan uses them (`resolved`)

    def time_s(self, microbatches: int) -> float:
        return self.a_s + (microbatches - 1) * self.c_s


def count_sequences(types: list[BlockType], avail: tuple[int, ...], max_len: int, limit: int) -> int:
    """Ordered sequences of block types within the GPU counts, counted up to `limit`."""
    total = 0

    def walk(used: list[int], depth: int) -> None:
        nonlocal total
        if total > limit or depth == max_len:
            return
        for bt in types:
            if used[bt.cls] + bt.gpus <= avail[bt.cls]:
                used[bt.cls] += bt.gpus
                total += 1
                walk(used, depth + 1)
                used[bt.cls] -= bt.gpus

    walk([0] * len(avail), 0)
    return total


def count_run_skeletons(types: list[BlockType], avail: tuple[int, ...], max_len: int, runs: int) -> int:
    """How many skeletons of exactly `runs` runs (on pairwise different classes), at most `max_len`
    stages, `block_skeletons` would list (`run_skeleton_counts`)."""
    return run_skeleton_counts(types, avail, max_len, runs)[max_len]


def run_skeleton_counts(types: list[BlockType], avail: tuple[int, ...], max_len: int, runs: int) -> list[int]:
    """`count_run_skeletons` for every length cap 0..`max_len` at once: per ordered choice of run
    types, the run lengths k_i <= avail // gpus, whose generating polynomial (a product of
    truncated geometric series) gives the count of each total length; summed up to each cap.
    One pass instead of one per length (`units.mixed_lengths` asks for many: about a fifth
    of a 1,024-GPU search's setup); microbatch sizes with the same block types share it."""
    return list(_run_skeleton_counts(tuple(types), tuple(avail), max_len, runs))


@functools.lru_cache(maxsize=64)
def _run_skeleton_counts(types: tuple[BlockType, ...], avail: tuple[int, ...], max_len: int,
                         runs: int) -> tuple[int, ...]:
    caps = Counter(tuple(sorted(avail[bt.cls] // bt.gpus for bt in seq))
                   for seq in itertools.permutations(types, runs) if len({bt.cls for bt in seq}) == runs)
    total = np.zeros(max_len + 1, dtype=np.int64)
    for key, times in caps.items():
        total += times * _length_counts(key, max_len)
    return tuple(np.cumsum(total).tolist())


@functools.lru_cache(maxsize=4096)
def _length_counts(caps: tuple[int, ...], max_len: int) -> np.ndarray:
    """Coefficients of prod_i (x + x^2 + ... + x^caps[i]) up to x^max_len: how many ways run
    lengths 1 <= k_i <= caps[i] sum to each total (read-only: cached)."""
    poly = np.zeros(max_len + 1, dtype=np.int64)
    poly[0] = 1
    for cap in caps:
        step = np.zeros_like(poly)
        for k in range(1, min(cap, max_len) + 1):
            step[k:] += poly[:max_len + 1 - k]
        poly = step
    poly.flags.writeable = False
    return poly


def exact_skeletons(types: list[BlockType], avail: tuple[int, ...], max_len: int) -> list[tuple[BlockType, ...]]:
    out: list[tuple[BlockType, ...]] = []

    def walk(prefix: list[BlockType], used: list[int]) -> None:
        if prefix:
            out.append(tuple(prefix))
        if len(prefix) == max_len:
            return
        for bt in types:
            if used[bt.cls] + bt.gpus <= avail[bt.cls]:
                used[bt.cls] += bt.gpus
                prefix.append(bt)
                walk(prefix, used)
                prefix.pop()
                used[bt.cls] -= bt.gpus

    walk([], [0] * len(avail))
    return out


def block_skeletons(types: list[BlockType], avail: tuple[int, ...], max_len: int, max_blocks: int,
                    mixed_lens: dict[int, int] | None = None) -> tuple[tuple[BlockType, ...], ...]:
    """Sequences of at most `max_blocks` runs, each run `count` copies of one block type, the runs
    on pairwise different GPU classes; skeletons of r >= 2 runs have at most `mixed_lens[r]`
    stages (default `max_len`). Microbatch sizes with the same block types share one listing
    (`_skeletons`, computed once; read-only, a tuple)."""
    return _skeletons(tuple(types), tuple(avail), max_len, max_blocks, tuple(sorted((mixed_lens or {}).items())))


@functools.lru_cache(maxsize=16)
def _skeletons(types: tuple[BlockType, ...], avail: tuple[int, ...], max_len: int, max_blocks: int,
               mixed_lens: tuple[tuple[int, int], ...]) -> tuple[tuple[BlockType, ...], ...]:
    lens = dict(mixed_lens)
    out: list[tuple[BlockType, ...]] = []

    def walk(prefix: list[BlockType], used: list[int], blocks: int) -> None:
        if blocks == max_blocks:
            return
        limit = min(max_len, lens.get(blocks + 1, max_len)) if blocks else max_len
        seen = {b.cls for b in prefix}
        for bt in types:
            if bt.cls in seen:
                continue
            for count in itertools.count(1):
                if len(prefix) + count > limit or used[bt.cls] + count * bt.gpus > avail[bt.cls]:
                    break
                run = [bt] * count
                used[bt.cls] += count * bt.gpus
                out.append(tuple(prefix + run))
                walk(prefix + run, used, blocks + 1)
                used[bt.cls] -= count * bt.gpus

    walk([], [0] * len(avail), 0)
    # fewest runs first, shortest first: a deadline keeps the most useful ones
    return tuple(sorted(out, key=lambda sk: (len({bt for bt in sk}), len(sk), sk)))


def _memory_binds(positions: list[StageOptions]) -> bool:
    """True when some stage's feasibility depends on how many microbatches are in flight."""
    s = len(positions)
    for k, p in enumerate(positions):
        full = p.mem_fixed + (s - k) * p.act <= p.capacity
        one = p.mem_fixed + p.act <= p.capacity
        if not np.array_equal(full, one):
            return True
    return False


def skeleton_templates(skeleton: tuple[BlockType, ...], options: dict[BlockType, StageOptions],
                       shapes: dict[BlockType, list[StageShape]], num_classes: int) -> list[Template]:
    """Every non-dominated template of one skeleton, including variants that only fit memory when
    the pipeline runs fewer microbatches than it has stages."""
    positions = [options[bt] for bt in skeleton]
    usage = [0] * num_classes
    for bt in skeleton:
        usage[bt.cls] += bt.gpus
    caps: list[int | None] = [None]
    if len(skeleton) > 1 and _memory_binds(positions):
        caps += list(range(1, len(skeleton)))
    out = []
    for cap in caps:
        for split in split_frontier(positions, cap):
            stages = tuple(TemplateStage(bt.cls, shapes[bt][o], first, last)
                           for bt, o, (first, last) in zip(skeleton, split.options, split.ranges))
            out.append(Template(tuple(usage), split.a_s, split.c_s, split.e_s, cap, stages))
    return out


@functools.lru_cache(maxsize=1 << 16)  # asked once per template and refinement round
def skeleton_group(skeleton: tuple[BlockType, ...]) -> tuple[BlockType, ...]:
    """The batch a skeleton's frontier is computed in: its run types in order (the runs of
    `block_skeletons` are on pairwise different GPU classes, so these are its distinct types)."""
    return tuple(dict.fromkeys(skeleton))


def bound_key(t: Template) -> tuple:
    """What bound templates are pruned within: GPU usage and skeleton group. Refinement
    (`units.refine_unit`) replaces a group's templates whole with tighter ones; had a template of
    another group been pruned as dominated by one of them, it would be lost once their tails rise,
    and the bound with it (1 A100-80 + 2 L4, OPT-350M at 4k tokens, global batch 8: A100 -> L4 (tp 2)
    pruned by L4 (tp 2) -> A100, whose refined tails then lifted the bound above that plan)."""
    return (t.usage, skeleton_group(t.skeleton or ()))


def _usage(t: Template) -> tuple:
    return t.usage


def prune_templates(templates: list[Template], key: Callable[[Template], tuple] = _usage) -> list[Template]:
    """Drop templates dominated by another of the same `key` (default: GPU usage; bound templates
    that refinement will replace group by group: `bound_key`): A, C and E no larger and memory
    allowing at least as many microbatches. Never changes the optimum. Order is deterministic."""
    if all(t.max_microbatches is None for t in templates):
        keep = pareto_indices([key(t) for t in templates], [t.a_s for t in templates],
                              [t.c_s for t in templates], [t.e_s for t in templates])
        return [templates[i] for i in keep]
    groups: dict[tuple, list[Template]] = {}
    for t in templates:
        groups.setdefault(key(t), []).append(t)
    out: list[Template] = []
    for k in sorted(groups):
        group = sorted(groups[k], key=lambda t: (t.c_s, t.a_s, t.e_s, -(t.max_microbatches or 10**9)))
        if all(t.max_microbatches is None for t in group):
            out.extend(prune_templates(group, key))
            continue
        kept: list[Template] = []
        for t in group:
            tm = t.max_microbatches or 10**9
            if not any(k.a_s <= t.a_s and k.e_s <= t.e_s and (k.max_microbatches or 10**9) >= tm for k in kept):
                kept.append(t)
        out.extend(kept)
    return out


def pareto_indices(usage: list[tuple] | list[int], a: list[float], c: list[float], e: list[float]) -> list[int]:
    """Indices of the templates `prune_templates` keeps when no memory cap differs (given as plain
    columns, so callers build Template objects only for the kept ones): per key in `usage` (GPU
    usage, or `bound_key`), in order of (C, A, E), those not dominated in (A, E) by an earlier one.
    Keys come in sorted order (`pareto_keep` on their ranks)."""
    if not len(usage):
        return []
    rank = {u: i for i, u in enumerate(sorted(set(usage)))}
    keys = np.fromiter((rank[u] for u in usage), dtype=np.int64, count=len(usage))
    return pareto_keep(keys, np.asarray(a, dtype=float), np.asarray(c, dtype=float),
                       np.asarray(e, dtype=float)).tolist()


PARETO_LEVELS = 16  # `pareto_keep` sweeps once per distinct E of a key up to this many; above, a staircase


def pareto_keep(keys: np.ndarray, a: np.ndarray, c: np.ndarray, e: np.ndarray) -> np.ndarray:
    """`pareto_indices` on integer keys, as arrays: by (key, C, A, E, index), the templates no
    earlier one of the same key dominates in (A, E). Dominance is transitive, so "no earlier one"
    is "no earlier kept one". Within a key a template of the j-th smallest E is dominated iff the
    least A of the earlier ones with one of the j smallest E is at most its A: one running minimum
    per level j over the sorted templates (keys kept apart by offsets on A's ranks, integers, so
    no float is rounded). Bound templates have one E per skeleton, one level on the 64-GPU
    ladder rung: 1-2 ms for 10,000 templates, where walking a staircase template by template took
    8 ms. Keys with more levels than `PARETO_LEVELS` take the staircase (`_staircase_keep`)."""
    n = len(keys)
    order = np.lexsort((np.arange(n), e, a, c, keys))
    k, big_a, big_e = keys[order], a[order], e[order]
    group = np.cumsum(np.concatenate([[True], k[1:] != k[:-1]])) - 1
    groups = int(group[-1]) + 1 if n else 0
    e_rank = np.unique(big_e, return_inverse=True)[1].astype(np.int64)
    pair = group * (int(e_rank.max()) + 1 if n else 1) + e_rank
    pairs, level = np.unique(pair, return_inverse=True)
    level = level - np.searchsorted(pairs, group * (int(e_rank.max()) + 1 if n else 1))  # j within its key
    levels = int(level.max()) + 1 if n else 0
    if levels > PARETO_LEVELS:
        return order[_staircase_keep(group, big_a, big_e)]
    value = np.unique(big_a, return_inverse=True)[1].astype(np.int64) + (groups - 1 - group) * n
    top = np.iinfo(np.int64).max
    dominated = np.zeros(n, dtype=bool)
    for j in range(levels):
        least = np.minimum.accumulate(np.where(level <= j, value, top))
        before = np.concatenate([[top], least[:-1]])
        dominated |= (level == j) & (before <= value)
    return order[~dominated]


def _staircase_keep(group: np.ndarray, a: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Positions kept of templates sorted by (key, C, A, E): per key the kept ones so far summed up
    by their staircase, A ascending and E strictly descending (each step the least E of any kept
    template with at most that A), searched by bisection; a kept template drops the steps it
    dominates."""
    out: list[int] = []
    prev = -1
    stair_a: list[float] = []
    stair_e: list[float] = []
    for i, (g, ai, ei) in enumerate(zip(group.tolist(), a.tolist(), e.tolist())):
        if g != prev:
            prev, stair_a, stair_e = g, [], []
        k = bisect.bisect_right(stair_a, ai)
        if k and stair_e[k - 1] <= ei:
            continue  # an earlier template has A and E no larger
        out.append(i)
        j = k  # the steps from k on have a larger A; those with E >= ei are now dominated
        while j < len(stair_a) and stair_e[j] >= ei:
            j += 1
        stair_a[k:j] = [ai]
        stair_e[k:j] = [ei]
    return np.asarray(out, dtype=np.int64)


@dataclass(frozen=True)
class PackedTemplates:
    """A template list as columns, to hand between processes: the thousands of bound templates a
    solved unit keeps for its refinement pickle as a few arrays instead of as objects (64 GPUs:
    about 0.8 MB per batch of two units, 0.04-0.12 s to unpickle as objects). `unpack` gives back
    templates equal to the packed ones."""

    usage: np.ndarray  # (n, classes)
    times: np.ndarray  # (n, 3): a_s, c_s, e_s
    max_microbatches: np.ndarray  # -1: None
    proto: np.ndarray  # -1: None
    skeleton: np.ndarray  # index into `skeletons`, -1: None
    skeletons: list[tuple]
    stages: list[tuple[TemplateStage, ...]] | None  # None: every template has none

    @classmethod
    def of(cls, templates: list[Template]) -> PackedTemplates:
        index: dict[tuple, int] = {}
        n = len(templates)
        sk = [-1 if t.skeleton is None else index.setdefault(t.skeleton, len(index)) for t in templates]
        width = len(templates[0].usage) if templates else 0
        # np.fromiter over flat iterables: several times faster than np.array on nested tuples
        return cls(np.fromiter(itertools.chain.from_iterable(t.usage for t in templates), dtype=np.int64,
                               count=n * width).reshape(n, width),
                   np.fromiter(itertools.chain.from_iterable((t.a_s, t.c_s, t.e_s) for t in templates), dtype=float,
                               count=3 * n).reshape(n, 3),
                   np.fromiter((-1 if t.max_microbatches is None else t.max_microbatches for t in templates),
                               dtype=np.int64, count=n),
                   np.fromiter((-1 if t.proto is None else t.proto for t in templates), dtype=np.int64, count=n),
                   np.array(sk, dtype=np.int64), list(index),
                   [t.stages for t in templates] if any(t.stages for t in templates) else None)

    def __len__(self) -> int:
        return len(self.proto)

    def replaced(self, covered: set[tuple], new: PackedTemplates) -> PackedTemplates:
        """These templates without those of the skeleton groups `covered` (`skeleton_group`),
        merged with `new`: the columns of `heapq.merge(kept, new, key=bound_key)` over the
        template lists, both in `bound_key` order already (on equal keys these first), without
        building a template. Skeletons no template keeps are dropped."""
        groups = [skeleton_group(sk) for sk in self.skeletons] + [()]  # index -1: no skeleton
        new_groups = [skeleton_group(sk) for sk in new.skeletons] + [()]
        rank = {g: r for r, g in enumerate(sorted(set(groups) | set(new_groups)))}
        keep = ~np.array([g in covered for g in groups])[self.skeleton]
        n_old = len(self.skeletons)
        sk = np.concatenate([self.skeleton[keep], np.where(new.skeleton < 0, -1, new.skeleton + n_old)])
        grank = np.concatenate([np.array([rank[g] for g in groups])[self.skeleton[keep]],
                                np.array([rank[g] for g in new_groups])[new.skeleton]])
        usage = np.concatenate([self.usage[keep], new.usage.reshape(len(new), self.usage.shape[1])])
        source = np.repeat([0, 1], [int(keep.sum()), len(new)])
        # the merge's order: key (usage, then group), then the list it came from, then its place there
        order = np.lexsort((np.arange(len(sk)), source, grank, *usage.T[::-1]))  # the last key sorts first
        used, sk_new = np.unique(sk[sk >= 0], return_inverse=True)
        remap = np.full(len(sk), -1)
        remap[sk >= 0] = sk_new
        skeletons = [*self.skeletons, *new.skeletons]
        stages = None
        if self.stages is not None or new.stages is not None:
            mine = self.stages if self.stages is not None else [()] * len(self)
            theirs = new.stages if new.stages is not None else [()] * len(new)
            joined = [st for st, k in zip(mine, keep.tolist()) if k] + list(theirs)
            stages = [joined[i] for i in order.tolist()]
        return PackedTemplates(usage[order], np.concatenate([self.times[keep], new.times.reshape(len(new), 3)])[order],
                               np.concatenate([self.max_microbatches[keep], new.max_microbatches])[order],
                               np.concatenate([self.proto[keep], new.proto])[order], remap[order],
                               [skeletons[k] for k in used.tolist()], stages)

    def unpack(self) -> list[Template]:
        n = len(self.proto)
        stages = self.stages if self.stages is not None else [()] * n
        skeletons = [*self.skeletons, None]  # index -1: None
        return [Template(tuple(u), a, c, e, None if m < 0 else m, st, skeletons[k], None if p < 0 else p)
                for u, (a, c, e), m, st, k, p in zip(self.usage.tolist(), self.times.tolist(),
                                                     self.max_microbatches.tolist(), stages,
                                                     self.skeleton.tolist(), self.proto.tolist())]
