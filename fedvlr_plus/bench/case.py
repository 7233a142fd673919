"""One case of ``fedvlr-plus bench suite``, measured inside its own process.

``python -m fedvlr_plus.bench.case '<case JSON>'`` loads the case's data, builds its model, trains the
asked-for rounds (every client, no evaluation) and prints one JSON line: the CPU (and its system part) and wall
time of each round, the median of the later rounds, the same for the sequential reference where the case asks
for it, and the time of full-sort evaluation passes where asked. The suite runs each case in a fresh process so
that the peak RSS it reads from the operating system belongs to that case alone.

A case is a dict: ``source`` (a data source, ``synthetic:UxI`` included), ``backbone`` (a federated backbone or
``recbole:<Model>``), ``fusion`` (None, or ``{"residual": bool}`` for the FedVLR layer, with ``"views"``: a view
store folder to read instead of encoding the items, ``"mode"``: the layer's ``--fusion`` mode, ``fedvlr`` unless
given, and ``"router_over"``), ``rounds``,
``sequential_rounds`` (0: no reference), ``evaluate`` (full-sort passes after training), ``device``,
``chunk_floats`` (the batched simulator's memory bound of a chunk, when not the default) and ``private_store``
(``memory`` by default, ``file`` for the tables in files).
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

#: width of the random views given to a synthetic source (it has no item content), as KU's CLIP views
SYNTHETIC_VIEW_DIM = 512


def synthetic_views(n_items: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Two L2-normalised random views (``text``, ``image``) for data without content: the layer's cost
    depends on their shapes, not on what they say."""
    g = np.random.default_rng([seed, n_items])
    out = {}
    for name in ("text", "image"):
        v = g.standard_normal((n_items, SYNTHETIC_VIEW_DIM)).astype(np.float32)
        out[name] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def _model(case: dict, data):
    """The backbone (a name or an adapter) the case trains."""
    backbone = case["backbone"]
    if backbone.startswith("recbole:"):
        from ..adapters.recbole.backbone import federate

        backbone, _ = federate(backbone.split(":", 1)[1], data=data, seed=0)
    if not case.get("fusion"):
        return backbone
    from ..fedvlr import FedVLROptions, build_fedvlr

    if isinstance(backbone, str):
        from ..adapters import make_backbone

        backbone = make_backbone(backbone, data.n_items, int(case.get("dim", 64)))
    views = synthetic_views(data.n_items) if case["source"].startswith("synthetic:") else None
    fusion = case["fusion"]
    over = {"router_over": fusion["router_over"]} if fusion.get("router_over") else {}
    opts = FedVLROptions(
        mode=fusion.get("mode", "fedvlr"),
        residual=bool(fusion.get("residual", False)),
        progress=False,
        views=fusion.get("views"),
        **over,
    )
    return build_fedvlr(data, backbone, opts, views)


def _timed_rounds(data, model, cfg, rounds: int) -> tuple[list[dict], object]:
    """Train ``rounds`` rounds (no evaluation); CPU and wall seconds of each."""
    from ..federation.engine import FederatedRun

    run = FederatedRun(data, model, cfg, progress=False)
    times = []
    for _ in range(rounds):
        t, c, k = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
        run.run_round()
        times.append(
            {
                "wall_s": time.perf_counter() - t,
                "cpu_s": time.process_time() - c,
                "sys_s": resource.getrusage(resource.RUSAGE_SELF).ru_stime - k,
            }
        )
    return times, run


def _summary(times: list[dict]) -> dict:
    """Round 1, and the median of the later rounds (round 1 itself when it is the only one)."""
    later = times[1:] or times
    return {
        "rounds": times,
        "round1_cpu_s": times[0]["cpu_s"],
        "round1_wall_s": times[0]["wall_s"],
        "round1_sys_s": times[0]["sys_s"],
        "later_cpu_s": statistics.median(t["cpu_s"] for t in later),
        "later_wall_s": statistics.median(t["wall_s"] for t in later),
        "later_sys_s": statistics.median(t["sys_s"] for t in later),
    }


def _message_sizes(run) -> dict:
    """Private state per client and the mean upload per client, over one more round (not timed): what a
    user's device keeps and sends, so the router's cost is read beside the round time."""
    from ..federation.privacy.leakage import upload_bytes
    from ..federation.state.choice import private_state_bytes

    sizes = []
    run.on_upload = lambda _round, update: sizes.append(upload_bytes(update))
    run.run_round()
    run.on_upload = None
    return {
        "private_bytes_per_client": private_state_bytes(run.bb, 1),
        "upload_bytes_per_client": float(np.mean(sizes)) if sizes else None,
    }


def measure(case: dict) -> dict:
    """Run ``case`` in this process and return its figures."""
    import torch

    from ..federation.config import FedConfig
    from ..run_data import load_and_split

    torch.set_num_threads(int(case.get("threads", 1)))
    t0, c0 = time.perf_counter(), time.process_time()
    data = load_and_split(case["source"])[0]
    model = _model(case, data)
    out = {
        "setup_cpu_s": time.process_time() - c0,
        "setup_wall_s": time.perf_counter() - t0,
        "clients": int(data.n_users),
        "items": int(data.n_items),
        "threads": torch.get_num_threads(),
    }
    extra = {k: case[k] for k in ("device", "chunk_floats", "private_store") if case.get(k)}
    cfg = FedConfig(rounds=10**6, eval_every=10**6, seed=0, **extra)
    times, run = _timed_rounds(data, model, replace(cfg, simulator="batched"), int(case.get("rounds", 3)))
    out["batched"] = _summary(times)
    out["simulator"] = getattr(run.sim, "name", "batched")
    out["private_store"] = run.store.kind
    out.update(_message_sizes(run))
    for split in ("valid",) * int(bool(case.get("evaluate"))):
        t, c = time.perf_counter(), time.process_time()
        run.evaluate(split, "full")
        out["eval_full_cpu_s"], out["eval_full_wall_s"] = time.process_time() - c, time.perf_counter() - t
    del run
    n_seq = int(case.get("sequential_rounds", 0))
    if n_seq:
        seq, _ = _timed_rounds(data, _model(case, data), replace(cfg, simulator="sequential"), n_seq)
        out["sequential"] = _summary(seq)
        out["speedup_cpu"] = out["sequential"]["later_cpu_s"] / max(out["batched"]["later_cpu_s"], 1e-12)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    out["peak_rss_mb"] = usage.ru_maxrss / 1024.0  # kilobytes on Linux
    if torch.cuda.is_initialized():
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main(argv=None) -> None:
    case = json.loads((argv or sys.argv[1:])[0])
    print(json.dumps(measure(case)))


if __name__ == "__main__":
    main()
