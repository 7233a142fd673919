"""``coldstart --jobs``: a study's seeds trained side by side in worker processes give the figures of the seeds
trained one after another (:mod:`fedvlr_plus.coldstart.seeds`)."""

import json

import numpy as np
import pytest
import torch
from test_coldstart import _feature_folder

from fedvlr_plus.cli import main

FLAGS = (
    "--backbone fedavg --fusion fedvlr --no-tune --rounds 3 --eval-every 1 --seeds 2 --dim 8 --local-epochs 1 "
    "--support 1,3 --support-epochs 2 --cold-users 0.2 --cold-items 0.2 --json --no-progress"
).split()


def _study(folder, jobs: int, capsys, *more: str) -> tuple[dict, str]:
    assert main(["coldstart", str(folder), *FLAGS, "--jobs", str(jobs), *more]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out.strip().splitlines()[-1])
    for key in ("command", "config"):  # (they name the worker count, which changes no figure)
        result.pop(key)
    return result, out.err


def test_a_recipe_that_cannot_be_sent_to_a_worker_trains_its_seeds_here():
    """The Python API may pass a lambda as the model's recipe: its seeds then train in this process."""
    from fedvlr_plus.coldstart.seeds import seed_jobs
    from fedvlr_plus.federation.config import FedConfig

    cfg = FedConfig(seed=4, seeds=3)
    seeds, workers = seed_jobs(cfg, 2, lambda data: None)
    assert workers == 1 and [c.seed for c in seeds] == [4, 5, 6] and {c.seeds for c in seeds} == {1}
    assert seed_jobs(cfg, 2, "fedavg")[1] == 2
    assert seed_jobs(cfg, 1, "fedavg")[1] == 1
    assert seed_jobs(FedConfig(seed=0, seeds=1), 2, "fedavg")[1] == 1


@pytest.mark.slow
def test_seeds_side_by_side_give_the_figures_of_seeds_one_after_another_and_a_killed_study_goes_on(tmp_path, capsys):
    """An item study and a new-user study at once; one torch thread in every run, as each worker has (several
    threads may sum in another order). The side-by-side study saves each seed in its --out folder as it finishes;
    the folder is not reused without --resume, and --resume reads the finished seeds back, trains the one lost, and
    gives the same result."""
    from _bad_input import assert_user_error, run_cli

    folder, out = _feature_folder(tmp_path / "fx"), tmp_path / "study"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one_by_one, err_one = _study(folder, 1, capsys)
        side_by_side, err_two = _study(folder, 2, capsys, "--out", str(out))
        steps = {p.name for p in (out / "finished").iterdir()}
        training = list((out / "runs").iterdir())  # each seed's checkpoints, removed once its step is saved
        for name in ("manifest.json", "step.json"):  # (a seed killed before it finished leaves nothing behind)
            (out / "finished" / "users-fedvlr-seed-1" / name).unlink()
        assert_user_error(run_cli("coldstart", str(folder), *FLAGS, "--out", str(out)), "already holds a study")
        again, err = _study(folder, 1, capsys, "--resume", str(out))
    finally:
        torch.set_num_threads(threads)
    assert "side by side in 2 worker processes" in err_two and "side by side" not in err_one
    assert len(one_by_one["selected_round"]) == 2 and len(one_by_one["user_coldstart"]["selected_round"]) == 2
    assert one_by_one["cold_among_cold"] and one_by_one["user_coldstart"]["curves"]
    assert side_by_side == one_by_one
    assert steps == {f"{study}-fedvlr-seed-{s}" for study in ("items", "users") for s in (0, 1)}
    assert (out / "runs").is_dir() and training == []
    assert err.count("read back from") == 3 and again == one_by_one
    other = run_cli("coldstart", str(folder), *FLAGS, "--resume", str(out), "--rounds", "4")
    assert_user_error(other, "finished", "rounds")
    # a third seed is added to the finished two (each seed's step does not depend on how many there are)
    more = run_cli("coldstart", str(folder), *FLAGS, "--resume", str(out), "--seeds", "3", "--jobs", "1")
    assert more.code == 0 and more.err.count("read back from") == 4, more.err
    assert len(json.loads(more.out.strip().splitlines()[-1])["selected_round"]) == 3


def test_a_seed_killed_midway_goes_on_from_its_checkpoint_to_the_figures_of_a_seed_trained_straight(
    tmp_path, monkeypatch
):
    """A cold-start seed with a run folder checkpoints as it trains; killed after round 2 of 4, it goes on from that
    checkpoint and ends in the selected round's model of a seed trained straight through without a folder."""
    from test_coldstart import _toy_views

    from fedvlr_plus.adapters import make_backbone
    from fedvlr_plus.coldstart.experiment import train_selected
    from fedvlr_plus.federation.config import FedConfig
    from fedvlr_plus.federation.engine import FederatedRun
    from fedvlr_plus.federation.synthetic import synthetic_data
    from fedvlr_plus.fedvlr import FusionLayer

    data = synthetic_data(40, 120, 12.0, groups=4, seed=0)
    views = _toy_views(data)

    def layer():
        return FusionLayer(make_backbone("fcf", data.n_items, 8), views, mode="fedvlr", router_hidden=8)

    cfg = FedConfig(rounds=4, local_epochs=1, batch_size=16, dim=8, lr=0.1, server_lr=0.5, seed=0, checkpoint_every=1)
    straight = train_selected(data, layer(), cfg)
    real_round, folder = FederatedRun.run_round, tmp_path / "seed"

    def killed_after_round_2(run):
        if run.round == 2:
            raise KeyboardInterrupt
        return real_round(run)

    monkeypatch.setattr(FederatedRun, "run_round", killed_after_round_2)
    with pytest.raises(KeyboardInterrupt):
        train_selected(data, layer(), cfg, folder=folder)
    monkeypatch.setattr(FederatedRun, "run_round", real_round)
    resumed_from, load = [], FederatedRun.load_checkpoint  # (the round each load of a checkpoint reached)
    monkeypatch.setattr(
        FederatedRun, "load_checkpoint", lambda run, *a: load(run, *a) or resumed_from.append(run.round)
    )
    resumed = train_selected(data, layer(), cfg, folder=folder)
    assert resumed_from == [2], "the seed did not go on from its checkpoint"
    assert (resumed.round, resumed.best["round"]) == (straight.round, straight.best["round"])
    users = np.arange(data.n_users)
    assert torch.equal(
        torch.as_tensor(resumed.sim.scores(users, resumed.shared)),
        torch.as_tensor(straight.sim.scores(users, straight.shared)),
    )
