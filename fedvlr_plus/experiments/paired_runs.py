"""Two finished run folders compared over the same test users (``fedvlr-plus experiment paired RUN_A RUN_B``).

Each seed folder of a federated run keeps ``per_user_test.csv`` (every test user's metrics at the selected round).
A user's figure is their mean over the run's seeds; the two runs are then paired over the users both evaluated,
per metric: mean difference (A − B), paired t-test and Wilcoxon signed-rank test
(:func:`fedvlr_plus.evaluation.stats.paired_frames`). Runs on different data or splits do not pair: their users
differ, and the overlap is reported.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import RunFolderError

PER_USER_FILE = "per_user_test.csv"


def per_user_of_run(folder) -> tuple[pd.DataFrame, list[str]]:
    """``(one row per test user with the mean of each metric over the seeds, the seed folders read)``."""
    folder = Path(folder)
    files = sorted(folder.glob(f"seed-*/{PER_USER_FILE}")) or sorted(folder.glob(PER_USER_FILE))
    if not files:
        raise RunFolderError(str(folder), f"has no {PER_USER_FILE} (neither in seed-*/ nor at the top)",
                             "pass the --out folder of a finished run made by this version")
    from ..evaluation.stats import per_user_mean

    frames = [pd.read_csv(f) for f in files]
    metrics = [c for c in frames[0].columns if "@" in c]
    return per_user_mean(frames, metrics), [str(f.parent) for f in files]


def paired_runs(folder_a, folder_b, metrics=None) -> dict:
    """The paired comparison of run A against run B over their common test users."""
    from ..evaluation.stats import paired_frames

    a, seeds_a = per_user_of_run(folder_a)
    b, seeds_b = per_user_of_run(folder_b)
    common = [m for m in a.columns if "@" in m and m in b.columns]
    wanted = list(metrics) if metrics else common
    missing = [m for m in wanted if m not in common]
    if missing:
        raise RunFolderError(str(folder_a if missing[0] not in a.columns else folder_b),
                             f"has no per-user {', '.join(missing)}", f"choose from {', '.join(common)}")
    return {"a": str(folder_a), "b": str(folder_b), "seeds_a": len(seeds_a), "seeds_b": len(seeds_b),
            "tests": {m: paired_frames(a, b, m, which="all") for m in wanted}}


def format_paired(result: dict) -> str:
    """A console table: one line per metric."""
    lines = [f"A = {result['a']} ({result['seeds_a']} seeds), B = {result['b']} ({result['seeds_b']} seeds); "
             "per user: the mean over seeds; paired over the users both evaluated",
             f"{'metric':<12}{'A':>9}{'B':>9}{'A - B':>10}{'t-test p':>11}{'Wilcoxon p':>12}{'users':>8}"]
    for m, t in result["tests"].items():
        lines.append(f"{m:<12}{t['mean_a']:>9.4f}{t['mean_b']:>9.4f}{t['mean_diff']:>+10.4f}"
                     f"{t['t_pvalue']:>11.3g}{t['wilcoxon_pvalue']:>12.3g}{t['n']:>8}")
    return "\n".join(lines)
