"""``experiment paired A B --also A2 B2``: paired comparisons on several draws of a split, pooled."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedvlr_plus.cli import main
from fedvlr_plus.errors import RunFolderError
from fedvlr_plus.experiments.pooled_pairs import pooled_pairs


def _folder(path, users, values, metric="ndcg@10"):
    path.mkdir(parents=True)
    pd.DataFrame({"user": users, metric: values}).to_csv(path / "per_user_test.csv", index=False)
    return path


def _draw(tmp_path, name, users, shift, noise_seed):
    """Run A = run B + ``shift`` + noise over ``users`` (one draw of a split)."""
    b = np.random.default_rng(noise_seed).random(len(users))
    a = b + shift + np.random.default_rng(noise_seed + 100).normal(0.0, 0.05, len(users))
    return _folder(tmp_path / f"{name}-a", users, a), _folder(tmp_path / f"{name}-b", users, b), a - b


def test_every_draws_users_go_into_one_pooled_t_test(tmp_path):
    a1, b1, d1 = _draw(tmp_path, "draw1", np.arange(40), 0.02, 0)
    a2, b2, d2 = _draw(tmp_path, "draw2", np.arange(20, 120), -0.01, 1)
    res = pooled_pairs([(a1, b1), (a2, b2)])
    both = np.concatenate([d1, d2])
    pooled = res["pooled"]["ndcg@10"]
    assert pooled["mean_diff"] == pytest.approx(both.mean(), abs=1e-12) and pooled["n"] == 140
    assert pooled["se"] == pytest.approx(both.std(ddof=1) / math.sqrt(140), abs=1e-12)
    assert pooled["t_pvalue"] == pytest.approx(stats.ttest_1samp(both, 0.0).pvalue, abs=1e-12)
    assert min(d1.mean(), d2.mean()) < pooled["mean_diff"] < max(d1.mean(), d2.mean())
    first = res["draws"][0]["tests"]["ndcg@10"]
    assert first["t_pvalue"] == pytest.approx(stats.ttest_1samp(d1, 0.0).pvalue, abs=1e-12) and first["n"] == 40
    assert res["n_users"] == 140 and res["n_distinct_users"] == 120 and pooled["draws"] == 2


def test_a_draw_without_any_difference_still_pools(tmp_path):
    a, b, d = _draw(tmp_path, "draw", np.arange(30), 0.01, 2)
    same_a = _folder(tmp_path / "same-a", np.arange(5), np.full(5, 0.5))
    same_b = _folder(tmp_path / "same-b", np.arange(5), np.full(5, 0.5))
    res = pooled_pairs([(a, b), (same_a, same_b)])
    assert res["draws"][1]["tests"]["ndcg@10"]["t_pvalue"] == 1.0
    both = np.concatenate([d, np.zeros(5)])
    assert res["pooled"]["ndcg@10"]["t_pvalue"] == pytest.approx(stats.ttest_1samp(both, 0.0).pvalue, abs=1e-12)


def test_a_metric_one_folder_lacks_is_one_line_naming_the_choices(tmp_path):
    a, b, _ = _draw(tmp_path, "draw", np.arange(10), 0.0, 3)
    other = _folder(tmp_path / "other", np.arange(10), np.zeros(10), metric="hr@10")
    with pytest.raises(RunFolderError, match="ndcg@10"):
        pooled_pairs([(a, b), (a, other)], ["ndcg@10"])


def test_the_paired_command_pools_the_pairs_given_with_also(tmp_path, capsys):
    a1, b1, _ = _draw(tmp_path, "draw1", np.arange(40), 0.02, 4)
    a2, b2, _ = _draw(tmp_path, "draw2", np.arange(40), 0.03, 5)
    assert main(["experiment", "paired", str(a1), str(b1), "--also", str(a2), str(b2), "--json"]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out.strip().splitlines()[-1])
    assert res["pooled_draws"] == json.loads(json.dumps(pooled_pairs([(a1, b1), (a2, b2)])))
    assert "pooled over 2 pairs of runs" in out.err and res["tests"]["ndcg@10"]["n"] == 40
