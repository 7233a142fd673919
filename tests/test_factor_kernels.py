"""The layer's sparse factor of deferred fused-row gradients: the compiled kernel against its torch reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _kernels import compiled_or_skip
from test_summed_chunks import BASE, _layer, _shared, _sum_of, _sums

from fedvlr_plus.fedvlr import closed_form


@pytest.fixture
def kernels():
    return compiled_or_skip(closed_form._KERNELS)


@pytest.mark.parametrize("seed", range(3))
def test_kernel_builds_the_torch_references_matrix(kernels, seed):
    g = np.random.default_rng(seed)
    c_n, t_max, s_max, n_items = 7, 11, 4, 60
    delta = torch.from_numpy(g.standard_normal((s_max, c_n * t_max)).astype(np.float32))
    delta[torch.from_numpy(g.random(delta.shape) < 0.6)] = 0.0
    delta[0, 3], delta[1, 5] = -0.0, float("nan")  # -0 is no entry, NaN is one (as torch's nonzero)
    real = torch.from_numpy(np.sort(g.choice(c_n * t_max, 50, replace=False)))
    items = torch.from_numpy(g.integers(0, n_items, len(real)))
    want = closed_form._factor_csr(delta, c_n, t_max, items, real, n_items)
    got = kernels.factor_csr(delta.numpy(), real.numpy(), items.numpy(), c_n, t_max, n_items)
    for a, b in zip(got, want):
        assert np.array_equal(a, b.numpy(), equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("residual", [False, True])
def test_round_sums_are_the_same_with_the_kernel(residual, monkeypatch, kernels):
    bb = _layer("fedavg", residual=residual, temperature=0.7)
    shared = _shared(bb)
    config = {**BASE, "upload": "grads", "weight_decay": 0.0}
    monkeypatch.setattr(closed_form, "KERNEL_AFTER_CELLS", 1 << 60)
    plain, _ = _sums(bb, shared, config, summed=True)
    monkeypatch.setattr(closed_form, "KERNEL_AFTER_CELLS", 0)
    used = []
    real_get = closed_form._KERNELS.get
    monkeypatch.setattr(closed_form._KERNELS, "get", lambda: used.append(1) or real_get())
    compiled, _ = _sums(bb, shared, config, summed=True)
    assert used
    for name in shared:
        (a, da), (b, db) = _sum_of(plain, name), _sum_of(compiled, name)
        assert torch.equal(a, b), name
        assert (da is None and db is None) or torch.equal(da, db), name


def test_preparing_the_schedule_and_factor_kernels_says_whether_they_exist(monkeypatch):
    from fedvlr_plus.federation.simulation import schedule

    for module in (schedule, closed_form):
        monkeypatch.setattr(module._KERNELS, "module", False)  # as where numba does not import
        assert module.prepare_kernels() is False
    pytest.importorskip("numba", reason="numba is not installed here")
    for module in (schedule, closed_form):
        monkeypatch.setattr(module._KERNELS, "module", None)
        assert module.prepare_kernels() is True
