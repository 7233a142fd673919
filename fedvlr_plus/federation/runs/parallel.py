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
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor


def default_jobs() -> int:
    """``$FEDVLR_JOBS`` where it is set, else the cores this process may use."""
    if os.environ.get("FEDVLR_JOBS", "").strip():
        return max(1, int(os.environ["FEDVLR_JOBS"]))
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def map_jobs(fn: Callable, items: Sequence, jobs: int | None) -> list:
    """``[fn(x) for x in items]``, in ``jobs`` worker processes when that is more than one (``None``: every core).
    ``fn`` must be a module-level function and ``items`` picklable. A worker's exception is raised here."""
    jobs = min(default_jobs() if jobs is None else int(jobs), len(items))
    if jobs <= 1:
        return [fn(x) for x in items]
    import torch

    threads = max(1, torch.get_num_threads() // jobs)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_worker, initargs=(threads,)) as pool:
        done = list(pool.map(_guarded, [(fn, x) for x in items]))
    for outcome in done:
        if outcome[0] == "error":
            raise outcome[1]
    return [outcome[1] for outcome in done]


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
