"""Train a large FedVLR population for one round into a run folder, then resume it for a second round in a fresh
process, and print each process's CPU time and peak memory: what resuming a big run costs. With ``--study``, a
third process trains as a cold-start study does (3 rounds, a full-sort validation pass after each, the selected
round's states kept aside and put back).

    python examples/resume_at_scale.py --out /tmp/scale-run                       # 35,598 clients x 18,357 items
    python examples/resume_at_scale.py --out /tmp/scale-run --store file --clients 2000 --items 500 --study

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


def one_step(source: str, out: str, step: str, store: str) -> dict:
    """One step (``train``: round 1 into ``out``; ``resume``: on to round 2; ``study``: a cold-start study's
    training) of FedAvg + FedVLR on ``source``, in this process."""
    from fedvlr_plus.adapters import make_backbone
    from fedvlr_plus.bench.case import synthetic_views
    from fedvlr_plus.coldstart.experiment import train_selected
    from fedvlr_plus.federation import FedConfig, run_federated
    from fedvlr_plus.fedvlr import FedVLROptions, build_fedvlr
    from fedvlr_plus.run_data import load_and_split

    data = load_and_split(source)[0]
    model = build_fedvlr(
        data, make_backbone("fedavg", data.n_items, 64), FedVLROptions(progress=False), synthetic_views(data.n_items)
    )
    rounds = {"train": 1, "resume": 2, "study": 3}[step]
    cfg = FedConfig(rounds=rounds, eval_every=1 if step == "study" else 10**6, seed=0, private_store=store)
    c0 = time.process_time()
    if step == "study":
        kind = train_selected(data, model, cfg).store.kind
    else:
        res = run_federated(data, model, cfg, out_dir=out, resume=step == "resume", progress=False)
        kind = res["resolved"]["private_store"]
    return {
        "step": step,
        "rounds": rounds,
        "store": kind,
        "cpu_s": round(time.process_time() - c0, 1),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="run folder (overwritten)")
    p.add_argument("--clients", type=int, default=35598)
    p.add_argument("--items", type=int, default=18357)
    p.add_argument("--store", default="auto", choices=("auto", "memory", "file"))
    p.add_argument("--study", action="store_true", help="also a cold-start study's training, in a third process")
    p.add_argument("--step", choices=("train", "resume", "study"), help=argparse.SUPPRESS)  # one process's part
    a = p.parse_args(argv)
    source = f"synthetic:{a.clients}x{a.items}"
    if a.step:
        print(json.dumps(one_step(source, a.out, a.step, a.store)))
        return
    shutil.rmtree(a.out, ignore_errors=True)
    for step in ("train", "resume") + (("study",) if a.study else ()):
        cmd = [
            sys.executable,
            __file__,
            "--out",
            a.out,
            "--clients",
            str(a.clients),
            "--items",
            str(a.items),
            "--store",
            a.store,
            "--step",
            step,
        ]
        print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
