"""``--log tensorboard,csv``: the per-round scalars a run writes while it trains are its history, read back with
TensorBoard's own event reader and as plain CSV; a resumed run logs each round once; off, nothing is written."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from _bad_input import assert_user_error, run_cli

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation.config import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.run_seeds import run_federated
from fedvlr_plus.federation.runs.round_log import CsvRounds
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import FusionLayer, router_report


def toy_layer():
    """40 users, 150 items, two content views that carry the item groups: the FedVLR layer around FedAvg."""
    data = synthetic_data(40, 150, 12.0, groups=4, seed=0)
    g = np.random.default_rng(0)
    onehot = np.eye(4)[np.arange(data.n_items) % 4]
    views = {
        "text": np.hstack([onehot, 0.3 * g.standard_normal((data.n_items, 12))]),
        "image": np.hstack([0.3 * g.standard_normal((data.n_items, 8)), onehot]),
    }
    return data, FusionLayer(make_backbone("fedavg", data.n_items, 8), views, router_hidden=8)


def cfg(**kw):
    base = dict(rounds=3, local_epochs=1, batch_size=16, dim=8, lr=0.1, server_lr=0.5, patience=5, seed=0)
    return FedConfig(**{**base, **kw})


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def expected(history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The history's values under the log's tags."""
    out = {"train/loss": [(r["round"], r["loss"]) for r in history]}
    out["train/clients"] = [(r["round"], r["clients"]) for r in history]
    out["time/train_seconds"] = [(r["round"], r["train_seconds"]) for r in history]
    for metric in history[0]["valid"]:
        out[f"valid/{metric}"] = [(r["round"], r["valid"][metric]) for r in history if "valid" in r]
    return out


def assert_same(logged, wanted):
    assert [s for s, _ in logged] == [s for s, _ in wanted]
    assert [v for _, v in logged] == pytest.approx([v for _, v in wanted], rel=1e-6)  # events hold float32


def test_tensorboard_and_csv_hold_the_history_and_the_router(tmp_path):
    data, layer = toy_layer()
    run = FederatedRun(data, layer, cfg(log=("tensorboard", "csv")), tmp_path / "seed-0", progress=False)
    history = run.run()["history"]
    logged = tensorboard_scalars(tmp_path / "tensorboard" / "seed-0")
    for tag, wanted in expected(history).items():
        assert_same(logged[tag], wanted)
    weights = [t for t in logged if t.startswith("router/weight/")]
    assert sorted(weights) == sorted(f"router/weight/{e}" for e in layer.experts)
    # the last round's router figures are the router report of the model the run ended with
    report = router_report(run)
    assert logged["router/entropy"][-1] == (3, pytest.approx(report["mean_entropy"], rel=1e-6))
    for expert, w in zip(report["experts"], report["mean_weights"]):
        assert logged[f"router/weight/{expert}"][-1] == (3, pytest.approx(w, rel=1e-6))

    with open(tmp_path / "rounds" / "seed-0.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rows] == [1, 2, 3]
    for tag, wanted in expected(history).items():
        assert_same([(int(r["round"]), float(r[tag])) for r in rows if r[tag]], wanted)
    assert float(rows[-1]["router/entropy"]) == pytest.approx(report["mean_entropy"])


def test_a_resumed_run_logs_each_round_once(tmp_path):
    data = synthetic_data(30, 40, 8.0, seed=1)
    run_federated(data, "fedavg", cfg(rounds=2, log=("tensorboard", "csv")), out_dir=tmp_path, progress=False)
    res = run_federated(
        data, "fedavg", cfg(rounds=4, log=("tensorboard", "csv")), out_dir=tmp_path, resume=True, progress=False
    )
    history = res["history"]
    assert [r["round"] for r in history] == [1, 2, 3, 4]
    assert_same(tensorboard_scalars(tmp_path / "tensorboard" / "seed-0")["train/loss"], expected(history)["train/loss"])
    with open(tmp_path / "rounds" / "seed-0.csv", newline="") as f:
        assert [int(r["round"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]
    assert not any(t.startswith("router/") for t in tensorboard_scalars(tmp_path / "tensorboard" / "seed-0"))


def test_a_seed_gone_on_from_its_tuning_candidate_logs_every_round_once(tmp_path):
    """The candidate logged rounds 1-2 in its own run folder; the seed goes on from it in the run's folder, and its
    logs hold the candidate's rounds, then its own."""
    data = synthetic_data(30, 40, 8.0, seed=1)
    logs = ("tensorboard", "csv")
    candidate = tmp_path / "tuning" / "default"
    run_federated(data, "fedavg", cfg(rounds=2, log=logs), out_dir=candidate, progress=False, test=False,
                  keep_selected=True)  # fmt: skip
    res = run_federated(data, "fedavg", cfg(rounds=4, log=logs), out_dir=tmp_path / "run", progress=False,
                        start_from={0: candidate / "seed-0"})  # fmt: skip
    history = res["history"]
    assert [r["round"] for r in history] == [1, 2, 3, 4]
    seed_events = tmp_path / "run" / "tensorboard" / "seed-0"
    assert_same(tensorboard_scalars(seed_events)["train/loss"], expected(history)["train/loss"])
    with open(tmp_path / "run" / "rounds" / "seed-0.csv", newline="") as f:
        assert [int(r["round"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]


def test_rows_a_killed_run_logged_past_its_checkpoint_are_dropped(tmp_path):
    path = tmp_path / "seed-0.csv"
    first = CsvRounds(path)
    for r in (1, 2, 3):
        first.write(r, {"train/loss": float(r)})
    resumed = CsvRounds(path)  # the checkpoint was at round 1: rounds 2 and 3 are trained again
    resumed.write(2, {"train/loss": 20.0, "valid/hr@10": 0.5})
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["round"], r["train/loss"], r["valid/hr@10"]) for r in rows] == [("1", "1.0", ""), ("2", "20.0", "0.5")]


def test_without_log_nothing_is_written(tmp_path):
    data = synthetic_data(30, 40, 8.0, seed=1)
    run_federated(data, "fedavg", cfg(rounds=1), out_dir=tmp_path, progress=False)
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "rounds").exists()


def test_log_needs_a_run_folder_and_a_known_kind():
    res = run_cli("run", "synthetic:60x40", "--backbone", "fedavg", "--rounds", "1", "--log", "csv")
    assert_user_error(res, "--log: writes the per-round logs into the run folder", "add --out RUN_DIR")
    res = run_cli("run", "synthetic:60x40", "--backbone", "fedavg", "--log", "tensorbord")
    assert_user_error(res, "--log: expected tensorboard or csv", "'tensorbord'")


def test_only_run_takes_log():
    assert "--log tensorboard,csv" in run_cli("run", "--help").out
    for command in (("coldstart",), ("experiment", "paper-table"), ("bench", "round")):
        assert "--log" not in run_cli(*command, "--help").out, command
