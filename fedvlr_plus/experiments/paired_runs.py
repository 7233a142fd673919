"""Two finished run folders compared over the same test users (``fedvlr-plus experiment paired RUN_A RUN_B``).

Each seed folder of a federated run keeps ``per_user_test.csv`` (every test user's metrics at the selected round,
and the user's number of training interactions). A user's figure is their mean over the run's seeds; the two runs
are then paired over the users both evaluated, per metric: mean difference (A − B), paired t-test and Wilcoxon
signed-rank test (:func:`fedvlr_plus.evaluation.stats.paired_frames`). Runs on different data or splits do not
pair: their users differ, and the overlap is reported. With ``by_history`` the same tests are also made within each
bucket of users' training interactions (the paper tables' buckets), which shows whether a change helps sparse
users, dense ones, or both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import RunFolderError
from ..evaluation.run_report import HISTORY_COLUMN

PER_USER_FILE = "per_user_test.csv"


def per_user_of_run(folder) -> tuple[pd.DataFrame, list[str]]:
    """``(one row per test user with the mean of each metric over the seeds, the seed folders read)``; the
    users' training interactions (``n_train``) ride along where the files have them."""
    folder = Path(folder)
    files = sorted(folder.glob(f"seed-*/{PER_USER_FILE}")) or sorted(folder.glob(PER_USER_FILE))
    if not files:
        raise RunFolderError(
            str(folder),
            f"has no {PER_USER_FILE} (neither in seed-*/ nor at the top)",
            "pass the --out folder of a finished run made by this version",
        )
    from ..evaluation.stats import per_user_mean

    frames = [pd.read_csv(f) for f in files]
    metrics = [c for c in frames[0].columns if "@" in c]
    out = per_user_mean(frames, metrics)
    if all(HISTORY_COLUMN in f.columns for f in frames):
        lengths = pd.concat([f[["user", HISTORY_COLUMN]] for f in frames]).drop_duplicates()
        if lengths["user"].duplicated().any():
            raise RunFolderError(
                str(folder),
                "its seeds give a user different numbers of training interactions",
                "its seed folders come from different data; re-run it into an empty folder",
            )
        out = out.merge(lengths, on="user")
    return out, [str(f.parent) for f in files]


#: a result.json larger than this is not a run's (a run's is kilobytes to a few megabytes)
_RESULT_LIMIT = 256 << 20


def recorded_data(folder) -> dict:
    """What the run in ``folder`` recorded about its data: ``{"dataset": name, "data_digest": digest}``, from its
    seed folders' (or its own) result.json; the keys it lacks (runs of earlier versions) are left out."""
    import json

    folder = Path(folder)
    files = sorted(folder.glob("seed-*/result.json")) or sorted(folder.glob("result.json"))
    seen: dict = {}
    for f in files:
        try:
            if f.stat().st_size > _RESULT_LIMIT:
                raise ValueError(f"larger than {_RESULT_LIMIT >> 20} MB")
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RunFolderError(str(f), f"cannot be read ({exc})", "pass the folder of a finished run") from None
        for key in ("dataset", "data_digest"):
            value = rec.get(key) if isinstance(rec, dict) else None
            if value is not None and seen.setdefault(key, value) != value:
                raise RunFolderError(
                    str(folder), f"its seed folders record different data ({key})", "re-run it into an empty folder"
                )
    return seen


def check_same_data(folder_a, a: pd.DataFrame, folder_b, b: pd.DataFrame) -> None:
    """Refuse two runs on different data: another data set, another split (digest), or other test users. Users
    are ids within a data set: the same numbers in two data sets are different people."""
    rec_a, rec_b = recorded_data(folder_a), recorded_data(folder_b)
    what = None
    if "dataset" in rec_a and "dataset" in rec_b and rec_a["dataset"] != rec_b["dataset"]:
        what = f"data set {rec_a['dataset']!r} vs {rec_b['dataset']!r}"
    elif "data_digest" in rec_a and "data_digest" in rec_b and rec_a["data_digest"] != rec_b["data_digest"]:
        what = (
            f"same data set name, another split or other interactions (digest "
            f"{rec_a['data_digest'][7:19]}… vs {rec_b['data_digest'][7:19]}…)"
        )
    else:
        users_a, users_b = set(a["user"].tolist()), set(b["user"].tolist())
        if users_a != users_b:
            what = (
                f"different test users ({len(users_a - users_b)} only in A, {len(users_b - users_a)} only in B, "
                f"{len(users_a & users_b)} in both)"
            )
    if what:
        raise RunFolderError(
            f"{folder_a} and {folder_b}",
            f"the runs are on different data: {what}",
            "pair runs of the same data and split",
        )


def paired_runs(folder_a, folder_b, metrics=None, by_history: bool = False) -> dict:
    """The paired comparison of run A against run B over their common test users (and, with ``by_history``,
    within each bucket of training interactions: ``by_history``, one dict per non-empty bucket)."""
    from ..evaluation.stats import paired_frames

    a, seeds_a = per_user_of_run(folder_a)
    b, seeds_b = per_user_of_run(folder_b)
    check_same_data(folder_a, a, folder_b, b)
    common = [m for m in a.columns if "@" in m and m in b.columns]
    wanted = list(metrics) if metrics else common
    missing = [m for m in wanted if m not in common]
    if missing:
        raise RunFolderError(
            str(folder_a if missing[0] not in a.columns else folder_b),
            f"has no per-user {', '.join(missing)}",
            f"choose from {', '.join(common)}",
        )
    result = {
        "a": str(folder_a),
        "b": str(folder_b),
        "seeds_a": len(seeds_a),
        "seeds_b": len(seeds_b),
        "tests": {m: paired_frames(a, b, m, which="all") for m in wanted},
    }
    if by_history:
        result["by_history"] = history_buckets(a, b, wanted, folder_a, folder_b)
    return result


def history_buckets(a: pd.DataFrame, b: pd.DataFrame, metrics: list[str], folder_a, folder_b) -> list[dict]:
    """The paired tests within each bucket of the common users' training interactions: ``bucket`` (its label),
    ``n_users`` and ``tests`` (metric -> :func:`paired_frames` result), for the non-empty buckets in order."""
    from ..coldstart.experiment import bucket_labels, history_bucket
    from ..evaluation.stats import paired_frames

    for frame, folder in ((a, folder_a), (b, folder_b)):
        if HISTORY_COLUMN not in frame.columns:
            raise RunFolderError(
                str(folder),
                f"its {PER_USER_FILE} has no {HISTORY_COLUMN} column (the users' "
                "training interactions, which `run --out` folders of this version keep; a "
                "cold-start study's joining users all have their support size instead)",
                "pair `run --out` folders made by this version, or leave out --by-history",
            )
    lengths = a[["user", HISTORY_COLUMN]].merge(b[["user", HISTORY_COLUMN]], on="user", suffixes=("_a", "_b"))
    differ = lengths[f"{HISTORY_COLUMN}_a"] != lengths[f"{HISTORY_COLUMN}_b"]
    if differ.any():
        row = lengths[differ].iloc[0]
        raise RunFolderError(
            str(folder_b),
            f"gives user {int(row['user'])} {int(row[HISTORY_COLUMN + '_b'])} "
            f"training interactions where {folder_a} gives {int(row[HISTORY_COLUMN + '_a'])}: "
            "the two runs were trained on different data",
            "compare runs of the same data and split",
        )
    counts = lengths[f"{HISTORY_COLUMN}_a"].to_numpy(np.int64)
    bucket = pd.Series(history_bucket(counts, np.arange(len(counts))), index=lengths["user"].to_numpy())
    out = []
    for i, label in enumerate(bucket_labels()):
        users = bucket.index[bucket.to_numpy() == i]
        if not len(users):
            continue
        sub_a, sub_b = a[a["user"].isin(users)], b[b["user"].isin(users)]
        out.append(
            {
                "bucket": label,
                "n_users": int(len(users)),
                "tests": {m: paired_frames(sub_a, sub_b, m, which="all") for m in metrics},
            }
        )
    return out


#: the console table's column heads (one line per metric follows)
_TEST_HEADER = f"{'metric':<12}{'A':>9}{'B':>9}{'A - B':>10}{'t-test p':>11}{'Wilcoxon p':>12}{'users':>8}"


def format_paired(result: dict) -> str:
    """A console table: one line per metric (then, with buckets, one per bucket and metric)."""
    lines = [
        f"A = {result['a']} ({result['seeds_a']} seeds), B = {result['b']} ({result['seeds_b']} seeds); "
        "per user: the mean over seeds; paired over the users both evaluated",
        _TEST_HEADER,
    ]
    lines += [_test_line(m, t) for m, t in result["tests"].items()]
    if result.get("by_history"):
        lines += ["", "by the users' training interactions:", f"{'history':<10}" + _TEST_HEADER]
        lines += [
            f"{row['bucket']:<10}" + _test_line(m, t) for row in result["by_history"] for m, t in row["tests"].items()
        ]
    return "\n".join(lines)


def _test_line(metric: str, t: dict) -> str:
    return (
        f"{metric:<12}{t['mean_a']:>9.4f}{t['mean_b']:>9.4f}{t['mean_diff']:>+10.4f}"
        f"{t['t_pvalue']:>11.3g}{t['wilcoxon_pvalue']:>12.3g}{t['n']:>8}"
    )
