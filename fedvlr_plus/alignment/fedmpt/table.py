"""FedMPT over several seeds: each row's per-seed figures, paired tests of every row against the single-prompt
baseline, as a JSON-ready dict and as markdown."""

from __future__ import annotations

import numpy as np

from ..paired_seeds import diff_text, paired, seeds_cell

#: figures of the seed table (higher is better except the two spurious rates)
FIGURES = ("mAP", "co_label_auc", "spurious_rate", "spurious_rate_at_r", "CF1", "OF1")


def _rows(report: dict) -> dict:
    """Row name -> figures of one seed's report (baseline, then the ablation rows, or FedMPT alone)."""
    return {"baseline": report["baseline"], **(report.get("ablation") or {"prompts+ot+gate": report["fedmpt"]})}


def seeds_report(per_seed: list[dict], seeds) -> dict:
    """Per-seed reports of ``align fedmpt`` -> means per row and figure, and each row minus the baseline."""
    rows = _rows(per_seed[0])
    mean = {r: {f: float(np.mean([_rows(s)[r][f] for s in per_seed])) for f in FIGURES} for r in rows}
    tests = {
        f"{r} - baseline": {
            f: paired([_rows(s)[r][f] for s in per_seed], [s["baseline"][f] for s in per_seed]) for f in FIGURES
        }
        for r in rows
        if r != "baseline"
    }
    keep = (
        "source",
        "n_items",
        "n_train",
        "n_test",
        "clients",
        "rounds",
        "evaluated_on",
        "decision_rule",
        "ot_rho",
        "raters",
    )
    return {
        **{k: per_seed[0][k] for k in keep},
        "seeds": list(seeds),
        "mean": mean,
        "paired": tests,
        "per_seed": per_seed,
    }


def markdown(report: dict, command: str) -> str:
    seeds, per_seed = report["seeds"], report["per_seed"]
    lines = [
        f"Command: `{command}`",
        "",
        f"Source {report['source']}; {report['n_train']} train / {report['n_test']} {report['evaluated_on']} "
        f"items; {report['clients']} clients, {report['rounds']} rounds, {report['raters']} rater tokens, "
        f"rho {report['ot_rho']}, decision rule {report['decision_rule']}. Cells: seed "
        f"{' / '.join(map(str, seeds))} (**mean**).",
        "",
        "| Row | " + " | ".join(FIGURES) + " |",
        "|---" * (len(FIGURES) + 1) + "|",
    ]
    for r in report["mean"]:
        cells = [seeds_cell([_rows(s)[r][f] for s in per_seed]) for f in FIGURES]
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each row minus the baseline, paired over seeds (mean ± standard error, seeds where higher, "
        "paired t-test p; lower is better for the spurious rates):",
        "",
        "| Comparison | " + " | ".join(FIGURES) + " |",
        "|---" * (len(FIGURES) + 1) + "|",
    ]
    for name, row in report["paired"].items():
        lines.append(f"| {name} | " + " | ".join(diff_text(row[f]) for f in FIGURES) + " |")
    return "\n".join(lines) + "\n"
