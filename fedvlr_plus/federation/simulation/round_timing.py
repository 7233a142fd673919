"""``bench round``: how long one federated round takes with the batched simulator and with the sequential
reference, from the same initial state, and how far apart their aggregated states end (a speed check that is also
a correctness check)."""

from __future__ import annotations

import resource
import time
from dataclasses import replace

import numpy as np
import torch

from ..config import FedConfig
from ..state.store import MemoryStore


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench_round(
    data, backbone, cfg: FedConfig | None = None, *, sequential: bool = True, repeats: int = 3, rounds: int = 1
) -> dict:
    """Time full rounds (every client, ``cfg.local_epochs`` local epochs, aggregation included, evaluation
    excluded) with the batched simulator and, unless ``sequential=False``, with the sequential reference, both
    from the same initial state. ``backbone``: a name or a ready adapter (a RecBole model, the FedVLR layer).

    ``rounds == 1``: the first round is timed ``repeats`` times and the fastest is reported (filters out other
    processes). ``rounds > 1``: each simulator trains ``rounds`` consecutive rounds and the median of rounds 2 to
    ``rounds`` is reported (round 1 carries one-off work: initial private states, the batched module client's
    self-check). Also reported: the process's peak RSS, the largest difference between the two aggregated shared
    states (after the last round timed) and, for module backbones, why the batched simulator fell back, if it did."""
    import gc

    from ..engine import FederatedRun

    cfg = replace(cfg or FedConfig(), clients_per_round=None, private_store="memory", seeds=1)
    repeats, rounds = max(1, int(repeats)), max(1, int(rounds))
    out = {
        "backbone": backbone if isinstance(backbone, str) else backbone.name,
        "dataset": data.name,
        "clients": None,
        "items": int(data.n_items),
        "train_interactions": int(len(data.train())),
        "negatives": cfg.negatives,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "rounds": rounds,
        "peak_rss_mb_before": _peak_rss_mb(),
    }
    timed = _timed_rounds if rounds > 1 else _timed_repeats
    runb = FederatedRun(data, backbone, replace(cfg, simulator="batched"), progress=False)
    out["clients"] = int(len(runb.eligible))
    out["local_epochs"] = runb.local_epochs
    out["simulator_batched"] = runb.sim.name
    # warm-up on a few clients (allocator, lazy initialisation) with a throwaway store
    warm = type(runb.sim)(
        runb.bb, runb.indptr, runb.indices, MemoryStore(), seed=cfg.seed, chunk_floats=cfg.chunk_floats
    )
    warm.fit(runb.eligible[:8], runb.shared, runb.round_config(1))
    out["batched_s"], out["batched_cpu_s"], new_b = timed(runb, repeats if rounds == 1 else rounds)
    out["fallback"] = getattr(runb.sim, "fallback", None)
    out["peak_rss_mb_batched"] = _peak_rss_mb()
    del runb
    gc.collect()
    if sequential:
        runs = FederatedRun(data, backbone, replace(cfg, simulator="sequential"), progress=False)
        out["simulator_sequential"] = runs.sim.name
        out["sequential_s"], out["sequential_cpu_s"], new_s = timed(runs, repeats if rounds == 1 else rounds)
        out["speedup"] = out["sequential_s"] / out["batched_s"]
        # the CPU-time ratio is the fairer figure when other processes compete for the cores
        out["speedup_cpu"] = out["sequential_cpu_s"] / out["batched_cpu_s"]
        out["max_abs_diff"] = max(float((new_b[k] - new_s[k]).abs().max()) for k in new_b)
        out["peak_rss_mb"] = _peak_rss_mb()
    return out


def _timed_repeats(run, repeats: int):
    """The fastest of ``repeats`` runs of round 1 (wall and CPU seconds) and the aggregated state."""
    import gc

    conf = run.round_config(1)
    best, best_cpu, new = float("inf"), float("inf"), None
    start = run.store.snapshot()  # every repeat trains the same first round from the same states
    for _ in range(repeats):
        run.store.restore(start)
        run.store.begin_round(1)
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        new = _trained(run, run.shared, conf)
        best = min(best, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - c)
    return best, best_cpu, new


def _trained(run, shared: dict, conf: dict) -> dict:
    """The shared state after one round of every eligible client, trained and aggregated as the engine does:
    streamed a chunk at a time where the simulator and strategy allow it (:mod:`.upload_stream`), else as one
    list of uploads."""
    from .upload_stream import can_stream, fit_streamed

    if can_stream(run.sim, run.strategy):
        examples = np.diff(run.indptr)[np.asarray(run.eligible, dtype=np.int64)]
        streamed = fit_streamed(run.sim, run.strategy, run.eligible, shared, run.specs, conf, examples)
        return run.strategy.from_sums(shared, streamed.sums, run.specs)
    return run.strategy.aggregate(shared, run.sim.fit(run.eligible, shared, conf), run.specs)


def _timed_rounds(run, rounds: int):
    """Median wall and CPU seconds of rounds 2..``rounds`` trained in a row, and the final shared state."""
    import gc

    walls, cpus = [], []
    for r in range(1, rounds + 1):
        run.store.begin_round(r)
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        run.shared = _trained(run, run.shared, run.round_config(r))
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
        run.store.prepare(r)
        run.store.commit()
    return float(np.median(walls[1:])), float(np.median(cpus[1:])), run.shared


def format_bench(res: dict) -> str:
    rounds = res.get("rounds", 1)
    how = f"median of rounds 2-{rounds}" if rounds > 1 else f"best of {res['repeats']}"
    lines = [
        f"{res['backbone']} on {res['dataset']}: {res['clients']} clients, {res['items']} items, "
        f"{res['train_interactions']} training interactions, {res['local_epochs']} local epochs, "
        f"{res['threads']} torch threads",
        f"  batched    {res['batched_s']:.3f} s per round, CPU {res['batched_cpu_s']:.3f} s ({how}; "
        f"process peak RSS {res['peak_rss_mb_batched']:.0f} MB)",
    ]
    if res.get("fallback"):
        lines.append(f"  (the batched simulator fell back to one client at a time: {res['fallback']})")
    if "sequential_s" in res:
        lines.append(f"  sequential {res['sequential_s']:.3f} s per round, CPU {res['sequential_cpu_s']:.3f} s")
        lines.append(
            f"  speed-up   {res['speedup']:.1f}x wall, {res['speedup_cpu']:.1f}x CPU   "
            f"(max |batched - sequential| after aggregation "
            f"{res['max_abs_diff']:.2e})"
        )
    return "\n".join(lines)
