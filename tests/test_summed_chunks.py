"""Chunks handed over as blocks (``federation/simulation/summed_chunk.py``) give the sums of the per-client uploads:
bit for
bit where they are the uploads' rows, to float rounding where they are the FedVLR layer's factors; and they are
used only where nothing changes or reads single uploads."""

import numpy as np
import pytest
import torch
from test_fedvlr_speed import N_ITEMS, N_USERS, _layer, _shared
from test_simulator import tiny_csr

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation import BatchedSimulator, MemoryStore
from fedvlr_plus.federation.simulation.running_sum import RunningSums
from fedvlr_plus.federation.simulation.summed_chunk import SummedChunk, check_summed, may_sum
from fedvlr_plus.federation.simulation.upload_stream import fit_streamed
from fedvlr_plus.federation.state.initial import init_shared_state
from fedvlr_plus.fedvlr import FUSED

BASE = dict(seed=0, round=2, epochs=2, negatives=2, batch_size=4, lr=0.3, item_lr_scale=3.0)


def _sums(bb, shared, config, summed: bool, chunk_floats: int = 4096):
    """The round's running sums from the batched simulator's chunks (several, at this ``chunk_floats``)."""
    indptr, indices = tiny_csr(N_USERS, N_ITEMS)
    sim = BatchedSimulator(bb, indptr, indices, MemoryStore(), seed=0, chunk_floats=chunk_floats)
    cids = np.arange(N_USERS)
    n = torch.tensor(np.diff(indptr)[cids], dtype=torch.float64)
    weights = n / n.sum()
    specs = {s.name: s for s in bb.all_specs()}
    sums = RunningSums(shared, [k for k in shared if specs[k].item_table])
    kinds, where = [], {int(c): i for i, c in enumerate(cids)}
    for chunk in sim.fit_chunks(cids, shared, config, summed=summed):
        kinds.append(type(chunk))
        if isinstance(chunk, SummedChunk):
            check_summed(shared, chunk, config["upload"])
            sums.add_summed(chunk, weights[torch.tensor([where[int(c)] for c in chunk.cids])])
        else:
            sums.add(chunk, weights[torch.tensor([where[u.cid] for u in chunk])])
    assert len(kinds) > 2  # several chunks
    return sums, kinds


def _sum_of(sums, name):
    return sums.row_sums(name) if name in sums.rows else (sums.dense_sum(name), None)


# stepped gathered rows (weight decay: no rank-one steps), and FedNCF's generic path with dense shared towers
@pytest.mark.parametrize("backbone,upload", [("fedavg", "params"), ("fcf", "grads"), ("fedncf", "params")])
def test_row_blocks_give_the_per_client_sums_bit_for_bit(backbone, upload):
    bb = make_backbone(backbone, N_ITEMS, 8)
    shared = init_shared_state(bb, 0)
    config = {**BASE, "upload": upload, "weight_decay": 0.01}
    got, kinds = _sums(bb, shared, config, summed=True)
    want, plain = _sums(bb, shared, config, summed=False)
    assert set(kinds) == {SummedChunk} and SummedChunk not in plain
    for name in shared:
        (a, da), (b, db) = _sum_of(got, name), _sum_of(want, name)
        assert torch.equal(a, b), name
        assert da is None or torch.equal(da, db), name
    assert any(float(_sum_of(got, n)[0].abs().max()) > 0 for n in shared)


@pytest.mark.parametrize(
    "backbone,extra",
    [
        ("fedavg", dict(upload="params")),
        ("fcf", dict(upload="grads")),
        ("fedavg", dict(upload="grads", local_shared=True)),
    ],
    ids=["fedavg-params", "fcf-grads", "fedavg-local-shared"],
)
def test_dot_head_factors_give_the_per_client_sums(backbone, extra):
    """A dot-product head's rank-one steps (``federation/simulation/dot_steps.py``) go to the sums as factors."""
    bb = make_backbone(backbone, N_ITEMS, 8)
    shared = init_shared_state(bb, 0)
    config = {**BASE, "weight_decay": 0.0, **extra}
    got, _ = _sums(bb, shared, config, summed=True)
    want, _ = _sums(bb, shared, config, summed=False)
    for name in shared:
        (a, da), (b, db) = _sum_of(got, name), _sum_of(want, name)
        assert float((b - (0 if extra["upload"] == "grads" else shared[name])).abs().max()) > 1e-4
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (name, float((a - b).abs().max()))
        assert torch.equal(da, db), name


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("chunk_floats", [4096, 1024], ids=["larger-chunks", "smaller-chunks"])
def test_fedvlr_factors_give_the_per_client_sums(residual, chunk_floats):
    """Gradient uploads of fixed fused views go to the sums as a sparse ``coef`` and the steps' directions, at
    any chunk size: the per-client sums to float rounding (the row counts exactly)."""
    bb = _layer("fedavg", residual=residual, temperature=0.7)
    shared = _shared(bb)
    config = {**BASE, "upload": "grads", "weight_decay": 0.0}
    got, _ = _sums(bb, shared, config, summed=True, chunk_floats=chunk_floats)
    want, _ = _sums(bb, shared, config, summed=False, chunk_floats=chunk_floats)
    for name in shared:
        (a, da), (b, db) = _sum_of(got, name), _sum_of(want, name)
        assert float(b.abs().max()) > 0
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (name, float((a - b).abs().max()))
        assert da is None or torch.allclose(da, db, rtol=1e-12, atol=0), name


@pytest.mark.parametrize("chunk_floats", [4096, 1024], ids=["larger-chunks", "smaller-chunks"])
def test_neumf_hidden_sums_give_the_per_client_sums(chunk_floats):
    """FedNCF behind the layer (its NeuMF steps): the fused rows' MF blocks as factors, their MLP blocks and
    ``mlp1_item`` as hidden sums read out once a round: the per-client sums to float rounding."""
    bb = _layer("fedncf", temperature=0.7)
    shared = _shared(bb)
    config = {**BASE, "upload": "grads", "weight_decay": 0.0}
    got, _ = _sums(bb, shared, config, summed=True, chunk_floats=chunk_floats)
    assert "neumf.mlp1_item" in got.hidden  # (the hidden path ran)
    want, _ = _sums(bb, shared, config, summed=False, chunk_floats=chunk_floats)
    d = bb.base.dim
    for name in shared:
        (a, da), (b, db) = _sum_of(got, name), _sum_of(want, name)
        assert float(b.abs().max()) > 0
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (name, float((a - b).abs().max()))
        assert da is None or torch.allclose(da, db, rtol=1e-12, atol=0), name
    mf_mlp = want.row_sums(FUSED)[0].view(N_ITEMS, -1, 2, d).abs().amax((0, 1, 3))
    assert float(mf_mlp.min()) > 0  # both blocks' gradients are there to compare


@pytest.mark.parametrize("model,chunk_floats", [("fedvlr", 4096), ("fedvlr", 1024), ("fedavg", 4096)])
def test_factors_are_used_when_they_fit(model, chunk_floats):
    bb = _layer("fedavg") if model == "fedvlr" else make_backbone("fedavg", N_ITEMS, 8)
    shared = _shared(bb) if model == "fedvlr" else init_shared_state(bb, 0)
    indptr, indices = tiny_csr(N_USERS, N_ITEMS)
    sim = BatchedSimulator(bb, indptr, indices, MemoryStore(), seed=0, chunk_floats=chunk_floats)
    config = {**BASE, "upload": "grads" if model == "fedvlr" else "params"}
    chunks = list(sim.fit_chunks(np.arange(N_USERS), shared, config, summed=True))
    assert all(c.row_factors and not c.row_blocks for c in chunks)
    if model == "fedvlr":  # the layer's coef holds the steps' nonzero per-row sums only
        for c in chunks:
            coef, factor = c.row_factors[FUSED][:2]
            assert coef.layout == torch.sparse_csr
            assert 0 < coef._nnz() <= len(c.row_factors[FUSED][4]) * factor.shape[0] // len(c.cids)


@pytest.mark.parametrize(
    "change",
    [dict(upload_noise=0.5), dict(upload_clip=1.0), dict(pad_uploads=N_ITEMS), "on_upload"],
    ids=["noise", "clip", "decoys", "inspected"],
)
def test_uploads_changed_or_inspected_on_their_way_come_one_by_one(change):
    config = {**BASE, "upload": "params"}
    assert may_sum(config, None)
    on_upload = (lambda r, u: None) if change == "on_upload" else None
    if change != "on_upload":
        config.update(change)
    assert not may_sum(config, on_upload)
    bb = make_backbone("fedavg", N_ITEMS, 8)
    indptr, indices = tiny_csr(N_USERS, N_ITEMS)
    sim = BatchedSimulator(bb, indptr, indices, MemoryStore(), seed=0, chunk_floats=4096)
    seen = []
    real = sim.fit_chunks
    sim.fit_chunks = lambda *a, **k: (seen.append(type(c)) or c for c in real(*a, **k))
    from fedvlr_plus.federation import make_strategy

    shared = init_shared_state(bb, 0)
    specs = {s.name: s for s in bb.all_specs()}
    cids = np.arange(N_USERS)
    fit_streamed(sim, make_strategy("fedavg"), cids, shared, specs, config, np.diff(indptr)[cids], on_upload=on_upload)
    assert seen and SummedChunk not in seen


def test_a_summed_chunk_missing_an_array_is_refused():
    bb = make_backbone("fedavg", N_ITEMS, 8)
    shared = init_shared_state(bb, 0)
    chunk = SummedChunk(kind="params", cids=np.arange(2), num_examples=np.ones(2), losses=np.zeros(2))
    with pytest.raises(ValueError, match="shared arrays"):
        check_summed(shared, chunk, "params")
    with pytest.raises(ValueError, match="aggregates 'grads'"):
        check_summed(shared, chunk, "grads")


def _hidden_chunk(cid: int, keys, vals, proj, right):
    """One client's upload of table ``t`` (holders by factors, values by hidden sums) and dense ``m``."""
    n_rows = 5
    rows = torch.unique(keys)
    coef = torch.zeros(n_rows, 1)  # (the holders only: the values are all in the hidden sums)
    parts = (keys, vals.clone(), torch.zeros_like(keys), n_rows, {"t": ("rows", proj), "m": ("outer", right)})
    factors = (coef, torch.zeros(1, proj.shape[1]), torch.zeros(1, dtype=torch.long), None, rows, 0 * rows)
    one = dict(cids=np.array([cid]), num_examples=np.array([1]), losses=np.array([0.0]))
    return SummedChunk(kind="grads", **one, row_factors={"t": factors}, hidden={"g": parts})


def test_hidden_sums_start_anew_where_readouts_differ_or_were_read():
    """The round's hidden sums map each chunk back with its own readouts, also after a read (their sum is then
    read again), to the per-upload sums ``Σ w (e_key ⊗ v) P`` and ``Σ w v^T right[key]``."""
    g = torch.Generator().manual_seed(0)
    shared = {"t": torch.zeros(5, 3), "m": torch.zeros(2, 4)}
    sums = RunningSums(shared, ["t"])
    want_t, want_m = torch.zeros(5, 3, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64)
    projs = [torch.randn(2, 3, generator=g) for _ in range(2)]
    right = torch.randn(5, 4, generator=g)
    for i, proj in enumerate([projs[0], projs[0], projs[1], projs[1]]):
        keys, vals = torch.tensor([0, 3, 3]), torch.randn(3, 2, generator=g)
        w = 0.1 * (i + 1)
        chunk = _hidden_chunk(i, keys, vals, proj, right)
        check_summed(shared, chunk, "grads")
        sums.add_summed(chunk, torch.tensor([w], dtype=torch.float64))
        for key, v in zip(keys, vals.double()):
            want_t[key] += w * (v @ proj.double())
            want_m += w * torch.outer(v, right[key].double())
        if i == 2:  # a read in the middle: what follows goes to new sums
            sums.row_sums("t"), sums.dense_sum("m")
    assert len(sums.rows["t"].hidden) == 1 and not sums.hidden["g"].done  # the chunk after the read: new sums
    assert torch.allclose(sums.row_sums("t")[0].double(), want_t, atol=1e-5)
    assert torch.allclose(sums.dense_sum("m"), want_m, atol=1e-5)
