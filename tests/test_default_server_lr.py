"""fedgrad's default server learning rate: independent of the number of clients, except FCF's declared sum rule."""

import numpy as np
import pytest

from fedvlr_plus.federation import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.synthetic import synthetic_data


@pytest.fixture(scope="module")
def many_clients():
    return synthetic_data(1500, 200, 12, seed=3)


@pytest.mark.parametrize("backbone", ["fedavg", "fedncf", "pfedrec"])
def test_fedgrad_default_server_lr_does_not_grow_with_clients(many_clients, backbone):
    run = FederatedRun(many_clients, backbone, FedConfig(strategy="fedgrad", seed=0), progress=False)
    assert run.per_round > 1000
    assert run.server_lr == 1.0


def test_fcf_keeps_its_sum_rule(many_clients):
    run = FederatedRun(many_clients, "fcf", FedConfig(seed=0), progress=False)
    assert run.server_lr == pytest.approx(run.lr * run.per_round)


def test_an_explicit_server_lr_still_wins(many_clients):
    run = FederatedRun(many_clients, "fedavg", FedConfig(strategy="fedgrad", server_lr=0.25), progress=False)
    assert run.server_lr == 0.25


def test_fedavg_fedgrad_with_defaults_trains_on_many_clients(many_clients):
    """The like-for-like row with defaults: the loss falls round on round instead of blowing up (the sum rule,
    lr x 1,500 clients, sent it to ~1e5 by round 3)."""
    run = FederatedRun(many_clients, "fedavg", FedConfig(strategy="fedgrad", local_epochs=1, seed=0), progress=False)
    losses = [run.run_round()["loss"] for _ in range(3)]
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0] < 0.75
