"""Template providers: what pipelines the assignment problem may choose from, for one microbatch size
and one replica class [lo, hi], as two sets: templates to build plans from, and optimistic templates
whose assignment optimum is a lower bound for every plan of the covered space.

* `ExactProvider` (`exact_provider`, small pools): every ordered sequence of stage groups.
* `BlocksProvider` (large pools): pipelines of at most three runs of identical groups of pairwise
  different GPU classes; the (A, C) frontier is computed once per microbatch size (it does not
  depend on the replica count) and each template's tail is re-costed per class. The bound uses, per skeleton, the
  least tail any split can have, so it holds for every plan of that space; memory assumes each
  pipeline runs at least as many microbatches as it has stages.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from planner.costmodel.base import CostModel
from planner.search.bounds import fluid_work, weighted_work_bound_s
from planner.search.options import OptionCosting, pruned_options, shared_bases
from planner.search.provider_options import Options, ProviderOptions
from planner.search.protos import (FrontierPart, Proto, StageTable, assemble, frontier_part, screens_of, stage_rows,
                                   stages_of)
from planner.search.space import BlockType, ResourceClass, StageShape, skeleton_usage
from planner.search.tail_levels import TailLevels
from planner.search.tail_plans import TailPlans
from planner.search.templates import (PackedTemplates, Template, TemplateStage, block_skeletons, pareto_indices,
                                      pareto_keep, prune_templates, skeleton_group)
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec
from solvers.batched_runs import (Row, RowCodes, batched_least_bottlenecks, coded_min_max_tails, row_skeleton,
                                  skeleton_row)
from solvers.frontier_table import batched_frontier_table
from solvers.horizon import Horizon
from solvers.partition import Split, min_max_tail, split_frontier
from solvers.uniform_layers import INF, Budget, full_options, least_a, uniform_view

@dataclass
class ProviderStats:
    skeletons: int = 0
    pruned: int = 0


def skeleton_rows(skeletons: Sequence[tuple[BlockType, ...]]) -> dict[tuple[BlockType, ...], list[Row]]:
    """Per group (a skeleton's run types in order, `TailLevels.skeleton_group`), the rows (runs
    as (type, count) pairs, `batched_runs.skeleton_row`) of its skeletons, sorted by counts;
    groups in first-seen order (homogeneous ones first, as `block_skeletons` lists them). One
    listing shared by several microbatch sizes (`templates.block_skeletons`) is grouped once."""
    kept = _ROWS_OF.get(id(skeletons))
    if kept is not None and kept[0] is skeletons:
        return kept[1]
    out: dict[tuple[BlockType, ...], set[Row]] = {}
    for sk in skeletons:
        row = skeleton_row(sk)
        out.setdefault(row[0::2], set()).add(row)
    rows = {g: sorted(rows, key=lambda r: r[1::2]) for g, rows in out.items()}
    if isinstance(skeletons, tuple):  # immutable: its grouping holds as long as it lives (kept here)
        if len(_ROWS_OF) >= 8:
            _ROWS_OF.pop(next(iter(_ROWS_OF)))
        _ROWS_OF[id(skeletons)] = (skeletons, rows)
    return rows


_ROWS_OF: dict[int, tuple[tuple, dict]] = {}  # `skeleton_rows` of the last few skeleton tuples, by identity


def coverage_name(max_blocks: int, mixed_lens: dict[int, int], num_slots: int) -> str:
    """'blocks<=B', with ',mixed<=K' when pipelines of two runs are limited to K stages (those of
    three runs never are: `units.mixed_lengths`)."""
    if max_blocks >= 2 and mixed_lens.get(2, num_slots) < num_slots:
        return f"blocks<={max_blocks},mixed<={mixed_lens[2]}"
    return f"blocks<={max_blocks}"


class BlocksProvider(ProviderOptions, TailLevels, TailPlans):
    def __init__(self, cost: CostModel, model: ModelSpec, training: TrainingSpec, classes: list[ResourceClass],
                 shapes: dict[BlockType, list[StageShape]], avail: tuple[int, ...], micro_batch: int,
                 single_node: bool, max_blocks: int = 3, deadline: float | None = None,
                 mixed_lens: dict[int, int] | None = None, bound_blocks: int | None = None) -> None:
        self.cost, self.model, self.training, self.classes = cost, model, training, classes
        self.shapes, self.micro_batch, self.single_node = shapes, micro_batch, single_node
        # pipelines of more runs than `bound_blocks` are plan templates only: candidates the bound
        # does not cover (see `api.search`), so the coverage names the bound's space
        self.bound_blocks = min(max_blocks, bound_blocks or max_blocks)
        self.coverage = coverage_name(self.bound_blocks, mixed_lens or {}, model.num_layer_slots)
        self.skeletons = block_skeletons(list(shapes), avail, model.num_layer_slots, max_blocks, mixed_lens)
        self.stats = ProviderStats(skeletons=len(self.skeletons))
        self.deadline = deadline
        # the deadline left some skeleton (of the general DP) without any split: no bound from
        # here (rows of the batched sweep it cuts short keep a bound, `protos.screens_of`)
        self.truncated = False
        self.cut_short = False  # the deadline cut some frontier short: plans from here are poorer
        r_all = max(1, sum(avail))
        self._r_lb = 1 if training.zero == 0 else r_all
        self._full: dict[int, dict[BlockType, Options]] = {}
        self._uniform: dict[BlockType, bool] = {}
        self._plan_protos: list[Proto] | None = None  # computed on first use (best-first search
        self._lb_protos: list[Proto] | None = None  # may never need this microbatch size)
        self._plan_screens: list[Proto] = []  # bound-only protos of the plan protos' cut rows
        self._plan_table: StageTable | None = None  # the plan protos' stages
        self._block_types = list(shapes)  # a stage table's block type codes index this
        self._code = {bt: k for k, bt in enumerate(self._block_types)}
        self._zero: PackedTemplates | None = None
        self._relaxed: list[Template] | PackedTemplates | None = None
        self._stage_index: dict[BlockType, np.ndarray] | None = None
        self._cells_of: dict[BlockType, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # see _stage_cells
        self._plan_use: list[tuple[int, ...]] | None = None  # see _plan_usage
        self._plan_stages: dict[int, tuple[TemplateStage, ...]] = {}  # see _template_stages
        self._class_levels: dict[tuple[int, int], tuple[dict, dict, dict]] = {}  # the class last refined
        self._rows: dict[tuple[BlockType, ...], list[Row]] | None = None
        self._base_views: dict[BlockType, object] = {}  # uniform views of the bound protos' options
        self._lb_meta: tuple | None = None  # see _lb_index
        self._lb_keys = np.zeros(0, dtype=np.int64)  # see _lb_index
        self._lb_usage = np.zeros((0, len(classes)), dtype=np.int64)  # see _lb_index
        self._lb_cols: tuple[np.ndarray, np.ndarray] | None = None  # see _lb_arrays
        self._lb_row_cache: tuple | None = None  # see _lb_rows
        self._groups: dict | None = None  # see _group_skeletons
        self._ac: dict[str, tuple[list[float], list[float]]] = {}  # see _columns
        self._tails: dict[tuple[int, int], dict[BlockType, Options]] = {}  # see _tail_options
        self._costing: dict[BlockType, OptionCosting] | None = None  # see _options
        self._horizon_at: Horizon | None = None  # see _horizon
        self._a_max = INF  # see cap_pipeline_time
        self.bound_rounds: int | None = None  # see sweep_bound_first

    @property
    def rows(self) -> dict[tuple[BlockType, ...], list[Row]]:
        """The skeletons' rows per group (`skeleton_rows`, computed once)."""
        if self._rows is None:
            self._rows = skeleton_rows(self.skeletons)
        return self._rows

    @property
    def plan_protos(self) -> list[Proto]:
        if self._plan_protos is None:
            parts = [self._proto_rows(1, 0, 1)]
            self._plan_protos, self._plan_table = self._assemble(parts)
            self._plan_screens = self._screens(parts)
        return self._plan_protos

    @property
    def lb_protos(self) -> list[Proto]:
        """The bound's protos: the plan protos (or, with ZeRO, those with memory for every
        replica), and a bound-only proto (no stages) per row a deadline cut short (`protos.screens_of`)."""
        if self._lb_protos is None:
            if self.bound_rounds is not None:
                self._set_lb_protos([self._proto_rows(self._r_lb, 0, 1, False, self.bound_rounds)])
            else:
                self._set_lb_protos(None if self._r_lb == 1 else [self._proto_rows(self._r_lb, 0, 1, False)])
        return self._lb_protos

    def sweep_bound_first(self, rounds: int) -> None:
        """The bound's protos from the sweep's first `rounds` rounds, each row cut there bounded by
        its screen (`protos.screens_of`); the plans' frontiers swept whole when first asked for, in
        the process that asks (`plan_protos`). docs/search.md, "Bound-first sweeps"."""
        self.bound_rounds = rounds

    def _set_lb_protos(self, parts: list[FrontierPart] | None) -> None:
        """The bound's protos from the plan protos (`parts` None) or from `parts` (with ZeRO: memory
        for every replica), each with its screens; of at most `bound_blocks` runs."""
        if parts is None:
            plan = self.plan_protos  # computed first: it sets the screens too
            self._lb_protos = self._bounded(plan + self._plan_screens)
        else:
            self._lb_protos = self._bounded(self._assemble(parts)[0] + self._screens(parts))

    def _bounded(self, protos: list[Proto]) -> list[Proto]:
        """The protos the bound covers: of at most `bound_blocks` runs."""
        if all(len(g) <= self.bound_blocks for g in self.rows):
            return protos
        return [p for p in protos if len(self.skeleton_group(p.skeleton)) <= self.bound_blocks]

    @property
    def needs_frontiers(self) -> bool:
        """Whether even the cheap bound needs every split frontier (some skeleton mixes runs)."""
        return any(len(set(sk)) > 1 for sk in self.skeletons)

    def frontier_part(self, part: int, parts: int) -> tuple:
        """Split frontiers of every `parts`-th uniform skeleton row from `part` (and, in part 0,
        of the skeletons the general DP solves), to hand from a worker process to the parent
        (`adopt_frontier_parts`), and in part 0 the option costing's bases (`OptionCosting.basis`);
        the stage options themselves are rebuilt from those there (cheaper than pickling them)."""
        if self.bound_rounds is not None:  # the bound's protos only (`sweep_bound_first`)
            plan, lb = None, self._proto_rows(self._r_lb, part, parts, False, self.bound_rounds)
        else:
            plan = self._proto_rows(1, part, parts)
            lb = None if self._r_lb == 1 else self._proto_rows(self._r_lb, part, parts, False)
        # part 0 also hands back the option costing's bases: the unit workers, forked from the
        # parent later, then inherit them instead of each rebuilding every block type's (about
        # 0.1 s per worker and microbatch size at 64 GPUs)
        bases = None
        if part == 0 and self._costing:
            bases = shared_bases({bt: c.basis for bt, c in self._costing.items()})
        return plan, lb, self._uniform, bases

    def adopt_frontier_parts(self, states: list[tuple]) -> None:
        """Take the frontiers of all parts (`frontier_part`, in part order)."""
        for _, _, uniform, bases in states:
            self._uniform.update(uniform)
            if bases is not None and self._costing is None:
                self._build_costing(bases)
        if self.bound_rounds is not None:  # plans' frontiers when first asked for (`sweep_bound_first`)
            self._plan_protos, self._plan_table, self._plan_screens = None, None, []
            self._set_lb_protos([st[1] for st in states])
        else:
            plan_parts = [st[0] for st in states]
            self._plan_protos, self._plan_table = self._assemble(plan_parts)
            self._plan_screens = self._screens(plan_parts)
            self._set_lb_protos(None if self._r_lb == 1 else [st[1] for st in states])
        self._ac = {}
        self._lb_cols = None
        self._plan_use = None
        self._plan_stages = {}
        self._stage_index = None
        self._cells_of = {}
        self._lb_meta = None
        self._lb_row_cache = None

    def relaxed_templates(self) -> list[Template] | PackedTemplates:
        """Cheap optimistic templates, before any frontier: per homogeneous skeleton of uniform
        layers (A_min, A_min / S, tail 0), with A_min the least A of any memory-feasible split;
        every split of it has A >= A_min and C >= A / S. Other skeletons need their frontier, so
        then this is `zero_tail_templates()`."""
        if self._relaxed is not None:
            return self._relaxed
        if any(len(set(sk)) > 1 for sk in self.skeletons):
            self._relaxed = self.zero_tail_templates()
            return self._relaxed
        full = self._full_options(self._r_lb)
        n_cls = len(self.classes)
        out = []
        for (bt,), rows in self.rows.items():
            view = uniform_view(full[bt])
            if view is None:
                self._relaxed = self.zero_tail_templates()
                return self._relaxed
            for s, a in least_a(view, [k for _, k in rows]).items():
                if a is not None:
                    out.append(Template(skeleton_usage((bt,) * s, n_cls), a, a / s, 0.0, None, ()))
        self._relaxed = prune_templates(out)
        return self._relaxed

    def _assemble(self, parts: list[FrontierPart]) -> tuple[list[Proto], StageTable | None]:
        """Protos of every part (`_proto_rows`) in one fixed order (homogeneous rows, two-run
        rows, then the general-DP skeletons), whatever the parts were, and their stages."""
        for part in parts:
            self.truncated = self.truncated or part.truncated
            self.cut_short = self.cut_short or part.cut_short
        out, stages = assemble(parts, (row for group_rows in self.rows.values() for row in group_rows))
        return out, stages

    def _screens(self, parts: list[FrontierPart]) -> list[Proto]:
        """The bound-only protos of every part (`protos.screens_of`), in row order."""
        screens: dict[tuple, Proto] = {}
        for part in parts:
            screens.update(part.screens)
        if not screens:
            return []
        return [screens[row] for group_rows in self.rows.values() for row in group_rows if row in screens]

    def _proto_rows(self, r_mem: int, part: int, parts: int, with_stages: bool = True,
                    rounds: int | None = None) -> FrontierPart:
        """Protos of every `parts`-th uniform skeleton row from `part`, by row; in part 0 also
        those of the skeletons the general DP solves; and what the deadline (or, with `rounds`,
        that many rounds of the sweep) cut short. Without `with_stages` (bound protos) the part
        keeps their A and C only."""
        full = self._full_options(r_mem)
        used = list(dict.fromkeys(bt for g in self.rows for bt in g))
        # uniform on every option (checked on the unpruned arrays) implies uniform on any subset
        for bt in used:
            if bt not in self._uniform:
                self._uniform[bt] = self._costings()[bt].uniform
        opts, _, keep = pruned_options(full, self.shapes, use_tail=False, uniform=self._uniform)
        budget = Budget(self.deadline, rounds=rounds)  # past it, each skeleton keeps its least-A split only
        views = {bt: uniform_view(opts[bt], trusted=True) if self._uniform[bt] else None for bt in used}
        # identical decoder layers: every skeleton of uniform types in one batched sweep
        rows = [row for g, group_rows in self.rows.items() if all(views[bt] is not None for bt in g)
                for row in group_rows]
        live = {bt: v for bt, v in views.items() if v is not None}
        table = batched_frontier_table(live, rows[part::parts], budget, self._horizon())
        screens = screens_of(table, budget.cut, batched_least_bottlenecks(live, budget.cut) if budget.cut else {})
        general: list[tuple[tuple[BlockType, ...], Split]] = []
        truncated = False  # a skeleton left without any split: only the fluid bound covers it
        for sk in self.skeletons if part == 0 else ():
            if all(views.get(bt) is not None for bt in set(sk)):
                continue
            if self.deadline is not None and time.perf_counter() > self.deadline:
                truncated = True
                break
            general.extend((sk, split) for split in split_frontier([full_options(opts[bt]) for bt in sk],
                                                                   with_tail=False))
        full_index = {bt: np.asarray(keep[bt], dtype=np.int64) for bt in keep}
        return frontier_part(table, general, self._code, full_index, truncated, screens, budget.hit, with_stages)

    def _horizon(self) -> Horizon:
        """Every plan's pipeline time is at least a work bound (`bounds.weighted_work_bound_s`):
        the split frontiers, and refinement's tail-capped level frontiers, need only the splits
        some plan at such a time can gain from (`solvers.horizon.Horizon`). Computed once."""
        if self._horizon_at is not None:
            return self._horizon_at
        shapes = [(bt.cls, shape) for bt, shapes in self.shapes.items() for shape in shapes]
        work = fluid_work(self.cost, self.model, self.training, self.classes, shapes, self.micro_batch)
        gpus = np.array([rc.gpus for rc in self.classes], dtype=float)
        microbatches = self.training.global_batch // self.micro_batch
        self._horizon_at = Horizon(weighted_work_bound_s(work, gpus, microbatches), microbatches, self._a_max)
        return self._horizon_at

    def cap_pipeline_time(self, a_max: float) -> None:
        """Leave out of the frontiers swept from now on every split whose A is above `a_max`: a
        plan's step less the step overhead, so no plan using one is faster than that plan
        (`solvers.horizon.Horizon`). Frontiers already swept keep theirs (more splits than
        needed, never fewer)."""
        self._a_max = a_max
        if self._horizon_at is not None:
            self._horizon_at = replace(self._horizon_at, a_max=a_max)

    def _lb_index(self) -> tuple[list[tuple[BlockType, ...]], np.ndarray, list[tuple[int, ...]]]:
        """The bound protos' distinct skeletons, each proto's skeleton index and GPU usage (computed
        once: hashing long skeleton tuples per proto and class was a hot spot)."""
        if self._lb_meta is None:
            index: dict[tuple[BlockType, ...], int] = {}
            of = [index.setdefault(p.skeleton, len(index)) for p in self.lb_protos]
            skeletons = list(index)
            usage = [skeleton_usage(sk, len(self.classes)) for sk in skeletons]
            group = [skeleton_group(sk) for sk in skeletons]
            # each proto's pruning key (`_lb_packed`), the same for every replica class: the rank
            # of its (usage, skeleton group) among the distinct ones, so that `pareto_keep` sorts
            # ints, in the same order, instead of nested tuples of block types
            by_skeleton = [(usage[k], group[k]) for k in range(len(skeletons))]
            rank = {key: i for i, key in enumerate(sorted(set(by_skeleton)))}
            at = np.array(of, dtype=np.int64)
            self._lb_keys = np.array([rank[key] for key in by_skeleton], dtype=np.int64)[at]
            self._lb_usage = np.array(usage, dtype=np.int64).reshape(len(skeletons), len(self.classes))[at]
            self._lb_meta = (skeletons, at, [usage[k] for k in of])
        return self._lb_meta

    def _lb_tails(self, tails: dict[BlockType, Options]) -> np.ndarray:
        """Per bound proto, the least possible largest stage tail of its skeleton over every
        memory-feasible split (fast for homogeneous ones; +inf where none fits). Memory feasibility
        comes from the bound protos' options (optimizer states sharded over the most replicas: the
        most permissive), tails from `tails`, so it bounds the tail of every split the proto
        stands for."""
        opts = self._with_tails(self._r_lb, tails, list(tails))
        views = {bt: self._tail_view(bt, o.tail) for bt, o in opts.items()}
        keys = [bt for bt, v in views.items() if v is not None]
        codes, row_of = self._lb_rows(keys)
        least = coded_min_max_tails([views[k] for k in keys], codes).tolist() if codes.live else []
        skeletons, of, _ = self._lb_index()
        per_skeleton = [least[m] if m >= 0 else min_max_tail([full_options(opts[bt]) for bt in sk])
                        for sk, m in zip(skeletons, row_of)]
        return np.array([INF if t is None else t for t in per_skeleton], dtype=float)[of]

    def _lb_rows(self, keys: list[BlockType]) -> tuple[RowCodes, list[int]]:
        """The uniform skeletons' rows over block types `keys` (coded once), and per distinct bound
        skeleton its row, or -1 (then the general DP gives its least tail)."""
        if self._lb_row_cache is None or self._lb_row_cache[0] != keys:
            have = set(keys)
            rows = [row for g, group_rows in self.rows.items()
                    if have.issuperset(g) and len(g) <= self.bound_blocks for row in group_rows]
            codes = RowCodes.of(keys, rows, self.model.num_layer_slots)
            at = {row_skeleton(row): i for i, row in enumerate(codes.live)}
            self._lb_row_cache = (keys, codes, [at.get(sk, -1) for sk in self._lb_index()[0]])
        return self._lb_row_cache[1], self._lb_row_cache[2]

    def _lb_packed(self, tails: dict[BlockType, Options]) -> PackedTemplates:
        """The bound protos with their skeleton's least tail (None-tailed ones dropped), pruned,
        as columns (equal to `PackedTemplates.of` of the templates: a unit's solve reads its bound
        templates as arrays and hands them to the parent so; building each as an object, then
        the LP's arrays and the packed columns from the objects, was 15 % of a unit's solve)."""
        skeletons, of, _ = self._lb_index()
        e = self._lb_tails(tails)
        live = np.flatnonzero(e < INF)
        a, c = self._lb_arrays()
        # pruned within (usage, skeleton group) only: refinement replaces groups whole (`bound_key`)
        keep = live[pareto_keep(self._lb_keys[live], a[live], c[live], e[live])]
        kept = of[keep]
        # skeletons numbered in order of first appearance, as `PackedTemplates.of` numbers them
        distinct, first, back = np.unique(kept, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        none = np.full(len(keep), -1, dtype=np.int64)
        return PackedTemplates(self._lb_usage[keep], np.column_stack([a[keep], c[keep], e[keep]]), none, none.copy(),
                               rank[back], [skeletons[k] for k in distinct[order].tolist()], None)

    def _lb_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """A and C of every bound proto as arrays (computed once per frontier); `_lb_index` is
        computed too, and with it `_lb_usage`."""
        if self._lb_cols is None:
            self._lb_index()
            protos = self.lb_protos
            self._lb_cols = (np.fromiter((p.a_s for p in protos), dtype=float, count=len(protos)),
                             np.fromiter((p.c_s for p in protos), dtype=float, count=len(protos)))
        return self._lb_cols

    def _columns(self, which: str) -> tuple[list[float], list[float]]:
        """A and C of every "plan" or "lb" proto as plain lists (computed once per frontier)."""
        if which not in self._ac:
            protos = self.plan_protos if which == "plan" else self.lb_protos
            self._ac[which] = ([p.a_s for p in protos], [p.c_s for p in protos])
        return self._ac[which]

    def zero_tail_templates(self) -> PackedTemplates:
        """The bound templates with every tail set to 0: their assignment optimum bounds every plan
        of this microbatch size whatever its replica count (tails are >= 0, memory as for r_all).
        As columns (`prune_templates` of the templates, by GPU usage, without building them)."""
        if self._zero is None:
            a, c = self._lb_arrays()
            keys = np.unique(self._lb_usage, axis=0, return_inverse=True)[1].reshape(-1)  # ranks of usage tuples
            keep = pareto_keep(keys, a, c, np.zeros(len(a)))
            none = np.full(len(keep), -1, dtype=np.int64)
            times = np.column_stack([a[keep], c[keep], np.zeros(len(keep))])
            self._zero = PackedTemplates(self._lb_usage[keep], times, none, none.copy(), none.copy(), [], None)
        return self._zero

    def templates(self, lo: int, hi: int) -> tuple[list[Template], list[Template]]:
        """Plan templates and bound templates for the class [lo, hi] (`plan_templates`,
        `bound_templates`)."""
        return self.plan_templates(lo), self.bound_templates(lo, hi)

    def plan_templates(self, replicas: int) -> list[Template]:
        """Every plan proto with its tail costed for `replicas` pipelines, pruned; stages are
        filled in only for the templates a plan uses (`resolved`)."""
        e_plan = self._plan_tails(replicas, replicas).tolist()
        usage = self._plan_usage()
        a, c = self._columns("plan")
        keep = pareto_indices(usage, a, c, e_plan)
        self.stats.pruned += len(usage) - len(keep)
        return [Template(usage[i], a[i], c[i], e_plan[i], None, (), None, i) for i in keep]

    def bound_templates(self, lo: int, hi: int) -> list[Template]:
        """Optimistic templates for the class [lo, hi] (`bound_set`'s, as objects)."""
        return self.bound_set(lo, hi).unpack()

    def bound_set(self, lo: int, hi: int) -> PackedTemplates:
        """Optimistic templates for the class [lo, hi]: per bound proto its skeleton's least
        tail (sync for `lo` pipelines, optimizer states sharded over `hi` with ZeRO), pruned; as
        columns."""
        return self._lb_packed(self._tail_options(lo, hi if self.training.zero else lo))

    def _plan_usage(self) -> list[tuple[int, ...]]:
        """GPU usage of every plan proto (computed once, per distinct skeleton)."""
        if self._plan_use is None:
            index: dict[tuple[BlockType, ...], tuple[int, ...]] = {}
            n_cls = len(self.classes)
            self._plan_use = [index[p.skeleton] if p.skeleton in index
                              else index.setdefault(p.skeleton, skeleton_usage(p.skeleton, n_cls))
                              for p in self.plan_protos]
        return self._plan_use

    def resolved(self, t: Template) -> Template:
        """A plan template with its stages (`templates` leaves them out: most templates are
        never part of a plan)."""
        return t if t.proto is None or t.stages else t._replace(stages=self._template_stages(t.proto))

    def _template_stages(self, i: int) -> tuple[TemplateStage, ...]:
        """Stages of plan proto i (built when a plan first uses it)."""
        if i not in self._plan_stages:
            p = self.plan_protos[i]
            assert self._plan_table is not None
            self._plan_stages[i] = tuple(TemplateStage(bt.cls, self.shapes[bt][o], first, last)
                                         for bt, (_, o, first, last) in zip(p.skeleton, stages_of(p, self._plan_table)))
        return self._plan_stages[i]

    def _stage_rows(self) -> dict[BlockType, np.ndarray]:
        """Per block type, (proto, option, first, end) of every plan proto stage using it."""
        if self._stage_index is None:
            protos = self.plan_protos
            assert self._plan_table is not None
            self._stage_index = {self._block_types[k]: v for k, v in stage_rows(protos, self._plan_table).items()}
        return self._stage_index

    def _plan_tails(self, r_sync: int, r_mem: int) -> np.ndarray:
        """Largest stage tail of every plan proto, costed for `r_sync` / `r_mem` replicas (one
        gather per block type; of identical layers on the plan stages' own ranges only,
        `OptionCosting.tails_at`)."""
        out = np.full(len(self.plan_protos), -np.inf)
        costing = self._costings()
        for bt, idx in self._stage_rows().items():
            if costing[bt].uniform:
                first, end, cell = self._stage_cells(bt)
                tails = costing[bt].tails_at(r_sync, r_mem, ("plan", first.tobytes(), end.tobytes()), first, end)
                np.maximum.at(out, idx[:, 0], tails[idx[:, 1], cell])
            else:
                tails = self._tail_options(r_sync, r_mem)[bt].tail
                np.maximum.at(out, idx[:, 0], tails[idx[:, 1], idx[:, 2], idx[:, 3]])
        return out

    def _stage_cells(self, bt: BlockType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct layer ranges [first, end) of the plan protos' stages of `bt`, and each
        stage's among them (computed once per frontier)."""
        if bt not in self._cells_of:
            idx = self._stage_rows()[bt]
            size = self.model.num_layer_slots + 1
            cells, cell = np.unique(idx[:, 2] * size + idx[:, 3], return_inverse=True)
            self._cells_of[bt] = (cells // size, cells % size, cell.reshape(-1))
        return self._cells_of[bt]

