"""Backbones: declared shared/private parts, and the same numbers in the three shape settings."""

import math

import pytest
import torch

from fedvlr_plus.adapters import BACKBONES, make_backbone, take_rows
from fedvlr_plus.adapters.base import Backbone
from fedvlr_plus.adapters.fedrap import FedRAP
from fedvlr_plus.federation.state.initial import init_private_states, init_shared_state

N, D = 12, 8


def test_declared_parts():
    parts = {
        name: (set(make_backbone(name, N, D).shared_names), set(make_backbone(name, N, D).private_names))
        for name in BACKBONES
    }
    assert parts["fedavg"] == ({"item_emb"}, {"head_w", "head_b"})
    assert parts["fcf"] == ({"item_emb"}, {"user_emb"})
    assert parts["pfedrec"] == ({"item_emb"}, {"head_w", "head_b", "item_emb_personal"})
    assert parts["fedrap"] == ({"item_common"}, {"item_personal", "head_w", "head_b"})
    shared, private = parts["fedncf"]
    assert private == {"user_gmf", "user_mlp"}
    assert {"item_gmf", "item_mlp", "mlp1_user", "mlp1_item", "mlp2_w", "mlp3_w", "out_gmf", "out_mlp"} <= shared
    with pytest.raises(ValueError, match="unknown backbone"):
        make_backbone("nope", N, D)


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_unbatched_batched_and_scoring_agree(name):
    """Client c's logits are the same computed alone, in a batch of clients, and when scoring all items."""
    bb = make_backbone(name, N, D)
    shared = init_shared_state(bb, seed=1)
    cids = [3, 7, 11]
    states = init_private_states(bb, cids, seed=1)
    g = torch.Generator().manual_seed(0)
    for st in states:  # make private tables non-trivial
        for s in bb.private_specs():
            st[s.name] = st[s.name] + 0.1 * torch.randn(st[s.name].shape, generator=g)
    items = torch.tensor([[0, 5, 5, 11], [2, 3, 4, 1], [9, 9, 0, 7]])
    # alone (full tables, global ids)
    alone = torch.stack([bb.logits({**shared, **st}, items[c]) for c, st in enumerate(states)])
    # batched training form: per-client gathered rows [C, L, d] and items=None
    p = {}
    for s in bb.all_specs():
        src = [shared[s.name]] * 3 if s.shared else [st[s.name] for st in states]
        p[s.name] = torch.stack([take_rows(t, items[c]) if s.item_table else t for c, t in enumerate(src)])
    batched = bb.logits(p, None)
    assert torch.allclose(alone, batched, atol=1e-6)
    # scoring form: shared unbatched, private stacked, all items
    priv = {s.name: torch.stack([st[s.name] for st in states]) for s in bb.private_specs()}
    scores = bb.logits({**shared, **priv}, None)
    assert scores.shape == (3, N)
    assert torch.allclose(scores.gather(1, items), alone, atol=1e-6)


def test_ncf_split_first_layer_is_the_concatenated_layer():
    bb = make_backbone("fedncf", N, D)
    p = {**init_shared_state(bb, 0), **init_private_states(bb, [0], 0)[0]}
    items = torch.arange(N)
    w = torch.cat([p["mlp1_user"], p["mlp1_item"]], dim=1)  # Linear(2d -> d) on [p_u ; q_i]
    x = torch.cat([p["user_mlp"].expand(N, D), p["item_mlp"]], dim=1)
    h = torch.relu(x @ w.T + p["mlp1_b"])
    h = torch.relu(h @ p["mlp2_w"].T + p["mlp2_b"])
    h = torch.relu(h @ p["mlp3_w"].T + p["mlp3_b"])
    z = torch.cat([p["user_gmf"] * p["item_gmf"], h], dim=1)  # NeuMF's [GMF ; MLP]
    out_w = torch.cat([p["out_gmf"], p["out_mlp"]])
    assert torch.allclose(bb.logits(p, items), z @ out_w + p["out_b"], atol=1e-6)
    assert torch.equal(p["out_gmf"], torch.ones(D))  # starts as the dot product of the GMF embeddings


def test_ncf_scores_every_item_block_by_block_bit_for_bit_as_its_head():
    """Scoring every item (no gradient) goes through cache-sized blocks of users x items; the figures must be
    the head's own, to the bit, for batches and catalogues that are not whole blocks, and for one user."""
    n_items, dim, users = 600, 16, 70
    bb = make_backbone("fedncf", n_items, dim)
    assert n_items % bb.SCORE_ITEMS and users % bb.SCORE_USERS
    shared = init_shared_state(bb, seed=2)
    g = torch.Generator().manual_seed(3)
    priv = {s.name: torch.randn(users, *s.shape, generator=g) for s in bb.private_specs()}
    p = {**shared, **priv}
    with torch.no_grad():
        blocked = bb.logits(p, None)
        whole = bb.head(p, bb.item_repr(p, None, {}), {})
        p_one = {**shared, **{k: v[5] for k, v in priv.items()}}
        one, one_whole = bb.logits(p_one, None), bb.head(p_one, bb.item_repr(p_one, None, {}), {})
    assert blocked.shape == (users, n_items) and torch.equal(blocked, whole)
    assert one.shape == (n_items,) and torch.equal(one, one_whole)
    # block by block, it holds fewer floats per item than the generic forward's [users, items, 2d] vectors
    assert bb.scoring_floats_per_item(2 * dim) < Backbone.scoring_floats_per_item(bb, 2 * dim)


@pytest.mark.parametrize("name", ["fedavg", "fcf", "pfedrec"])
def test_dot_heads_score_every_item_with_one_product(name):
    bb = make_backbone(name, 50, 8)
    # a shared table scores as one product (2 floats per item); PFedRec's per-user copies of the table do not
    assert (bb.scoring_floats_per_item(8) == 2) == (name != "pfedrec")


def test_fedrap_curriculum_does_not_compound():
    bb = FedRAP(N, D, fedrap_lambda=1e-2, fedrap_mu=1e-1)
    for t in (1, 2, 5, 30):
        lam, mu = bb.curriculum(t)
        assert math.isclose(lam, math.tanh(t / 10) * 1e-2) and math.isclose(mu, math.tanh(t / 10) * 1e-1)
    assert bb.curriculum(1)[0] > 0  # the curriculum is never zero, not even in the first round
    # the penalty is what the docstring says, on the batch items
    p = {**init_shared_state(bb, 0), **init_private_states(bb, [0], 0)[0]}
    p["item_personal"] = p["item_personal"] + 1.0
    items = torch.tensor([1, 2])
    reg = bb.regulariser(p, items, torch.ones(2), {"round": 10})
    lam, mu = bb.curriculum(10)
    a, c = p["item_personal"][items], p["item_common"][items]
    expect = -lam * ((a - c) ** 2).mean(-1).mean() + mu * c.abs().mean(-1).mean()
    assert torch.allclose(reg, expect)


def test_private_initialisation_is_per_client_and_reproducible():
    bb = make_backbone("fedavg", N, D)
    a = init_private_states(bb, [0, 1, 2], seed=0)
    b = init_private_states(bb, [2], seed=0)[0]
    assert torch.equal(a[2]["head_w"], b["head_w"])  # same client, alone or in a group
    assert not torch.equal(a[0]["head_w"], a[1]["head_w"])  # different clients differ
    assert abs(float(torch.stack([s["head_w"] for s in a]).std()) - 0.1) < 0.05


def test_cli_lists_every_backbone():
    from fedvlr_plus.federation import FEDERATED_BACKBONES, STRATEGIES
    from fedvlr_plus.federation.strategies.base import make_strategy

    assert FEDERATED_BACKBONES == tuple(sorted(BACKBONES))
    for name in STRATEGIES:
        assert make_strategy(name, server_lr=0.1).name == name
