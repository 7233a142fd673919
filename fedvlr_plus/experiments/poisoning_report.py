"""The poisoning table as Markdown, CSV and a plot (exposure and NDCG against the attacker fraction)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ..atomic_write import atomic_write, atomic_write_text, make_dirs
from ..jsonio import write_json_atomic
from .poisoning import EXPOSURE_KS, TEST_KEYS

COLUMNS = [f"exposure_hr@{k}" for k in EXPOSURE_KS] + [f"test_{k}" for k in TEST_KEYS]


def _cell(row: dict, key: str) -> str:
    if row.get(key) is None:
        return "–"
    lo, hi = row[f"{key}_ci"]
    p = row.get(f"{key}_p")
    mark = "" if p is None else (f" (p={p:.0e})" if p < 1e-3 else f" (p={p:.2f})")
    return f"{row[key]:.4f} ± {row[f'{key}_std']:.4f} [{lo:.4f}, {hi:.4f}]{mark}"


def markdown_table(result: dict) -> str:
    head = ["aggregation", "attackers", "fake clients"] + [c.replace("_", " ") for c in COLUMNS] + ["rounds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in result["rows"]:
        cells = [row["strategy"], f"{row['fraction']:.0%}", str(row["attackers"])]
        cells += [_cell(row, c) for c in COLUMNS]
        cells.append(",".join(map(str, row["selected_rounds"])))
        lines.append("| " + " | ".join(cells) + " |")
    s = result["settings"]
    lines += [
        "",
        f"Mean ± std over {s['seeds']} seeds (targets {', '.join(map(str, s['targets']))}); "
        "[95% bootstrap CI over the pooled (seed, user) values]; p: paired t-test against the same "
        "aggregation without attackers. exposure hr@K: the target's HR@K among users who never "
        "interacted with it; test ndcg@K: all test users, at the round selected on validation.",
        f"CPU time {result['cpu_s']:.0f} s, wall time {result['wall_s']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def csv_text(result: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    extra = [s for c in COLUMNS for s in (c, f"{c}_std", f"{c}_ci_low", f"{c}_ci_high", f"{c}_p")]
    w.writerow(["strategy", "fraction", "attackers", "seeds", "targets", "selected_rounds"] + extra)
    for r in result["rows"]:
        vals = [v for c in COLUMNS for v in (r[c], r[f"{c}_std"], *r[f"{c}_ci"], r[f"{c}_p"])]
        w.writerow(
            [
                r["strategy"],
                r["fraction"],
                r["attackers"],
                " ".join(map(str, r["seeds"])),
                " ".join(map(str, r["targets"])),
                " ".join(map(str, r["selected_rounds"])),
            ]
            + vals
        )
    return buf.getvalue()


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in (
        (axes[0], "exposure_hr@10", "target exposure HR@10"),
        (axes[1], "test_ndcg@10", "test NDCG@10"),
    ):
        for strategy in dict.fromkeys(r["strategy"] for r in result["rows"]):
            rows = [r for r in result["rows"] if r["strategy"] == strategy]
            x = [100 * r["fraction"] for r in rows]
            ax.errorbar(
                x, [r[key] for r in rows], yerr=[r[f"{key}_std"] for r in rows], marker="o", capsize=3, label=strategy
            )
        ax.set_xlabel("attackers (% of real clients)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"item promotion on {result['settings']['dataset']} ({result['settings']['backbone']})")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)


def write_report(result: dict, out) -> None:
    """``poisoning.md``, ``poisoning.csv``, ``poisoning.png`` and ``result.json`` in ``out``."""
    out = make_dirs(Path(out))
    atomic_write_text(out / "poisoning.md", markdown_table(result))
    atomic_write_text(out / "poisoning.csv", csv_text(result))
    plot(result, out / "poisoning.png")
    write_json_atomic(out / "result.json", result)
