"""``experiment paired RUN_A RUN_B``: two run folders compared over the same test users."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from _bad_input import assert_user_error, run_cli
from fedvlr_plus.cli import main

FLAGS = ["--rounds", "3", "--eval-every", "1", "--local-epochs", "1", "--dim", "8", "--metrics", "hr@10,ndcg@10",
         "--valid-metric", "ndcg@10", "--seeds", "2", "--no-progress"]


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
