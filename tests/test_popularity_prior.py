"""The popularity prior of joining users (``--new-user-prior popularity``): the prior added to a scorer, its weight
chosen on validation users with a tie kept at the smaller weight, and the coldstart command choosing and recording
it on the validation joining users only."""

import json

import numpy as np
import pytest
import torch

from fedvlr_plus.coldstart.popularity_prior import (
    PRIOR_EXTENSION,
    PRIOR_WEIGHTS,
    WithPrior,
    best_weight,
    log_popularity,
)


def test_log_popularity_is_centred_and_ordered_as_the_counts():
    prior = log_popularity([0, 3, 1, 10])
    assert float(prior.sum()) == pytest.approx(0.0, abs=1e-6)
    assert list(torch.argsort(prior)) == [0, 2, 1, 3]


def test_the_prior_is_added_to_the_scores_by_its_weight_and_zero_leaves_them_alone():
    prior = log_popularity([0, 3, 1, 10])
    base = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    assert torch.equal(WithPrior(lambda u: base, prior, 0.0)(np.arange(2)), base)
    assert torch.allclose(WithPrior(lambda u: base, prior, 2.0)(np.arange(2)), base + 2.0 * prior)


def test_best_weight_keeps_the_best_validation_score_and_the_smaller_weight_on_a_tie():
    prior = log_popularity([0, 1])
    score = {0.0: 0.1, 0.5: 0.3, 1.0: 0.3, 2.0: 0.2, 4.0: 0.0}
    weight, scorer, value = best_weight(lambda u: torch.zeros(1, 2), prior, lambda s: score[s.weight])
    assert (weight, scorer.weight, value) == (0.5, 0.5, 0.3)
    assert best_weight(lambda u: None, prior, lambda s: 1.0)[0] == 0.0 == min(PRIOR_WEIGHTS)


def test_best_weight_goes_on_past_the_grids_top_only_while_the_largest_weight_tried_is_the_best():
    prior = log_popularity([0, 1])

    def chosen(score):
        tried = []

        def score_valid(s):
            tried.append(s.weight)
            return score(s.weight)

        return best_weight(lambda u: None, prior, score_valid)[0], tried

    # rising in the weight: every extension weight is tried and the last one kept
    weight, tried = chosen(lambda w: w)
    assert weight == max(PRIOR_EXTENSION) > max(PRIOR_WEIGHTS)
    assert tried == [*sorted(PRIOR_WEIGHTS), *PRIOR_EXTENSION]
    # peaking at 8, the first extension weight: 16 is tried, found worse, and the extension stops there
    weight, tried = chosen(lambda w: -abs(w - 8.0))
    assert (weight, tried) == (8.0, [*sorted(PRIOR_WEIGHTS), 8.0, 16.0])
    # peaking inside the grid (at 2): nothing past the grid is tried
    weight, tried = chosen(lambda w: -abs(w - 2.0))
    assert (weight, tried) == (2.0, list(sorted(PRIOR_WEIGHTS)))
    # a tie between the grid's top and the first extension weight keeps the smaller weight and stops
    weight, tried = chosen(lambda w: min(w, 4.0))
    assert (weight, tried) == (4.0, [*sorted(PRIOR_WEIGHTS), 8.0])


def test_coldstart_prior_is_chosen_on_validation_joining_users_and_recorded(tmp_path, capsys):
    from test_coldstart import _feature_folder

    from fedvlr_plus.cli import main

    folder = _feature_folder(tmp_path / "fx")
    args = [
        "coldstart",
        str(folder),
        "--backbone",
        "fedavg",
        "--cold-users",
        "0.2",
        "--support",
        "1,3",
        "--support-epochs",
        "auto",
        "--rounds",
        "2",
        "--seeds",
        "2",
        "--dim",
        "8",
        "--local-epochs",
        "1",
        "--no-progress",
        "--metrics",
        "hr@5,ndcg@5",
        "--cold-select",
        "ndcg@5",
        "--json",
    ]
    assert main(args + ["--new-user-prior", "none"]) == 0
    out, err = capsys.readouterr()
    plain = json.loads(out.strip().splitlines()[-1])["user_coldstart"]
    assert "choices by their ndcg@5 (--cold-select)" in err  # the study says which metric made its choices
    assert main(args) == 0  # the prior is the default where validation joining users are set aside
    uc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["user_coldstart"]
    assert uc["new_user_prior"] == "popularity" and "new_user_prior" not in plain
    for n in ("1", "3"):
        for with_prior, without in zip(uc["support_epochs"]["chosen"][n], plain["support_epochs"]["chosen"][n]):
            assert with_prior["prior_weight"] in (*PRIOR_WEIGHTS, *PRIOR_EXTENSION)
            assert "prior_weight" not in without
            # each epoch count scored at its best weight, weight 0 among them: never below the plain choice
            for e, v in without["valid"].items():
                assert with_prior["valid"][e] >= v - 1e-12
        # the reference rankers and the reported users are the same: only the model's scores changed
        assert uc["curves"]["pop"][n] == plain["curves"]["pop"][n]


def test_coldstart_prior_needs_validation_joining_users(tmp_path, capsys):
    from test_coldstart import _feature_folder

    from fedvlr_plus.cli import main

    folder = _feature_folder(tmp_path / "fx")
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fedavg",
            "--cold-users",
            "0.2",
            "--support",
            "1",
            "--support-epochs",
            "2",
            "--rounds",
            "1",
            "--seeds",
            "1",
            "--dim",
            "8",
            "--no-progress",
            "--new-user-prior",
            "popularity",
        ]
    )
    assert code == 2 and "--new-user-prior" in capsys.readouterr().err
