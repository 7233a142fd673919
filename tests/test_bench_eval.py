"""``fedvlr-plus bench eval``: timed evaluation passes of a trained model, checked against the reference paths."""

import json

import pytest
from _bad_input import run_cli

from fedvlr_plus.bench.evaluation import eval_passes, reference_paths
from fedvlr_plus.federation import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.synthetic import synthetic_data


def test_bench_eval_times_both_protocols_and_checks_the_reference_paths():
    res = run_cli("bench", "eval", "synthetic:60x150", "--backbone", "fedncf", "--dim", "8", "--check", "--json")
    assert res.code == 0, res.err
    doc = json.loads(res.out.strip().splitlines()[-1])
    assert doc["model"] == "fedncf" and doc["users"] == 60 and doc["train_rounds"] == 1
    assert [p["protocol"] for p in doc["passes"]] == ["full", "sampled"]
    for p in doc["passes"]:
        assert p["same_figures"] is True and p["cpu_s"] >= 0 and p["reference"]["cpu_s"] >= 0
        assert p["figures"] == p["reference"]["figures"] and 0 <= p["figures"]["hr@10"] <= 1
    assert "test sampled:" in res.err and "the same figures" in res.err


def test_the_reference_paths_are_switched_on_for_the_block_only():
    run = FederatedRun(synthetic_data(40, 120, 8, seed=0), "fedncf", FedConfig(rounds=1, dim=8), progress=False)
    run.run_round()
    calls = []
    score_items = run.sim.score_items
    run.sim.score_items = lambda *a: calls.append(1) or score_items(*a)
    with reference_paths(run):
        assert run.sim.score_candidates is False
        rows = eval_passes(run, "test", ["sampled"], check=False)
    assert calls == [] and run.sim.score_candidates is True  # every item was scored inside the block
    eval_passes(run, "test", ["sampled"], check=False)
    assert calls and rows[0]["figures"]


@pytest.mark.parametrize(
    "flags,line",
    [
        (["--backbone", "nosuch"], "--backbone nosuch: unknown backbone"),
        (["--backbone", "fedavg", "--protocols", "full,foo"], "--protocols full,foo: unknown protocol foo"),
        (["--backbone", "fedavg", "--protocols", ","], "--protocols ,: unknown protocol (none)"),
        (["--backbone", "fedavg", "--protocols", "sampled"], "--protocols sampled: "),  # 40 items: no 99 negatives
    ],
)
def test_bench_eval_refuses_bad_flags_in_one_line(flags, line):
    res = run_cli("bench", "eval", "synthetic:30x40", *flags)
    assert res.code != 0 and line in res.err and "Traceback" not in res.err


def test_bench_eval_leaves_the_sampled_protocol_out_where_it_cannot_run_unless_asked_for():
    res = run_cli("bench", "eval", "synthetic:30x40", "--backbone", "fedavg", "--dim", "8", "--json")
    assert res.code == 0, res.err
    assert "the sampled protocol is left out: " in res.err and "40 items in all" in res.err
    assert [p["protocol"] for p in json.loads(res.out.strip().splitlines()[-1])["passes"]] == ["full"]


def test_bench_eval_times_an_untrained_model_with_no_training_rounds():
    res = run_cli(
        "bench",
        "eval",
        "synthetic:60x150",
        "--backbone",
        "fedavg",
        "--dim",
        "8",
        "--train-rounds",
        "0",
        "--protocols",
        "full",
        "--json",
    )
    assert res.code == 0, res.err
    doc = json.loads(res.out.strip().splitlines()[-1])
    assert doc["train_rounds"] == 0 and doc["passes"][0]["protocol"] == "full" and doc["threads"] >= 1
