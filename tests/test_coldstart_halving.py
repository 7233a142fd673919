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
    "items": ["--fusion-residual", "--tune", "--halving"],  # rated among cold items under the best cold rule
    "users": ["--cold-users", "0.2", "--support", "1", "--support-epochs", "1", "--tune", "--halving"],  # joining users
}


def _tuning(capsys, folder, study, *extra) -> dict:
    assert main(["coldstart", str(folder), *COMMON, *STUDIES[study], *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tuning"]


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_survivors_score_as_if_trained_straight_and_the_rest_are_stopped(tmp_path, capsys, monkeypatch, study):
    from fedvlr_plus.fedvlr import halving

    folder = _feature_folder(tmp_path / "fx")
    straight = {c["name"]: c["valid"] for c in _tuning(capsys, folder, study, "--no-halving")["candidates"]}
    monkeypatch.setattr(halving, "MIN_ROUNDS_TO_HALVE", 8)  # 8 rounds are too short to cut
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


def test_a_grid_killed_midway_goes_on_through_the_same_cuts(tmp_path, capsys, monkeypatch):
    """``--out DIR``: the candidates train in ``DIR/runs/`` and keep their score at each budget. Killed in the middle
    of the second budget, ``--resume`` scores the first budget's candidates and the one that finished the second
    budget without training or scoring them again, and the killed candidate goes on from its checkpoint: the same
    report as a grid trained straight, each score taken once, and one round trained twice (the one after the killed
    candidate's checkpoint)."""
    from fedvlr_plus.coldstart import study, tune_halving
    from fedvlr_plus.federation.engine import FederatedRun
    from fedvlr_plus.fedvlr import halving

    folder, out = _feature_folder(tmp_path / "fx"), tmp_path / "study"
    monkeypatch.setattr(halving, "MIN_ROUNDS_TO_HALVE", 8)
    real_round, real_score, trained = FederatedRun.run_round, tune_halving._candidate_score, []
    real_scorer, scored = study._scorer_of, []
    kill = {"at_call": None, "calls": 0}

    def counted_round(run):
        if kill["calls"] == kill["at_call"] and run.round == 3:  # in the middle of the budget from 2 to 4 rounds
            raise KeyboardInterrupt
        trained.append(run.round)
        return real_round(run)

    def counted_score(job):
        kill["calls"] += 1
        return real_score(job)

    def counted_scorer(*ratings):
        score = real_scorer(*ratings)
        return lambda run: scored.append((str(run.run_dir), run.cfg.rounds)) or score(run)  # (candidate, budget)

    monkeypatch.setattr(study, "_scorer_of", counted_scorer)
    monkeypatch.setattr(FederatedRun, "run_round", counted_round)
    monkeypatch.setattr(tune_halving, "_candidate_score", counted_score)
    straight = _tuning(capsys, folder, "items")
    straight_rounds, recipes = len(trained), len(straight["candidates"])
    trained.clear(), scored.clear()
    kill["at_call"] = recipes + 2  # the second candidate of the second budget
    assert main(["coldstart", str(folder), *COMMON, *STUDIES["items"], "--out", str(out), "--json"]) == 130
    assert capsys.readouterr().err.count("views: the precomputed features") == 1  # loaded once, not per candidate
    assert {p.name for p in (out / "runs").iterdir()} == {"tuning-fedvlr"}
    killed_rounds, kill["at_call"] = len(trained), None
    trained.clear()
    resumed = _tuning(capsys, folder, "items", "--resume", str(out))
    assert resumed == straight
    assert killed_rounds + len(trained) == straight_rounds + 1
    assert len(scored) == len(set(scored)) > recipes  # no candidate scored twice at one budget
    assert list((out / "runs").iterdir()) == []  # the tuner's folders go once its choice is saved
