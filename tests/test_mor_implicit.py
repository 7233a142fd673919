"""MoR on implicit feedback: train-only pairs, the FedAvg-reward baseline, held-out clients and the seeds loop."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import fedvlr_plus.alignment.mor.seeds as mor_seeds
from fedvlr_plus.alignment.mor.baselines import UniformRouter, fedavg_reward
from fedvlr_plus.alignment.mor.implicit import interaction_pairs, user_profiles, with_popularity
from fedvlr_plus.alignment.mor.method import MoRConfig, make_clients
from fedvlr_plus.alignment.mor.table import paired_test, summarise


def _split(n_users=24, n_items=30, per_user=8, seed=0):
    """Each user: ``per_user`` training items, then one valid and one test item (split 1 / 2), all distinct."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        items = rng.choice(n_items, per_user + 2, replace=False)
        for j, i in enumerate(items):
            rows.append((u, int(i), 0 if j < per_user else (1 if j == per_user else 2)))
    inter = pd.DataFrame(rows, columns=["user", "item", "split"])
    return SimpleNamespace(
        inter=inter,
        n_users=n_users,
        n_items=n_items,
        name="tiny",
        part=lambda p: inter[inter["split"] == {"valid": 1, "test": 2}[p]],
    )


def _feats(n_items=30, d=4, seed=1):
    return np.random.default_rng(seed).normal(size=(n_items, d)).astype(np.float32)


@pytest.mark.parametrize("negatives", ["uniform", "popular"])
def test_interaction_pairs_hold_training_items_only_and_ignore_valid_test(negatives):
    split = _split()
    feats = _feats()
    groups = np.arange(split.n_users) % 3
    pairs = interaction_pairs(split, feats, groups, ("a", "b", "c"), negatives=negatives, seed=0)
    tr = split.inter[split.inter["split"] == 0]
    train_set = set(zip(tr["user"], tr["item"]))
    held = split.inter[split.inter["split"] > 0]
    held_set = set(zip(held["user"], held["item"]))
    chosen = set(zip(pairs.user.tolist(), pairs.chosen_item.tolist()))
    assert chosen <= train_set and not chosen & held_set
    # a negative is never one of the user's training items
    assert not set(zip(pairs.user.tolist(), pairs.rejected_item.tolist())) & train_set
    # the pairs do not depend on the valid / test rows at all: moving them to other items changes nothing
    moved = split.inter.copy()
    moved.loc[moved["split"] > 0, "item"] = (moved.loc[moved["split"] > 0, "item"] + 1) % split.n_items
    again = interaction_pairs(
        SimpleNamespace(**{**vars(split), "inter": moved}), feats, groups, ("a", "b", "c"), negatives=negatives, seed=0
    )
    assert np.array_equal(again.chosen_item, pairs.chosen_item)
    assert np.array_equal(again.rejected_item, pairs.rejected_item)
    assert np.allclose(again.context, pairs.context)
    assert np.array_equal(pairs.client, groups[pairs.user])


def test_popularity_and_profiles_read_training_rows_only():
    split = _split()
    feats = _feats()
    moved = split.inter.copy()
    moved.loc[moved["split"] > 0, "item"] = 0  # every valid / test interaction on item 0
    other = SimpleNamespace(**{**vars(split), "inter": moved})
    assert np.allclose(with_popularity(split, feats), with_popularity(other, feats))
    assert np.allclose(user_profiles(split, feats), user_profiles(other, feats))
    tr = split.inter[split.inter["split"] == 0]
    u0 = tr[tr["user"] == 0]["item"].to_numpy()
    assert np.allclose(user_profiles(split, feats)[0], feats[u0].mean(0), atol=1e-6)


def test_fedavg_reward_is_the_example_weighted_mean_of_the_client_parameters():
    split = _split()
    pairs = interaction_pairs(split, _feats(), np.arange(split.n_users) % 3, ("a", "b", "c"), seed=0)
    seen = []
    model, hist = fedavg_reward(
        pairs,
        kind="bilinear",
        rounds=3,
        local_epochs=1,
        seed=0,
        on_round=lambda r, state, updates: seen.append((state, updates)),
    )
    assert [h["round"] for h in hist] == [1, 2, 3] and len(seen) == 3
    n = np.array([u.num_examples for u in seen[-1][1]], float)
    assert sorted(u.cid for u in seen[-1][1]) == [0, 1, 2] and n.sum() == len(pairs)
    w = n / n.sum()
    for name, value in model.state_dict().items():
        mean = sum(wk * u.arrays[name].double() for wk, u in zip(w, seen[-1][1]))
        assert torch.allclose(value.double(), mean, atol=1e-6)
        # a round's broadcast is the previous round's average, not any one client's parameters
        prev = sum(wk * u.arrays[name].double() for wk, u in zip(w, seen[-2][1]))
        assert torch.allclose(seen[-1][0][name].double(), prev, atol=1e-6)
    state = model.state_dict()
    for u in seen[-1][1]:  # no client's own parameters are the model
        assert not all(torch.allclose(state[k].double(), u.arrays[k].double()) for k in state)


def test_uniform_router_weighs_every_client_equally():
    w = UniformRouter(4)(np.zeros((3, 2)), np.zeros(3, np.int64))
    assert w.shape == (3, 4) and torch.allclose(w, torch.full((3, 4), 0.25))


def test_a_held_out_client_never_trains_a_reward():
    split = _split(n_users=40)
    feats = _feats()
    groups = np.arange(split.n_users) % 4
    setting = SimpleNamespace(split=split, feats=feats, groups=groups, names=("g0", "g1", "g2", "g3"), held_out=(3,))
    cfg = MoRConfig(reward_epochs=1, public_fraction=0.2)
    train, public, test, outside = mor_seeds.seed_pairs(setting, cfg, 0.25)
    for part in (train, public, test):
        assert len(part) and not (part.group == 3).any()
    assert len(outside) and (outside.group == 3).all()
    assert set(outside.user.tolist()) == set(np.flatnonzero(groups == 3).tolist())
    clients = make_clients(train, test, cfg)
    assert sorted(c.cid for c in clients) == [0, 1, 2]
    spy = []
    fedavg_reward(train, rounds=1, local_epochs=1, on_round=lambda r, s, ups: spy.extend(u.cid for u in ups))
    assert sorted(spy) == [0, 1, 2]


def _fake_run(seed, mor_hr):
    pol = lambda hr: {
        pop: {part: {"grpo": {"hr@10": hr, "ndcg@10": hr / 2}} for part in ("valid", "test")}
        for pop in ("clients", "held_out_clients")
    }
    ref = {
        pop: {part: {"hr@10": 0.1, "ndcg@10": 0.05} for part in ("valid", "test")}
        for pop in ("clients", "held_out_clients")
    }
    return {
        "seed": seed,
        "reference": ref,
        "policy": {"mor": pol(mor_hr), "uniform": pol(0.1 + 0.001 * seed), "fedavg": pol(0.09)},
        "reward_accuracy": {"mor": 0.7, "uniform": 0.6, "fedavg": 0.65},
        "reward_accuracy_held_out_clients": {"mor": 0.7, "uniform": 0.6, "fedavg": 0.65},
    }


def test_seeds_loop_runs_every_seed_on_one_setting_and_tests_pairs(monkeypatch):
    prepared, seen = [], []
    monkeypatch.setattr(
        mor_seeds,
        "prepare_setting",
        lambda data, **kw: (
            prepared.append(kw)
            or SimpleNamespace(
                names=("g0", "g1"), held_out=(1,), backbone={}, ref=SimpleNamespace(cand=np.zeros((1, 7)))
            )
        ),
    )
    hr = {3: 0.12, 4: 0.15, 5: 0.11}
    monkeypatch.setattr(
        mor_seeds, "run_seed", lambda s, cfg, **kw: seen.append((cfg.seed, kw)) or _fake_run(cfg.seed, hr[cfg.seed])
    )
    res = mor_seeds.run_mor_seeds(object(), seeds=3, first_seed=3, cfg=MoRConfig(), seed_kw={"negatives": "uniform"})
    assert len(prepared) == 1 and [s for s, _ in seen] == [3, 4, 5] and res["seeds"] == [3, 4, 5]
    assert all(kw == {"negatives": "uniform"} for _, kw in seen)
    st = res["summary"]["stats"]["clients/test/hr@10/mor"]
    assert st["mean"] == pytest.approx(np.mean(list(hr.values()))) and st["n"] == 3
    assert st["std"] == pytest.approx(np.std(list(hr.values()), ddof=1))
    t = res["summary"]["tests"]["clients/test/hr@10/mor-vs-uniform"]
    from scipy.stats import ttest_rel

    assert t["p"] == pytest.approx(ttest_rel(list(hr.values()), [0.103, 0.104, 0.105]).pvalue)
    assert res["held_out_clients"] == ["g1"]


def test_paired_test_is_undefined_without_spread_or_seeds():
    assert np.isnan(paired_test([0.1], [0.2])["p"])
    assert np.isnan(paired_test([0.2, 0.3], [0.1, 0.2])["p"])  # the same difference on every seed
    assert paired_test([0.2, 0.35, 0.3], [0.1, 0.2, 0.25])["p"] < 1
    assert np.isnan(summarise([_fake_run(0, 0.2)])["stats"]["clients/test/hr@10/mor"]["std"])


def _content_split(n_users=40, n_items=20, per_user=6, seed=0):
    """Half the users train only on items 0-9, the other half only on items 10-19; the two item halves sit
    around opposite content directions, and the items have no genres."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        lo = 0 if u < n_users // 2 else 10
        for j, i in enumerate(rng.choice(np.arange(lo, lo + 10), per_user + 2, replace=False)):
            rows.append((u, int(i), 0 if j < per_user else (1 if j == per_user else 2)))
    inter = pd.DataFrame(rows, columns=["user", "item", "split"])
    content = rng.normal(scale=0.3, size=(n_items, 5)).astype(np.float32)
    content[:10, 0] += 3.0
    content[10:, 0] -= 3.0
    items = pd.DataFrame({"categories": [[] for _ in range(n_items)]})
    return SimpleNamespace(
        inter=inter,
        n_users=n_users,
        n_items=n_items,
        name="tiny",
        items=items,
        users=None,
        features={"tags": content * 7.0},
    )


def test_taste_groups_from_a_shipped_feature_array_separate_users_by_the_content_they_chose():
    from fedvlr_plus.alignment.mor.implicit import setting_features, train_only_groups

    split = _content_split()
    feats, vectors = setting_features(split, content="tags")
    assert np.allclose(np.linalg.norm(feats, axis=1), 1.0, atol=1e-5)  # rows scaled to unit norm
    groups, names = train_only_groups(split, "taste", k=2, seed=0, item_vectors=vectors)
    assert names == ("taste-0", "taste-1")
    first, second = groups[:20], groups[20:]
    assert len(set(first)) == 1 and len(set(second)) == 1 and first[0] != second[0]


def test_items_without_genres_need_a_feature_array_and_a_wrong_name_is_refused():
    from fedvlr_plus.alignment.mor.implicit import setting_features
    from fedvlr_plus.errors import ConfigError

    split = _content_split()
    with pytest.raises(ConfigError, match=r"tiny: its items have no genres.*--content NAME.*tags"):
        setting_features(split, content=None)
    with pytest.raises(ConfigError, match=r"--content nope: not a feature array of tiny \(its arrays: tags\)"):
        setting_features(split, content="nope")


def test_items_without_genres_or_feature_arrays_are_told_where_content_comes_from():
    from fedvlr_plus.alignment.mor.implicit import setting_features
    from fedvlr_plus.errors import ConfigError

    split = _content_split()
    split.features, split.format, split.source = {}, "feature-folder", "tiny"
    with pytest.raises(ConfigError, match=r"no genres .*\(it ships no feature array either: add image_features"):
        setting_features(split, content=None)


def test_a_group_without_users_is_refused_with_every_group_size():
    from fedvlr_plus.errors import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"--groups: tiny: group\(s\) taste-2 have no users .*taste-0 3, "
        r"taste-1 2, taste-2 0",
    ):
        mor_seeds._check_groups(np.array([0, 0, 1, 0, 1]), ("taste-0", "taste-1", "taste-2"), "tiny")
    mor_seeds._check_groups(np.array([0, 1, 2]), ("taste-0", "taste-1", "taste-2"), "tiny")  # all present: fine


def test_the_rating_gap_comparison_refuses_items_without_genres():
    from fedvlr_plus.alignment.mor.method import run_mor_ratings
    from fedvlr_plus.datasets import InteractionData
    from fedvlr_plus.errors import ConfigError

    users, items = np.repeat(np.arange(6), 5), np.tile(np.arange(5), 6)
    data = InteractionData.from_raw(
        "bare", users, items, rating=np.tile([5, 1, 3, 4, 2], 6), timestamp=np.arange(30), item_order=np.arange(5)
    )
    data = data.replace(items=pd.DataFrame({"title": [""] * 5, "categories": [[] for _ in range(5)]}))
    with pytest.raises(ConfigError, match=r"bare: its items have no genres .*interactions comparison takes --content"):
        run_mor_ratings(data)


def test_align_mor_says_what_it_does_and_when_each_seed_is_done(monkeypatch, capsys):
    """A Toys-sized run is minutes of silence otherwise."""
    from fedvlr_plus.cli import main

    class Stop(Exception):
        pass

    def fake(data, *, on_seed, **kw):
        on_seed({"seed": 4, "seconds": 12.3})
        raise Stop

    monkeypatch.setattr(mor_seeds, "run_mor_seeds", fake)
    with pytest.raises(Stop):
        main(["align", "mor", "ml-100k", "--seed", "4", "--seeds", "2"])
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "align mor: ml-100k, seeds 4-5; the reference backbone (fedavg, 30 rounds) first"
    assert err[1] == "align mor: seed 4 done in 12 s"
