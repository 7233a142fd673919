"""FedVPA-GP over several seeds: each method's held-out pairwise accuracy per client type, mean ± sd over the
seeds, and paired tests of FedVPA-GP against the monolithic reward and FedVPL, as a JSON-ready dict and as
markdown."""

from __future__ import annotations

import numpy as np

from ..paired_seeds import diff_text, paired, seeds_cell

METHODS = ("monolithic", "fedvpl", "fedvpa_gp")
METHOD_NAMES = {"monolithic": "monolithic (same network, z = 0)", "fedvpl": "FedVPL", "fedvpa_gp": "FedVPA-GP"}
#: (row name, method, reference) of the paired comparisons, each on every figure
COMPARISONS = (
    ("FedVPA-GP - monolithic", "fedvpa_gp", "monolithic"),
    ("FedVPA-GP - FedVPL", "fedvpa_gp", "fedvpl"),
    ("FedVPL - monolithic", "fedvpl", "monolithic"),
)
#: the central (no federation) linear rewards of the report's ``ceiling``
CEILINGS = {
    "pooled": "central pooled linear BT (no federation)",
    "per_type": "central per-type linear BT (oracle type)",
}


def figure_names(types) -> list[str]:
    """The table's columns: each client type, their mean, and the unseen clients."""
    return [*types, "mean of types", "unseen"]


def method_figures(report: dict, method: str) -> dict:
    """One seed's figures of one method: accuracy per type, the mean over types, the unseen clients' accuracy."""
    acc = report["accuracy"][method]
    return {**acc, "mean of types": float(np.mean(list(acc.values()))), "unseen": report["unseen_accuracy"][method]}


def _ceiling_figures(report: dict, kind: str) -> dict:
    acc = report["ceiling"][kind]
    return {**acc, "mean of types": float(np.mean(list(acc.values())))}


def _latent_figures(report: dict, method: str) -> dict:
    """How much a latent method uses z: KL of its posteriors to N(0, I), the swap flip rate, type separation."""
    flips = report["swap"]["flip_rate" if method == "fedvpa_gp" else "fedvpl_flip_rate"]
    sep = report["separation"][method]
    return {
        "kl": report["kl"][method],
        "swap_flip_rate": flips,
        "purity": sep["purity"],
        "silhouette": sep["silhouette"],
    }


def _spread(values) -> dict:
    v = np.asarray([x for x in values if x is not None], np.float64)
    return {"mean": float(v.mean()) if len(v) else None, "sd": float(v.std(ddof=1)) if len(v) > 1 else None}


def _cell(values) -> str:
    """A seeds cell, or a dash where a seed has no such figure (e.g. no prototypes were assigned)."""
    return "–" if any(v is None for v in values) else seeds_cell(values, sd=True)


def seeds_report(per_seed: list[dict], seeds) -> dict:
    """Per-seed reports of ``align fedvpa-gp`` -> mean ± sd per method and figure, and the paired tests."""
    types = list(per_seed[0]["accuracy"]["monolithic"])
    figs = figure_names(types)
    rows = {m: [method_figures(s, m) for s in per_seed] for m in METHODS}
    summary = {m: {f: _spread([r[f] for r in rows[m]]) for f in figs} for m in METHODS}
    ceiling = {
        k: {f: _spread([_ceiling_figures(s, k)[f] for s in per_seed]) for f in [*types, "mean of types"]}
        for k in CEILINGS
    }
    latent = {
        m: {
            k: _spread([_latent_figures(s, m)[k] for s in per_seed])
            for k in ("kl", "swap_flip_rate", "purity", "silhouette")
        }
        for m in ("fedvpl", "fedvpa_gp")
    }
    tests = {
        name: {f: paired([r[f] for r in rows[a]], [r[f] for r in rows[b]]) for f in figs} for name, a, b in COMPARISONS
    }
    first = per_seed[0]
    return {
        "source": first["source"],
        "types": types,
        "seeds": list(seeds),
        "clients": first["clients"],
        "config": {k: v for k, v in first["config"].items() if k != "seed"},
        "accuracy": summary,
        "ceiling": ceiling,
        "latent": latent,
        "paired": tests,
        "per_seed": per_seed,
    }


def markdown(report: dict, command: str) -> str:
    """The table a reader gets: per-seed accuracies with mean ± sd, z usage, and the paired tests."""
    seeds, per_seed, types = report["seeds"], report["per_seed"], report["types"]
    figs = figure_names(types)
    c = report["clients"]
    lines = [
        f"Command: `{command}`",
        "",
        f"Source {report['source']}; {c['train']} training clients ({c['pairs_per_client']:.0f} pairs each on "
        f"average), {c['unseen']} unseen clients ({c['context_pairs_unseen']} context pairs each); "
        f"{report['config']['rounds']} rounds. Held-out pairwise accuracy; cells: seed "
        f"{' / '.join(map(str, seeds))} (**mean ± sd**).",
        "",
        "| Method | " + " | ".join(figs) + " |",
        "|---" * (len(figs) + 1) + "|",
    ]
    for m in METHODS:
        cells = [seeds_cell([method_figures(s, m)[f] for s in per_seed], sd=True) for f in figs]
        lines.append(f"| {METHOD_NAMES[m]} | " + " | ".join(cells) + " |")
    for k, name in CEILINGS.items():
        cells = [seeds_cell([_ceiling_figures(s, k)[f] for s in per_seed], sd=True) for f in figs[:-1]]
        lines.append(f"| {name} | " + " | ".join(cells) + " | |")
    lines += [
        "",
        "How much z is used (KL of the posteriors to N(0, I); share of predictions flipped by swapping z "
        "between types; prototype purity and silhouette of the clients' mean z by true type):",
        "",
        "| Method | KL | swap flips | purity | silhouette |",
        "|---|---|---|---|---|",
    ]
    for m in ("fedvpl", "fedvpa_gp"):
        cells = [
            _cell([_latent_figures(s, m)[k] for s in per_seed])
            for k in ("kl", "swap_flip_rate", "purity", "silhouette")
        ]
        lines.append(f"| {METHOD_NAMES[m]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Paired over seeds (difference mean ± standard error, seeds where higher, paired t-test p):",
        "",
        "| Comparison | " + " | ".join(figs) + " |",
        "|---" * (len(figs) + 1) + "|",
    ]
    for name, row in report["paired"].items():
        lines.append(f"| {name} | " + " | ".join(diff_text(row[f]) for f in figs) + " |")
    return "\n".join(lines) + "\n"
