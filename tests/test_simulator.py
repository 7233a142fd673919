"""Schedules, counter-based draws, the batched simulator against the sequential reference, configs and bench."""

import argparse

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedvlr_plus.adapters import make_backbone, rowdot
from fedvlr_plus.cli.run.args import add_run_arguments, config_from_args
from fedvlr_plus.federation import (
    BatchedSimulator,
    FedConfig,
    MemoryStore,
    SequentialSimulator,
    bench_round,
    format_bench,
)
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.simulation import rng
from fedvlr_plus.federation.simulation.schedule import build_schedule
from fedvlr_plus.federation.state.initial import init_shared_state
from fedvlr_plus.federation.synthetic import synthetic_data


def tiny_csr(n_users=25, n_items=40, seed=0):
    g = np.random.default_rng(seed)
    rows, cols = [], []
    for u in range(n_users):
        k = int(g.integers(1, 15))
        rows += [u] * k
        cols += list(g.choice(n_items, k, replace=False))
    m = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n_users, n_items))
    m.sort_indices()
    return m.indptr.astype(np.int64), m.indices.astype(np.int64)


def test_counter_based_draws():
    a = rng.uniform(7, 1, np.arange(10_000))
    assert np.array_equal(a, rng.uniform(7, 1, np.arange(10_000)))  # deterministic
    assert not np.array_equal(a, rng.uniform(8, 1, np.arange(10_000)))  # seed matters
    assert a.min() >= 0 and a.max() < 1 and abs(a.mean() - 0.5) < 0.02
    assert np.array_equal(rng.uniform(7, 1, np.arange(5, 10)), a[5:10])  # a draw depends only on its key
    z = rng.normal(3, np.arange(20_000))
    assert abs(z.mean()) < 0.03 and abs(z.std() - 1) < 0.03


def test_schedule_contents_and_independence_from_the_group():
    indptr, indices = tiny_csr()
    n_items = 40
    kw = dict(seed=3, round=2, epochs=3, negatives=2, batch_size=4)
    sched = build_schedule(indptr, indices, np.arange(25), n_items, **kw)
    for c in range(25):
        pos = set(indices[indptr[c] : indptr[c + 1]].tolist())
        steps = sched.steps_of(c)
        assert len(steps) == 3 * -(-len(pos) // 4) == sched.n_steps[c]
        got_pos = [i for items, labels in steps for i, lab in zip(items, labels) if lab == 1]
        negs = [i for items, labels in steps for i, lab in zip(items, labels) if lab == 0]
        assert sorted(got_pos) == sorted(list(pos) * 3)  # every positive once per epoch
        assert len(negs) == 2 * len(got_pos) and not (set(negs) & pos)  # k negatives each, never a positive
        assert set(sched.touched_of(c)) == set(got_pos) | set(negs)
        # the same client alone, from its own one-row CSR keyed by its id, gets the same steps
        own = indices[indptr[c] : indptr[c + 1]]
        alone = build_schedule(np.array([0, len(own)]), own, np.array([0]), n_items, ids=np.array([c]), **kw)
        for (a_items, a_lab), (b_items, b_lab) in zip(alone.steps_of(0), steps):
            assert np.array_equal(a_items, b_items) and np.array_equal(a_lab, b_lab)
    # negatives are spread over the whole catalogue minus the positives (valid/test-only items included)
    assert len(set(sched.ex_item[sched.ex_label == 0].tolist())) > 30


def test_schedule_is_the_same_with_and_without_the_bitmaps(monkeypatch):
    from fedvlr_plus.federation.simulation import schedule

    indptr, indices = tiny_csr(n_users=60, n_items=90, seed=4)
    kw = dict(seed=5, round=3, epochs=2, negatives=3, batch_size=4)
    dense = build_schedule(indptr, indices, np.arange(60), 90, **kw)
    monkeypatch.setattr(schedule, "dense_key_space", lambda size, lookups: False)
    searched = build_schedule(indptr, indices, np.arange(60), 90, **kw)
    for name in ("ex_client", "ex_step", "ex_slot", "ex_item", "ex_label", "touched_ptr", "touched", "ex_local"):
        assert np.array_equal(getattr(dense, name), getattr(searched, name)), name
    negatives = dense.ex_item[dense.ex_label == 0]
    assert len(np.unique(negatives)) > 60  # the draws reach most of the catalogue


def test_schedule_errors():
    indptr = np.array([0, 0, 2])
    with pytest.raises(ValueError, match="no training"):
        build_schedule(indptr, np.array([0, 1]), np.array([0]), 5, seed=0, round=1, epochs=1, negatives=1, batch_size=4)
    with pytest.raises(ValueError, match="every item"):
        build_schedule(indptr, np.array([0, 1]), np.array([1]), 2, seed=0, round=1, epochs=1, negatives=1, batch_size=4)
    with pytest.raises(ValueError, match="sorted"):
        build_schedule(
            np.array([0, 2]), np.array([3, 1]), np.array([0]), 5, seed=0, round=1, epochs=1, negatives=1, batch_size=4
        )


def _round(sim_cls, bb, indptr, indices, config, chunk_floats=1 << 24):
    store = MemoryStore()
    sim = sim_cls(bb, indptr, indices, store, seed=0, chunk_floats=chunk_floats)
    shared = init_shared_state(bb, 0)
    ups = sim.fit(np.arange(len(indptr) - 1), shared, config)
    return ups, store, sim.scores(np.arange(len(indptr) - 1), shared)


@pytest.mark.parametrize(
    "name,upload,wd",
    [
        ("fedavg", "params", 0.05),
        ("fcf", "grads", 0.0),
        ("pfedrec", "params", 0.0),
        ("fedrap", "params", 0.01),
        ("fedncf", "params", 0.01),
    ],
)
def test_batched_round_equals_sequential_reference(name, upload, wd):
    indptr, indices = tiny_csr()
    bb = make_backbone(name, 40, 8)
    config = dict(
        seed=0, round=3, epochs=2, negatives=2, batch_size=4, lr=0.3, item_lr_scale=3.0, weight_decay=wd, upload=upload
    )
    ub, sb, cb = _round(BatchedSimulator, bb, indptr, indices, config, chunk_floats=4096)  # several chunks
    us, ss, cs = _round(SequentialSimulator, bb, indptr, indices, config)
    for a, b in zip(ub, us):
        assert a.cid == b.cid and a.num_examples == b.num_examples and a.kind == b.kind == upload
        assert set(a.arrays) == set(b.arrays) == set(bb.shared_names)
        for k in a.arrays:
            assert torch.allclose(a.arrays[k], b.arrays[k], atol=1e-5), (a.cid, k)
        for k in a.rows:
            assert torch.equal(a.rows[k], b.rows[k])
        assert abs(a.metrics["loss"] - b.metrics["loss"]) < 1e-5
    for c in range(len(indptr) - 1):
        sa, sb_ = sb.load(c), ss.load(c)
        assert set(sa) == set(sb_)
        for k in sa:
            assert torch.allclose(sa[k], sb_[k], atol=1e-5)
    assert torch.allclose(cb, cs, atol=1e-5)


def test_weight_decay_is_applied():
    indptr, indices = tiny_csr()
    bb = make_backbone("fedavg", 40, 8)
    base = dict(seed=0, round=1, epochs=2, negatives=1, batch_size=4, lr=0.5, item_lr_scale=1.0, upload="params")
    plain, _, _ = _round(BatchedSimulator, bb, indptr, indices, {**base, "weight_decay": 0.0})
    decayed, store, _ = _round(BatchedSimulator, bb, indptr, indices, {**base, "weight_decay": 0.5})
    n0 = sum(float(u.arrays["item_emb"].norm()) for u in plain)
    n1 = sum(float(u.arrays["item_emb"].norm()) for u in decayed)
    assert n1 < 0.95 * n0
    # hand check for one step on the dense head: w <- w(1 - lr*wd) - lr*g, so decay alone shrinks w
    one = dict(base, epochs=1, weight_decay=0.5, lr=1e-9)
    ups, st, _ = _round(SequentialSimulator, bb, indptr, indices, one)
    from fedvlr_plus.federation.state.initial import init_private_states

    w0 = init_private_states(bb, [0], 0)[0]["head_w"]
    assert torch.allclose(st.load(0)["head_w"], w0, atol=1e-6)


def test_client_sampling_is_seeded():
    data = synthetic_data(60, 50, 8, seed=1)
    run = FederatedRun(data, "fedavg", FedConfig(clients_per_round=0.25, seed=4), progress=False)
    a, b = run.sample_clients(1), run.sample_clients(2)
    assert len(a) == round(0.25 * len(run.eligible)) and not np.array_equal(a, b)
    assert np.array_equal(
        a, FederatedRun(data, "fedavg", FedConfig(clients_per_round=0.25, seed=4), progress=False).sample_clients(1)
    )
    assert len(FederatedRun(data, "fedavg", FedConfig(clients_per_round=7), progress=False).sample_clients(1)) == 7
    assert len(FederatedRun(data, "fedavg", FedConfig(clients_per_round=1.0), progress=False).sample_clients(1)) == len(
        run.eligible
    )


def test_cli_flags_build_the_config():
    parser = add_run_arguments(argparse.ArgumentParser(), include_io=True)
    args = parser.parse_args(
        [
            "--backbone",
            "fedncf",
            "--rounds",
            "7",
            "--local-epochs",
            "2",
            "--lr",
            "0.05",
            "--clients-per-round",
            "0.5",
            "--strategy",
            "fedgrad",
            "--server-optimizer",
            "adam",
            "--weight-decay",
            "1e-4",
            "--seeds",
            "3",
            "--ks",
            "5,10",
        ]
    )
    cfg = config_from_args(args)
    assert (cfg.rounds, cfg.local_epochs, cfg.lr, cfg.clients_per_round) == (7, 2, 0.05, 0.5)
    assert (cfg.strategy, cfg.server_optimizer, cfg.weight_decay, cfg.seeds) == ("fedgrad", "adam", 1e-4, 3)
    assert 50 in cfg.ks and 5 in cfg.ks  # the selection metric's cut-off is always computed
    assert (
        config_from_args(parser.parse_args(["--backbone", "fcf", "--clients-per-round", "20"])).clients_per_round == 20
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--backbone", "fedavg", "--strategy", "krum"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--backbone", "fedavg", "--clients-per-round", "2.5"])
    with pytest.raises(ValueError, match="lr_decay"):
        FedConfig(lr_decay=0.0)


def test_bench_round_reports_both_simulators():
    data = synthetic_data(40, 150, 10, seed=0)
    res = bench_round(data, "fedavg", FedConfig(local_epochs=2), repeats=1)
    assert res["clients"] == 40 and res["batched_s"] > 0 and res["sequential_s"] > 0
    assert res["speedup"] == pytest.approx(res["sequential_s"] / res["batched_s"])
    assert res["speedup_cpu"] == pytest.approx(res["sequential_cpu_s"] / res["batched_cpu_s"])
    assert res["max_abs_diff"] < 1e-5  # both simulators produce the same aggregated state
    assert "speed-up" in format_bench(res)


def test_history_context_reaches_the_backbone_identically():
    """A backbone that conditions on the user's history (as the FedVLR router will) through ctx["hist_global"]
    and a constant feature table gets the same numbers from both simulators."""
    from fedvlr_plus.adapters.fedavg import FedAvgMF

    class HistoryMF(FedAvgMF):
        uses_history = True

        def __init__(self, n_items, dim):
            super().__init__(n_items, dim)
            self.features = torch.randn(n_items, dim, generator=torch.Generator().manual_seed(5))

        def head(self, p, vecs, ctx):
            h, m = ctx["hist_global"], ctx["hist_mask"].to(vecs.dtype)
            pooled = (self.features[h] * m.unsqueeze(-1)).sum(-2) / m.sum(-1, keepdim=True)
            return super().head(p, vecs, ctx) + 0.1 * rowdot(vecs, pooled)

    indptr, indices = tiny_csr()
    bb = HistoryMF(40, 8)
    config = dict(
        seed=0,
        round=1,
        epochs=2,
        negatives=1,
        batch_size=4,
        lr=0.3,
        item_lr_scale=3.0,
        weight_decay=0.0,
        upload="params",
    )
    ub, _, cb = _round(BatchedSimulator, bb, indptr, indices, config, chunk_floats=4096)
    us, _, cs = _round(SequentialSimulator, bb, indptr, indices, config)
    for a, b in zip(ub, us):
        assert torch.allclose(a.arrays["item_emb"], b.arrays["item_emb"], atol=1e-5)
    assert torch.allclose(cb, cs, atol=1e-5)
    plain = make_backbone("fedavg", 40, 8)
    _, _, c_plain = _round(BatchedSimulator, plain, indptr, indices, config)
    assert not torch.allclose(cb, c_plain, atol=1e-3)  # the history term is really used


@pytest.mark.parametrize("name", ["fcf", "fedavg"])
def test_local_shared_grads_follow_the_clients_trajectory(name):
    """--local-shared: the uploaded gradient sum is taken along the client's own updated copy; batched ==
    sequential, one step equals Algorithm 1, more steps differ from it."""
    indptr, indices = tiny_csr()
    bb = make_backbone(name, 40, 8)
    base = dict(
        seed=0,
        round=2,
        epochs=3,
        negatives=2,
        batch_size=4,
        lr=0.3,
        item_lr_scale=1.0,
        weight_decay=0.0,
        upload="grads",
    )
    ub, _, _ = _round(BatchedSimulator, bb, indptr, indices, {**base, "local_shared": True}, chunk_floats=4096)
    us, _, _ = _round(SequentialSimulator, bb, indptr, indices, {**base, "local_shared": True})
    fixed, _, _ = _round(SequentialSimulator, bb, indptr, indices, base)
    for a, b in zip(ub, us):
        for k in a.arrays:
            assert torch.allclose(a.arrays[k], b.arrays[k], atol=1e-5), (a.cid, k)
    assert any(not torch.allclose(a.arrays[k], f.arrays[k], atol=1e-4) for a, f in zip(us, fixed) for k in a.arrays)
    one = {**base, "epochs": 1, "batch_size": 1000}  # a single local step: nothing to follow yet
    o1, _, _ = _round(SequentialSimulator, bb, indptr, indices, {**one, "local_shared": True})
    o0, _, _ = _round(SequentialSimulator, bb, indptr, indices, one)
    for a, b in zip(o1, o0):
        for k in a.arrays:
            assert torch.allclose(a.arrays[k], b.arrays[k], atol=1e-6)
