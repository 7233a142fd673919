"""The batched simulator scores chosen items (``score_items``) as it scores the whole catalogue, and the sampled
protocol of a federated run asks for its candidates only, with the figures of scoring every item."""

import numpy as np
import pytest
import torch
from test_fedvlr_speed import N_ITEMS, N_USERS, _layer, _shared
from test_simulator import tiny_csr

from fedvlr_plus.adapters import BACKBONES, make_backbone
from fedvlr_plus.evaluation import evaluate
from fedvlr_plus.federation import BatchedSimulator, FedConfig, MemoryStore
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.state.initial import init_shared_state
from fedvlr_plus.federation.synthetic import synthetic_data

CONFIG = dict(seed=0, round=1, epochs=2, negatives=2, batch_size=4, lr=0.3, item_lr_scale=3.0, upload="params")


def _trained_sim(bb, shared, chunk_floats=1 << 24):
    indptr, indices = tiny_csr(N_USERS, N_ITEMS)
    sim = BatchedSimulator(bb, indptr, indices, MemoryStore(), seed=0, chunk_floats=chunk_floats)
    sim.fit(np.arange(N_USERS), shared, CONFIG)  # private states that differ between users
    return sim


def _candidates(n_rows, width, seed=3):
    g = np.random.default_rng(seed)
    return np.stack([g.choice(N_ITEMS, size=width, replace=False) for _ in range(n_rows)])


def _assert_matches_full_scores(sim, shared):
    users = np.array([0, 3, 3, 7, 24, 11])  # a user may come twice (two test items)
    cand = _candidates(len(users), 9)
    full = sim.scores(users, shared)
    want = torch.gather(full, 1, torch.from_numpy(cand))
    got = sim.score_items(users, cand, shared)
    assert got.shape == (len(users), 9)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_each_backbone_scores_chosen_items_as_it_scores_every_item(name):
    bb = make_backbone(name, N_ITEMS, 8)
    shared = init_shared_state(bb, 0)
    _assert_matches_full_scores(_trained_sim(bb, shared), shared)


@pytest.mark.parametrize(
    "backbone,kw",
    [
        ("fedavg", {}),
        ("fedavg", {"content_preference": True}),
        ("fedncf", {}),
        ("pfedrec", {"personal_offset": True}),
        ("fedrap", {}),
        ("fedavg", {"mode": "uniform"}),
    ],
)
def test_the_fusion_layer_scores_chosen_items_as_it_scores_every_item(backbone, kw):
    bb = _layer(backbone, **kw)
    shared = _shared(bb)
    _assert_matches_full_scores(_trained_sim(bb, shared), shared)


def test_chosen_items_are_scored_a_chunk_of_users_at_a_time():
    bb = make_backbone("fedncf", N_ITEMS, 8)
    shared = init_shared_state(bb, 0)
    sim = _trained_sim(bb, shared)
    users, cand = np.arange(N_USERS), _candidates(N_USERS, 9)
    whole = sim.score_items(users, cand, shared)
    sim.chunk_floats = 1  # one user a chunk: each row still its own user's and items' (matrix products of
    # other shapes may round the last bit differently)
    assert torch.allclose(sim.score_items(users, cand, shared), whole, rtol=1e-6, atol=1e-7)


def test_a_runs_sampled_protocol_scores_its_candidates_only_with_the_same_figures():
    data = synthetic_data(80, 150, 10, seed=2)
    run = FederatedRun(data, "fedncf", FedConfig(rounds=2, seed=1, dim=8), progress=False)
    run.run()
    full_calls = []
    scores = run.sim.scores
    run.sim.scores = lambda *a, **k: full_calls.append(1) or scores(*a, **k)
    fast = run.evaluate("test", "sampled")
    assert full_calls == []  # every candidate came from score_items
    plain = evaluate(
        data,
        lambda users: scores(np.asarray(users), run.shared),
        split="test",
        protocol="sampled",
        ks=tuple(run.cfg.ks),
        metrics=tuple(run.cfg.metrics),
        seed=int(run.cfg.seed),
    )
    assert fast.summary() == plain.summary()


@pytest.mark.parametrize(
    "make,wanted",
    [
        (lambda: make_backbone("fedavg", N_ITEMS, 8), False),
        (lambda: make_backbone("fcf", N_ITEMS, 8), False),
        (lambda: _layer("fedavg"), False),  # the closed form: one product
        (lambda: make_backbone("fedncf", N_ITEMS, 8), True),
        (lambda: make_backbone("fedrap", N_ITEMS, 8), True),
        (lambda: _layer("fedncf"), True),
        (lambda: _layer("fedavg", balance=0.1), True),
    ],
)  # a penalty: autograd
def test_candidates_are_scored_alone_where_every_item_is_not_one_matrix_product(make, wanted):
    indptr, indices = tiny_csr(N_USERS, N_ITEMS)
    sim = BatchedSimulator(make(), indptr, indices, MemoryStore(), seed=0)
    assert sim.prefers_candidates is wanted
