"""The FedVLR paper's Table 4 with its privacy budget (``fedvlr-plus experiment privacy-table``).

One federated run per noise multiplier σ (clipped, noised uploads, :mod:`fedvlr_plus.federation.privacy.noise`) and
seed, each selected on validation (the engine's early stopping); the table gives the test figure at the selected
round (mean and standard deviation over seeds, a bootstrap interval over users of the per-user values averaged
over seeds, and a paired test against the unprotected run) beside the accounted client-level ε of that run
(:mod:`fedvlr_plus.federation.privacy.accountant`).

Every σ row clips uploads at the same C, σ = 0 included, and the first row is the run with neither clipping nor
noise: the σ = 0 row then shows what clipping alone costs, and each other row what the noise adds on top.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..evaluation import EvalResult, paired_test
from ..evaluation.stats import bootstrap_ci
from ..jsonio import write_json_atomic


def per_user_mean(runs, metric: str) -> pd.DataFrame:
    """Each user's test ``metric`` at the selected round, averaged over the seeds (users in every seed)."""
    frames = [r.best["test_full"].frame("all")[["user", metric]] for r in runs]
    g = pd.concat(frames).groupby("user")[metric]
    mean = g.mean()[g.size() == len(frames)]
    return mean.reset_index()


def summarise_runs(runs, metric: str, seed: int) -> dict:
    """Test ``metric`` over seeds (mean, std), its bootstrap CI over users, validation figure, selected rounds."""
    per_seed = [float(r.best["test_full"].frame("all")[metric].mean()) for r in runs]
    users = per_user_mean(runs, metric)
    return {
        "test": float(np.mean(per_seed)),
        "test_std": float(np.std(per_seed, ddof=1)) if len(runs) > 1 else 0.0,
        "test_ci": bootstrap_ci(users[metric].to_numpy(), seed=seed),
        "per_seed": per_seed,
        "valid": float(np.mean([r.best["valid"][metric] for r in runs])),
        "selected_round": [int(r.best["round"]) for r in runs],
        "n_users": int(len(users)),
        "privacy": runs[0].result_json.get("privacy"),
    }


def paired_vs(runs, base_runs, metric: str) -> dict:
    """Paired test over users of the seed-averaged per-user ``metric``: ``runs`` minus ``base_runs``."""

    def as_result(frame):
        empty = pd.DataFrame(columns=["user", metric])
        return EvalResult(per_user=frame, per_user_warm=empty, per_user_cold=empty, metric_names=[metric])

    return paired_test(as_result(per_user_mean(runs, metric)), as_result(per_user_mean(base_runs, metric)), metric)


def run_privacy_table(
    data,
    backbone,
    cfg,
    noises,
    *,
    metric: str = "ndcg@50",
    label: str = "",
    jobs: int | None = 1,
    folder=None,
    resume: bool = False,
) -> dict:
    """The unprotected run, then every σ in ``noises`` with uploads clipped at ``cfg.upload_clip`` (1.0 when
    unset), each over ``cfg.seeds`` seeds; the JSON-ready table. ``jobs``, ``folder``, ``resume``: how the runs
    train, where they checkpoint and whether those there continue (:func:`.setting_runs.train_settings`)."""
    from ..federation.privacy.accountant import DEFAULT_UPLOAD_CLIP
    from .setting_runs import train_settings

    clip = float(cfg.upload_clip or DEFAULT_UPLOAD_CLIP)  # the engine's own default when noise is on
    settings = {
        f"sigma-{sigma:g}-clip-{c:g}": (sigma, c) for sigma, c in [(0.0, 0.0)] + [(float(s), clip) for s in noises]
    }
    cfgs = {
        name: replace(cfg, upload_noise=sigma, upload_clip=c, target_epsilon=None)
        for name, (sigma, c) in settings.items()
    }
    trained = train_settings(data, backbone, cfgs, jobs=jobs, folder=folder, resume=resume)
    rows, base = [], None
    for name, (sigma, c) in settings.items():
        runs = trained[name]
        row = {"sigma": sigma, "clip": c, **summarise_runs(runs, metric, cfg.seed)}
        p = row["privacy"] or {}
        row["epsilon"], row["epsilon_server"] = p.get("epsilon"), p.get("epsilon_server")
        if base is None:
            base = runs
        else:
            t = paired_vs(runs, base, metric)
            row["vs_unprotected"] = {k: t[k] for k in ("mean_diff", "t_pvalue", "wilcoxon_pvalue") if k in t}
        rows.append(row)
    first = next((r["privacy"] for r in rows if r["privacy"]), {}) or {}
    return {
        "experiment": "privacy-table",
        "dataset": data.name,
        "model": label,
        "metric": metric,
        "seeds": list(range(cfg.seed, cfg.seed + cfg.seeds)),
        "rows": rows,
        "delta": first.get("delta"),
        "clip": clip,
        "q": first.get("q"),
        "config": cfg.to_dict(),
    }


def row_label(row: dict) -> str:
    """``none`` for the unprotected run, else σ (its uploads clipped)."""
    return "none" if row["clip"] == 0 and row["sigma"] == 0 else f"{row['sigma']:g}"


def _fmt(x, spec=".4f") -> str:
    return "—" if x is None else format(x, spec)


def format_markdown(result: dict) -> str:
    m = result["metric"]
    lines = [
        f"| σ | clip C | ε (δ = {_fmt(result['delta'], '.2g')}) | ε vs server | valid {m} | test {m} (± std) | "
        f"95% CI | Δ vs none (p) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        vs = r.get("vs_unprotected")
        diff = f"{vs['mean_diff']:+.4f} ({vs.get('t_pvalue', float('nan')):.2g})" if vs else "—"
        eps = "∞" if r["epsilon"] is None else f"{r['epsilon']:.3g}"
        eps_s = "∞" if r["epsilon_server"] is None else f"{r['epsilon_server']:.3g}"
        clip = "off" if r["clip"] == 0 else f"{r['clip']:g}"
        lines.append(
            f"| {row_label(r)} | {clip} | {eps} | {eps_s} | {r['valid']:.4f} | {r['test']:.4f} ± "
            f"{r['test_std']:.4f} | [{_fmt(r['test_ci'][0])}, {_fmt(r['test_ci'][1])}] | {diff} |"
        )
    return "\n".join(lines)


def format_csv(result: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "sigma",
            "clip",
            "epsilon",
            "delta",
            "epsilon_server",
            "valid",
            "test",
            "test_std",
            "ci_low",
            "ci_high",
            "mean_diff_vs_unprotected",
            "t_pvalue",
        ]
    )
    for r in result["rows"]:
        vs = r.get("vs_unprotected") or {}
        w.writerow(
            [
                r["sigma"],
                r["clip"],
                r["epsilon"],
                result["delta"],
                r["epsilon_server"],
                r["valid"],
                r["test"],
                r["test_std"],
                r["test_ci"][0],
                r["test_ci"][1],
                vs.get("mean_diff"),
                vs.get("t_pvalue"),
            ]
        )
    return buf.getvalue()


def plot(result: dict, path: Path) -> None:
    """Test metric against σ with its CI, each point labelled with its ε."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    x = np.arange(len(rows))
    y = np.array([r["test"] for r in rows])
    lo = y - np.array([r["test_ci"][0] for r in rows])
    hi = np.array([r["test_ci"][1] for r in rows]) - y
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=4)
    for xi, yi, r in zip(x, y, rows):
        eps = "ε = ∞" if r["epsilon"] is None else f"ε = {r['epsilon']:.3g}"
        ax.annotate(eps, (xi, yi), textcoords="offset points", xytext=(6, 8), fontsize=8)
    ax.set_xticks(x, [row_label(r) for r in rows])
    ax.set_xlabel(f"noise multiplier σ (uploads clipped at C = {result['clip']:g}; none: no clipping, no noise)")
    ax.set_ylabel(f"test {result['metric']} (95% CI)")
    ax.set_title(f"{result['model']} on {result['dataset']}: utility vs privacy", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def write_privacy_table(result: dict, out_dir) -> None:
    """table.md, table.csv, result.json and table.png in ``out_dir``."""
    from ..atomic_write import atomic_write, atomic_write_text

    out = Path(out_dir)
    atomic_write_text(out / "table.md", format_markdown(result) + "\n")
    atomic_write_text(out / "table.csv", format_csv(result))
    atomic_write(out / "table.png", lambda tmp: plot(result, Path(tmp)))
    write_json_atomic(out / "result.json", result)
