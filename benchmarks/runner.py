"""The benchmark sweep: every (scenario, planner) pair is one task, run once and cached by content.

A task's key is the sha256 of everything that decides its result: the resolved scenario (model,
cluster, training, profile contents, knobs, time limit), the planner's name and identity, the code
version (package version + a digest of the planner, solver and baseline sources) and the record
format. Results live as one JSON per task under OUT/tasks/<key>.json, written atomically by the
driver as tasks finish, so an interrupted sweep resumes where it stopped and a rerun skips what is
done. A planner that raises is a result ("crashed", kept); a task whose worker died or whose
executor failed ("worker-failed") is retried on the next run.

Every plan, ours or a baseline's, is re-scored here by the one evaluator under the scenario's cost
model and checked by `planner.validate.violations`; an infeasible, invalid or failing planner is
recorded with its reason, never dropped.

OUT belongs to the runner once it holds OUT/bench.json (the marker written on first use): such a
folder is resumed. A folder that exists, is not empty and has no marker is refused unless `force`;
`force` also reruns every task and replaces its record.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from benchmarks.executor import Executor, Outcome
from benchmarks.scenario import ResolvedScenario
from planner.costmodel.base import CostModel
from planner.errors import HetplanError, InfeasibleError
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec
from planner.specs.models import ModelSpec
from planner.specs.training import TrainingSpec

RECORD_FORMAT = "hetplan.bench.task/v1"
OUT_FORMAT = "hetplan.bench/v1"
MARKER = "bench.json"
OURS = "hetplan"
MAX_VIOLATIONS = 10
WORKER_FAILED = "worker-failed"  # the only status a rerun retries


class PlannerFn(Protocol):
    """A planner: specs and a cost model in, a `hetplan.plan/v1` Plan out; InfeasibleError when it has
    none. It may also offer `with_time_limit(seconds) -> PlannerFn`; the runner then hands it the
    scenario's `time_limit_s`."""

    def __call__(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan: ...


@dataclass(frozen=True)
class SearchPlanner:
    """Our planner (`planner.search`) as a PlannerFn."""

    time_limit_s: float | None = None

    def __call__(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cost: CostModel) -> Plan:
        from planner.search import search

        return search(model, cluster, training, cost=cost, time_limit=self.time_limit_s).plan

    def with_time_limit(self, seconds: float | None) -> SearchPlanner:
        return replace(self, time_limit_s=seconds)


def baseline_registry() -> dict[str, PlannerFn]:
    """`benchmarks.baselines.BASELINES`, looked up when asked for ({} while it does not exist)."""
    module = importlib.import_module("benchmarks.baselines")
    return dict(getattr(module, "BASELINES", None) or {})


def default_planners() -> dict[str, PlannerFn]:
    """hetplan first, then every registered baseline."""
    return {OURS: SearchPlanner(), **baseline_registry()}


def select_planners(registry: Mapping[str, PlannerFn], names: Sequence[str] | None) -> dict[str, PlannerFn]:
    """The planners named (all when `names` is None), in registry order; unknown names are errors."""
    if names is None:
        return dict(registry)
    unknown = [n for n in names if n not in registry]
    if unknown or not names:
        raise HetplanError("--planners", f"unknown planner(s) {unknown or names} (known: {', '.join(registry)})")
    return {n: fn for n, fn in registry.items() if n in names}


# -- keys --------------------------------------------------------------------------------------------
def _source_files() -> list[tuple[str, Path]]:
    import benchmarks.baselines
    import planner
    import solvers

    out = []
    for module, skip in ((planner, {"cli", "emit"}), (solvers, set()), (benchmarks.baselines, set())):
        root = Path(module.__file__).resolve().parent
        for f in root.rglob("*"):
            rel = f.relative_to(root)
            if f.suffix in (".py", ".csv", ".json") and "__pycache__" not in rel.parts and rel.parts[0] not in skip:
                out.append((f"{module.__name__}/{rel.as_posix()}", f))
    return sorted(out)


def code_version() -> str:
    """Package version + digest of the code that decides results (planner minus its CLI and emitters,
    solvers, baselines, packaged data). Any edit there invalidates cached records."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("hetplan")
    except PackageNotFoundError:
        ver = "unknown"
    digest = hashlib.sha256()
    for name, path in _source_files():
        digest.update(name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return f"hetplan {ver}+src.{digest.hexdigest()[:16]}"


def planner_identity(fn: object) -> str:
    """Which code a registry entry is (a fake and the real planner of one name get different keys)."""
    fn = getattr(fn, "func", fn)  # functools.partial: the function it wraps
    kind = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', type(fn).__name__)}"


def task_key(scenario: ResolvedScenario, planner: str, identity: str, code: str) -> str:
    doc = {"format": RECORD_FORMAT, "code": code, "planner": planner, "identity": identity,
           "scenario": scenario.content()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Task:
    key: str
    planner: str
    fn: PlannerFn
    scenario: ResolvedScenario


def make_tasks(scenarios: Sequence[ResolvedScenario], planners: Mapping[str, PlannerFn],
               code: str | None = None) -> list[Task]:
    """One task per (scenario, planner), scenarios in the order given, planners in registry order."""
    code = code or code_version()
    out = []
    for sc in scenarios:
        for name, fn in planners.items():
            limited = getattr(fn, "with_time_limit", None)
            bound = limited(sc.time_limit_s) if callable(limited) else fn
            out.append(Task(task_key(sc, name, planner_identity(fn), code), name, bound, sc))
    return out


# -- one task (runs in a worker) ------------------------------------------------------------------------
def _base(task: Task) -> dict[str, Any]:
    sc = task.scenario
    types = "+".join(f"{n}x{g}" for g, n in sorted(sc.cluster.counts_by_type().items()))
    return {"format": RECORD_FORMAT, "key": task.key, "scenario": sc.name, "planner": task.planner,
            "model": sc.model.name, "gpus": sc.cluster.num_gpus, "gpu_types": types,
            "global_batch": sc.training.global_batch, "seq_len": sc.training.seq_len, "cost": sc.cost_name}


# Fields that define the training problem; the rest (recompute, max_tp, micro_batches, ...) only bound
# a search space, which a planner may narrow.
PROBLEM_FIELDS = ("global_batch", "seq_len", "dtype", "optimizer", "zero", "sequence_parallel", "schedule",
                  "attention", "cp_comm")


def _mismatch(plan: Plan, sc: ResolvedScenario) -> str | None:
    """A plan for another model or training problem is not comparable, however fast."""
    if plan.model != sc.model:
        return f"plan is for model '{plan.model.name}', the scenario trains '{sc.model.name}'"
    diff = [k for k in PROBLEM_FIELDS if getattr(plan.training, k) != getattr(sc.training, k)]
    if diff:
        return f"plan changes the training problem ({', '.join(diff)})"
    used = sorted({s.recompute for p in plan.pipelines for s in p.stages} - set(sc.training.recompute))
    if used:
        return f"plan uses recompute {used}, the scenario allows {list(sc.training.recompute)}"
    return None


def score(plan: object, sc: ResolvedScenario, cost: CostModel) -> dict[str, Any]:
    """Validity and the one evaluator's numbers for a planner's answer."""
    from planner.evaluate import evaluate
    from planner.validate import violations

    if not isinstance(plan, Plan):
        return {"status": "invalid", "reason": f"planner returned {type(plan).__name__}, not a Plan"}
    problems = [str(v) for v in violations(plan, sc.cluster, cost)]
    mismatch = _mismatch(plan, sc)
    if mismatch:
        problems.insert(0, mismatch)
    try:
        pred = evaluate(plan, sc.cluster, cost, check=False)
    except HetplanError as exc:
        return {"status": "invalid", "reason": f"cannot be scored: {exc}", "violations": problems[:MAX_VIOLATIONS]}
    own = plan.predicted
    return {"status": "invalid" if problems else "ok", "reason": problems[0] if problems else "",
            "violations": problems[:MAX_VIOLATIONS], "step_s": pred.step_s, "tokens_per_s": pred.tokens_per_s,
            "mfu": pred.mfu, "tflops_per_gpu": pred.tflops_per_gpu, "bottleneck": pred.bottleneck,
            "lower_bound_s": own.lower_bound_s if own else None, "gap": own.gap if own else None,
            "gpus_used": plan.num_gpus, "pipelines": len(plan.pipelines), "micro_batch": plan.micro_batch,
            "cost_sources": dict(sorted(pred.cost_sources.items())), "plan": json.loads(plan.to_json())}


def run_task(task: Task) -> dict[str, Any]:
    """Plan one scenario with one planner and score the answer; never raises for a planner's failure."""
    record = _base(task)
    sc = task.scenario
    cost = sc.cost_model()
    start = time.perf_counter()
    try:
        plan = task.fn(sc.model, sc.cluster, sc.training, cost)
    except InfeasibleError as exc:
        return {**record, "status": "infeasible", "reason": exc.reason, "planning_s": time.perf_counter() - start}
    except HetplanError as exc:
        return {**record, "status": "error", "reason": str(exc), "planning_s": time.perf_counter() - start}
    except Exception as exc:  # noqa: BLE001 - a planner bug is a result to report, not the sweep's end
        return {**record, "status": "crashed", "reason": f"{type(exc).__name__}: {exc}",
                "planning_s": time.perf_counter() - start}
    planning_s = time.perf_counter() - start
    return {**record, "planning_s": planning_s, **score(plan, sc, sc.cost_model())}


# -- the output folder and the cache ---------------------------------------------------------------------
def prepare_out(out: Path, force: bool) -> None:
    """Create OUT, or accept it for resuming; refuse a folder the runner did not create unless `force`."""
    if out.exists() and not out.is_dir():
        raise HetplanError("--out", f"{out} exists and is not a directory")
    marker = out / MARKER
    if out.is_dir() and any(out.iterdir()) and not marker.is_file() and not force:
        raise HetplanError("--out", f"{out} is not empty and was not created by `hetplan bench` "
                                    f"(no {MARKER}); use --force to write into it")
    if marker.is_file() and not force:
        try:
            ok = json.loads(marker.read_text(encoding="utf-8")).get("format") == OUT_FORMAT
        except (json.JSONDecodeError, AttributeError):
            ok = False
        if not ok:
            raise HetplanError("--out", f"{marker} is not a {OUT_FORMAT} marker; use --force to write into {out}")
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    if not marker.is_file() or force:
        write_atomic(marker, json.dumps({"format": OUT_FORMAT, "created_by": "hetplan bench"}, indent=2) + "\n")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def cached_record(out: Path, key: str) -> dict[str, Any] | None:
    """The stored record of a finished task, or None (missing, unreadable, other format, worker failed)."""
    path = out / "tasks" / f"{key}.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT or record.get("key") != key:
        return None
    return None if record.get("status") == WORKER_FAILED else record


def crash_record(task: Task, error: str) -> dict[str, Any]:
    return {**_base(task), "status": WORKER_FAILED, "reason": error}


@dataclass
class SweepResult:
    records: list[dict[str, Any]]  # in task order: scenarios as given, planners in registry order
    ran: int
    cached: int


Progress = Callable[[int, int, dict[str, Any]], None]


def run_sweep(tasks: Sequence[Task], make_executor: Callable[[], Executor[Task]], out: Path | None = None,
              force: bool = False, progress: Progress | None = None) -> SweepResult:
    """Run the tasks not already done under OUT (all with `force`), writing each record as it lands.
    The executor is only started when something is left to run."""
    records: dict[str, dict[str, Any]] = {}
    if out is not None:
        prepare_out(out, force)
        if not force:
            for t in tasks:
                hit = cached_record(out, t.key)
                if hit is not None:
                    records[t.key] = hit
    todo = list({t.key: t for t in tasks if t.key not in records}.values())
    total, done = len(tasks), len(records)
    if todo:
        with make_executor() as ex:
            for t in todo:
                ex.submit(t)
            for outcome in ex.results():
                record = _record(outcome)
                if out is not None:
                    write_atomic(out / "tasks" / f"{record['key']}.json", json.dumps(record, indent=1) + "\n")
                records[record["key"]] = record
                done += 1
                if progress:
                    progress(done, total, record)
    return SweepResult([records[t.key] for t in tasks], ran=len(todo), cached=total - len(todo))


def _record(outcome: Outcome[Task]) -> dict[str, Any]:
    if outcome.error is not None or not isinstance(outcome.value, dict):
        return crash_record(outcome.task, outcome.error or "no record returned")
    return outcome.value
