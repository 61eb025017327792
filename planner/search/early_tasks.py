"""Tasks of the next batch started before it, in the worker pool, taken only if that batch asks
for them with the same arguments (the same answer, `parallel` module doc).

The best-first loop solves units in batches of two, each against the best plan when its batch
starts, and waits for the slower one: the other worker idled (up to 0.06 s at a batch on the
64-GPU ladder rung, 0.04-0.08 core-seconds over its 1 s search with `stop_gap`), besides each
batch's round trip through the pool. Each time a batch's task (or an early one) is back while another of the
batch still runs, the next of the units the next batch would hold, given the best plan of the
tasks back (`ahead`), starts now against that plan. The next batch takes their outs where the
best plan after the whole batch is that one (the slower task found nothing faster) and it holds
those units; otherwise the early tasks' outs are dropped (their worker time spent).
"""

from __future__ import annotations

import itertools
import queue
from collections.abc import Callable
from typing import Any


class EarlyTasks:
    """`fn` run on batches of tasks in a `multiprocessing` pool, the next batch's tasks started
    early as workers free up (`run`); `best_of(out)` is the fastest plan a task's out holds (None:
    none). `taken` and `dropped` count the early tasks used and left."""

    def __init__(self, fn: Callable[[tuple], Any], best_of: Callable[[Any], float | None]) -> None:
        self.fn, self.best_of = fn, best_of
        self.ahead: dict[tuple, tuple[int, Any]] = {}  # the early task, by its arguments: (key, handle)
        self.done: queue.SimpleQueue = queue.SimpleQueue()  # keys of tasks back, from the pool's thread
        self.keys = itertools.count()
        self.taken = self.dropped = 0

    def _submit(self, pool: Any, task: tuple) -> tuple[int, Any]:
        key = next(self.keys)
        return key, pool.apply_async(self.fn, (task,), callback=lambda _: self.done.put(key),
                                     error_callback=lambda _: self.done.put(key))

    def run(self, pool: Any, tasks: list[tuple], best: float | None,
            ahead: Callable[[float | None], list[tuple]] | None) -> list[Any]:
        """The outs of `tasks`, one batch whose best plan so far is `best` (None: none), in order:
        each from the early task of the same arguments if there is one, else started now. With
        `ahead` (the next batch's tasks if the best plan is then the one given; none: no next
        batch), each time a task is back while another of the batch still runs, the next of
        those tasks starts early."""
        left, self.ahead = self.ahead, {}  # used once: an early task left over is of a state gone by
        handles = []
        for task in tasks:
            if task in left:
                handles.append(left.pop(task))
                self.taken += 1
            else:
                handles.append(self._submit(pool, task))
        self.dropped += len(left)
        running = {key for key, h in handles if not h.ready()}
        for key, h in handles:  # those back already count toward the early tasks' best plan
            if key not in running:
                best = self._better(best, h.get())
        early = {key for key, _ in self.ahead.values()}
        while running:
            key = self.done.get()
            if key in running:
                running.discard(key)
                best = self._better(best, next(h for k, h in handles if k == key).get())
            elif key not in early:
                continue  # an early task of an earlier batch, or one back before this batch began
            if ahead is not None and running:
                # a worker is free: the next batch's next task (a different best plan makes
                # earlier ones useless: they are dropped with the next batch)
                todo = [t for t in ahead(best) if t not in self.ahead]
                if todo:
                    self.ahead[todo[0]] = self._submit(pool, todo[0])
                    early.add(self.ahead[todo[0]][0])
        return [h.get() for _, h in handles]

    def idle(self) -> bool:
        """Whether no early task is still running (one left over is dropped unread)."""
        return all(h.ready() for _, h in self.ahead.values())

    def _better(self, best: float | None, out: Any) -> float | None:
        found = self.best_of(out)
        return found if best is None or (found is not None and found < best) else best
