"""``coldstart --tune`` cuts its grid by successive halving, each candidate going on from where it stopped (in memory,
or from its folder in a worker process)."""

from __future__ import annotations

import json

import pytest
from test_coldstart import _feature_folder

from fedvlr_plus.cli import main

COMMON = ["--backbone", "fedavg", "--fusion", "fedvlr", "--rounds", "8", "--eval-every", "2", "--seeds", "1"]
COMMON += ["--dim", "8", "--local-epochs", "1", "--no-progress", "--metrics", "hr@5,ndcg@5", "--cold-select", "ndcg@5"]
STUDIES = {
    "items": ["--fusion-residual", "--tune"],  # rated among cold items under the best cold rule
    "users": ["--cold-users", "0.2", "--support", "1", "--support-epochs", "1", "--tune"],  # joining users
}


def _tuning(capsys, folder, study, *extra) -> dict:
    assert main(["coldstart", str(folder), *COMMON, *STUDIES[study], *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tuning"]


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_survivors_score_as_if_trained_straight_and_the_rest_are_stopped(tmp_path, capsys, monkeypatch, study):
    from fedvlr_plus.fedvlr import halving

    folder = _feature_folder(tmp_path / "fx")
    straight = {c["name"]: c["valid"] for c in _tuning(capsys, folder, study, "--no-halving")["candidates"]}
    monkeypatch.setattr(halving, "MIN_ROUNDS_TO_HALVE", 8)  # 8 rounds are too short to cut by default
    tune = _tuning(capsys, folder, study)
    stopped = {c["name"]: c["stopped_at_round"] for c in tune["candidates"]}
    assert set(stopped.values()) - {None} and set(stopped.values()) <= {None, 2, 4}  # budgets 2, 4 and 8
    survivors = [c for c in tune["candidates"] if c["stopped_at_round"] is None]
    assert tune["selected"] in [c["name"] for c in survivors]
    for c in survivors:  # trained 2 rounds, then on to 4, then to 8, in memory: the score of a straight run
        assert c["valid"] == pytest.approx(straight[c["name"]], abs=1e-9), c["name"]
    assert tune["selected"] == max(survivors, key=lambda c: c["valid"])["name"]


@pytest.mark.slow
@pytest.mark.parametrize("study", sorted(STUDIES))
def test_candidates_side_by_side_score_as_one_after_another(tmp_path, capsys, monkeypatch, study):
    """``--jobs 2``: each budget's candidates train in worker processes, each going on from its own folder's
    checkpoint; one torch thread in both studies (each worker has one): the same report, cut for cut."""
    import torch

    from fedvlr_plus.fedvlr import halving

    # a new-user study: more joining users, rated by hr@5, so that the candidates' scores differ (a comparison of
    # equal scores would prove nothing about which score belongs to which candidate)
    folder = _feature_folder(tmp_path / "fx", n_users=60 if study == "users" else 30)
    extra = ["--cold-select", "hr@5", "--cold-users", "0.4"] if study == "users" else []
    monkeypatch.setattr(halving, "MIN_ROUNDS_TO_HALVE", 8)  # (read here, where the budgets are set)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one_by_one = _tuning(capsys, folder, study, *extra, "--jobs", "1")
        assert main(["coldstart", str(folder), *COMMON, *STUDIES[study], *extra, "--jobs", "2", "--json"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr()
    assert "side by side in 2 worker processes" in out.err
    side_by_side = json.loads(out.out.strip().splitlines()[-1])["tuning"]
    assert {c["stopped_at_round"] for c in one_by_one["candidates"]} - {None}  # (the grid was cut)
    assert len({c["valid"] for c in one_by_one["candidates"]}) > 1
    assert side_by_side == one_by_one
