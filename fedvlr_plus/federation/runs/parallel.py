"""Seeds and tuning recipes trained side by side, one worker process each, on the machine's cores.

A run's seeds are independent, and so are the recipes a tuned run tries. The rounds of one run use few cores well
(many small tensor operations), so whole runs in separate processes use a multi-core machine far better than
threads inside one run. Workers are started with ``spawn`` (a forked torch can hang in its thread pool), each with
its share of the torch threads, and each trains exactly what the sequential loop would: the same seeds, the same
settings, so the same figures.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager

#: the pool that ``map_jobs`` calls share inside a :func:`shared_workers` block: [(jobs, threads), pool], or []
_SHARED: list = []
_SHARING = [False]


def usable_cores() -> int:
    """The cores this process may use (its CPU affinity where the system has one, else every core)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def default_jobs() -> int:
    """``$FEDVLR_JOBS`` where it is set, else the cores this process may use."""
    if os.environ.get("FEDVLR_JOBS", "").strip():
        return max(1, int(os.environ["FEDVLR_JOBS"]))
    return usable_cores()


def balanced_workers(n_jobs: int, cores: int) -> int:
    """Worker processes for ``n_jobs`` jobs of about equal length on ``cores`` cores: one per job up to the cores;
    beyond them the fewest, up to twice the cores, that keep every core busy in every wave of jobs. Three seeds on
    two cores in two workers leave one core idle while the third seed trains alone; in three workers the system
    shares the two cores among them and no core waits (five recipes: three workers, then the last two)."""
    if n_jobs <= cores:
        return max(n_jobs, 1)
    for workers in range(cores, 2 * cores + 1):
        if n_jobs % workers == 0 or n_jobs % workers >= cores:
            return workers
    return cores


def worker_count(jobs: int | None, n_jobs: int) -> int:
    """The workers ``map_jobs`` starts for ``n_jobs`` jobs: ``jobs`` (or ``$FEDVLR_JOBS``) where given, at most one
    per job; else :func:`balanced_workers` on the cores this process may use."""
    if jobs is None and not os.environ.get("FEDVLR_JOBS", "").strip():
        return balanced_workers(n_jobs, default_jobs())
    return max(1, min(default_jobs() if jobs is None else int(jobs), n_jobs))


def map_jobs(
    fn: Callable, items: Sequence, jobs: int | None, *, names: Sequence[str] | None = None, what: str = ""
) -> list:
    """``[fn(x) for x in items]``, in worker processes when :func:`worker_count` is more than one (``jobs``: their
    number; ``None``: as the cores allow). ``fn`` must be a module-level function and ``items`` picklable. A
    worker's exception is raised here, once every job has ended. With ``names`` (one per item), each job that ends
    in a worker is announced on stderr, ``what`` first (the workers' own progress bars are off: several processes
    would write over each other's)."""
    jobs = worker_count(jobs, len(items))
    if jobs <= 1:
        return [fn(x) for x in items]
    import torch

    threads = max(1, torch.get_num_threads() // jobs)
    report = JobsProgress(what, names) if names is not None else None
    if _SHARING[0]:
        try:
            done = _run_all(_shared_pool(jobs, threads), fn, items, report)
        except BaseException:  # a broken pool (a worker killed) or an interrupt: a later call starts afresh
            _close_shared()
            raise
    else:
        with _new_pool(jobs, threads) as pool:
            done = _run_all(pool, fn, items, report)
    for outcome in done:
        if outcome[0] == "error":
            raise outcome[1]
    return [outcome[1] for outcome in done]


def _run_all(pool: ProcessPoolExecutor, fn: Callable, items: Sequence, report: JobsProgress | None) -> list:
    """Every item's outcome (:func:`_guarded`), in the items' order; ``report`` hears of each as it ends."""
    futures = {pool.submit(_guarded, (fn, x)): i for i, x in enumerate(items)}
    done: list = [None] * len(items)
    for future in as_completed(futures):
        i = futures[future]
        done[i] = future.result()
        if report is not None:
            report.ended(i, failed=done[i][0] == "error")
    return done


class JobsProgress:
    """One stderr line per job that ends in a worker: ``paper-table: fedavg seed 2 done (4/35, 3 min 10 s)``."""

    def __init__(self, what: str, names: Sequence[str]):
        self.what, self.names = what, list(names)
        self.start = time.monotonic()
        self.count = 0

    def ended(self, index: int, failed: bool = False) -> None:
        self.count += 1
        elapsed = _duration(time.monotonic() - self.start)
        state = "failed" if failed else "done"
        head = f"{self.what}: " if self.what else ""
        print(
            f"{head}{self.names[index]} {state} ({self.count}/{len(self.names)}, {elapsed})",
            file=sys.stderr,
            flush=True,
        )


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 10 s`` or ``1 h 05 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


@contextmanager
def shared_workers() -> Iterator[None]:
    """Inside this block, ``map_jobs`` calls that need no more workers, with the same threads, reuse one pool: a
    tuned run's rungs and then its seeds start their workers once, not once per call (a worker's start, the
    interpreter and torch's import, costs about 2.5 s of CPU). A worker keeps no state of one job that a later job
    reads: each job builds its run from its arguments, and all randomness is keyed by seed and round."""
    if _SHARING[0]:  # nested: the outer block owns the pool
        yield
        return
    _SHARING[0] = True
    try:
        yield
    finally:
        _SHARING[0] = False
        _close_shared()


def _shared_pool(jobs: int, threads: int) -> ProcessPoolExecutor:
    """The block's pool: the one started before where it has as many workers or more, with these threads; else a
    new one (the old one is closed)."""
    if _SHARED and _SHARED[0][0] >= jobs and _SHARED[0][1] == threads:
        return _SHARED[1]
    _close_shared()
    _SHARED[:] = [(jobs, threads), _new_pool(jobs, threads)]
    return _SHARED[1]


def _close_shared() -> None:
    if _SHARED:
        _SHARED[1].shutdown()
        _SHARED.clear()


def _new_pool(jobs: int, threads: int) -> ProcessPoolExecutor:
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_worker, initargs=(threads,))


def _start_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _guarded(job):
    """Run one job; an exception comes back as a value (one that cannot be pickled as its message and traceback)."""
    fn, item = job
    try:
        return "ok", fn(item)
    except BaseException as e:  # noqa: BLE001 (any failure of a worker is the caller's to raise)
        try:
            pickle.dumps(e)
            return "error", e
        except Exception:
            return "error", RuntimeError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
