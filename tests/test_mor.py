import numpy as np
import pytest
import torch

from fedvlr_plus.alignment.grpo import GRPOConfig
from fedvlr_plus.alignment.mor.method import (
    REWARD_KINDS,
    MoRConfig,
    RewardClient,
    Router,
    Standardiser,
    fuse,
    make_reward,
    query_clients,
    reward_report,
    run_grpo,
    train_bradley_terry,
)
from fedvlr_plus.alignment.pairs import PreferencePairs, holdout_split
from fedvlr_plus.federation.messages import ClientUpdate


def _conflict_pairs(n_per_group=200, d=4, seed=0):
    """Group 0 prefers items with a large feature 0, group 1 items with a large feature 1 (and the two features
    are anti-correlated, so the groups disagree). The context carries no group information."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in (0, 1):
        a = rng.normal(size=(n_per_group, d)).astype(np.float32)
        b = rng.normal(size=(n_per_group, d)).astype(np.float32)
        a[:, 1] = -a[:, 0] + 0.1 * a[:, 1]
        b[:, 1] = -b[:, 0] + 0.1 * b[:, 1]
        a_wins = a[:, g] > b[:, g]
        rows.append((np.where(a_wins[:, None], a, b), np.where(a_wins[:, None], b, a), np.full(n_per_group, g)))
    chosen = np.concatenate([r[0] for r in rows])
    rejected = np.concatenate([r[1] for r in rows])
    group = np.concatenate([r[2] for r in rows]).astype(np.int64)
    ctx = rng.normal(size=(len(group), d)).astype(np.float32) * 0.1
    return PreferencePairs(
        context=ctx, chosen=chosen, rejected=rejected, client=group.copy(), group=group, group_names=("g0", "g1")
    )


@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_bradley_terry_learns_each_architecture(kind):
    p = _conflict_pairs().of_client(0)
    m = make_reward(kind, 4, 4, seed=0)
    losses = train_bradley_terry(m, p, epochs=40, lr=2e-2)
    assert losses[-1] < losses[0]
    c = RewardClient(0, kind, p, p, epochs=150, lr=3e-2)
    assert c.accuracy(p) > 0.9


def test_client_uploads_scores_only_and_keeps_its_model_private():
    p = _conflict_pairs()
    c = RewardClient(3, "mlp", p.of_client(0), None, epochs=5)
    q = {"query.context": np.zeros((5, 4), np.float32), "query.items": np.random.rand(5, 3, 4).astype(np.float32)}
    u = c.fit(q, {"round": 1})
    msg = u.to_message()
    assert list(msg["arrays"]) == ["scores"] and msg["arrays"]["scores"].shape == (5, 3)
    assert msg["rows"] == {}
    n_params = sum(v.numel() for v in c.store.load(3).values())
    assert sum(a.size for a in msg["arrays"].values()) == 15 < n_params
    # the model lives in the client's store and is reused, not retrained: the same queries give the same scores
    state = {k: v.clone() for k, v in c.store.load(3).items()}
    u2 = c.fit(q, {"round": 2})
    assert torch.equal(u.arrays["scores"], u2.arrays["scores"])
    assert all(torch.equal(state[k], v) for k, v in c.store.load(3).items())
    with pytest.raises(ValueError, match="did not send"):
        c.fit({"query.context": q["query.context"]}, {})


def test_query_clients_rejects_parameter_uploads():
    class Leaky:
        cid = 0

        def fit(self, shared, config):
            return ClientUpdate(
                cid=0, kind="params", arrays={"scores": torch.zeros(2, 1), "W": torch.zeros(3)}, num_examples=1
            )

    with pytest.raises(ValueError, match="scores only"):
        query_clients([Leaky()], np.zeros((2, 4)), np.zeros((2, 1, 4)))


def test_standardiser_and_fuse_hand_computed():
    s = torch.tensor([[1.0, 3.0], [10.0, 30.0]])  # client 0 mean 2 std 1.414; client 1 mean 20 std 14.14
    st = Standardiser.fit(s)
    z = st(s)
    assert torch.allclose(z[0], z[1], atol=1e-6)  # scales removed
    assert torch.allclose(z[0], torch.tensor([-0.7071, 0.7071]), atol=1e-4)
    w = torch.tensor([[1.0, 0.0], [0.25, 0.75]])  # [Q=2, K=2]
    zq = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # [K, Q]
    assert torch.allclose(fuse(w, zq), torch.tensor([1.0, 0.25 * 2 + 0.75 * 4]))


def test_router_prefers_the_matching_client_and_fused_beats_uniform_and_single():
    p = _conflict_pairs(300)
    train, test = holdout_split(p, 0.3, seed=0)
    train, public = holdout_split(train, 0.3, seed=1)
    clients = [
        RewardClient(k, ("bilinear", "mlp")[k], train.of_client(k), test.of_client(k), epochs=30) for k in (0, 1)
    ]
    cfg = MoRConfig(router_epochs=300, router_balance=0.0)
    rep, router, std = reward_report(clients, public, test, cfg)
    w = np.array(rep["router_weights"]["mean_weight"])
    assert w[0, 0] > 0.5 and w[1, 1] > 0.5  # honesty check 2: w_k > 1/K for the matching objective
    ra = rep["reward_accuracy"]
    assert ra["fused"] >= ra["best_single"] and ra["fused"] > ra["uniform"] + 0.1
    for c in rep["clients"]:
        assert c["own"] > 0.8 and c["others"] < 0.5  # honesty check 1: each client is worse on the other's pairs


def test_router_routes_an_objective_it_never_saw_by_the_mean_over_the_seen_ones():
    from fedvlr_plus.alignment.mor.router import train_router

    torch.manual_seed(0)
    router = Router(3, n_objectives=3, n_clients=2)
    x = torch.randn(40, 3)
    o = torch.arange(40) % 2  # objectives 0 and 1 only; 2 is a held-out group
    z = torch.randn(2, 40)
    untrained = router(x[:5], torch.full((5,), 2))
    train_router(router, z, -z, x, o, epochs=20, balance=0.0)
    assert router.seen.tolist() == [True, True, False]
    w2 = router(x[:5], torch.full((5,), 2))
    mean_seen = (router(x[:5], torch.zeros(5, dtype=torch.long)) + router(x[:5], torch.ones(5, dtype=torch.long))) / 2
    assert torch.allclose(w2, mean_seen, atol=1e-6) and not torch.allclose(w2, untrained, atol=1e-3)
    # a seen objective still reads its own input weights: the same as the raw network
    raw = torch.softmax(
        router.net(torch.cat([x[:5], torch.nn.functional.one_hot(torch.zeros(5, dtype=torch.long), 3).float()], -1)), -1
    )
    assert torch.allclose(router(x[:5], torch.zeros(5, dtype=torch.long)), raw)
    mixed = router(x[:2], torch.tensor([0, 2]))
    assert torch.allclose(mixed[0], raw[0]) and torch.allclose(mixed[1], w2[1])


class _ConstClient:
    """A client whose reward is the same for every item (scores only)."""

    def __init__(self, cid):
        self.cid = cid

    def fit(self, shared, config):
        q = np.asarray(shared["query.items"])
        return ClientUpdate(cid=self.cid, kind="params", arrays={"scores": torch.ones(q.shape[:-1])}, num_examples=1)


class _FeatureClient(_ConstClient):
    def fit(self, shared, config):
        q = torch.as_tensor(np.asarray(shared["query.items"]))
        return ClientUpdate(cid=self.cid, kind="params", arrays={"scores": q[..., 0].float()}, num_examples=1)


def _policy_setup(n_users=16, C=6, d=3):
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(20, d)).astype(np.float32)
    cand = np.stack([rng.choice(20, C, replace=False) for _ in range(n_users)])
    ref = rng.normal(size=(n_users, C)).astype(np.float32)
    x = rng.normal(size=(n_users, d)).astype(np.float32)
    return feats, cand, ref, x


def _router_std(K=1):
    router = Router(3, 1, K)
    std = Standardiser(torch.zeros(K), torch.ones(K))
    return router, std


def test_grpo_equal_rewards_leave_the_policy_at_the_reference():
    feats, cand, ref, x = _policy_setup()
    router, std = _router_std()
    cfg = MoRConfig(grpo_rounds=5, users_per_round=16, grpo=GRPOConfig(group_size=4, beta=0.0))
    policy, hist = run_grpo(
        [_ConstClient(0)],
        router,
        std,
        ref_logits=ref,
        cand=cand,
        x=x,
        o=np.zeros(len(x), np.int64),
        feats=feats,
        cfg=cfg,
    )
    assert all(h["kl"] == pytest.approx(0.0, abs=1e-10) for h in hist)
    assert torch.all(policy.W == 0) and torch.all(policy.b == 0)


def test_grpo_raises_reward_and_a_huge_beta_keeps_the_reference():
    feats, cand, ref, x = _policy_setup()
    router, std = _router_std()
    kw = dict(ref_logits=ref, cand=cand, x=x, o=np.zeros(len(x), np.int64), feats=feats)
    free = MoRConfig(
        grpo_rounds=40, users_per_round=16, policy_lr=0.05, grpo=GRPOConfig(group_size=8, beta=0.0, kl="exact")
    )
    _, h_free = run_grpo([_FeatureClient(0)], router, std, cfg=free, **kw)
    tied = MoRConfig(
        grpo_rounds=40, users_per_round=16, policy_lr=0.05, grpo=GRPOConfig(group_size=8, beta=100.0, kl="exact")
    )
    _, h_tied = run_grpo([_FeatureClient(0)], router, std, cfg=tied, **kw)
    first = np.mean([h["reward"] for h in h_free[:5]])
    last = np.mean([h["reward"] for h in h_free[-5:]])
    assert last > first + 0.3  # the reward (feature 0) goes up
    assert h_free[-1]["kl"] > 0.1
    assert h_tied[-1]["kl"] < 0.02 * h_free[-1]["kl"]  # a huge KL weight pins pi to pi_ref


def test_policy_rankings_hand_computed():
    import fedvlr_plus.alignment.mor.method as mor

    class Flip(torch.nn.Module):  # the "policy" reverses the reference order over the candidates
        def forward(self, ref, x, f):
            return -ref

    ref_scores = np.array([[5.0, 4.0, 3.0, 2.0, 1.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    mask = np.zeros((2, 5), bool)
    mask[1, 0] = True  # user 1 trained on item 0
    cand = np.array([[0, 1, 2], [1, 2, 3]])
    targets = np.array([2, 4])
    out = mor.policy_rankings(
        Flip(),
        ref_scores=ref_scores,
        train_mask=mask,
        cand=cand,
        x=np.zeros((2, 1)),
        feats=np.zeros((5, 1)),
        targets=targets,
        cfg=MoRConfig(),
        k=1,
    )
    # reference: user 0 target rank 2, user 1 (item 0 masked) target rank 3 -> no hit at 1
    assert out["reference"]["hr@1"] == 0.0
    # flipped: user 0's target (candidate ref-rank 2 of 3) becomes rank 0; user 1's target is not a candidate
    assert out["grpo"]["hr@1"] == 0.5 and out["grpo"]["ndcg@1"] == 0.5
    assert out["target_in_candidates"] == 0.5


def test_policy_rankings_in_blocks_of_users_equal_one_pass_over_every_user(monkeypatch):
    """Ranks and policy logits are computed a block of users at a time (the candidates' features of every user at
    once were 8 GB on Amazon 2014 Toys); the figures must not depend on the block size."""
    import fedvlr_plus.alignment.mor.policy as mp

    rng = np.random.default_rng(4)
    n_users, n_items, c_n = 37, 30, 6
    ref_scores = np.round(rng.normal(size=(n_users, n_items)), 1).astype(np.float32)  # ties included
    mask = rng.random((n_users, n_items)) < 0.2
    cand = np.stack([rng.choice(n_items, c_n, replace=False) for _ in range(n_users)])
    targets = np.where(rng.random(n_users) < 0.8, rng.integers(0, n_items, n_users), -1)
    policy = mp.ResidualPolicy(3, 4)
    with torch.no_grad():
        policy.W.normal_(generator=torch.Generator().manual_seed(0))
    args = dict(
        ref_scores=ref_scores,
        train_mask=mask,
        cand=cand,
        x=rng.normal(size=(n_users, 3)),
        feats=rng.normal(size=(n_items, 4)),
        targets=targets,
        cfg=MoRConfig(),
        k=5,
    )
    whole = mp.policy_rankings(policy, **args)
    monkeypatch.setattr(mp, "RANK_BLOCK", 8)  # 30 users with targets: three full blocks and a partial one
    assert mp.policy_rankings(policy, **args) == whole
    users = np.flatnonzero(targets >= 0)
    s = np.where(mask[users], -np.inf, ref_scores[users]).astype(np.float64)
    want = (s > s[np.arange(len(users)), targets[users]][:, None]).sum(1)
    assert np.array_equal(mp.reference_ranks(ref_scores, mask, users, targets[users]), want)


def test_align_mor_command_on_hh_folder(tmp_path, capsys):
    import json

    from test_alignment_pairs import make_hh_cached

    from fedvlr_plus.cli import main

    root, cache = make_hh_cached(tmp_path)
    assert (
        main(
            [
                "align",
                "mor",
                str(root),
                "--cache-dir",
                str(cache),
                "--reward-epochs",
                "3",
                "--json",
                "--out",
                str(tmp_path / "mor.json"),
            ]
        )
        == 0
    )
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(rep["reward_accuracy"]) >= {"uniform", "best_single", "fused"}
    assert {c["architecture"] for c in rep["clients"]} == {"bilinear", "mlp"}
    assert all({"own", "others"} <= set(c) for c in rep["clients"])
    assert rep["uplink"]["arrays"] == ["scores"] and rep["grpo"] == [] and rep["policy"] is None
    assert json.loads((tmp_path / "mor.json").read_text())["reward_accuracy"] == rep["reward_accuracy"]
