"""The FedVLR layer's closed-form step and scoring give the numbers of autograd and of the sequential reference."""

import numpy as np
import pytest
import torch
from test_simulator import tiny_csr

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation import BatchedSimulator, MemoryStore, SequentialSimulator
from fedvlr_plus.federation.state.initial import init_shared_state
from fedvlr_plus.fedvlr import FUSED, FusionLayer
from fedvlr_plus.fedvlr.closed_form import MixtureDotHead

N_USERS, N_ITEMS = 25, 40


def _layer(backbone="fedavg", **kw):
    g = np.random.default_rng(1)
    views = {"text": g.standard_normal((N_ITEMS, 12)), "image": g.standard_normal((N_ITEMS, 6))}
    return FusionLayer(make_backbone(backbone, N_ITEMS, 8), views, router_hidden=8, **kw)


def _shared(bb):
    """The round's broadcast state with real fused views (the placeholder is all zeros)."""
    shared = init_shared_state(bb, 0)
    server = bb.init_server(0)
    # a trained-looking ID table: the routers and heads then see views that differ between items
    server = {k: v + 0.3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(2)) for k, v in server.items()}
    shared[FUSED] = bb.fused_views(server)
    return shared


def _fit(sim_cls, bb, config, closed_form=True, chunk_floats=1 << 24):
    indptr, indices = tiny_csr(N_USERS, N_ITEMS)
    if not closed_form:
        bb.closed_form = lambda: None  # this instance only: the generic autograd path
    store = MemoryStore()
    sim = sim_cls(bb, indptr, indices, store, seed=0, chunk_floats=chunk_floats)
    shared = _shared(bb)
    ups = sim.fit(np.arange(N_USERS), shared, config)
    return ups, store, sim.scores(np.arange(N_USERS), shared)


def _assert_same(got, want, atol=1e-5):
    (ua, sa, ca), (ub, sb, cb) = got, want
    for a, b in zip(ua, ub):
        assert a.cid == b.cid and set(a.arrays) == set(b.arrays)
        for k in a.arrays:
            assert torch.allclose(a.arrays[k], b.arrays[k], atol=atol), (a.cid, k)
        for k in a.rows:
            assert torch.equal(a.rows[k], b.rows[k])
        assert abs(a.metrics["loss"] - b.metrics["loss"]) < atol
    for c in range(N_USERS):
        x, y = sa.load(c), sb.load(c)
        assert set(x) == set(y)
        for k in x:
            assert torch.allclose(x[k], y[k], atol=atol), (c, k)
    assert torch.allclose(ca, cb, atol=atol)


CONFIGS = {
    "grads": dict(upload="grads", weight_decay=0.0),
    "grads+wd": dict(upload="grads", weight_decay=0.05),
    "local_shared": dict(upload="grads", weight_decay=0.0, local_shared=True),
    "params": dict(upload="params", weight_decay=0.01),
    # more steps than the fused row's width: the rows' gradient is summed step by step, not at the end
    "grads+many_steps": dict(upload="grads", weight_decay=0.01, batch_size=1),
}


#: the layer's options the closed form covers: the paper's form, the residual ID path, the content preference
VARIANTS = {"plain": {}, "residual": dict(residual=True), "content": dict(content_preference=True)}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("backbone", ["fedavg", "fcf"])
@pytest.mark.parametrize("mode", list(CONFIGS))
def test_closed_form_round_equals_autograd_and_sequential(variant, backbone, mode, monkeypatch):
    config = {**dict(seed=0, round=2, epochs=2, negatives=2, batch_size=4, lr=0.3, item_lr_scale=3.0), **CONFIGS[mode]}
    calls = []
    step = MixtureDotHead.step_from
    monkeypatch.setattr(MixtureDotHead, "step_from", lambda self, *a, **k: calls.append(1) or step(self, *a, **k))
    kw = dict(VARIANTS[variant], temperature=0.7)
    fast = _fit(BatchedSimulator, _layer(backbone, **kw), config, chunk_floats=4096)  # several chunks
    assert calls, "the closed form did not run"
    n_fast = len(calls)
    slow = _fit(BatchedSimulator, _layer(backbone, **kw), config, closed_form=False)
    assert len(calls) == n_fast, "the autograd path ran the closed form"
    _assert_same(fast, slow)
    _assert_same(fast, _fit(SequentialSimulator, _layer(backbone, **kw), config))


@pytest.mark.parametrize("kernel", ["compiled", "torch"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mode", ["grads", "params"])
def test_rows_read_by_id_give_the_autograd_round(kernel, variant, mode, monkeypatch):
    """A catalogue too large to read whole a step: the step reads its examples' rows by id (:class:`IndexedRows`),
    with the compiled kernel and with its torch fallback, and gives autograd's numbers."""
    from fedvlr_plus.federation.simulation import indexed_rows
    from fedvlr_plus.fedvlr import closed_form

    monkeypatch.setattr(closed_form, "ALL_ROWS_RATIO", 0)
    monkeypatch.setattr(indexed_rows._KERNELS, "module", None if kernel == "compiled" else False)
    monkeypatch.setattr(indexed_rows, "KERNEL_FROM_FLOATS", 0)  # (these tables are small)
    seen = []
    dot = indexed_rows.IndexedRows.dot
    monkeypatch.setattr(indexed_rows.IndexedRows, "dot", lambda self, h: seen.append(1) or dot(self, h))
    config = {**dict(seed=0, round=2, epochs=2, negatives=2, batch_size=4, lr=0.3, item_lr_scale=3.0), **CONFIGS[mode]}
    kw = dict(VARIANTS[variant], temperature=0.7)
    fast = _fit(BatchedSimulator, _layer(**kw), config, chunk_floats=4096)
    assert seen, "no step read its rows by id"
    assert (indexed_rows._KERNELS.module is not False) == (kernel == "compiled")
    _assert_same(fast, _fit(BatchedSimulator, _layer(**kw), config, closed_form=False))


@pytest.mark.parametrize("kw", [dict(mode="sum"), dict(mode="uniform"), dict(balance=0.1)])
def test_closed_form_is_declined_where_it_does_not_hold(kw):
    assert _layer(**kw).closed_form() is None
    assert _layer().closed_form() is not None
    assert _layer("fedrap").closed_form() is None  # a private item table added to the fused vector
    assert _layer("fedncf").closed_form() is None  # an MLP head


def test_full_sort_scores_come_in_chunks_bounded_by_chunk_floats(monkeypatch):
    """Scoring every item for every user holds one chunk of ``[B, N]`` scores at a time, never ``[B, N, d]``."""
    bb = _layer()
    indptr, indices = tiny_csr(N_USERS, N_ITEMS)
    sim = BatchedSimulator(bb, indptr, indices, MemoryStore(), seed=0, chunk_floats=8 * N_ITEMS)
    seen = []
    scores = MixtureDotHead.scores
    monkeypatch.setattr(
        MixtureDotHead, "scores", lambda self, f, p, ctx: seen.append(p["head_w"].shape[0]) or scores(self, f, p, ctx)
    )
    shared = _shared(bb)
    got = sim.scores(np.arange(N_USERS), shared)
    assert seen and max(seen) * N_ITEMS * 2 <= 8 * N_ITEMS and sum(seen) == N_USERS
    bb.closed_form = lambda: None
    want = BatchedSimulator(bb, indptr, indices, MemoryStore(), seed=0).scores(np.arange(N_USERS), shared)
    assert got.shape == (N_USERS, N_ITEMS) and torch.allclose(got, want, atol=1e-5)


def test_a_resumed_fedvlr_run_ends_with_the_same_numbers(tmp_path):
    """The server keeps the graph of the views it broadcast; after a restore it must rebuild it from the restored
    state (a stale graph would step the server from the wrong parameters)."""
    from fedvlr_plus.federation.config import FedConfig
    from fedvlr_plus.federation.run_seeds import run_federated
    from fedvlr_plus.federation.synthetic import synthetic_data

    data = synthetic_data(40, 150, 10, seed=0)
    g = np.random.default_rng(0)
    views = {"text": g.standard_normal((150, 12)), "image": g.standard_normal((150, 6))}

    def layer():
        return FusionLayer(make_backbone("fedavg", 150, 8), views, router_hidden=8)

    cfg = FedConfig(
        rounds=4, local_epochs=2, batch_size=8, negatives=2, dim=8, patience=10, ks=(5, 10), valid_metric="hr@10"
    )
    full = run_federated(data, layer(), cfg, out_dir=tmp_path / "full", progress=False)

    def interrupt(run, record):
        if record["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_federated(data, layer(), cfg, out_dir=tmp_path / "cut", progress=False, on_round=interrupt)
    resumed = run_federated(data, layer(), cfg, out_dir=tmp_path / "cut", resume=True, progress=False)
    figures = [[(h["round"], h["loss"], h.get("valid")) for h in r["history"]] for r in (full, resumed)]
    assert len(figures[0]) == 4 and figures[0] == figures[1]
    assert resumed["test"] == full["test"]


def test_router_input_dense_and_gathered_agree(monkeypatch):
    """The router's input as one product over a small catalogue equals the gathered mean of the history's rows."""
    from fedvlr_plus.federation.simulation.batched import history_ctx
    from fedvlr_plus.fedvlr import router
    from fedvlr_plus.fedvlr.router import VIEWS

    indptr, indices = tiny_csr(N_USERS, N_ITEMS)
    views = torch.randn(N_ITEMS, 24, generator=torch.Generator().manual_seed(0))
    ctx = {VIEWS: views, **history_ctx(indptr, indices, np.arange(N_USERS))}
    dense = router.history_mean(ctx)
    monkeypatch.setattr(router, "DENSE_HISTORY_RATIO", 0)
    gathered = router.history_mean(ctx)
    want = torch.stack([views[indices[indptr[u] : indptr[u + 1]]].mean(0) for u in range(N_USERS)])
    assert torch.allclose(dense, want, atol=1e-6) and torch.allclose(gathered, want, atol=1e-6)


def test_preparing_the_step_kernel_says_whether_it_exists(monkeypatch):
    from fedvlr_plus.federation.simulation import indexed_rows

    monkeypatch.setattr(indexed_rows._KERNELS, "module", None)
    assert indexed_rows.prepare_kernels() is (indexed_rows._row_kernels() is not None)
    monkeypatch.setattr(indexed_rows._KERNELS, "module", False)  # as where numba does not import
    assert indexed_rows.prepare_kernels() is False


def test_small_steps_score_with_torch_and_never_import_numba(monkeypatch):
    """A small table (KU, ml-100k) costs no numba import: its steps stay on the torch path, with the same scores."""
    from fedvlr_plus.federation.simulation import indexed_rows

    monkeypatch.setattr(indexed_rows._KERNELS, "module", None)
    g = torch.Generator().manual_seed(0)
    table, ids, h = torch.randn(30, 6, generator=g), torch.randint(0, 30, (4, 5), generator=g), torch.randn(4, 3)
    rows = indexed_rows.IndexedRows(table, ids, 2, 3)
    got = rows.dot(h)
    assert indexed_rows._KERNELS.module is None  # not imported
    want = torch.einsum("clje,ce->clj", table[ids].view(4, 5, 2, 3), h)
    assert torch.allclose(got, want, atol=1e-6)
    monkeypatch.setattr(indexed_rows, "KERNEL_FROM_FLOATS", 0)
    assert torch.allclose(rows.dot(h), want, atol=1e-5)
    assert torch.allclose(rows.weighted_sum(torch.ones(4, 5)), table[ids].sum(1), atol=1e-5)


def test_bench_markdown_shows_the_system_part_of_a_round_where_it_is_large():
    from fedvlr_plus.bench.suite import _cpu

    assert _cpu({"round1_cpu_s": 12.0, "round1_sys_s": 4.0}, "round1") == "12.0 s (4.000 s sys)"
    assert _cpu({"later_cpu_s": 6.0, "later_sys_s": 0.2}, "later") == "6.000 s"
    assert _cpu({"later_cpu_s": 6.0}, "later") == "6.000 s"  # a suite.json written before the split


@pytest.mark.parametrize(
    "kw,by_mixture",
    [
        ({}, True),
        ({"residual": True}, True),
        ({"mode": "uniform"}, False),
        ({"content_preference": True}, False),
        ({"mode": "mlp"}, False),
    ],
)
def test_fedncf_scores_the_routers_mixtures_without_forming_them(kw, by_mixture, monkeypatch):
    bb = _layer("fedncf", **kw)
    shared = _shared(bb)
    indptr, indices = tiny_csr(N_USERS, N_ITEMS)
    sim = BatchedSimulator(bb, indptr, indices, MemoryStore(), seed=0)
    sim.fit(
        np.arange(N_USERS),
        shared,
        dict(seed=0, round=1, epochs=2, negatives=2, batch_size=4, lr=0.3, item_lr_scale=3.0, upload="params"),
    )
    calls = []
    mixture_logits = bb.base.mixture_logits
    monkeypatch.setattr(bb.base, "mixture_logits", lambda *a: calls.append(1) or mixture_logits(*a))
    fast = sim.scores(np.arange(N_USERS), shared)
    assert bool(calls) is by_mixture
    bb.score_mixtures = False  # the mixtures formed, then the head
    formed = sim.scores(np.arange(N_USERS), shared)
    assert torch.allclose(fast, formed, rtol=1e-5, atol=1e-6), (fast - formed).abs().max()


def test_one_clients_mixture_scores_are_its_row_of_the_batch():
    bb = _layer("fedncf")
    p = dict(_shared(bb))
    g = torch.Generator().manual_seed(4)
    w = torch.softmax(torch.randn(3, 3, generator=g), -1)
    p["user_gmf"], p["user_mlp"] = torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g)
    experts = torch.randn(N_ITEMS, 3, 16, generator=g)
    batch = bb.base.mixture_logits(p, w, experts)
    one = bb.base.mixture_logits(p | {"user_gmf": p["user_gmf"][1], "user_mlp": p["user_mlp"][1]}, w[1], experts)
    assert one.shape == (N_ITEMS,) and torch.allclose(one, batch[1], atol=1e-6)
    head = bb.base.head(p, torch.einsum("bj,njk->bnk", w, experts), {})
    assert torch.allclose(batch, head, atol=1e-5)


def test_the_sequential_reference_scores_fedncf_mixtures_as_the_batched_simulator():
    config = dict(seed=0, round=1, epochs=2, negatives=2, batch_size=4, lr=0.3, item_lr_scale=3.0, upload="params")
    _, _, batched = _fit(BatchedSimulator, _layer("fedncf"), config)
    _, _, sequential = _fit(SequentialSimulator, _layer("fedncf"), config)
    assert torch.allclose(batched, sequential, rtol=1e-5, atol=1e-6)
