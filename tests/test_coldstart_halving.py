"""``coldstart --tune`` cuts its grid by successive halving, each candidate's run kept in memory between budgets."""

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
