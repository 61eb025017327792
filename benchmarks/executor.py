"""Where benchmark tasks run: a local process pool or a Ray cluster, behind one small interface.

An executor is built around one worker function (`worker(task) -> value`, importable by name so
that other processes can unpickle it). `submit(task)` queues a task; `results()` yields an
`Outcome` for every task submitted so far, in completion order, until none is left. A worker that
raises, or a process that dies, gives an Outcome with `error` set instead of stopping the sweep.
Ray is imported only when asked for.

A sweep that stops early (an exception, Ctrl-C, or SIGTERM turned into one by `stop_on_sigterm`)
takes its worker processes with it: `LocalExecutor` terminates them rather than waiting for their
tasks, and each worker terminates the processes it started (a search's own fork pool) on SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from planner.errors import HetplanError

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One finished task: its value, or why there is none."""

    task: T
    value: Any = None
    error: str | None = None


class Executor(Protocol[T]):
    def submit(self, task: T) -> None: ...

    def results(self) -> Iterator[Outcome[T]]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor[T]: ...

    def __exit__(self, *exc: object) -> None: ...


def _one_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


class _Closing:
    def __enter__(self) -> Any:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class LocalExecutor(_Closing, Generic[T]):
    """`workers` processes on this machine (concurrent.futures). `spawn` by default: the parent may
    hold solver or Ray threads, which a forked child would inherit in an unknown state."""

    def __init__(self, worker: Callable[[T], Any], workers: int = 1, start_method: str = "spawn") -> None:
        if workers < 1:
            raise HetplanError("--workers", "needs at least 1")
        import multiprocessing as mp

        self._worker = worker
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context(start_method),
                                         initializer=_worker_init)
        self._pending: dict[Future[Any], T] = {}

    def submit(self, task: T) -> None:
        self._pending[self._pool.submit(self._worker, task)] = task

    def results(self) -> Iterator[Outcome[T]]:
        while self._pending:
            done, _ = wait(list(self._pending), return_when=FIRST_COMPLETED)
            for fut in done:
                task = self._pending.pop(fut)
                try:
                    yield Outcome(task, value=fut.result())
                except Exception as exc:  # noqa: BLE001 - a worker crash is a result, not the end of the sweep
                    yield Outcome(task, error=_one_line(exc))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(abort=kind is not None)

    def close(self, abort: bool = False) -> None:
        """Wait for the running tasks, or with `abort` (the sweep stopped early) terminate them."""
        if abort:
            for proc in list((getattr(self._pool, "_processes", None) or {}).values()):  # no public way before 3.14
                with contextlib.suppress(OSError):
                    proc.terminate()
        self._pool.shutdown(wait=not abort, cancel_futures=True)
        self._pending.clear()


def _worker_init() -> None:
    """In each worker: on SIGTERM, terminate the processes this worker started (a search's fork
    pool) and exit at once. Raising instead would not do: the pool catches a task's exceptions,
    SystemExit included, and goes on to the next task."""
    signal.signal(signal.SIGTERM, _terminate_children)


def _terminate_children(signum: int, frame: object) -> None:
    import multiprocessing as mp

    for child in mp.active_children():
        with contextlib.suppress(OSError):
            child.terminate()
    os._exit(128 + signum)


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) in the main thread while inside, so that `with` blocks (an
    executor's) unwind as on Ctrl-C; the previous handler comes back after."""
    def stop(signum: int, frame: object) -> None:
        sys.exit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise HetplanError("--backend", "ray is not installed (pip install 'hetplan[ray]', or use "
                                        "--backend local)") from None
    return ray


def _import_roots() -> str:
    """The folders that hold `planner` and `benchmarks`, for local Ray workers' PYTHONPATH (they do
    not inherit the driver's sys.path, and an uninstalled checkout must still import)."""
    import benchmarks
    import planner

    roots = {str(Path(m.__file__).resolve().parents[1]) for m in (planner, benchmarks) if m.__file__}
    extra = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(sorted(roots) + ([extra] if extra else []))


class RayExecutor(_Closing, Generic[T]):
    """One Ray remote task per submitted task. Uses the Ray session already initialised in this
    process if there is one; else connects to `address`, or starts a local Ray (with `workers`
    CPUs) and shuts down only what it started."""

    def __init__(self, worker: Callable[[T], Any], address: str | None = None, workers: int | None = None) -> None:
        ray = import_ray()
        self._ray = ray
        self._owns = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": {"PYTHONPATH": _import_roots()}})
            self._owns = True
        self._remote = ray.remote(num_cpus=1, max_retries=0)(worker)
        self._pending: dict[Any, T] = {}

    def submit(self, task: T) -> None:
        self._pending[self._remote.remote(task)] = task

    def results(self) -> Iterator[Outcome[T]]:
        ray = self._ray
        while self._pending:
            done, _ = ray.wait(list(self._pending), num_returns=1)
            for ref in done:
                task = self._pending.pop(ref)
                try:
                    yield Outcome(task, value=ray.get(ref))
                except Exception as exc:  # noqa: BLE001 - RayTaskError, worker died, ...
                    yield Outcome(task, error=_one_line(exc))

    def close(self) -> None:
        for ref in list(self._pending):
            with contextlib.suppress(Exception):  # already finished or gone: nothing left to stop
                self._ray.cancel(ref, force=True)
        self._pending.clear()
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()


def make_executor(worker: Callable[[T], Any], backend: str, address: str | None = None,
                  workers: int | None = None) -> LocalExecutor[T] | RayExecutor[T]:
    """The executor a CLI option names ('local' or 'ray')."""
    if backend == "local":
        if address:
            raise HetplanError("--address", "only with --backend ray")
        return LocalExecutor(worker, workers or 1)
    if backend == "ray":
        return RayExecutor(worker, address, workers)
    raise HetplanError("--backend", f"unknown backend '{backend}' (local, ray)")


__all__ = ["Executor", "LocalExecutor", "Outcome", "RayExecutor", "import_ray", "make_executor", "stop_on_sigterm"]
