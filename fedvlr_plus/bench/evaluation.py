"""``bench eval``: how long one evaluation pass of a trained model takes, per protocol, and with ``check`` the same
pass by the reference path (every item scored for the sampled protocol; the FedVLR layer's mixtures formed before
the backbone's head; NeuMF's tower run on every (user, item) pair; a RecBole model behind the layer scoring each
user alone), its time and whether the figures agree.

The fast paths (candidates alone, mixtures scored per expert) sum floats in another order than the reference
path; ``check`` is how a user sees, on their own data, that no reported figure moves."""

from __future__ import annotations

import time
from contextlib import contextmanager

PROTOCOLS = ("full", "sampled")


def timed_pass(run, split: str, protocol: str) -> dict:
    """Wall and CPU seconds of ``run.evaluate(split, protocol)`` and its summary figures."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = run.evaluate(split, protocol)
    return {
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "figures": {k: float(v) for k, v in result.summary().items()},
    }


@contextmanager
def reference_paths(run):
    """Within the block, ``run`` scores by its reference paths (the switches exist on the batched simulator and
    the FedVLR layer; other simulators and backbones have no fast path to switch off)."""
    switches = [
        (obj, name)
        for obj, name in (
            (run.sim, "score_candidates"),
            (run.bb, "score_mixtures"),
            (getattr(run.sim, "base", None), "score_decomposed"),
            (run.sim, "score_users_together"),
        )
        if hasattr(obj, name)
    ]
    saved = [getattr(obj, name) for obj, name in switches]
    try:
        for obj, name in switches:
            setattr(obj, name, False)
        yield
    finally:
        for (obj, name), value in zip(switches, saved):
            setattr(obj, name, value)


def eval_passes(run, split: str, protocols, check: bool, say=None) -> list[dict]:
    """One timed pass per protocol (and its reference pass with ``check``); ``say(line)`` after each."""
    rows = []
    for protocol in protocols:
        row = {"split": split, "protocol": protocol, **timed_pass(run, split, protocol)}
        if check:
            with reference_paths(run):
                row["reference"] = timed_pass(run, split, protocol)
            row["same_figures"] = row["reference"]["figures"] == row["figures"]
        rows.append(row)
        if say is not None:
            say(format_pass(row))
    return rows


def format_pass(row: dict) -> str:
    line = f"{row['split']} {row['protocol']}: {row['wall_s']:.1f} s wall, {row['cpu_s']:.1f} s CPU"
    if "reference" in row:
        ref = row["reference"]
        same = "the same figures" if row["same_figures"] else "figures DIFFER"
        line += (
            f"; reference path {ref['wall_s']:.1f} s wall, {ref['cpu_s']:.1f} s CPU "
            f"({ref['cpu_s'] / max(row['cpu_s'], 1e-9):.2f}x), {same}"
        )
    figures = ", ".join(f"{k} {v:.4f}" for k, v in row["figures"].items())
    return f"{line}\n  {figures}"
