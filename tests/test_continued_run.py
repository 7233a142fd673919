"""A run that goes on from a tuning candidate's checkpoint reports what it would have trained from the start.

``run --fusion fedvlr`` tunes its recipe on the first seed; that seed then goes on from the kept recipe's candidate
instead of training its rounds again (FederatedRun.continue_from), in a run folder of its own or without one.
"""

from __future__ import annotations

import pytest

from fedvlr_plus.federation.config import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.synthetic import synthetic_data

CANDIDATE_ROUNDS, RUN_ROUNDS = 6, 10


def _cfg(rounds: int, lr: float, **changes) -> FedConfig:
    return FedConfig(
        rounds=rounds,
        dim=8,
        local_epochs=1,
        seed=0,
        patience=100,
        lr=lr,
        valid_metric="ndcg@10",
        metrics=("hr", "ndcg"),
        ks=(10,),
        **changes,
    )


def _figures(result: dict) -> dict:
    """What a run reports, bar its timings."""
    history = [{k: v for k, v in r.items() if not k.endswith("_seconds")} for r in result["history"]]
    return {k: result[k] for k in ("selected_round", "rounds_run", "valid", "test", "test_ci")} | {"history": history}


def _candidate(data, folder, lr: float, keep_selected: bool = True) -> dict:
    cfg = _cfg(CANDIDATE_ROUNDS, lr, checkpoint_every=CANDIDATE_ROUNDS)
    return FederatedRun(data, "fedavg", cfg, folder, progress=False, test=False, keep_selected=keep_selected).run()


# lr 0.05: validation is best at round 1 and the run keeps it, so the continued run tests the candidate's kept
# model; lr 2.0: the candidate's best round is before its last, and training on may select a later one; lr 0.5:
# the candidate's last round is its best, which its checkpoint holds once
@pytest.mark.parametrize("lr, best_before_last", [(0.05, True), (2.0, True), (0.5, False)])
@pytest.mark.parametrize("own_folder", [False, True])
def test_a_run_continued_from_a_candidate_reports_the_figures_of_a_run_from_the_start(
    tmp_path, lr, best_before_last, own_folder
):
    data = synthetic_data(n_users=80, n_items=120, seed=1)
    candidate = _candidate(data, tmp_path / "candidate", lr)
    assert (candidate["selected_round"] < CANDIDATE_ROUNDS) == best_before_last
    heard: list[int] = []
    folders = (tmp_path / "continued", tmp_path / "straight") if own_folder else (None, None)
    continued = FederatedRun(
        data, "fedavg", _cfg(RUN_ROUNDS, lr), folders[0], progress=False,
        on_round=lambda run, record: heard.append(record["round"]),
    )  # fmt: skip
    assert continued.continue_from(tmp_path / "candidate")
    assert continued.round == CANDIDATE_ROUNDS
    if own_folder:  # checkpointed at once, with the selected round's test: a kill now loses nothing
        assert continued.folder.has_checkpoint() and continued.best["test_full"] is not None
    result = continued.run()
    straight = FederatedRun(data, "fedavg", _cfg(RUN_ROUNDS, lr), folders[1], progress=False).run()
    assert _figures(result) == _figures(straight)
    if own_folder:
        assert (folders[0] / "per_user_test.csv").read_text() == (folders[1] / "per_user_test.csv").read_text()
    # the selected round so far, with its model in place, then the rounds it trained itself
    earlier = [candidate["selected_round"]]
    assert heard == earlier + list(range(CANDIDATE_ROUNDS + 1, RUN_ROUNDS + 1))
    if lr == 0.05:
        assert result["selected_round"] == candidate["selected_round"]


def test_a_run_trains_from_the_start_where_the_candidate_kept_no_selected_model(tmp_path):
    data = synthetic_data(n_users=80, n_items=120, seed=1)
    _candidate(data, tmp_path / "candidate", 2.0, keep_selected=False)
    run = FederatedRun(data, "fedavg", _cfg(RUN_ROUNDS, 2.0), progress=False)
    assert not run.continue_from(tmp_path / "candidate") and run.round == 0
    # a candidate whose private states live in a file keeps its selected model in a file of its own, not in the
    # checkpoint: nothing to go on from either
    cfg = _cfg(CANDIDATE_ROUNDS, 2.0, checkpoint_every=CANDIDATE_ROUNDS, private_store="file")
    FederatedRun(data, "fedavg", cfg, tmp_path / "filed", progress=False, test=False, keep_selected=True).run()
    filed = FederatedRun(data, "fedavg", _cfg(RUN_ROUNDS, 2.0, private_store="file"), progress=False)
    assert not filed.continue_from(tmp_path / "filed") and filed.round == 0
    # and a run whose own folder holds a checkpoint resumes that, never another run
    _candidate(data, tmp_path / "kept", 2.0)
    FederatedRun(data, "fedavg", _cfg(2, 2.0), tmp_path / "own", progress=False).run()
    own = FederatedRun(data, "fedavg", _cfg(RUN_ROUNDS, 2.0), tmp_path / "own", progress=False)
    assert not own.continue_from(tmp_path / "kept") and own.round == 0
