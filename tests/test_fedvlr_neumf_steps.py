"""FedNCF behind the FedVLR layer: the batched chunk's hand-written NeuMF steps (:mod:`fedvlr_plus.fedvlr.neumf_steps`)
give the numbers of the generic autograd path and of the sequential reference."""

import functools

import pytest
from test_fedvlr_speed import CONFIGS, _assert_same, _fit, _layer

from fedvlr_plus.federation import BatchedSimulator, SequentialSimulator
from fedvlr_plus.fedvlr.neumf_steps import NeuMFSteps

BASE = dict(seed=0, round=2, epochs=2, negatives=2, batch_size=4, lr=0.3, item_lr_scale=3.0)


def _assert_close(got, want, rtol=2e-5):
    """Every upload and stored state within ``rtol`` of the largest entry of its array (the uploads are small:
    ``_assert_same``'s absolute tolerance alone would pass a gradient off by a tenth of a percent)."""
    _assert_same(got, want)
    (ua, sa, _), (ub, sb, _) = got, want
    pairs = [(a.arrays[k], b.arrays[k]) for a, b in zip(ua, ub) for k in a.arrays]
    for c in range(len(ua)):
        x, y = sa.load(ua[c].cid), sb.load(ub[c].cid)
        pairs += [(x[k], y[k]) for k in x]
    for a, b in pairs:
        if b.numel():
            assert float((a - b).abs().max()) <= rtol * float(b.abs().max()) + 1e-9


def _autograd(layer):
    layer.step_kernel = lambda: None  # this instance only: the generic autograd path
    return layer


def _counted(monkeypatch) -> list:
    calls = []
    step = NeuMFSteps.step
    monkeypatch.setattr(NeuMFSteps, "step", lambda self, *a, **k: calls.append(1) or step(self, *a, **k))
    return calls


VARIANTS = {"plain": {}, "residual": dict(residual=True), "over views": dict(router_over="views")}


@functools.cache
def _references(variant: str, mode: str):
    """The generic autograd round and the sequential reference, once per variant and mode: the two ``by_id`` cases
    below differ in how the NeuMF steps read the MF blocks only, which neither reference uses."""
    config, kw = {**BASE, **CONFIGS[mode]}, dict(VARIANTS[variant], temperature=0.7)
    with pytest.MonkeyPatch.context() as mp:
        calls = _counted(mp)
        slow = _fit(BatchedSimulator, _autograd(_layer("fedncf", **kw)), config)
        assert not calls, "the autograd path ran the NeuMF steps"
    return slow, _fit(SequentialSimulator, _layer("fedncf", **kw), config)


#: (mode, kernel, by_id): every mode with the compiled kernels; the MF blocks read by id, and the torch path of the
#: first layer, once per variant (neither depends on the mode's options)
CASES = [(m, "compiled", False) for m in ("grads", "grads+wd", "grads+many_steps")]
CASES += [("grads", "compiled", True), ("grads", "torch", False)]


@pytest.mark.parametrize("mode, kernel, by_id", CASES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_neumf_steps_give_the_autograd_round_and_the_sequential_one(variant, mode, kernel, by_id, monkeypatch):
    """``by_id``: a catalogue too large to read whole a step (the MF blocks read by id, :class:`IndexedRows`);
    ``kernel``: the first layer's item side by the compiled kernels or by their torch path."""
    from fedvlr_plus.fedvlr import neumf_steps

    slow, sequential = _references(variant, mode)
    if by_id:
        monkeypatch.setattr(neumf_steps, "ALL_ROWS_RATIO", 0)
    monkeypatch.setattr(neumf_steps._KERNELS, "module", None if kernel == "compiled" else False)
    kernel_calls = _kernel_calls(monkeypatch)
    calls = _counted(monkeypatch)
    kw = dict(VARIANTS[variant], temperature=0.7)
    fast = _fit(BatchedSimulator, _layer("fedncf", **kw), {**BASE, **CONFIGS[mode]}, chunk_floats=4096)  # chunks
    assert calls, "the NeuMF steps did not run"
    # every upload the steps form themselves is there and not zero (a comparison of zeros would prove nothing)
    for name in ("fusion.F", "mlp1_item", "mlp2_w", "out_gmf"):
        assert any(float(u.arrays[name].abs().sum()) > 0 for u in fast[0]), name
    assert bool(kernel_calls) == (kernel == "compiled"), kernel_calls
    _assert_close(fast, slow)
    _assert_close(fast, sequential)


def _kernel_calls(monkeypatch) -> list:
    """The names of the compiled kernels the steps call, one entry a call (numba's module itself is not patched:
    the steps' module-level look-up is)."""
    from fedvlr_plus.fedvlr import neumf_steps

    calls, get = [], neumf_steps._compiled

    class Counting:
        def __init__(self, module):
            self.module = module

        def __getattr__(self, name):
            return lambda *a: calls.append(name) or getattr(self.module, name)(*a)

    monkeypatch.setattr(neumf_steps, "_compiled", lambda like: None if get(like) is None else Counting(get(like)))
    return calls


@pytest.mark.parametrize("mode", ["local_shared", "params"])
def test_neumf_steps_are_declined_where_each_client_steps_its_tower(mode, monkeypatch):
    config = {**BASE, **CONFIGS[mode]}
    calls = _counted(monkeypatch)
    fast = _fit(BatchedSimulator, _layer("fedncf", temperature=0.7), config)
    assert not calls
    _assert_same(fast, _fit(SequentialSimulator, _layer("fedncf", temperature=0.7), config))


def test_neumf_steps_are_offered_only_in_front_of_fedncfs_own_head():
    assert _layer("fedncf").step_kernel() is not None
    assert _layer("fedncf").closed_form() is None  # scoring keeps the layer's own mixture path
    assert _layer("fedncf", content_preference=True).step_kernel() is None
    assert _layer("fedncf", balance=0.1).step_kernel() is None
    assert _layer("fedncf", mode="uniform").step_kernel() is None
    assert type(_layer("fedrap").step_kernel()).__name__ == "MixtureAdditive"  # FedRAP's own, not the NeuMF steps
    assert type(_layer().step_kernel()).__name__ == "MixtureDotHead"
