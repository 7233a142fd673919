"""MoR's item view: recent-item contexts, the clients' private co-occurrence rewards, the item policy and GRPO."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from fedvlr_plus.alignment.mor.baselines import UniformRouter
from fedvlr_plus.alignment.mor.config import MoRConfig
from fedvlr_plus.alignment.mor.items import (
    ItemRewardClient,
    fedavg_item_reward,
    item_counts,
    next_item_pairs,
    pair_queries,
    recent_items,
    training_sequences,
)
from fedvlr_plus.alignment.mor.policy import ItemContext, ItemResidualPolicy, ResidualPolicy, run_grpo
from fedvlr_plus.alignment.mor.rewards import query_clients
from fedvlr_plus.alignment.mor.router import Standardiser
from fedvlr_plus.alignment.pairs import holdout_split

N_ITEMS = 40


def _paired_split(n_users=60, pairs_per_user=3, seed=0):
    """Items come in couples (2k, 2k + 1): a user who takes 2k takes 2k + 1 next. Each user: ``pairs_per_user``
    couples in training (time order), then one valid and one test item."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        ks = rng.choice(N_ITEMS // 2, pairs_per_user + 1, replace=False)
        seq = [i for k in ks[:-1] for i in (2 * k, 2 * k + 1)] + [2 * ks[-1], 2 * ks[-1] + 1]
        for t, i in enumerate(seq):
            rows.append((u, int(i), t, 0 if t < len(seq) - 2 else (1 if t == len(seq) - 2 else 2)))
    inter = pd.DataFrame(rows, columns=["user", "item", "timestamp", "split"])
    return SimpleNamespace(
        inter=inter,
        n_users=n_users,
        n_items=N_ITEMS,
        name="couples",
        part=lambda p: inter[inter["split"] == {"valid": 1, "test": 2}[p]],
    )


def _feats(d=3, seed=1):
    return np.random.default_rng(seed).normal(size=(N_ITEMS, d)).astype(np.float32)


def test_recent_items_are_the_latest_training_items_newest_first():
    split = _paired_split(n_users=3)
    recent = recent_items(split, length=10, half_life=2.0)
    tr = split.inter[split.inter["split"] == 0]
    for u in range(3):
        seq = tr[tr["user"] == u].sort_values("timestamp")["item"].to_numpy()
        assert np.array_equal(recent.hist[u, : len(seq)], seq[::-1]) and (recent.hist[u, len(seq) :] == -1).all()
        assert np.allclose(recent.weight[u, : len(seq)], 0.5 ** (np.arange(len(seq)) / 2.0))
        assert (recent.weight[u, len(seq) :] == 0).all()
    # the valid / test rows are never read
    moved = split.inter.copy()
    moved.loc[moved["split"] > 0, "item"] = 0
    again = recent_items(SimpleNamespace(**{**vars(split), "inter": moved}), length=10, half_life=2.0)
    assert np.array_equal(again.hist, recent.hist)
    h, w = recent.of(np.array([0]), exclude=np.array([recent.hist[0, 1]]))
    assert w[0, 1] == 0 and w[0, 0] == recent.weight[0, 0]


def test_item_counts_hand_computed():
    seqs = {0: np.array([1, 2, 3]), 1: np.array([2, 1]), 2: np.array([0])}
    cooc, n = item_counts(seqs, [0, 1], 4, "cooc")
    cooc = cooc.toarray()
    assert np.array_equal(n, [0, 2, 2, 1])
    assert cooc[1, 2] == cooc[2, 1] == 2 and cooc[1, 3] == 1 and cooc[0].sum() == 0 and np.trace(cooc) == 0
    nxt, _ = item_counts(seqs, [0, 1], 4, "next")
    nxt = nxt.toarray()
    # user 0: 1->2, 2->3, 1->3 (window 5); user 1: 2->1
    assert nxt[1, 2] == 1 and nxt[2, 3] == 1 and nxt[1, 3] == 1 and nxt[2, 1] == 1 and nxt[3, 1] == 0
    with pytest.raises(ValueError, match="unknown item reward"):
        item_counts(seqs, [0], 4, "bilinear")


def test_next_item_pairs_take_the_latest_training_items_over_unseen_items():
    split = _paired_split(n_users=12)
    groups = np.arange(12) % 2
    pairs = next_item_pairs(split, _feats(), groups, ("a", "b"), latest=3, seed=0)
    seqs = training_sequences(split)
    for u in range(12):
        rows = pairs.user == u
        assert np.array_equal(pairs.chosen_item[rows], seqs[u][::-1][:3])
        assert not np.isin(pairs.rejected_item[rows], seqs[u]).any()
    assert np.array_equal(pairs.client, groups[pairs.user])


def _clients(split, kinds=("cooc", "next"), n_groups=2, seed=0):
    groups = np.arange(split.n_users) % n_groups
    pairs = next_item_pairs(split, _feats(), groups, tuple(f"g{g}" for g in range(n_groups)), latest=4, seed=seed)
    train, test = holdout_split(pairs, 0.25, seed=seed, by="user")
    recent = recent_items(split, length=8, half_life=3.0)
    seqs = training_sequences(split)
    clients = [
        ItemRewardClient(
            k,
            kinds[k % len(kinds)],
            train.of_client(k),
            test.of_client(k),
            sequences=seqs,
            n_items=N_ITEMS,
            recent=recent,
            seed=seed,
        )
        for k in range(n_groups)
    ]
    return clients, train, test, recent, seqs


def test_item_clients_learn_their_users_couples_and_upload_scores_only():
    split = _paired_split()
    clients, train, test, recent, _ = _clients(split)
    for c in clients:
        # counts come from the client's own training users only: held-out users are not in them
        held = np.setdiff1d(np.unique(c.test.user), np.unique(c.train.user))
        # "next" only sees the couple from 2k to 2k + 1, not back, so it is right on about half the older
        # positives; chance is 0.5 for both
        assert len(held) and c.accuracy(c.test) > {"cooc": 0.9, "next": 0.65}[c.kind]
        assert c.theta[0] > 0  # more co-occurrence with the history -> higher reward
    update = clients[0].fit(
        pair_queries(recent)(test) | {"query.context": test.context, "query.items": np.zeros((len(test), 2, 3))},
        {"round": 0},
    )
    assert set(update.arrays) == {"scores"} and tuple(update.arrays["scores"].shape) == (len(test), 2)
    with pytest.raises(ValueError, match="query.history"):
        clients[0].fit({"query.item_ids": np.zeros((1, 1), np.int64)}, {})


def test_fedavg_item_reward_pools_the_clients_counts():
    split = _paired_split()
    clients, train, _, recent, seqs = _clients(split)
    pooled = fedavg_item_reward(train, sequences=seqs, n_items=N_ITEMS, recent=recent, seed=0)
    counts = sum(item_counts(seqs, np.unique(c.train.user), N_ITEMS, "cooc")[0].toarray() for c in clients)
    n = sum(item_counts(seqs, np.unique(c.train.user), N_ITEMS, "cooc")[1] for c in clients)
    assert np.allclose(pooled.sim.toarray(), counts / np.sqrt(np.maximum(n[:, None] * n[None, :], 1)))
    assert np.allclose(pooled.logpop, np.log1p(n)) and pooled.train is train


def test_item_policy_starts_at_the_reference_and_adds_the_weighted_item_term():
    torch.manual_seed(0)
    ref, x, f = torch.randn(2, 3), torch.randn(2, 4), torch.randn(2, 3, 5)
    hist, w, cand = (
        np.array([[1, 2], [0, -1]]),
        np.array([[1.0, 0.5], [1.0, 0.0]], np.float32),
        np.array([[3, 4, 5], [3, 4, 5]]),
    )
    pol = ItemResidualPolicy(4, 5, 6)
    assert torch.allclose(pol(ref, x, f, ids=(hist, w, cand)), ResidualPolicy(4, 5)(ref, x, f))
    with torch.no_grad():
        pol.A[1, 4] = 2.0
        pol.A[2, 4] = 4.0
        pol.A[0, 5] = 3.0
    out = pol(ref, x, f, ids=(hist, w, cand)) - ref
    assert torch.allclose(out, torch.tensor([[0.0, 1 * 2.0 + 0.5 * 4.0, 0.0], [0.0, 0.0, 3.0]]))


def test_grpo_on_item_rewards_moves_the_couple_up():
    """Each user's candidates: every unseen item, the reference uniform over them. The users' last training item
    is 2k; the fused item reward prefers 2k + 1 (its couple), and after GRPO the policy puts it first far more often
    than the reference's chance rate."""
    split = _paired_split(n_users=80, seed=3)
    clients, train, _, recent, _ = _clients(split, kinds=("cooc",), seed=3)
    users = np.arange(split.n_users)
    seqs = training_sequences(split)
    # drop the latest training item so the history ends on 2k and 2k + 1 is unseen
    last = np.array([seqs[u][-1] for u in users])
    hist, weight = recent.hist[:, 1:], recent.weight[:, 1:] / 0.5 ** (1 / 3.0)
    cand = np.stack([np.setdiff1d(np.arange(N_ITEMS), seqs[u][:-1])[: N_ITEMS - 8] for u in users])
    keep = (cand == last[:, None]).any(1)
    users, cand, hist, weight, last = users[keep], cand[keep], hist[keep], weight[keep], last[keep]
    ctx = ItemContext(hist, weight, cand)
    feats, x = _feats(), np.zeros((len(users), 3), np.float32)
    std = Standardiser.fit(
        query_clients(
            clients,
            x,
            feats[cand],
            extra={"query.history": hist, "query.history_weight": weight, "query.item_ids": cand},
        )
    )
    cfg = MoRConfig(grpo_rounds=30, users_per_round=len(users), policy_lr=0.1, seed=0)
    policy, history = run_grpo(
        clients,
        UniformRouter(len(clients)),
        std,
        ref_logits=np.zeros(cand.shape, np.float32),
        cand=cand,
        x=x,
        o=np.zeros(len(users), np.int64),
        feats=feats,
        cfg=cfg,
        item_context=ctx,
    )
    with torch.no_grad():
        logits = policy(
            torch.zeros(cand.shape),
            torch.as_tensor(x),
            torch.as_tensor(feats[cand]),
            ids=ctx.rows(np.arange(len(users))),
        ).numpy()
    top = cand[np.arange(len(users)), logits.argmax(1)]
    assert (top == last).mean() > 0.5 > 1.0 / cand.shape[1] * 5
    assert history[-1]["reward"] > history[0]["reward"]


def _held_loss(router, margin, x, o, rows):
    with torch.no_grad():
        fused = (router(x[rows], o[rows]).T * margin[:, rows]).sum(0)
    return float(-torch.nn.functional.logsigmoid(fused).mean())


def test_router_holdout_keeps_the_epoch_best_on_the_held_out_public_pairs():
    from fedvlr_plus.alignment.mor.router import Router, _holdout_rows, train_router

    rng = np.random.default_rng(0)
    n, K = 120, 3
    x = torch.as_tensor(rng.normal(size=(n, 4)), dtype=torch.float32)
    o = torch.zeros(n, dtype=torch.long)
    zc, zr = (torch.as_tensor(rng.normal(size=(K, n)), dtype=torch.float32) for _ in range(2))  # pure noise
    margin = zc - zr
    fit, held = _holdout_rows(n, 0.3, 0)
    torch.manual_seed(1)
    early = Router(4, 1, K, hidden=16)
    train_router(early, zc, zr, x, o, epochs=300, lr=0.05, balance=0.0, seed=0, holdout=0.3)
    torch.manual_seed(1)
    last = Router(4, 1, K, hidden=16)  # the same run on the same rows, without stopping early
    train_router(last, zc[:, fit], zr[:, fit], x[fit], o[fit], epochs=300, lr=0.05, balance=0.0, seed=0)
    assert _held_loss(early, margin, x, o, held) < _held_loss(last, margin, x, o, held)
    # no holdout: every row is fitted
    assert _holdout_rows(n, 0.0, 0) == (slice(None), None)


def test_reference_per_seed_trains_one_backbone_per_seed(monkeypatch):
    import fedvlr_plus.alignment.mor.seeds as mor_seeds

    trained, seen = [], []
    base = SimpleNamespace(
        split=SimpleNamespace(),
        backbone={"name": "fedavg", "rounds": 2},
        names=("g0", "g1"),
        held_out=(1,),
        ref=SimpleNamespace(cand=np.zeros((1, 7))),
    )
    base._replace = lambda **kw: SimpleNamespace(**{**vars(base), **kw})
    monkeypatch.setattr(mor_seeds, "prepare_setting", lambda data, **kw: base)
    monkeypatch.setattr(
        mor_seeds, "train_backbone", lambda split, **kw: trained.append(kw["seed"]) or (np.full((1, 1), kw["seed"]), {})
    )
    monkeypatch.setattr(mor_seeds, "reference_candidates", lambda split, scores, c: ("ref", int(scores[0, 0])))
    import fedvlr_plus.alignment.mor.table as mor_table

    monkeypatch.setattr(mor_table, "summarise", lambda runs: {})
    monkeypatch.setattr(
        mor_seeds, "run_seed", lambda s, cfg, **kw: seen.append((cfg.seed, s.ref)) or {"seed": cfg.seed}
    )
    res = mor_seeds.run_mor_seeds(object(), seeds=3, first_seed=2, cfg=MoRConfig(), reference_per_seed=True)
    assert trained == [2, 3, 4] and seen == [(2, ("ref", 2)), (3, ("ref", 3)), (4, ("ref", 4))]
    assert [r["backbone"]["seed"] for r in res["per_seed"]] == [2, 3, 4] and res["config"]["reference_per_seed"]


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], {"architectures": ("bilinear", "mlp"), "grpo_rounds": 60, "users_per_round": 256, "router_holdout": 0.0}),
        (
            ["--reward-view", "items"],
            {"architectures": ("cooc", "next"), "grpo_rounds": 60, "users_per_round": 1024, "router_holdout": 0.2},
        ),
        (
            ["--reward-view", "items", "--grpo-rounds", "5", "--router-holdout", "0"],
            {"grpo_rounds": 5, "router_holdout": 0.0},
        ),
    ],
)
def test_cli_defaults_per_reward_view(flags, expected):
    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.cli.align.preference import _mor_config

    args = build_parser().parse_args(["align", "mor", "ml-100k", *flags])
    cfg = _mor_config(args, interactions=True)
    assert {k: getattr(cfg, k) for k in expected} == expected


def test_one_seed_of_the_item_view_runs_end_to_end():
    import fedvlr_plus.alignment.mor.seeds as mor_seeds
    from fedvlr_plus.alignment.mor.backbone import reference_candidates
    from fedvlr_plus.alignment.mor.implicit import user_profiles

    split = _paired_split(n_users=80, seed=5)
    split.train = lambda: split.inter[split.inter["split"] == 0]
    feats = _feats()
    groups = np.arange(split.n_users) % 4
    ref = reference_candidates(split, np.random.default_rng(0).normal(size=(80, N_ITEMS)), 12)
    s = mor_seeds.ImplicitSetting(
        split,
        feats,
        groups,
        ("g0", "g1", "g2", "g3"),
        user_profiles(split, feats),
        ref,
        {"name": "fake", "rounds": 0},
        (3,),
        recent_items(split, length=6),
        training_sequences(split),
    )
    out = mor_seeds.run_seed(
        s,
        MoRConfig(
            architectures=("cooc", "next"),
            grpo_rounds=2,
            users_per_round=16,
            router_epochs=5,
            router_holdout=0.2,
            seed=0,
        ),
        negatives="popular",
        view="items",
        fedavg_rounds=1,
    )
    assert set(out["policy"]) == {"mor", "uniform", "fedavg"}
    for name in out["policy"]:
        for pop in ("clients", "held_out_clients"):
            assert 0 <= out["policy"][name][pop]["test"]["grpo"]["hr@10"] <= 1
    assert [c["architecture"] for c in out["clients"]] == ["cooc", "next", "cooc"]
    assert out["pairs"]["held_out_clients"] > 0 and all(0 <= v <= 1 for v in out["reward_accuracy"].values())
    with pytest.raises(ValueError, match="view must be one of"):
        mor_seeds.run_seed(s, MoRConfig(), view="ids")


def _dense_counts(sequences, users, n_items, kind, window=5):
    """The dense form the sparse table replaces (the reference it must equal)."""
    counts = np.zeros((n_items, n_items), np.float32)
    for u in users:
        seq = sequences[u]
        if kind == "cooc":
            items = np.unique(seq)
            counts[np.ix_(items, items)] += 1
        else:
            for lag in range(1, window + 1):
                np.add.at(counts, (seq[:-lag], seq[lag:]), 1)
    np.fill_diagonal(counts, 0)
    return counts


@pytest.mark.parametrize("form", ["sparse", "dense"])
@pytest.mark.parametrize("kind", ["cooc", "next"])
def test_pair_counts_and_reward_features_equal_the_dense_table_bit_for_bit(kind, form):
    from fedvlr_plus.alignment.mor.items import reward_features

    rng = np.random.default_rng(3)
    n_items = 40
    seqs = {u: rng.integers(0, n_items, rng.integers(1, 15)) for u in range(30)}  # repeats and self-pairs too
    table, n = item_counts(seqs, range(30), n_items, kind, dense_max_items=0 if form == "sparse" else n_items)
    assert (table.dense is None) == (form == "sparse")
    dense = _dense_counts(seqs, range(30), n_items, kind)
    assert np.array_equal(table.toarray(), dense)
    if form == "sparse":
        assert len(table.keys) == np.count_nonzero(dense)
    sim_dense = dense / np.sqrt(np.maximum(n[:, None] * n[None, :], 1.0))
    sim = table.cosine(n)
    assert np.array_equal(sim.toarray(), sim_dense)
    hist = rng.integers(-1, n_items, (7, 5))
    weight = rng.random((7, 5))
    ids = rng.integers(0, n_items, (7, 3))
    h = np.maximum(hist, 0)
    knn = (sim_dense[h[:, :, None], ids[:, None, :]] * weight[:, :, None]).sum(1)
    want = np.stack([np.log1p(knn), np.log1p(n)[ids]], -1)
    assert np.array_equal(reward_features(sim, np.log1p(n), hist, weight, ids), want)


def test_pair_counts_grow_with_the_pairs_seen_not_with_the_catalogue():
    seqs = {0: np.array([5, 70_000]), 1: np.array([70_000, 123_456, 5])}
    table, n = item_counts(seqs, [0, 1], 200_000, "cooc")
    assert table.dense is None and len(table.keys) == 6 and table.values.nbytes == 24  # 6 ordered pairs of 3 items
    assert table.lookup([5, 5, 7], [70_000, 123_456, 8]).tolist() == [2.0, 1.0, 0.0]
    assert n[[5, 70_000, 123_456]].tolist() == [2.0, 2.0, 1.0]


def test_reference_candidates_in_blocks_of_users_equal_one_sort_of_every_row(monkeypatch):
    import fedvlr_plus.alignment.mor.backbone as mb

    split = _paired_split(n_users=50, seed=2)
    split.train = lambda: split.inter[split.inter["split"] == 0]
    scores = np.round(np.random.default_rng(1).normal(size=(50, N_ITEMS)), 1).astype(np.float32)  # many ties
    tr = split.train()
    mask = np.zeros(scores.shape, bool)
    mask[tr["user"].to_numpy(), tr["item"].to_numpy()] = True
    want = np.argsort(-np.where(mask, -np.inf, scores), axis=1, kind="stable")[:, :7]
    monkeypatch.setattr(mb, "RANK_BLOCK", 8)  # 50 users: six full blocks and a partial one
    ref = mb.reference_candidates(split, scores, 7)
    assert np.array_equal(ref.cand, want) and ref.cand.dtype == want.dtype
    assert (
        np.array_equal(ref.logits, np.take_along_axis(scores, want, 1))
        and not mask[np.arange(50)[:, None], ref.cand].any()
    )
