"""Bad input to ``fedvlr-plus experiment paired RUN_A RUN_B``: runs that do not pair (other data, another
split, other test users) and folders that are not runs. One line naming both folders and what differs, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _bad_input import assert_user_error, run_cli


def _run(out: Path, source, backbone: str = "pop") -> Path:
    res = run_cli("run", source, "--backbone", backbone, "--metrics", "hr@10,ndcg@10", "--out", out)
    assert res.code == 0, res.err
    return out


def _atomic(folder: Path, name: str, seed: int) -> Path:
    """A RecBole atomic folder named ``name``: 40 users, 60 items, 8 timed interactions each."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    lines = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    for u in range(40):
        lines += [f"u{u}\ti{i}\t5\t{1000 + 100 * u + j}" for j, i in enumerate(rng.choice(60, 8, replace=False))]
    (folder / f"{name}.inter").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("paired")
    one = _atomic(root / "a" / "shop", "shop", seed=0)
    other = _atomic(root / "b" / "shop", "shop", seed=1)  # same name and sizes, other interactions
    return {
        "pop": _run(root / "pop", one),
        "random": _run(root / "random", one, "random"),
        "other_split": _run(root / "other-split", other),
        "other_data": _run(root / "other-data", "synthetic:40x60"),
    }


def _paired(*args):
    return run_cli("experiment", "paired", *map(str, args))


def test_runs_on_the_same_data_pair(runs):
    res = _paired(runs["pop"], runs["random"], "--json")
    assert res.code == 0, res.err
    assert json.loads(res.out.strip().splitlines()[-1])["tests"]["hr@10"]["n"] == 40


def test_runs_on_two_data_sets_are_refused_naming_both(runs):
    line = assert_user_error(_paired(runs["pop"], runs["other_data"]), "data set 'shop' vs 'synthetic-40x60'")
    assert str(runs["pop"]) in line and str(runs["other_data"]) in line


def test_runs_on_one_name_but_another_split_are_refused(runs):
    line = assert_user_error(_paired(runs["pop"], runs["other_split"]), "different data", "digest")
    assert str(runs["other_split"]) in line


def test_a_pair_given_with_also_is_checked_too(runs):
    res = _paired(runs["pop"], runs["random"], "--also", runs["pop"], runs["other_data"])
    assert_user_error(res, str(runs["other_data"]), "different data")


def _unrecorded_copy(run: Path, dest: Path, drop_users: int = 0) -> Path:
    """``run`` as a run of an earlier version would be: no data recorded; ``drop_users`` test users fewer."""
    shutil.copytree(run, dest)
    (dest / "result.json").unlink()
    if drop_users:
        frame = pd.read_csv(dest / "per_user_test.csv")
        frame.iloc[drop_users:].to_csv(dest / "per_user_test.csv", index=False)
    return dest


def test_runs_without_records_and_other_test_users_are_refused(runs, tmp_path):
    b = _unrecorded_copy(runs["random"], tmp_path / "old", drop_users=3)
    assert_user_error(_paired(runs["pop"], b), "different test users", "3 only in A", "37 in both")


def test_runs_without_records_and_the_same_users_still_pair(runs, tmp_path):
    b = _unrecorded_copy(runs["random"], tmp_path / "old")
    assert _paired(runs["pop"], b).code == 0


def test_an_unreadable_result_is_named(runs, tmp_path):
    b = shutil.copytree(runs["random"], tmp_path / "garbled")
    (b / "result.json").write_text('{"dataset": ')
    assert_user_error(_paired(runs["pop"], b), str(b / "result.json"), "cannot be read")


@pytest.mark.parametrize(
    "make, needles",
    [
        (lambda tmp: tmp / "missing", ("missing", "per_user_test.csv")),
        (lambda tmp: (tmp / "file.txt").write_text("x") and tmp / "file.txt", ("file.txt", "per_user_test.csv")),
    ],
    ids=["missing", "a-file"],
)
def test_a_folder_that_is_not_a_run_is_named(runs, tmp_path, make, needles):
    assert_user_error(_paired(runs["pop"], make(tmp_path)), *needles)


def test_a_metric_neither_run_has_is_named(runs):
    assert_user_error(_paired(runs["pop"], runs["random"], "--metrics", "mrr@10"), "mrr@10", "hr@10")
