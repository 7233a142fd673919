"""A dot-product head's local steps as rank-one sums over the broadcast table (``federation/simulation/dot_steps.py``)
give
the sequential reference's uploads, private states and losses, and are taken only where they apply."""

import numpy as np
import pytest
import torch
from test_simulator import tiny_csr

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation import BatchedSimulator, MemoryStore, SequentialSimulator
from fedvlr_plus.federation.simulation.dot_steps import DotSteps
from fedvlr_plus.federation.state.initial import init_shared_state

CONFIG = dict(seed=0, round=3, epochs=2, negatives=2, lr=0.3, item_lr_scale=3.0, weight_decay=0.0)


def _round(sim_cls, bb, config, monkeypatch=None):
    calls = []
    if monkeypatch is not None:
        step = DotSteps.step
        monkeypatch.setattr(DotSteps, "step", lambda self, *a: calls.append(1) or step(self, *a))
    indptr, indices = tiny_csr()
    store = MemoryStore()
    sim = sim_cls(bb, indptr, indices, store, seed=0, chunk_floats=4096)  # several chunks
    shared = init_shared_state(bb, 0)
    shared = {k: v + 0.2 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in shared.items()}
    ups = sim.fit(np.arange(len(indptr) - 1), shared, config)
    return ups, store, len(calls), shared


@pytest.mark.parametrize("name", ["fedavg", "fcf", "pfedrec"])
@pytest.mark.parametrize(
    "mode",
    [
        dict(upload="params", batch_size=4),
        dict(upload="grads", batch_size=4),
        dict(upload="grads", local_shared=True, batch_size=3),
        dict(upload="params", batch_size=1),
    ],  # many steps: every earlier step counts
    ids=["params", "grads", "local-shared", "many-steps"],
)
def test_rank_one_steps_equal_the_sequential_reference(name, mode, monkeypatch):
    bb = make_backbone(name, 40, 8)
    config = {**CONFIG, **mode}
    got, got_store, n_calls, shared = _round(BatchedSimulator, bb, config, monkeypatch)
    want, want_store, _, _ = _round(SequentialSimulator, bb, config)
    assert n_calls > 0
    moved = 0.0
    for a, b in zip(got, want):
        assert a.cid == b.cid and set(a.arrays) == set(b.arrays)
        for k in a.arrays:
            assert torch.equal(a.rows[k], b.rows[k])
            assert torch.allclose(a.arrays[k], b.arrays[k], atol=1e-5), (a.cid, k)
            start = 0.0 if a.kind == "grads" else shared[k][a.rows[k]]
            moved = max(moved, float((b.arrays[k] - start).abs().max()))
        assert abs(a.metrics["loss"] - b.metrics["loss"]) < 1e-5
    assert moved > 1e-3
    for c in range(25):
        x, y = got_store.load(c), want_store.load(c)
        assert set(x) == set(y) and all(torch.allclose(x[k], y[k], atol=1e-5) for k in x), c


@pytest.mark.parametrize("why", ["weight decay", "big catalogue", "regulariser"])
def test_rank_one_steps_are_not_taken_where_they_do_not_apply(why, monkeypatch):
    name = "fedrap" if why == "regulariser" else "fedavg"
    bb = make_backbone(name, 40, 8)
    config = {**CONFIG, "upload": "params", "batch_size": 4, "weight_decay": 0.05 if why == "weight decay" else 0.0}
    if why == "big catalogue":
        monkeypatch.setattr("fedvlr_plus.federation.simulation.dot_steps.ALL_ROWS_RATIO", 0)
    _, _, n_calls, _ = _round(BatchedSimulator, bb, config, monkeypatch)
    assert n_calls == 0


@pytest.mark.parametrize("kernel", ["compiled", "torch"])
@pytest.mark.parametrize(
    "name,mode",
    [
        ("fedavg", dict(upload="params")),
        ("fcf", dict(upload="grads")),
        ("pfedrec", dict(upload="params", weight_decay=0.05)),
    ],
)
def test_row_by_id_steps_of_a_big_catalogue_equal_the_sequential_reference(kernel, name, mode, monkeypatch):
    """Where the catalogue is too big for rank-one steps, a dot-product head's step reads its rows by id (the
    compiled scores or their torch fallback, ``embedding_bag`` sums) and gives the sequential reference's numbers."""
    from fedvlr_plus.federation.simulation import indexed_rows

    monkeypatch.setattr("fedvlr_plus.federation.simulation.dot_steps.ALL_ROWS_RATIO", 0)
    monkeypatch.setattr(indexed_rows._KERNELS, "module", None if kernel == "compiled" else False)
    monkeypatch.setattr(indexed_rows, "KERNEL_FROM_FLOATS", 0)  # (these tables are small)
    seen = []
    dot = indexed_rows.IndexedRows.dot
    monkeypatch.setattr(indexed_rows.IndexedRows, "dot", lambda self, h: seen.append(1) or dot(self, h))
    bb = make_backbone(name, 40, 8)
    config = {**CONFIG, "batch_size": 4, **mode}
    got, got_store, n_calls, shared = _round(BatchedSimulator, bb, config, monkeypatch)
    want, want_store, _, _ = _round(SequentialSimulator, bb, config)
    assert n_calls == 0 and seen, "the steps did not read rows by id"
    assert (indexed_rows._KERNELS.module is not False) == (kernel == "compiled")
    for a, b in zip(got, want):
        assert a.cid == b.cid
        for k in a.arrays:
            assert torch.equal(a.rows[k], b.rows[k])
            assert torch.allclose(a.arrays[k], b.arrays[k], atol=1e-5), (a.cid, k)
        assert abs(a.metrics["loss"] - b.metrics["loss"]) < 1e-5
    for c in range(25):
        x, y = got_store.load(c), want_store.load(c)
        assert all(torch.allclose(x[k], y[k], atol=1e-5) for k in x), c


def test_the_reported_loss_is_the_weighted_cross_entropy():
    import torch.nn.functional as F

    from fedvlr_plus.nn import weighted_bce_sums

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 50, generator=g, dtype=torch.float64) * 8
    x[0, :4] = torch.tensor([-100.0, 100.0, 30.0, -30.0], dtype=torch.float64)  # the stable range of both forms
    y = (torch.rand(6, 50, generator=g) < 0.3).double()
    w = torch.rand(6, 50, generator=g, dtype=torch.float64)
    want = F.binary_cross_entropy_with_logits(x, y, weight=w, reduction="none").sum(1)
    # softplus returns x itself above 20, where log(1 + e^x) is x + 2e-9: equal to 1e-8
    assert torch.allclose(weighted_bce_sums(x, y, w), want, rtol=1e-8, atol=1e-8)
