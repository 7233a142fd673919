"""FedDTL's report table: per-seed figures of the three methods, paired tests over seeds and the split's skew,
as a JSON-ready dict and as markdown."""

from __future__ import annotations

import numpy as np

from ..paired_seeds import diff_text, paired, seeds_cell

#: (row name, method, reference) of the paired comparisons, each on every figure
COMPARISONS = (
    ("FedDTL - FedAvg both", "feddtl", "fedavg_both"),
    ("decoupled SFT - FedAvg both", "decoupled_sft", "fedavg_both"),
    ("FedDTL - decoupled SFT", "feddtl", "decoupled_sft"),
)
FIGURES = (("warm", "hr@10"), ("cold", "hr@10"), ("warm", "ndcg@10"), ("cold", "ndcg@10"))
METHOD_NAMES = {
    "fedavg_both": "FedAvg of both towers",
    "decoupled_sft": "decoupled SFT only",
    "feddtl": "FedDTL (SFT + GRPO)",
}


def paired_tests(per_seed: list[dict]) -> dict:
    """Every comparison of :data:`COMPARISONS` on every figure of :data:`FIGURES`, from the per-seed headlines."""
    return {
        name: {
            f"{kind} {fig}": paired([s[m][kind][fig] for s in per_seed], [s[r][kind][fig] for s in per_seed])
            for kind, fig in FIGURES
        }
        for name, m, r in COMPARISONS
    }


def tv_summary(tvs: list[float]) -> dict:
    return {"mean": float(np.mean(tvs)), "min": float(np.min(tvs)), "max": float(np.max(tvs))}


def _count(report: dict, key: str) -> str:
    """An item count, as a range over the seeds when each seed draws its own classes."""
    values = [row[key] for row in report["per_seed"] if key in row] or [report[key]]
    return str(min(values)) if min(values) == max(values) else f"{min(values)}–{max(values)}"


def _shots(report: dict) -> str:
    """The few-shot regime's clause of the table's caption (empty with every training interaction)."""
    shots = report.get("shots", 0)
    if not shots:
        return ""
    counts = [s["labelled_examples"] for s in report["per_seed"]]
    noun = "example" if shots == 1 else "examples"
    return f"few-shot: at most {shots} training {noun} per item ({min(counts)}-{max(counts)} in all); "


def _split(report: dict) -> str:
    """The caption's clause on what the Dirichlet dealt to the clients."""
    if report.get("split", "users") == "examples":
        if report["alpha"] == 0:
            return "each class's training examples all at one client (alpha 0, the pathological split)"
        return f"each class's training examples dealt by Dirichlet alpha {report['alpha']}"
    if report["alpha"] == 0:
        return f"each dominant class's users all at one client (alpha 0; {report['dominant']})"
    return f"Dirichlet alpha {report['alpha']} over each user's dominant class ({report['dominant']})"


def _headline(report: dict) -> str:
    """Which model the table's cells score: one global model under the split over examples (no client owns a
    user), else the global one for FedAvg of both towers and each client's own tower for the decoupled methods."""
    if report.get("split", "users") == "examples":
        return "every method's global model (no client owns a user under the split over examples)"
    return (
        "headline evaluation (global model for FedAvg of both towers, each client's own tower for the "
        "decoupled methods)"
    )


def markdown(report: dict, command: str) -> str:
    """The table a reader gets: the methods per seed, the paired tests, and each seed's split skew."""
    seeds, per_seed = report["seeds"], report["per_seed"]
    lines = [
        f"Command: `{command}`",
        "",
        f"Source {report['source']}; {_count(report, 'n_warm_items')} warm (base) / "
        f"{_count(report, 'n_cold_items')} cold (novel) items; classes: {report['classes']}; "
        f"{report['clients']} clients, {_split(report)}; "
        f"{_shots(report)}evaluated on {report['evaluated_on']}. "
        f"Cells: seed {' / '.join(map(str, seeds))} (**mean**); {_headline(report)}.",
        "",
        "| Method | base (warm) HR@10 | novel (cold) HR@10 | base NDCG@10 | novel NDCG@10 |",
        "|---|---|---|---|---|",
    ]
    for m, name in METHOD_NAMES.items():
        lines.append(f"| {name} | " + " | ".join(seeds_cell([s[m][k][f] for s in per_seed]) for k, f in FIGURES) + " |")
    lines += [
        "",
        "Paired over seeds (difference mean ± standard error, seeds where higher, paired t-test p):",
        "",
        "| Comparison | " + " | ".join(f"{k} {f}" for k, f in FIGURES) + " |",
        "|---|---|---|---|---|",
    ]
    for name, row in report["paired"].items():
        lines.append(f"| {name} | " + " | ".join(diff_text(row[f"{k} {f}"]) for k, f in FIGURES) + " |")
    lines += [
        "",
        "Split skew per seed (users per client; total-variation distance of each client's training-item "
        "class mix to the global mix, mean / min / max):",
        "",
    ]
    for s, row in zip(seeds, per_seed):
        tv = row["client_class_tv"]
        novel = f", novel classes {row['novel_classes']}" if "novel_classes" in row else ""
        examples = f", examples {row['client_examples']}" if "client_examples" in row else ""
        lines.append(
            f"- seed {s}: users {row['client_users']}{examples}, TV {tv['mean']:.3f} / {tv['min']:.3f} / "
            f"{tv['max']:.3f}{novel}"
        )
    return "\n".join(lines) + "\n"
