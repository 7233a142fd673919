"""Seeds of the MoR comparison turned into mean +- std, paired t-tests (scipy.stats.ttest_rel, MoR against each
other row on the same seeds) and the markdown table the docs quote."""

from __future__ import annotations

import numpy as np

ROWS = ("reference", "fedavg", "uniform", "mor")
LABELS = {
    "reference": "reference policy (backbone)",
    "fedavg": "GRPO on the FedAvg reward",
    "uniform": "GRPO on uniform reward averaging",
    "mor": "GRPO on MoR's routed reward",
}
POPULATIONS = ("clients", "held_out_clients")


def _policy_value(run: dict, row: str, pop: str, part: str, metric: str) -> float:
    if row == "reference":
        return run["reference"][pop][part][metric]
    return run["policy"][row][pop][part]["grpo"][metric]


def per_seed_values(runs: list[dict]) -> dict:
    """{"pop/part/metric/row": [value per seed]} for the policies, and {"reward/<where>/row": [...]} for the
    rewards' pairwise accuracy (where: held-out users of the clients, or the held-out clients)."""
    out = {}
    for pop in POPULATIONS:
        for part in ("valid", "test"):
            for metric in ("hr@10", "ndcg@10"):
                for row in ROWS:
                    out[f"{pop}/{part}/{metric}/{row}"] = [_policy_value(r, row, pop, part, metric) for r in runs]
    for where, key in (("held_out_users", "reward_accuracy"), ("held_out_clients", "reward_accuracy_held_out_clients")):
        for row in ROWS[1:]:
            out[f"reward/{where}/{row}"] = [r[key][row] for r in runs]
    return out


def paired_test(a, b) -> dict:
    """Paired t-test of a against b over the same seeds (nan where fewer than two seeds or no spread)."""
    from scipy.stats import ttest_rel

    a, b = np.asarray(a, float), np.asarray(b, float)
    diff = a - b
    if len(a) < 2 or np.allclose(diff, diff[0]):
        return {"mean_diff": float(diff.mean()) if len(a) else float("nan"), "t": float("nan"), "p": float("nan")}
    res = ttest_rel(a, b)
    return {"mean_diff": float(diff.mean()), "t": float(res.statistic), "p": float(res.pvalue)}


def summarise(runs: list[dict]) -> dict:
    """Mean, std (ddof 1) and n of every value, and MoR's paired tests against every other row."""
    values = per_seed_values(runs)
    stats = {
        k: {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else float("nan"), "n": len(v)}
        for k, v in values.items()
    }
    tests = {}
    for key in values:
        head, _, row = key.rpartition("/")
        if row == "mor":
            for other in ROWS:
                if other != "mor" and f"{head}/{other}" in values:
                    tests[f"{head}/mor-vs-{other}"] = paired_test(values[key], values[f"{head}/{other}"])
    return {"values": values, "stats": stats, "tests": tests}


def _cell(stats: dict, key: str, scale: float = 100.0) -> str:
    s = stats.get(key)
    if s is None:
        return "—"
    sd = "" if s["std"] != s["std"] else f" ± {scale * s['std']:.2f}"
    return f"{scale * s['mean']:.2f}{sd}"


def _p(tests: dict, key: str) -> str:
    t = tests.get(key)
    return "—" if t is None or t["p"] != t["p"] else f"{t['p']:.3g}"


def markdown_table(result: dict, command: str) -> str:
    """The comparison table (percent, mean ± std over seeds) with MoR's paired-test p-values per row."""
    st, tests = result["summary"]["stats"], result["summary"]["tests"]
    n = len(result["seeds"])
    lines = [
        f"`{command}` ({n} seed{'s' if n != 1 else ''}: {', '.join(map(str, result['seeds']))}; "
        f"held-out clients: {', '.join(result['held_out_clients']) or 'none'})",
        "",
        "| row | test HR@10 | test NDCG@10 | p (MoR vs row, HR / NDCG) | valid HR@10 | reward acc., held-out "
        "users | held-out clients: test HR@10 | NDCG@10 | reward acc. |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        base = "clients/test"
        p = (
            "—"
            if row == "mor"
            else (f"{_p(tests, f'{base}/hr@10/mor-vs-{row}')} / {_p(tests, f'{base}/ndcg@10/mor-vs-{row}')}")
        )
        lines.append(
            " | ".join(
                [
                    f"| {LABELS[row]}",
                    _cell(st, f"{base}/hr@10/{row}"),
                    _cell(st, f"{base}/ndcg@10/{row}"),
                    p,
                    _cell(st, f"clients/valid/hr@10/{row}"),
                    _cell(st, f"reward/held_out_users/{row}"),
                    _cell(st, f"held_out_clients/test/hr@10/{row}"),
                    _cell(st, f"held_out_clients/test/ndcg@10/{row}"),
                    _cell(st, f"reward/held_out_clients/{row}"),
                ]
            )
            + " |"
        )
    lines += [
        "",
        "p: paired t-test over seeds (scipy.stats.ttest_rel) of MoR's GRPO policy against the row, on the "
        "participating clients' users; — where undefined (one seed, or no spread).",
    ]
    return "\n".join(lines) + "\n"
