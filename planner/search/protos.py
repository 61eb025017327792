"""Split frontiers as a `BlocksProvider` holds them: one `Proto` per (A, C) point of a skeleton,
the stages of all of them in one flat `StageTable`.

Frontiers are computed in worker processes and handed to the parent as a `FrontierPart` of plain
arrays. As named tuples with nested (first, last) tuples per stage they took 0.07-0.12 s per
microbatch size to pickle at 64 GPUs and 0.17-0.22 s to unpickle in the parent, beside both
workers, and about 0.2 s to build in the worker (`solvers.frontier_table`). A proto's stages are
read only when a plan uses it (`stages_of`) or all at once as arrays (`stage_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from planner.search.space import BlockType
from solvers.batched_runs import Row, row_skeleton
from solvers.distinct import distinct
from solvers.frontier_table import FrontierTable
from solvers.partition import Split


class Proto(NamedTuple):
    """One split of a skeleton on its (A, C) frontier."""

    skeleton: tuple[BlockType, ...]
    a_s: float
    c_s: float
    at: int  # its first stage in the provider's `StageTable`; -1: a bound-only screen, no stages


_FIELDS = ("code", "option", "first", "last")


@dataclass(frozen=True)
class StageTable:
    """Stages of many protos, a proto's stages consecutive, first stage first."""

    code: np.ndarray  # the stage's block type, as an index into the provider's block types
    option: np.ndarray  # the stage's option, as an index into its block type's unpruned shapes
    first: np.ndarray  # first layer slot
    last: np.ndarray  # last layer slot

    def __len__(self) -> int:
        return len(self.code)

    def narrowed(self) -> StageTable:
        """The same table in int32 (block type codes, option indices and layer slots are small)."""
        return StageTable(*(getattr(self, f).astype(np.int32) for f in _FIELDS))

    @classmethod
    def concat(cls, tables: list[StageTable]) -> StageTable:
        if not tables:
            none = np.zeros(0, dtype=np.int64)
            return cls(none, none, none, none)
        return cls(*(np.concatenate([getattr(t, f) for t in tables]) for f in _FIELDS))


class FrontierPart(NamedTuple):
    """The split frontiers of one part of a microbatch size's rows (`BlocksProvider._proto_rows`):
    the points of each key (the uniform rows, then the general DP's skeletons) in order."""

    keys: list  # rows (`uniform` of them), then skeletons
    uniform: int
    counts: np.ndarray  # points per key
    a: np.ndarray
    c: np.ndarray
    start: np.ndarray  # each point's first stage in `stages` (and the end)
    stages: StageTable | None  # None: bound protos only, whose stages nobody reads
    truncated: bool  # the deadline left a general-DP skeleton without any split
    screens: dict[Row, Proto]  # bound-only protos of the cut rows, by row (`screens_of`)
    cut_short: bool  # the deadline cut the batched sweep short


def frontier_part(table: FrontierTable, general: list[tuple[tuple[BlockType, ...], Split]],
                  code_of: dict[BlockType, int], full_index: dict[BlockType, np.ndarray], truncated: bool,
                  screens: dict[Row, Proto], cut_short: bool, with_stages: bool) -> FrontierPart:
    """A part from the batched sweep's `table` and the general DP's (skeleton, split) pairs, with
    each stage's option mapped to its block type's unpruned shapes (`full_index[bt][o]`)."""
    keys: list = list(table.rows) + list(dict.fromkeys(sk for sk, _ in general))
    counts = np.concatenate([table.counts, _general_counts(general)]).astype(np.int64)
    a = np.concatenate([table.a, [sp.a_s for _, sp in general]])
    c = np.concatenate([table.c, [sp.c_s for _, sp in general]])
    lens = np.concatenate([np.diff(table.start), [len(sk) for sk, _ in general]]).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    stages = None
    if with_stages:
        kind_code = np.array([code_of[bt] for bt in table.keys], dtype=np.int64)
        option = table.option.copy()
        for x, bt in enumerate(table.keys):
            mine = table.kind == x
            option[mine] = full_index[bt][table.option[mine]]
        ours = StageTable(kind_code[table.kind], option, table.first, table.last)
        theirs = [(code_of[bt], int(full_index[bt][o]), first, last)
                  for sk, sp in general for bt, o, (first, last) in zip(sk, sp.options, sp.ranges)]
        cols = np.array(theirs, dtype=np.int64).reshape(-1, 4).T
        # a part crosses a pipe: half the bytes in int32
        stages = StageTable.concat([ours, StageTable(*cols)]).narrowed()
    return FrontierPart(keys, len(table.rows), counts, a, c, start, stages, truncated, screens, cut_short)


def _general_counts(general: list[tuple[tuple[BlockType, ...], Split]]) -> list[int]:
    counts: dict[tuple[BlockType, ...], int] = {}
    for sk, _ in general:
        counts[sk] = counts.get(sk, 0) + 1
    return list(counts.values())


def assemble(parts: list[FrontierPart], rows: Iterable[Row]) -> tuple[list[Proto], StageTable | None]:
    """Protos of every part in one fixed order (the uniform rows in `rows` order, then the general
    DP's skeletons, part by part), whatever the parts were, and their stages in one table (None
    where the parts have none)."""
    index: dict[Row, tuple[int, int]] = {}
    firsts, offsets = [], []
    offset = 0
    for k, part in enumerate(parts):
        index.update({row: (k, j) for j, row in enumerate(part.keys[:part.uniform])})
        firsts.append(np.concatenate([[0], np.cumsum(part.counts)]).tolist())
        offsets.append(offset)
        offset += 0 if part.stages is None else len(part.stages)
    cols = [(part.a.tolist(), part.c.tolist(), part.start.tolist()) for part in parts]
    has_stages = all(part.stages is not None for part in parts)
    out: list[Proto] = []

    def take(k: int, j: int, skeleton: tuple[BlockType, ...]) -> None:
        a, c, start = cols[k]
        off = offsets[k]
        for q in range(firsts[k][j], firsts[k][j + 1]):
            out.append(Proto(skeleton, a[q], c[q], off + start[q] if has_stages else -1))

    for row in rows:
        hit = index.get(row)
        if hit is not None:
            take(hit[0], hit[1], row_skeleton(row))
    for k, part in enumerate(parts):
        for j in range(part.uniform, len(part.keys)):
            take(k, j, part.keys[j])
    stages = StageTable.concat([p.stages for p in parts if p.stages is not None]) if has_stages else None
    return out, stages


def screens_of(table: FrontierTable, cut: list[Row], least: dict[Row, float | None]) -> dict[Row, Proto]:
    """Bound-only protos (no stages) for the rows a deadline cut short: every split of a row that
    its frontier did not reach has a smaller C than the last point found, so A at least that
    point's (the least A under a lower cap only grows) and C at least the row's least bottleneck
    (`least`, `batched_runs.batched_least_bottlenecks`)."""
    if not cut:
        return {}
    at = {row: i for i, row in enumerate(table.rows)}
    firsts = table.row_starts().tolist()
    a, c = table.a.tolist(), table.c.tolist()
    out = {}
    for row in cut:
        i = at.get(row)
        c_lb = least.get(row)
        if i is None or c_lb is None:
            continue
        q = max(range(firsts[i], firsts[i + 1]), key=lambda q: (a[q], -c[q]))
        if c_lb < c[q]:
            out[row] = Proto(row_skeleton(row), a[q], c_lb, -1)
    return out


def stages_of(proto: Proto, table: StageTable) -> list[tuple[int, int, int, int]]:
    """(block type code, option, first, last) of each stage of `proto`, first stage first."""
    lo, hi = proto.at, proto.at + len(proto.skeleton)
    return list(zip(table.code[lo:hi].tolist(), table.option[lo:hi].tolist(), table.first[lo:hi].tolist(),
                    table.last[lo:hi].tolist()))


def stage_rows(protos: list[Proto], table: StageTable) -> dict[int, np.ndarray]:
    """Per block type code, (proto, option, first, end) of every stage of `protos` of that type."""
    if not protos:
        return {}
    at = np.array([p.at for p in protos], dtype=np.int64)
    n = np.array([len(p.skeleton) for p in protos], dtype=np.int64)
    ends = np.cumsum(n)
    stage = np.repeat(at - (ends - n), n) + np.arange(int(ends[-1]))
    proto = np.repeat(np.arange(len(protos)), n)
    code = table.code[stage]
    out = {}
    for k in distinct(code).tolist():
        mine = code == k
        s = stage[mine]
        out[k] = np.stack([proto[mine], table.option[s], table.first[s], table.last[s] + 1], axis=1)
    return out
