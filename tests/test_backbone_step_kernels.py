"""The backbones' own closed-form local steps (``adapters/fedrap_steps.py``, ``adapters/fedncf_steps.py``) give the
sequential reference's uploads, private states and losses over two rounds, and are taken only where they apply."""

import pytest
from test_store_rows_in_place import CONFIG, assert_same, two_rounds

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.adapters.fedncf import FedNCF
from fedvlr_plus.adapters.fedncf_steps import FedNCFSteps
from fedvlr_plus.adapters.fedrap import FedRAP
from fedvlr_plus.adapters.fedrap_steps import FedRAPSteps
from fedvlr_plus.federation import BatchedSimulator, SequentialSimulator

STEPS = {"fedrap": FedRAPSteps, "fedncf": FedNCFSteps}
PENALISED = dict(fedrap_lambda=0.5, fedrap_mu=0.3)  # FedRAP's penalties strong enough to matter
MODES = [
    dict(upload="params", weight_decay=0.0),
    dict(upload="params", weight_decay=0.02),
    dict(upload="grads", local_shared=True, weight_decay=0.0),
]
CASES = [
    *(("fedrap", PENALISED, mode) for mode in MODES),
    ("fedrap", dict(fedrap_lambda=0, fedrap_mu=0), MODES[0]),  # (FedRAP then adds no penalty at all)
    *(("fedncf", {}, mode) for mode in MODES),
]


def _counted(name: str, monkeypatch) -> list:
    """A list that grows by one for every closed-form step of backbone ``name``."""
    calls, steps = [], STEPS[name]
    step = steps.step
    monkeypatch.setattr(steps, "step", lambda self, *a: calls.append(1) or step(self, *a))
    return calls


@pytest.mark.parametrize("name,options,mode", CASES)
def test_closed_form_steps_equal_the_sequential_reference(name, options, mode, monkeypatch):
    bb = make_backbone(name, 40, 8, **options)
    config = dict(CONFIG, **mode)
    calls = _counted(name, monkeypatch)
    batched = two_rounds(BatchedSimulator, bb, config)
    assert calls  # the closed form trained the chunks
    assert_same(batched, two_rounds(SequentialSimulator, bb, config))


def test_a_gradient_upload_without_local_steps_is_left_to_autograd(monkeypatch):
    bb = make_backbone("fedrap", 40, 8, **PENALISED)
    config = dict(CONFIG, upload="grads", weight_decay=0.0)
    calls = _counted("fedrap", monkeypatch)
    batched = two_rounds(BatchedSimulator, bb, config)
    assert not calls
    assert_same(batched, two_rounds(SequentialSimulator, bb, config))


def test_a_subclass_that_changes_the_forward_gets_no_closed_form():
    class Penalised(FedRAP):
        def split_regulariser(self, shared_vecs, personal, mask, config):
            return 2.0 * super().split_regulariser(shared_vecs, personal, mask, config)

    class Wider(FedNCF):
        def layer_sizes(self):
            return [2 * self.dim, self.dim, self.dim // 2]

    assert Penalised(40, 8).step_kernel() is None and Wider(40, 8).step_kernel() is None
    assert FedRAP(40, 8).step_kernel() is not None and FedNCF(40, 8).step_kernel() is not None
