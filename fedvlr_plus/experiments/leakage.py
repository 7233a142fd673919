"""Item-set leakage, measured with and without defences (``fedvlr-plus experiment leakage``).

For every (padding, noise) setting and seed, one federated run with a server-side attacker
(:class:`~fedvlr_plus.federation.privacy.leakage.ItemSetAttack`) watching every upload; the table gives each attack's
precision and recall against the clients' true training items (pooled over all rounds' uploads, mean over seeds),
the bytes uploaded per round, the test figure at the round selected on validation and the accounted ε.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..federation.privacy.leakage import ATTACKS, ItemSetAttack
from ..jsonio import write_json_atomic
from .privacy_table import summarise_runs
from .setting_runs import train_settings


class ItemSetWatch:
    """The server-side attacker of each run (:class:`ItemSetAttack`): it watches every upload, what it saw goes
    into the run's checkpoints, and its summary travels back with the run's figures (a class, so that a worker
    process gets it by pickling)."""

    def __call__(self, run):
        indptr, indices = run.indptr, run.indices
        run.attack = ItemSetAttack(lambda c: indices[indptr[c] : indptr[c + 1]], lambda: run.shared)
        run.checkpointed_observer = run.attack
        return run.attack.observe

    def report(self, run) -> dict:
        return run.attack.summary()


def pad_label(pad: int) -> str:
    return {0: "none", -1: "all (dense)"}.get(int(pad), f"{int(pad)} rows")


def leakage_row(pad: int, sigma: float, runs: list, metric: str, seed: int) -> dict:
    """One (padding, noise) row from its seeds' runs (:class:`~.setting_runs.SeedRun` with the attack's summary)."""
    summaries = [r.observed for r in runs]
    row = {
        "pad_uploads": int(pad),
        "defence": pad_label(pad),
        "sigma": float(sigma),
        **summarise_runs(runs, metric, seed),
        "bytes_per_round": float(np.mean([s["bytes_per_round"] for s in summaries])),
        "per_seed_attack": summaries,
    }
    for a in ATTACKS:
        for k in ("precision", "recall"):
            row[f"{a}_{k}"] = float(np.mean([s["overall"][a][k] for s in summaries]))
    row["epsilon"] = (row["privacy"] or {}).get("epsilon")
    return row


def run_leakage(data, backbone, cfg, pads, noises, *, metric: str = "ndcg@50", label: str = "", **how) -> dict:
    """Every padding in ``pads`` with every noise multiplier in ``noises``; the JSON-ready table. ``how``: ``jobs``,
    ``folder`` and ``resume``, how the runs train, where they checkpoint (with their attackers' counts) and whether
    those there continue, as :func:`.setting_runs.train_settings` takes them."""
    settings = {f"pad-{pad}-sigma-{sigma:g}": (pad, sigma) for pad in pads for sigma in noises}
    cfgs = {
        name: replace(cfg, pad_uploads=int(pad), upload_noise=float(sigma), target_epsilon=None)
        for name, (pad, sigma) in settings.items()
    }
    trained = train_settings(data, backbone, cfgs, observer=ItemSetWatch(), **how)
    rows = [leakage_row(pad, sigma, trained[name], metric, cfg.seed) for name, (pad, sigma) in settings.items()]
    return {
        "experiment": "leakage",
        "dataset": data.name,
        "model": label,
        "metric": metric,
        "seeds": list(range(cfg.seed, cfg.seed + cfg.seeds)),
        "rows": rows,
        "config": cfg.to_dict(),
    }


def format_markdown(result: dict) -> str:
    m = result["metric"]
    lines = [
        f"| padding | σ | ε | row-id attack P / R | magnitude attack P / R | test {m} (± std) | MB per round |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        eps = "∞" if r["epsilon"] is None else f"{r['epsilon']:.3g}"
        lines.append(
            f"| {r['defence']} | {r['sigma']:g} | {eps} | {r['row_ids_precision']:.3f} / "
            f"{r['row_ids_recall']:.3f} | {r['magnitude_precision']:.3f} / {r['magnitude_recall']:.3f} | "
            f"{r['test']:.4f} ± {r['test_std']:.4f} | {r['bytes_per_round'] / 1e6:.2f} |"
        )
    return "\n".join(lines)


def format_csv(result: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    cols = [
        "pad_uploads",
        "sigma",
        "epsilon",
        "row_ids_precision",
        "row_ids_recall",
        "magnitude_precision",
        "magnitude_recall",
        "test",
        "test_std",
        "valid",
        "bytes_per_round",
    ]
    w.writerow(cols)
    for r in result["rows"]:
        w.writerow([r[c] for c in cols])
    return buf.getvalue()


def write_leakage(result: dict, out_dir) -> None:
    """table.md, table.csv and result.json in ``out_dir``."""
    from ..atomic_write import atomic_write_text

    out = Path(out_dir)
    atomic_write_text(out / "table.md", format_markdown(result) + "\n")
    atomic_write_text(out / "table.csv", format_csv(result))
    write_json_atomic(out / "result.json", result)
