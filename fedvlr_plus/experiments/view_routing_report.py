"""Markdown and JSON of the view-routing ablation and the planted benchmark (:mod:`.view_routing`, :mod:`.planted`):
one table of rows with paired tests against ``FedVLR (views)``, and the routers' weight recovery."""

from __future__ import annotations

import math

from .view_routing import VIEWS_ROW


def _p(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.1e}" if x < 1e-3 else f"{x:.3f}"


def rows_table(setting: dict, which: str = "all") -> str:
    """Every row: the metrics (mean ± sd over seeds), the difference from FedVLR (views) on the first metric and
    its paired p-values over users, seconds per round (``which``: all or warm test targets)."""
    result, metric = setting["result"], setting["metric"]
    paired = setting["paired"] if which == "all" else setting["warm_paired"]
    table = result.table(which)
    head = (
        "| row | "
        + " | ".join(f"test {k}" for k in result.metrics)
        + f" | FedVLR (views) − row, {metric} | p (t) | p (Wilcoxon) | s / round |"
    )
    lines = [head, "|" + "---|" * (len(result.metrics) + 5)]
    for label, row in table.iterrows():
        cells = [f"{row[k]:.4f} ± {row[f'{k}_sd']:.4f}" for k in result.metrics]
        test = paired.get(label)
        diff = "—" if test is None else f"{test['mean_diff']:+.4f}"
        pt = "—" if test is None else _p(test["t_pvalue"])
        pw = "—" if test is None else _p(test["wilcoxon_pvalue"])
        sec = setting["rows"].get(label, {}).get("seconds_per_round")
        lines.append(
            f"| {label} | "
            + " | ".join(cells)
            + f" | {diff} | {pt} | {pw} | "
            + ("—" if sec is None else f"{sec:.2f}")
            + " |"
        )
    seeds = int(table["seeds"].max())
    users = f"{int(table['users'].max())} test users" + ("" if which == "all" else " with warm targets")
    lines += [
        "",
        f"{setting['data']}: {users}, {seeds} seeds; mean ± sd across "
        f"seeds; paired tests over users of the seed-averaged figure.",
    ]
    return "\n".join(lines)


def recovery_table(setting: dict) -> str:
    """Per routed row: argmax accuracy and Spearman's rho against the planted modality (mean over seeds, and each
    seed), the mean weight on the planted modality's view, the mean weights."""
    lines = [
        "| router | experts | argmax accuracy | Spearman ρ | weight on planted view | mean weights | "
        "accuracy per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, rec in setting["recovery"].items():
        per_seed = ", ".join(f"{s['accuracy']:.3f}" for s in rec["seeds"])
        lines.append(
            f"| {label} | {', '.join(rec['experts'])} | {_f(rec['accuracy'])} | {_f(rec['spearman'])} | "
            f"{_f(rec['mean_weight_on_planted'])} | {', '.join(f'{w:.3f}' for w in rec['mean_weights'])} "
            f"| {per_seed} |"
        )
    sizes = ", ".join(f"{k} {v}" for k, v in setting["planted"].items())
    lines += [
        "",
        f"Users planted with each modality: {sizes}. Operator experts name no modality: each is read as "
        "the modality most of the users it wins for were planted with (the best labelling there is).",
    ]
    return "\n".join(lines)


def lean_table(setting: dict) -> str:
    """The per-user look: users by the view their router leans on and how decided it is, and the mean gain of
    FedVLR (views) over the fixed fusions there."""
    entries = setting.get("by_lean") or []
    if not entries:
        return ""
    gains = [k for k in entries[0] if k.startswith("gain over")]
    lines = [
        f"| leans on | largest weight | users | {VIEWS_ROW} {setting['metric']} | " + " | ".join(gains) + " |",
        "|" + "---|" * (4 + len(gains)),
    ]
    for e in entries:
        lines.append(
            f"| {e['leans_on']} | {e['top_weight']} | {e['users']} | {e[VIEWS_ROW]:.4f} | "
            + " | ".join(f"{e[g]:+.4f}" for g in gains)
            + " |"
        )
    return "\n".join(lines)


def _f(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def render(out: dict) -> str:
    """The planted report (``mixed`` and ``control``) or one data set's ablation, as Markdown."""
    parts = []
    for name, setting in out.items():
        parts.append(f"## {name}: {setting['data']}\n")
        if setting.get("recovery"):
            parts += ["### weight recovery\n", recovery_table(setting), ""]
        parts += ["### rows\n", rows_table(setting), ""]
        if setting.get("warm_paired"):
            parts += ["### rows, warm test targets\n", rows_table(setting, "warm"), ""]
        if setting.get("router_weights"):
            parts += [
                "Mean router weights: "
                + "; ".join(f"{k}: {', '.join(f'{x:.3f}' for x in w)}" for k, w in setting["router_weights"].items()),
                "",
            ]
        lean = lean_table(setting)
        if lean:
            parts += ["### where routing differs from a fixed fusion (per user)\n", lean, ""]
    return "\n".join(parts)


def to_json(out: dict) -> dict:
    """JSON-ready: every setting's table, paired tests, recovery and timing."""
    plain = {}
    for name, setting in out.items():
        plain[name] = {k: v for k, v in setting.items() if k != "result"}
        plain[name]["table"] = setting["result"].to_dict()
        plain[name]["reference"] = VIEWS_ROW
    return plain
