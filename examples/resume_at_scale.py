"""Train a large FedVLR population for one round into a run folder, then resume it for a second round in a fresh
process, and print each process's CPU time and peak memory: what resuming a big run costs.

    python examples/resume_at_scale.py --out /tmp/scale-run                       # 35,598 clients x 18,357 items
    python examples/resume_at_scale.py --out /tmp/scale-run --store file --clients 2000 --items 500

The population is synthetic (``synthetic:UxI``) with two random 512-wide views per item, as in ``fedvlr-plus bench
suite``: the cost depends on the shapes, not on what the views say. Each step runs in its own process so that its
peak memory is its own. The folder is overwritten.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time


def one_step(source: str, out: str, rounds: int, store: str, resume: bool) -> dict:
    """Train (or resume) ``rounds`` rounds of FedAvg + FedVLR on ``source`` into ``out``, in this process."""
    from fedvlr_plus.bench.case import synthetic_views
    from fedvlr_plus.federation import FedConfig, run_federated
    from fedvlr_plus.fedvlr import FedVLROptions, build_fedvlr
    from fedvlr_plus.adapters import make_backbone
    from fedvlr_plus.run_data import load_and_split

    data = load_and_split(source)[0]
    model = build_fedvlr(data, make_backbone("fedavg", data.n_items, 64), FedVLROptions(progress=False),
                         synthetic_views(data.n_items))
    cfg = FedConfig(rounds=rounds, eval_every=10 ** 6, seed=0, private_store=store)
    c0 = time.process_time()
    res = run_federated(data, model, cfg, out_dir=out, resume=resume, progress=False)
    return {"step": "resume" if resume else "train", "rounds": rounds, "store": res["resolved"]["private_store"],
            "cpu_s": round(time.process_time() - c0, 1),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="run folder (overwritten)")
    p.add_argument("--clients", type=int, default=35598)
    p.add_argument("--items", type=int, default=18357)
    p.add_argument("--store", default="auto", choices=("auto", "memory", "file"))
    p.add_argument("--step", choices=("train", "resume"), help=argparse.SUPPRESS)   # one process's part
    a = p.parse_args(argv)
    source = f"synthetic:{a.clients}x{a.items}"
    if a.step:
        print(json.dumps(one_step(source, a.out, 1 if a.step == "train" else 2, a.store, a.step == "resume")))
        return
    shutil.rmtree(a.out, ignore_errors=True)
    for step in ("train", "resume"):
        cmd = [sys.executable, __file__, "--out", a.out, "--clients", str(a.clients), "--items", str(a.items),
               "--store", a.store, "--step", step]
        print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
