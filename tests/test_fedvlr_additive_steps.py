"""FedRAP behind the FedVLR layer: the batched chunk's hand-written additive steps
(:mod:`fedvlr_plus.fedvlr.additive_steps`) give the numbers of the generic autograd path and of the sequential
reference, with FedRAP's penalties strong enough to matter."""

import numpy as np
import pytest
from test_fedvlr_neumf_steps import BASE, _assert_close, _autograd
from test_fedvlr_speed import CONFIGS, N_ITEMS, _assert_same, _fit

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation import BatchedSimulator, SequentialSimulator
from fedvlr_plus.fedvlr import FusionLayer
from fedvlr_plus.fedvlr.additive_steps import AdditiveSteps

PENALTIES = {"strong": dict(fedrap_lambda=0.5, fedrap_mu=0.3), "none": dict(fedrap_lambda=0.0, fedrap_mu=0.0)}


def _layer(penalties: str = "strong", **kw):
    g = np.random.default_rng(1)
    views = {"text": g.standard_normal((N_ITEMS, 12)), "image": g.standard_normal((N_ITEMS, 6))}
    base = make_backbone("fedrap", N_ITEMS, 8, **PENALTIES[penalties])
    return FusionLayer(base, views, router_hidden=8, temperature=0.7, **kw)


def _counted(monkeypatch) -> list:
    calls = []
    step = AdditiveSteps.step
    monkeypatch.setattr(AdditiveSteps, "step", lambda self, *a, **k: calls.append(1) or step(self, *a, **k))
    return calls


MODES, VARIANTS = ("grads", "grads+wd", "grads+many_steps"), ({}, {"residual": True})
CASES = [*((mode, variant, "strong") for mode in MODES for variant in VARIANTS), ("grads", {}, "none")]


@pytest.mark.parametrize("mode,variant,penalties", CASES)
def test_additive_steps_give_the_autograd_round_and_the_sequential_one(mode, variant, penalties, monkeypatch):
    config = {**BASE, **CONFIGS[mode]}
    slow = _fit(BatchedSimulator, _autograd(_layer(penalties, **variant)), config)
    sequential = _fit(SequentialSimulator, _layer(penalties, **variant), config)
    calls = _counted(monkeypatch)
    fast = _fit(BatchedSimulator, _layer(penalties, **variant), config, chunk_floats=4096)  # several chunks
    assert calls, "the additive steps did not run"
    for name in ("fusion.F",):  # the upload the steps form themselves is there and not zero
        assert any(float(u.arrays[name].abs().sum()) > 0 for u in fast[0]), name
    _assert_close(fast, slow)
    _assert_close(fast, sequential)


@pytest.mark.parametrize("mode", ["local_shared", "params"])
def test_additive_steps_are_declined_where_the_clients_step_the_fused_rows(mode, monkeypatch):
    config = {**BASE, **CONFIGS[mode]}
    calls = _counted(monkeypatch)
    fast = _fit(BatchedSimulator, _layer(), config)
    assert not calls
    _assert_same(fast, _fit(SequentialSimulator, _layer(), config))


def test_additive_steps_are_offered_only_in_front_of_fedraps_own_forward():
    from fedvlr_plus.adapters.fedrap import FedRAP

    class Penalised(FedRAP):
        def split_regulariser(self, shared_vecs, personal, mask, config):
            return 2.0 * super().split_regulariser(shared_vecs, personal, mask, config)

    assert type(_layer().step_kernel()).__name__ == "MixtureAdditive"
    assert _layer(balance=0.1).step_kernel() is None
    assert _layer(content_preference=True).step_kernel() is None
    assert _layer(mode="uniform").step_kernel() is None
    views = {"text": np.ones((N_ITEMS, 4))}
    assert FusionLayer(Penalised(N_ITEMS, 8), views, router_hidden=8).step_kernel() is None
