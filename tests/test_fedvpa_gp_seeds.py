"""``align fedvpa-gp --seeds``: each seed exactly as ``--seed S`` alone, mean ± sd and the paired tests from those
figures."""

import json

import numpy as np
import pytest
from scipy.stats import ttest_rel
from test_alignment_pairs import make_hh_cached


def test_seeds_match_single_seed_runs_and_the_paired_tests(tmp_path, capsys):
    from fedvlr_plus.cli import main

    root, cache = make_hh_cached(tmp_path)
    flags = [
        "align",
        "fedvpa-gp",
        str(root),
        "--cache-dir",
        str(cache),
        "--rounds",
        "3",
        "--clients-per-type",
        "2",
        "--unseen-per-type",
        "1",
        "--context-pairs",
        "3",
        "--latent",
        "2",
        "--json",
    ]
    single = []
    for s in (0, 1, 2):
        assert main([*flags, "--seed", str(s)]) == 0
        single.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    out = tmp_path / "table"
    assert main([*flags, "--seeds", "0", "1", "2", "--out-dir", str(out)]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["seeds"] == [0, 1, 2] and rep["types"] == ["helpful-base", "harmless-base"]
    for one, many in zip(single, rep["per_seed"]):
        assert many["accuracy"] == one["accuracy"] and many["unseen_accuracy"] == one["unseen_accuracy"]

    def mean_of_types(report, method):
        return float(np.mean(list(report["accuracy"][method].values())))

    a = [mean_of_types(s, "fedvpa_gp") for s in single]
    b = [mean_of_types(s, "monolithic") for s in single]
    got = rep["paired"]["FedVPA-GP - monolithic"]["mean of types"]
    assert got["diff"] == pytest.approx(np.subtract(a, b).tolist())
    if got["p"] is not None and np.ptp(np.subtract(a, b)) > 0:
        assert got["p"] == pytest.approx(ttest_rel(a, b).pvalue)
    helpful = [s["accuracy"]["fedvpl"]["helpful-base"] for s in single]
    assert rep["accuracy"]["fedvpl"]["helpful-base"]["mean"] == pytest.approx(np.mean(helpful))
    assert rep["accuracy"]["fedvpl"]["helpful-base"]["sd"] == pytest.approx(np.std(helpful, ddof=1))
    unseen = [s["unseen_accuracy"]["fedvpa_gp"] for s in single]
    assert rep["paired"]["FedVPA-GP - FedVPL"]["unseen"]["n"] == 3
    assert rep["accuracy"]["fedvpa_gp"]["unseen"]["mean"] == pytest.approx(np.mean(unseen))
    assert json.loads((out / "result.json").read_text())["paired"] == rep["paired"]
    table = (out / "table.md").read_text()
    assert f"{np.mean(helpful):.4f} ± {np.std(helpful, ddof=1):.4f}" in table
    assert "FedVPA-GP - FedVPL" in table and table.startswith("Command: `fedvlr-plus")


def test_one_seed_out_dir_writes_its_table(tmp_path, capsys):
    from fedvlr_plus.cli import main

    root, cache = make_hh_cached(tmp_path)
    out = tmp_path / "one"
    assert (
        main(
            [
                "align",
                "fedvpa-gp",
                str(root),
                "--cache-dir",
                str(cache),
                "--rounds",
                "2",
                "--clients-per-type",
                "2",
                "--unseen-per-type",
                "1",
                "--context-pairs",
                "3",
                "--latent",
                "2",
                "--out-dir",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "FedVPA-GP on" in printed  # the one-seed summary is unchanged
    rep = json.loads((out / "result.json").read_text())
    assert rep["seeds"] == [0] and rep["paired"]["FedVPA-GP - monolithic"]["mean of types"]["p"] is None
    assert "| FedVPA-GP |" in (out / "table.md").read_text()
