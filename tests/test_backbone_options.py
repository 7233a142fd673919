"""A backbone's own options (FedRAP's penalties) live on the backbone: declared by it, passed to it by the command
line, the Python API and the Flower app, recorded with a run's settings, and checked when a run resumes."""

from __future__ import annotations

import argparse

import pytest

from fedvlr_plus.adapters import BACKBONES, FedRAP, FedRAPOptions, backbone_options, make_backbone, option_names
from fedvlr_plus.errors import ResumeMismatch
from fedvlr_plus.federation import FedConfig, FederatedRun, run_federated
from fedvlr_plus.federation.engine import dataset_identity
from fedvlr_plus.federation.synthetic import synthetic_data

FAST = dict(rounds=2, local_epochs=1, batch_size=8, negatives=1, dim=8, patience=10, ks=(5, 10), valid_metric="hr@10")


@pytest.fixture(scope="module")
def small():
    return synthetic_data(30, 80, 8, seed=1)


def test_fedrap_declares_its_penalties_and_uses_the_values_given():
    assert FedRAP.options_type is FedRAPOptions and option_names() == {"fedrap_lambda", "fedrap_mu"}
    default = make_backbone("fedrap", 10, 4)
    assert default.option_values() == {"fedrap_lambda": 1e-4, "fedrap_mu": 1e-2}
    given = make_backbone("fedrap", 10, 4, fedrap_lambda=0.5)
    assert (given.lam0, given.mu0) == (0.5, 1e-2)
    assert given.curriculum(10)[0] == pytest.approx(0.5 * 0.7615941559557649)
    assert all(make_backbone(n, 10, 4).option_values() == {} for n in BACKBONES if n != "fedrap")


@pytest.mark.parametrize("bad", [{"fedrap_lambda": -1.0}, {"fedrap_mu": -0.1}])
def test_a_negative_penalty_is_refused(bad):
    with pytest.raises(ValueError, match="fedrap_lambda and fedrap_mu must be >= 0"):
        FedRAPOptions(**bad)
    with pytest.raises(ValueError, match="must be >= 0"):
        FedRAP(10, 4, **bad)


def test_the_options_are_read_from_flags_or_a_mapping_and_none_keeps_the_default():
    flags = argparse.Namespace(fedrap_lambda=0.3, fedrap_mu=None, lr=0.1)
    assert backbone_options("fedrap", flags) == {"fedrap_lambda": 0.3}
    assert backbone_options("fedrap", {"fedrap_mu": 0.2}) == {"fedrap_mu": 0.2}
    assert backbone_options("fedavg", flags) == {}
    assert "fedrap_lambda" not in {f for f in FedConfig().to_dict()}


def test_a_run_records_the_penalties_of_fedrap_only(small):
    rap = run_federated(small, "fedrap", FedConfig(**FAST), progress=False, options={"fedrap_mu": 0.05})
    assert (rap["config"]["fedrap_lambda"], rap["config"]["fedrap_mu"]) == (1e-4, 0.05)
    avg = run_federated(small, "fedavg", FedConfig(**FAST), progress=False)
    assert not option_names() & set(avg["config"])


def _figures(res):
    return [(h["round"], h["loss"], h.get("valid")) for h in res["history"]], res["test"]


def test_the_same_penalty_by_name_or_by_ready_adapter_gives_the_same_run(small):
    by_name = run_federated(small, "fedrap", FedConfig(**FAST), progress=False, options={"fedrap_lambda": 0.2})
    ready = run_federated(
        small, FedRAP(small.n_items, FAST["dim"], fedrap_lambda=0.2), FedConfig(**FAST), progress=False
    )
    other = run_federated(small, "fedrap", FedConfig(**FAST), progress=False, options={"fedrap_lambda": 5.0})
    assert _figures(by_name) == _figures(ready)
    assert _figures(by_name) != _figures(other)  # the option reaches the loss


def test_resume_refuses_a_changed_penalty_and_accepts_the_same(small, tmp_path):
    run_federated(small, "fedrap", FedConfig(**FAST), out_dir=tmp_path, progress=False)
    with pytest.raises(ResumeMismatch, match=r"--fedrap-lambda: the run used 0\.0001, this call 0\.001"):
        run_federated(
            small,
            "fedrap",
            FedConfig(**{**FAST, "rounds": 3}),
            out_dir=tmp_path,
            resume=True,
            progress=False,
            options={"fedrap_lambda": 1e-3},
        )
    more = run_federated(
        small,
        "fedrap",
        FedConfig(**{**FAST, "rounds": 3}),
        out_dir=tmp_path,
        resume=True,
        progress=False,
        options={"fedrap_lambda": 1e-4},
    )  # the default, given explicitly
    assert more["rounds_run"] == 3


def _checkpoint_of(run, **config):
    return {
        "backbone": run.backbone_name,
        "dataset": dataset_identity(run.data),
        "round": 0,
        "config": {**run.recorded_config(), **config},
        "resolved": run._resolved(),
    }


def test_a_folder_recorded_with_penalties_for_every_backbone_still_resumes(small, tmp_path):
    """Run folders written while every config carried FedRAP's penalties list them for a FedAvg run too."""
    from fedvlr_plus.federation.runs.same_run import check_same_run

    avg = FederatedRun(small, "fedavg", FedConfig(**FAST), tmp_path / "a")
    check_same_run(avg, _checkpoint_of(avg, fedrap_lambda=1e-4, fedrap_mu=1e-2))  # no error
    rap = FederatedRun(small, "fedrap", FedConfig(**FAST), tmp_path / "b")
    check_same_run(rap, _checkpoint_of(rap))
    with pytest.raises(ResumeMismatch, match="--fedrap-mu: the run used 0.5"):
        check_same_run(rap, _checkpoint_of(rap, fedrap_mu=0.5))


def test_the_command_line_builds_fedrap_with_its_flags(small):
    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.cli.run.federated import build_backbone

    parser = build_parser()
    args = parser.parse_args(["run", "ml-100k", "--backbone", "fedrap", "--fedrap-lambda", "0.25"])
    bb = build_backbone(args, small, 8, False)
    assert isinstance(bb, FedRAP) and bb.option_values() == {"fedrap_lambda": 0.25, "fedrap_mu": 1e-2}
    plain = parser.parse_args(["run", "ml-100k", "--backbone", "fedrap"])
    assert build_backbone(plain, small, 8, False) == "fedrap"  # no flag: the engine builds it with defaults
    with pytest.raises(SystemExit):  # bench suite never builds FedRAP from the flags: it does not take them
        parser.parse_args(["bench", "suite", "--fedrap-lambda", "0.25"])


def test_the_api_recipe_passes_its_penalties_to_the_backbone(small):
    from fedvlr_plus import api

    cfg = FedConfig(**FAST)
    built = api.FedRAP(fedrap_mu=0.3, lr=0.2).build(small, cfg)
    assert built.option_values() == {"fedrap_lambda": 1e-4, "fedrap_mu": 0.3} and built.dim == FAST["dim"]
    assert api.FedRAP(lr=0.2).build(small, cfg) == "fedrap"
    with pytest.raises(ValueError, match="must be >= 0"):
        api.FedRAP(fedrap_lambda=-1.0)


def test_flower_run_config_takes_the_penalties_for_the_backbone(small):
    pytest.importorskip("flwr")
    from fedvlr_plus.flower.app import Settings, build_backbone

    s = Settings.from_run_config({"data": "ml-100k", "backbone": "fedrap", "fedrap-lambda": 0.125, "dim": 8})
    assert s.backbone_options == {"fedrap_lambda": 0.125}
    assert build_backbone(small, s).option_values()["fedrap_lambda"] == 0.125
    other = Settings.from_run_config({"data": "ml-100k", "backbone": "fedavg", "fedrap-lambda": 0.125, "dim": 8})
    assert build_backbone(small, other).option_values() == {}


def _folder_with_text_views(path, n_users=24, n_items=40):
    """Interactions (leave-one-out by time) and a text view per item: what paper-table and coldstart need."""
    import numpy as np

    g = np.random.default_rng(0)
    rows = [(u, int(i), 1, t) for u in range(n_users) for t, i in enumerate(g.choice(n_items, size=6, replace=False))]
    path.mkdir()
    (path / "inter.csv").write_text(
        "userID,itemID,rating,timestamp\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)
    )
    np.save(path / "text_features.npy", g.standard_normal((n_items, 6)).astype(np.float32))
    return str(path)


@pytest.mark.parametrize(
    "command",
    [
        ["experiment", "paper-table", "FOLDER", "--backbones", "fedrap", "--variants", "none", "--seeds", "1"],
        [
            "experiment",
            "poisoning",
            "synthetic:30x40",
            "--backbone",
            "fedrap",
            "--strategies",
            "fedavg",
            "--attackers",
            "0",
            "--seeds",
            "1",
        ],
        ["experiment", "privacy-table", "synthetic:30x40", "--backbone", "fedrap", "--noise", "0", "--seeds", "1"],
        ["coldstart", "FOLDER", "--backbone", "fedrap", "--seeds", "1"],
    ],
)
def test_every_command_that_trains_fedrap_passes_its_penalties_to_the_backbone(command, monkeypatch, tmp_path):
    from _bad_input import run_cli

    from fedvlr_plus.adapters import fedrap

    seen = []
    original = fedrap.FedRAP.__init__

    def spy(self, *a, **kw):
        seen.append((kw.get("fedrap_lambda"), kw.get("fedrap_mu")))
        original(self, *a, **kw)

    monkeypatch.setattr(fedrap.FedRAP, "__init__", spy)
    command = [_folder_with_text_views(tmp_path / "data") if a == "FOLDER" else a for a in command]
    res = run_cli(
        *command,
        "--rounds",
        "1",
        "--local-epochs",
        "1",
        "--dim",
        "4",
        "--no-progress",
        "--fedrap-lambda",
        "0.003",
        "--fedrap-mu",
        "0.02",
    )
    assert res.code == 0, res.err
    assert (0.003, 0.02) in seen
