"""The paper table's report: notes on missing parts, Markdown, CSV, JSON, a plot and the terminal summary of the
result :func:`fedvlr_plus.experiments.paper.table.run_paper_table` returns."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from ...atomic_write import atomic_write, atomic_write_text
from ...jsonio import write_json_atomic
from .sparsity import sparsity_frame, sparsity_markdown

#: the parts of the table, in the order they are reported
PARTS = ("all", "warm", "cold", "cold_among_cold")


def table_notes(result: dict) -> list[str]:
    """One sentence per part of the table that no row has (no cold targets in test, say), so that every report
    says why a section is missing instead of leaving it out silently."""
    from ...evaluation.results import empty_part_reason

    present = {r["part"] for r in result["rows"]}
    notes = []
    for part in (p for p in PARTS if p not in present):
        why = empty_part_reason("cold" if part == "cold_among_cold" else part)
        if part == "cold_among_cold" and not result.get("n_cold_items"):
            why = "no cold items to rank among; every item has a training interaction"
        notes.append(f"{part.replace('_', ' ')}: {why}")
    return notes


def _fmt(row: dict, k: str) -> str:
    v = row.get(k)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    lo, hi = row.get(f"{k}_ci", [math.nan, math.nan])
    sd = row.get(f"{k}_std", 0.0)
    s = f"{v:.4f}"
    if row.get("seeds", 1) > 1:
        s += f" ± {sd:.4f}"
    if lo is not None and not math.isnan(lo):
        s += f" [{lo:.4f}, {hi:.4f}]"
    return s


def markdown_table(result: dict) -> str:
    keys = result["metrics"]
    lines = [
        f"# Table 2 on {result['dataset']} (test, full ranking, training items masked; "
        f"seeds {result['seeds']}; model selection on validation only)",
        "",
    ]
    titles = {
        "all": "All test targets",
        "warm": "Warm targets (item seen in training)",
        "cold": "Cold targets (never in training), ranked among all items",
        "cold_among_cold": "Cold targets ranked among cold items only",
    }
    for part in PARTS:
        part_rows = [r for r in result["rows"] if r["part"] == part]
        if not part_rows:
            continue
        lines += [
            f"## {titles[part]} ({part_rows[0]['n_users']} users)",
            "",
            "| model | " + " | ".join(keys) + " |",
            "|---" * (len(keys) + 1) + "|",
        ]
        for r in part_rows:
            lines.append(f"| {r['model']} | " + " | ".join(_fmt(r, k) for k in keys) + " |")
        lines.append("")
    for label, why in result.get("skipped", {}).items():
        lines.append(f"Not run: {label} ({why}).")
    for note in result.get("notes", []):
        lines.append(f"Not reported: {note}.")
    for label, t in result.get("tuning", {}).items():
        if t.get("from"):
            lines.append(f"Recipe of {label}: {t['selected']}, the one {t['from']} chose (--tune).")
            continue
        scores = ", ".join(f"{c['name']} {c['valid']:.4f}" for c in t["candidates"])
        lines.append(
            f"Recipe of {label} chosen on valid {t['metric']} (seed {t['seed']}; --tune): {t['selected']} ({scores})."
        )
    lines.append(
        "Mean over seeds ± standard deviation across seeds [95% bootstrap CI over users of the per-user "
        "values averaged over seeds]. References: pop/random/antipop and the content-only ranker."
    )
    if result["paired_tests"]:
        lines += [
            "",
            "## Paired tests over users (per-user values averaged over seeds)",
            "",
            "| comparison | part | metric | mean a | mean b | diff | t-test p | Wilcoxon p |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, parts in result["paired_tests"].items():
            for part, per in parts.items():
                for k, t in per.items():
                    lines.append(
                        f"| {name} | {part} | {k} | {t['mean_a']:.4f} | {t['mean_b']:.4f} | "
                        f"{t['mean_diff']:+.4f} | {t['t_pvalue']:.3g} | {t['wilcoxon_pvalue']:.3g} |"
                    )
    lines += sparsity_markdown(result.get("sparsity", {}), headline_metric(keys))
    return "\n".join(lines) + "\n"


def headline_metric(keys: list[str]) -> str:
    """The metric the plot and the history-length section show: NDCG at the largest cut-off, if any."""
    ndcg = [k for k in keys if k.startswith("ndcg")]
    return max(ndcg or keys, key=lambda k: int(k.split("@")[1]))


def write_report(result: dict, out: Path) -> None:
    """table.csv, table.md, result.json, table.png (NDCG at the largest K, by part, with CIs) and sparsity.csv
    (every row by users' history length)."""
    out.mkdir(parents=True, exist_ok=True)
    keys = result["metrics"]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        ["model", "kind", "part", "n_users", "seeds"]
        + [c for k in keys for c in (k, f"{k}_std", f"{k}_ci_low", f"{k}_ci_high")]
    )
    for r in result["rows"]:
        w.writerow(
            [r["model"], r["kind"], r["part"], r["n_users"], r["seeds"]]
            + [c for k in keys for c in (r.get(k), r.get(f"{k}_std"), *r.get(f"{k}_ci", [None, None]))]
        )
    atomic_write_text(out / "table.csv", buf.getvalue())
    atomic_write_text(out / "table.md", markdown_table(result))
    if result.get("sparsity", {}).get("buckets"):
        atomic_write_text(out / "sparsity.csv", sparsity_frame(result["sparsity"]).to_csv(index=False))
    write_json_atomic(out / "result.json", result)
    plot_table(result, out / "table.png")


def plot_table(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = headline_metric(result["metrics"])
    parts = [p for p in PARTS if any(r["part"] == p for r in result["rows"])]
    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(parts), figsize=(4.2 * len(parts), 0.32 * len(models) + 1.6), squeeze=False)
    for ax, part in zip(axes[0], parts):
        by = {r["model"]: r for r in result["rows"] if r["part"] == part}
        ys = np.arange(len(models))
        vals = [by[m][key] if m in by else np.nan for m in models]

        def err(m, side, by=by):  # CI half-widths; a degenerate interval (all values equal) draws none
            if m not in by or by[m][f"{key}_ci"][side] is None or math.isnan(by[m][f"{key}_ci"][side]):
                return 0.0
            return max(0.0, (by[m][key] - by[m][f"{key}_ci"][0]) if side == 0 else (by[m][f"{key}_ci"][1] - by[m][key]))

        lo = [err(m, 0) for m in models]
        hi = [err(m, 1) for m in models]
        colors = [
            "#999999"
            if m in ("pop", "random", "antipop", "content")
            else ("#1f77b4" if "+fedvlr" in m else ("#2ca02c" if "+" in m else "#ff7f0e"))
            for m in models
        ]
        ax.barh(ys, vals, xerr=[lo, hi], color=colors, capsize=2)
        ax.set_yticks(ys, models if ax is axes[0][0] else [""] * len(models))
        ax.invert_yaxis()
        ax.set_title(part.replace("_", " "))
        ax.set_xlabel(key)
    fig.suptitle(f"{result['dataset']}: test {key} (95% CI)")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def print_table(result: dict, file=None) -> None:
    keys = result["metrics"]
    for part in PARTS:
        part_rows = [r for r in result["rows"] if r["part"] == part]
        if not part_rows:
            continue
        print(f"[{part}] {part_rows[0]['n_users']} users", file=file)
        w = max(22, *(len(r["model"]) for r in part_rows))
        print(f"  {'model':<{w}}" + "".join(f"{k:>12}" for k in keys), file=file)
        for r in part_rows:
            print(f"  {r['model']:<{w}}" + "".join(f"{r[k]:>12.4f}" for k in keys), file=file)
    for note in result.get("notes", []):
        print(f"note: {note}", file=file)
    for name, parts in result["paired_tests"].items():
        for part, per in parts.items():
            k = keys[-1]
            t = per[k]
            print(
                f"  {name} [{part}] {k}: {t['mean_diff']:+.4f} (t-test p {t['t_pvalue']:.3g}, "
                f"Wilcoxon p {t['wilcoxon_pvalue']:.3g})",
                file=file,
            )
