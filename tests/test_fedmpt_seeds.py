"""``align fedmpt --seeds``: each seed exactly as ``--seed S`` alone, and the paired tests from those figures."""
import json

import numpy as np
import pytest
from scipy.stats import ttest_rel

from _shared import stub_minilm_encoders
from fedvlr_plus.alignment import fedmpt as M


def test_seeds_match_single_seed_runs_and_the_paired_test(tmp_path, capsys, monkeypatch):
    from fedvlr_plus.cli import main

    stub_minilm_encoders(monkeypatch, M)
    flags = ["align", "fedmpt", "ml-100k", "--rounds", "1", "--no-ablation", "--raters", "4", "--proj-dim", "0",
             "--cache-dir", "", "--json"]
    single = []
    for s in (0, 1):
        assert main([*flags, "--seed", str(s)]) == 0
        single.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    out = tmp_path / "table"
    assert main([*flags, "--seeds", "0", "1", "--out-dir", str(out)]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["seeds"] == [0, 1]
    for one, many in zip(single, rep["per_seed"]):
        for row in ("baseline", "fedmpt"):
            assert many[row]["mAP"] == one[row]["mAP"] and many[row]["CF1"] == one[row]["CF1"]
    a = [s["fedmpt"]["mAP"] for s in single]
    b = [s["baseline"]["mAP"] for s in single]
    got = rep["paired"]["prompts+ot+gate - baseline"]["mAP"]
    assert got["diff"] == pytest.approx(np.subtract(a, b).tolist())
    assert got["p"] == pytest.approx(ttest_rel(a, b).pvalue)
    assert rep["mean"]["baseline"]["mAP"] == pytest.approx(np.mean(b))
    assert json.loads((out / "result.json").read_text())["paired"] == rep["paired"]
    assert f"{np.mean(a):.4f}" in (out / "table.md").read_text()
