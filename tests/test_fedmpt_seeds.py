"""``align fedmpt --seeds``: each seed exactly as ``--seed S`` alone, and the paired tests from those figures."""

import json

import numpy as np
import pytest
from _shared import stub_minilm_encoders
from scipy.stats import ttest_rel

from fedvlr_plus.alignment.fedmpt import method as M


def test_seeds_match_single_seed_runs_and_the_paired_test(tmp_path, capsys, monkeypatch):
    from fedvlr_plus.cli import main

    stub_minilm_encoders(monkeypatch, M)
    flags = [
        "align",
        "fedmpt",
        "ml-100k",
        "--rounds",
        "1",
        "--no-ablation",
        "--raters",
        "4",
        "--proj-dim",
        "0",
        "--cache-dir",
        "",
        "--json",
    ]
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


def test_a_catalogue_without_co_labels_reports_the_spurious_rate_as_not_applicable(tmp_path, capsys, monkeypatch):
    """Each item carries one of three categories (the category all items share is dropped): no label has a usual
    co-label, so the spurious rate has no item to count; the line said 'nan' and the k-means into five clients
    of three distinct label vectors left a cluster empty (numpy warnings)."""
    import warnings

    from fedvlr_plus.cli import main

    stub_minilm_encoders(monkeypatch, M)
    rng = np.random.default_rng(0)
    reviews = [
        {"user_id": f"U{u}", "parent_asin": f"P{i:03d}", "rating": 5.0, "timestamp": 1600000000000 + k}
        for u in range(40)
        for k, i in enumerate(rng.choice(90, 10, replace=False))
    ]
    meta = [
        {"parent_asin": f"P{i:03d}", "title": f"toy {i}", "categories": ["Toys", ["A", "B", "C"][i % 3]]}
        for i in range(90)
    ]
    (tmp_path / "Toys.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reviews))
    (tmp_path / "meta_Toys.jsonl").write_text("".join(json.dumps(m) + "\n" for m in meta))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert (
            main(
                [
                    "align",
                    "fedmpt",
                    str(tmp_path / "Toys.jsonl"),
                    "--rounds",
                    "1",
                    "--no-ablation",
                    "--raters",
                    "4",
                    "--proj-dim",
                    "0",
                    "--cache-dir",
                    "",
                ]
            )
            == 0
        )
    said = capsys.readouterr()
    assert "spurious n/a (no test item carries a label's usual co-label without that label)" in said.out + said.err
