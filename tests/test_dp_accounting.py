"""Accounted (epsilon, delta) of noised uploads: the figures are the dp-accounting library's own, --target-epsilon
reaches its target, and a run's JSON and console carry the budget."""

import json

import dp_accounting
import pytest
from _bad_input import run_cli
from dp_accounting.rdp import RdpAccountant

from fedvlr_plus.federation import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.privacy.accountant import (
    default_delta,
    epsilon_poisson,
    epsilon_sampled,
    epsilon_server,
    noise_for_epsilon,
    privacy_block,
)
from fedvlr_plus.federation.synthetic import synthetic_data

REL = dp_accounting.NeighboringRelation
SETTINGS = [(1.0, 50, 943, 100), (0.5, 10, 200, 30), (2.0, 120, 120, 5)]  # (sigma, per round, clients, rounds)


def _direct(event, relation, delta):
    acc = RdpAccountant(neighboring_relation=relation)
    acc.compose(event)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("sigma,m,n,rounds", SETTINGS)
def test_epsilon_is_the_librarys_own_computation(sigma, m, n, rounds):
    delta = default_delta(n)
    gauss_half = dp_accounting.GaussianDpEvent(sigma / 2)  # replace-one: the clipped contribution moves by 2C
    wor = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(n, m, gauss_half), rounds)
    server = dp_accounting.SelfComposedDpEvent(gauss_half, rounds)
    direct_server = _direct(server, REL.REPLACE_ONE, delta)
    # the smaller of two valid bounds: sampled without replacement, and no amplification at all
    assert epsilon_sampled(sigma, m, n, rounds, delta) == pytest.approx(
        min(_direct(wor, REL.REPLACE_ONE, delta), direct_server), rel=1e-9
    )
    pois = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(m / n, dp_accounting.GaussianDpEvent(sigma)), rounds
    )
    assert epsilon_poisson(sigma, m / n, rounds, delta) == pytest.approx(
        _direct(pois, REL.ADD_OR_REMOVE_ONE, delta), rel=1e-9
    )
    assert epsilon_server(sigma, rounds, delta) == pytest.approx(direct_server, rel=1e-9)
    # sampling amplifies: fewer clients per round, less epsilon; the server, who sees the sample, gets no amplification
    assert epsilon_sampled(sigma, m, n, rounds, delta) <= epsilon_server(sigma, rounds, delta) + 1e-9


def test_default_delta_is_below_one_over_the_population():
    assert default_delta(1000) == pytest.approx(1000**-1.1)
    assert default_delta(1000) < 1 / 1000


@pytest.mark.parametrize("target,m,n,rounds", [(1.0, 50, 943, 100), (8.0, 10, 200, 30), (3.0, 120, 120, 5)])
def test_target_epsilon_picks_a_sigma_that_reaches_it(target, m, n, rounds):
    delta = default_delta(n)
    sigma = noise_for_epsilon(target, m, n, rounds, delta)
    eps = epsilon_sampled(sigma, m, n, rounds, delta)
    assert eps <= target and eps == pytest.approx(target, rel=0.02)
    assert epsilon_sampled(sigma * 0.98, m, n, rounds, delta) > target  # and it is (nearly) the least such sigma


def test_no_noise_means_no_guarantee():
    block = privacy_block(0.0, 1.0, 5, 10, 3)
    assert block["epsilon"] is None and block["epsilon_server"] is None


def test_a_noised_run_reports_its_budget_and_a_plain_one_none():
    data = synthetic_data(40, 150, 6, seed=2)
    cfg = FedConfig(rounds=2, local_epochs=1, dim=8, clients_per_round=10, upload_noise=0.8, upload_clip=0.5)
    run = FederatedRun(data, "fcf", cfg, progress=False)
    p = run.run()["privacy"]
    n = len(run.eligible)
    assert (p["sigma"], p["clip"], p["clients_per_round"], p["population"], p["rounds"]) == (0.8, 0.5, 10, n, 2)
    assert p["q"] == pytest.approx(10 / n) and p["delta"] == pytest.approx(default_delta(n))
    assert p["epsilon"] == pytest.approx(epsilon_sampled(0.8, 10, n, 2, default_delta(n)))
    assert "privacy" not in FederatedRun(data, "fcf", FedConfig(rounds=1, local_epochs=1, dim=8), progress=False).run()


def test_target_epsilon_sets_the_noise_the_clients_use():
    data = synthetic_data(40, 150, 6, seed=2)
    cfg = FedConfig(rounds=3, local_epochs=1, dim=8, clients_per_round=8, target_epsilon=4.0, dp_delta=1e-4)
    run = FederatedRun(data, "fcf", cfg, progress=False)
    assert (
        run.round_config(1)["upload_noise"] == pytest.approx(noise_for_epsilon(4.0, 8, len(run.eligible), 3, 1e-4))
        and run.round_config(1)["upload_clip"] == 1.0
    )
    p = run.run()["privacy"]
    assert p["epsilon"] == pytest.approx(4.0, rel=0.02) and p["epsilon"] <= 4.0 and p["target_epsilon"] == 4.0
    with pytest.raises(ValueError, match="not both"):
        FedConfig(upload_noise=1.0, target_epsilon=2.0)


def test_run_json_and_console_carry_the_budget():
    res = run_cli(
        "run",
        "synthetic:30x80",
        "--backbone",
        "fcf",
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--dim",
        "8",
        "--upload-noise",
        "1.5",
        "--clients-per-round",
        "10",
        "--no-progress",
        "--json",
    )
    assert res.code == 0, res.err
    p = json.loads(res.out.strip().splitlines()[-1])["privacy"]
    assert p["sigma"] == 1.5 and p["rounds"] == 2 and p["epsilon"] > 0
    assert f"privacy: epsilon {p['epsilon']:.3g} at delta" in res.out


def _privacy_table(out, jobs: int, *more: str):
    """The tiny privacy table, its runs in ``jobs`` worker processes (one torch thread in this process), into
    ``--out out`` (or, with ``more``, where its flags say)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _privacy_table_cli(jobs, *(more or ("--out", str(out))))
    finally:
        torch.set_num_threads(threads)


def _privacy_table_cli(jobs: int, *more: str):
    return run_cli(
        "experiment",
        "privacy-table",
        "synthetic:30x80",
        "--backbone",
        "fcf",
        "--noise",
        "0,1",
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--dim",
        "8",
        "--seeds",
        "2",
        "--clients-per-round",
        "10",
        "--metric",
        "ndcg@10",
        "--no-progress",
        "--jobs",
        str(jobs),
        "--json",
        *more,
    )


def test_privacy_table_runs_side_by_side_change_nothing_and_a_killed_table_resumes(tmp_path, monkeypatch):
    out = tmp_path / "t4"
    res = _privacy_table(out, jobs=2)
    assert res.code == 0, res.err
    assert "6 runs side by side in 2 worker processes" in res.err
    result = json.loads(res.out.strip().splitlines()[-1])
    one_by_one = _privacy_table(tmp_path / "one", jobs=1)
    assert "side by side" not in one_by_one.err
    again = json.loads(one_by_one.out.strip().splitlines()[-1])
    assert again["config"].pop("jobs") == 1 and result["config"].pop("jobs") == 2
    assert again == result
    # the unprotected run, then σ = 0 and 1 with the uploads clipped at the same C
    assert [(r["sigma"], r["clip"]) for r in result["rows"]] == [(0.0, 0.0), (0.0, 1.0), (1.0, 1.0)]
    assert result["seeds"] == [0, 1]
    clean, clipped, noised = result["rows"]
    assert (
        clean["epsilon"] is None
        and clipped["epsilon"] is None
        and noised["epsilon"]
        == pytest.approx(
            epsilon_sampled(1.0, 10, noised["privacy"]["population"], noised["privacy"]["rounds"], result["delta"])
        )
    )
    assert len(noised["per_seed"]) == 2 and noised["test_ci"][0] <= noised["test"] <= noised["test_ci"][1]
    assert "mean_diff" in noised["vs_unprotected"] and "mean_diff" in clipped["vs_unprotected"]
    assert "vs_unprotected" not in clean
    written = {p.name for p in out.iterdir()}
    assert written == {"table.md", "table.csv", "table.png", "result.json", "config.toml", "runs", ".fedvlr.lock"}
    assert {p.name for p in (out / "runs").iterdir()} == {"sigma-0-clip-0", "sigma-0-clip-1", "sigma-1-clip-1"}
    table = (out / "table.md").read_text()
    assert f"| 1 | 1 | {noised['epsilon']:.3g} |" in table and "| none | off | ∞ |" in table
    assert "| 0 | 1 | ∞ |" in table
    _refuses_its_folder_and_resumes_to_the_uninterrupted_figures(out, tmp_path / "fresh", monkeypatch)


def _refuses_its_folder_and_resumes_to_the_uninterrupted_figures(out, fresh, monkeypatch):
    """The table in ``out`` (its runs' folders written by workers) is refused when run again; a longer table continues
    every run from its checkpoint, in one process, to what a table trained straight gives."""
    from _bad_input import assert_user_error

    assert_user_error(_privacy_table(None, 1, "--out", str(out)), "already holds runs", f"--resume {out}")
    loaded = []
    load = FederatedRun.load_checkpoint
    monkeypatch.setattr(FederatedRun, "load_checkpoint", lambda run, *a: loaded.append(run.round) or load(run, *a))
    resumed = _privacy_table(None, 1, "--resume", str(out), "--rounds", "4")
    assert loaded == [0] * 6  # (each of the 3 rows x 2 seeds, read before its run goes on)
    straight = _privacy_table(None, 1, "--out", str(fresh), "--rounds", "4")
    assert resumed.code == 0 and straight.code == 0, resumed.err + straight.err
    one, two = (json.loads(r.out.strip().splitlines()[-1]) for r in (resumed, straight))
    assert one == two and max(one["rows"][0]["selected_round"]) > 2
    assert (out / "table.md").read_text() == (fresh / "table.md").read_text()
    other = _privacy_table(None, 1, "--resume", str(out), "--out", str(fresh))
    assert_user_error(other, "--out", f"--resume {out}")
