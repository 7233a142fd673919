"""``experiment paired RUN_A RUN_B``: two run folders compared over the same test users."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from _bad_input import assert_user_error, run_cli

from fedvlr_plus.cli import main

FLAGS = [
    "--rounds",
    "3",
    "--eval-every",
    "1",
    "--local-epochs",
    "1",
    "--dim",
    "8",
    "--metrics",
    "hr@10,ndcg@10",
    "--valid-metric",
    "ndcg@10",
    "--seeds",
    "2",
    "--no-progress",
]


def test_paired_runs_average_each_user_over_seeds_and_pair_the_two_runs(tmp_path, capsys):
    from scipy import stats

    for name, backbone in (("a", "fedavg"), ("b", "fcf")):
        assert main(["run", "synthetic:40x60", "--backbone", backbone, *FLAGS, "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    assert main(["experiment", "paired", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(res["tests"]) == {"hr@10", "ndcg@10"} and res["seeds_a"] == res["seeds_b"] == 2

    def per_user(run):
        frames = [pd.read_csv(tmp_path / run / f"seed-{s}" / "per_user_test.csv") for s in (0, 1)]
        return pd.concat(frames).groupby("user")["ndcg@10"].mean()

    a, b = per_user("a"), per_user("b")
    test = res["tests"]["ndcg@10"]
    assert test["n"] == len(a) == len(b)
    assert test["mean_diff"] == pytest.approx(float((a - b).mean()), abs=1e-12)
    assert test["t_pvalue"] == pytest.approx(float(stats.ttest_rel(a.to_numpy(), b.to_numpy()).pvalue), abs=1e-12)
    assert np.isclose(test["mean_a"], a.mean())


def test_paired_runs_name_a_folder_without_per_user_metrics(tmp_path):
    (tmp_path / "empty").mkdir()
    res = run_cli("experiment", "paired", str(tmp_path / "empty"), str(tmp_path / "empty"))
    assert_user_error(res, str(tmp_path / "empty"), "per_user_test.csv")


def test_run_files_keep_each_test_users_training_interactions(tmp_path):
    from fedvlr_plus.run_data import load_and_split

    data = load_and_split("synthetic:40x60")[0]
    counts = data.user_history_length("train")
    assert main(["run", "synthetic:40x60", "--backbone", "fedavg", *FLAGS, "--out", str(tmp_path / "fed")]) == 0
    assert (
        main(["run", "synthetic:40x60", "--backbone", "pop", "--metrics", "hr@10", "--out", str(tmp_path / "pop")]) == 0
    )
    for path in (tmp_path / "fed" / "seed-1" / "per_user_test.csv", tmp_path / "pop" / "per_user_test.csv"):
        frame = pd.read_csv(path)
        assert len(frame) > 0 and counts.min() != counts.max()  # (users of different lengths: a real check)
        np.testing.assert_array_equal(frame["n_train"].to_numpy(), counts[frame["user"].to_numpy()])


def _per_user_folder(folder, users, n_train, values, seed=0):
    path = folder / f"seed-{seed}"
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"user": users, "n_targets": 1, "n_train": n_train, "ndcg@10": values}).to_csv(
        path / "per_user_test.csv", index=False
    )


def test_paired_by_history_tests_each_bucket_of_training_interactions_over_its_users(tmp_path):
    from scipy import stats

    from fedvlr_plus.experiments.paired_runs import paired_runs

    g = np.random.default_rng(0)
    users = np.arange(60)
    n_train = np.repeat([0, 10, 11, 20, 21, 150], 10)  # no history, both edges of the first buckets, a far one
    a, b = g.random(60), g.random(60)
    _per_user_folder(tmp_path / "a", users, n_train, a)
    _per_user_folder(tmp_path / "b", users[::-1], n_train[::-1], b[::-1])  # row order must not matter
    res = paired_runs(tmp_path / "a", tmp_path / "b", by_history=True)
    rows = {r["bucket"]: r for r in res["by_history"]}
    assert list(rows) == ["0", "1-10", "11-20", "21-50", "101-200"]
    assert [rows[k]["n_users"] for k in rows] == [10, 10, 20, 10, 10]
    for label, members in (
        ("0", n_train == 0),
        ("1-10", (n_train > 0) & (n_train <= 10)),
        ("11-20", (n_train > 10) & (n_train <= 20)),
        ("101-200", n_train == 150),
    ):
        t = rows[label]["tests"]["ndcg@10"]
        assert t["n"] == members.sum()
        assert t["mean_diff"] == pytest.approx(float((a - b)[members].mean()), abs=1e-12)
        assert t["t_pvalue"] == pytest.approx(float(stats.ttest_rel(a[members], b[members]).pvalue), abs=1e-12)
    overall = sum(r["tests"]["ndcg@10"]["mean_diff"] * r["n_users"] for r in rows.values()) / 60
    assert overall == pytest.approx(res["tests"]["ndcg@10"]["mean_diff"], abs=1e-12)


def test_paired_by_history_refuses_runs_without_lengths_or_on_different_data(tmp_path):
    users = np.arange(5)
    _per_user_folder(tmp_path / "a", users, [1, 2, 3, 4, 5], np.zeros(5))
    _per_user_folder(tmp_path / "b", users, [1, 2, 3, 4, 6], np.zeros(5))
    res = run_cli("experiment", "paired", str(tmp_path / "a"), str(tmp_path / "b"), "--by-history")
    assert_user_error(res, str(tmp_path / "b"), "different data")
    (tmp_path / "old" / "seed-0").mkdir(parents=True)
    pd.DataFrame({"user": users, "n_targets": 1, "ndcg@10": 0.0}).to_csv(
        tmp_path / "old" / "seed-0" / "per_user_test.csv", index=False
    )
    res = run_cli("experiment", "paired", str(tmp_path / "a"), str(tmp_path / "old"), "--by-history")
    assert_user_error(res, str(tmp_path / "old"), "n_train")
    assert run_cli("experiment", "paired", str(tmp_path / "a"), str(tmp_path / "old")).code == 0
