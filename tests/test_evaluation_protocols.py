"""Protocols, warm/cold breakdown, reference rankers, bootstrap intervals and paired tests on small data."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from test_evaluation_metrics import make_data, matrix_scorer, row

from fedvlr_plus.datasets import DataError
from fedvlr_plus.evaluation import EvalResult, evaluate, paired_test, reference_scorer, sample_negatives


def random_data(n_users=40, n_items=300, seed=0, per_user=12, n_test=1, cold_items=10):
    """Each user: per_user train items, 1 valid, n_test test items; the last `cold_items` items never in train."""
    rng = np.random.default_rng(seed)
    rows = []
    warm = n_items - cold_items
    for u in range(n_users):
        items = rng.choice(n_items, per_user + 1 + n_test, replace=False)
        tr = [i for i in items if i < warm][:per_user]
        rest = [i for i in items if i not in tr][: 1 + n_test]
        rows += [(u, i, 0) for i in tr] + [(u, rest[0], 1)] + [(u, i, 2) for i in rest[1:]]
    return make_data(rows, n_users, n_items)


# ---------------------------------------------------------------------- sampled protocol
def test_sampled_negatives_are_seeded_distinct_and_never_positive():
    data = random_data(n_test=2)
    pairs = data.test()[["user", "item"]].drop_duplicates().sort_values(["user", "item"])
    users = pairs["user"].to_numpy()
    a = sample_negatives(data, users, 99, seed=3)
    b = sample_negatives(data, users, 99, seed=3)
    c = sample_negatives(data, users, 99, seed=4)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.shape == (len(users), 99)
    positives = data.inter.groupby("user")["item"].apply(set)  # all splits
    for p, u in enumerate(users):
        assert len(set(a[p].tolist())) == 99
        assert not (set(a[p].tolist()) & positives[u])
        assert a[p].min() >= 0 and a[p].max() < data.n_items
    # both targets of a user get their own draws
    assert not np.array_equal(a[0], a[1])


def test_sampled_negatives_are_uniform_over_the_complement():
    # one user with positives {0, 2, 3}; 4 free items {1, 4, 5, 6}; draw 2 of them many times
    data = make_data([(0, 0, 0), (0, 2, 1), (0, 3, 2)], 1, 7)
    neg = sample_negatives(data, np.zeros(4000, np.int64), 2, seed=0)
    counts = np.bincount(neg.ravel(), minlength=7)
    assert counts[[0, 2, 3]].sum() == 0
    assert np.allclose(counts[[1, 4, 5, 6]] / 4000, 0.5, atol=0.04)  # each free item in 2/4 of the draws


def test_sampled_protocol_seeded_and_constant_scorer_exact():
    data = random_data(n_test=2)
    const = matrix_scorer(np.zeros((data.n_users, data.n_items)))
    r1 = evaluate(data, const, protocol="sampled", ks=(1, 10, 100), seed=1)
    # all 100 candidates tied: HR@K = K/100 exactly, for every pair and user
    assert np.allclose(r1.per_user["hr@10"], 0.10) and np.allclose(r1.per_user["hr@100"], 1.0)
    assert np.allclose(r1.per_user["hr@1"], 0.01)
    assert (r1.per_user["n_targets"] == 2).all()
    pop = reference_scorer("pop", data)
    a = evaluate(data, pop, protocol="sampled", seed=5)
    b = evaluate(data, pop, protocol="sampled", seed=5)
    c = evaluate(data, pop, protocol="sampled", seed=6)
    pd.testing.assert_frame_equal(a.per_user, b.per_user)
    assert not a.per_user["ndcg@50"].equals(c.per_user["ndcg@50"])
    assert a.meta["mean_candidates"] == 100


def test_sampled_per_pair_average_by_hand():
    # user 0 has 2 test targets among 4 items; positives {0,1,2}; with n_negatives=1 the only free item is 3.
    data = make_data([(0, 0, 0), (0, 1, 2), (0, 2, 2)], 1, 4)
    S = [[0.0, 0.9, 0.1, 0.5]]  # target 1 beats item 3 (hit@1), target 2 loses (rank 2)
    r = row(evaluate(data, matrix_scorer(S), protocol="sampled", n_negatives=1, ks=(1,)), 0)
    assert r["hr@1"] == pytest.approx(0.5) and r["mrr@1"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="cannot sample 2 negatives"):
        evaluate(data, matrix_scorer(S), protocol="sampled", n_negatives=2)


def test_score_items_path_equals_full_row_gather():
    data = random_data(n_test=2)
    rnd = reference_scorer("random", data, seed=7)
    plain = lambda users: rnd(users)  # noqa: E731  (no score_items attribute -> gather from full rows)
    a = evaluate(data, rnd, protocol="sampled", seed=2, batch_size=7)
    b = evaluate(data, plain, protocol="sampled", seed=2, batch_size=64)
    pd.testing.assert_frame_equal(a.per_user, b.per_user)


# ---------------------------------------------------------------------- full protocol mechanics
def test_batching_and_scorer_types_do_not_change_results():
    data = random_data(n_test=3)
    S = np.random.default_rng(0).integers(0, 5, (data.n_users, data.n_items))  # integer scores, many ties
    base = evaluate(data, matrix_scorer(S), batch_size=512)
    for scorer, bs in [
        (lambda u: torch.as_tensor(S[u]), 3),
        (lambda u: S[u].astype(np.float16), 1),
        (lambda u: torch.as_tensor(S[u], dtype=torch.bfloat16), 17),
    ]:
        other = evaluate(data, scorer, batch_size=bs)
        pd.testing.assert_frame_equal(base.per_user, other.per_user)
    # the scorer's own array is not modified by masking
    T = torch.as_tensor(S, dtype=torch.float32)
    evaluate(data, lambda u: T[torch.as_tensor(u)])
    assert not torch.isnan(T).any()


def test_torch_sort_path_equals_numpy_sort_path(monkeypatch):
    from fedvlr_plus.evaluation import metrics

    data = random_data(n_test=4)
    S = np.random.default_rng(1).integers(0, 4, (data.n_users, data.n_items)).astype(np.float32)
    S[:, :20] = -np.inf
    base = evaluate(data, matrix_scorer(S), ks=(1, 10, 400), mask_history="all")
    monkeypatch.setattr(metrics, "NUMPY_SORT_ON_CPU", False)
    other = evaluate(data, matrix_scorer(S), ks=(1, 10, 400), mask_history="all")
    pd.testing.assert_frame_equal(base.per_user, other.per_user)


def test_bad_scorer_output_and_arguments_raise():
    data = random_data()
    bad = np.zeros((data.n_users, data.n_items))
    bad[3, 5] = np.nan
    with pytest.raises(ValueError, match="NaN scores for user 3"):
        evaluate(data, matrix_scorer(bad))
    with pytest.raises(ValueError, match=r"returned shape \(40, 299\), expected \(40, 300\)"):
        evaluate(data, lambda u: np.zeros((len(u), data.n_items - 1)))
    ok = matrix_scorer(np.zeros((data.n_users, data.n_items)))
    for kwargs, msg in [
        ({"split": "train"}, "split must be"),
        ({"protocol": "uni"}, "protocol must be"),
        ({"mask_history": "valid"}, "mask_history must be"),
        ({"ks": (0,)}, "K must be"),
        ({"metrics": ("auc",)}, "unknown metric"),
        ({"batch_size": 0}, "batch_size"),
    ]:
        with pytest.raises(ValueError, match=msg):
            evaluate(data, ok, **kwargs)
    unsplit = data.replace(inter=data.inter.assign(split=np.int8(-1)))
    with pytest.raises(DataError, match="not split"):
        evaluate(unsplit, ok)


def test_warm_cold_partition():
    # user 0: test items 1 (warm: user 1 trains on it) and 4 (cold: nobody trains on it)
    # user 1: only warm target 2; user 2: only cold target 4
    data = make_data([(0, 0, 0), (1, 1, 0), (1, 3, 0), (2, 2, 0), (0, 1, 2), (0, 4, 2), (1, 2, 2), (2, 4, 2)], 3, 5)
    S = np.tile([0.0, 3.0, 2.0, 1.0, 4.0], (3, 1))  # cold item 4 first, then 1, 2, 3
    res = evaluate(data, matrix_scorer(S), ks=(1, 2))
    assert list(res.per_user["user"]) == [0, 1, 2]
    assert list(res.per_user_warm["user"]) == [0, 1] and list(res.per_user_cold["user"]) == [0, 2]
    assert list(res.per_user_warm["n_targets"]) == [1, 1] and list(res.per_user_cold["n_targets"]) == [1, 1]
    # user 0: all targets -> hit@1 (item 4), recall@1 1/2; warm only -> item 1 is second (item 4 stays a candidate)
    assert row(res, 0)["recall@1"] == 0.5 and row(res, 0)["hr@1"] == 1
    assert row(res, 0, "warm")["hr@1"] == 0 and row(res, 0, "warm")["hr@2"] == 1
    assert row(res, 0, "cold")["hr@1"] == 1
    js = res.to_json("test", ci=False)
    assert js["test_warm_n_users"] == 2 and js["test_cold_n_users"] == 2 and js["n_users"] == 3
    # a data set without cold targets: empty cold frame, None in JSON
    warm_only = make_data([(0, 0, 0), (0, 1, 0), (0, 1, 2)], 1, 3)
    r2 = evaluate(warm_only, matrix_scorer(np.zeros((1, 3))), ks=(1,))
    assert len(r2.per_user_cold) == 0 and r2.to_json()["test_cold"]["hr@1"] is None
    json.dumps(r2.to_json())


# ---------------------------------------------------------------------- reference rankers
def test_reference_rankers():
    data = make_data([(0, 1, 0), (1, 1, 0), (1, 2, 0), (2, 0, 2), (0, 3, 2)], 3, 4)
    pop = reference_scorer("pop", data)
    assert np.array_equal(pop(np.array([0, 2])), [[0, 2, 1, 0], [0, 2, 1, 0]])
    assert np.array_equal(reference_scorer("antipop", data)(np.array([1]))[0], [0, -2, -1, 0])
    rnd = reference_scorer("random", data, seed=1)
    assert np.array_equal(rnd(np.array([2, 0]))[1], rnd(np.array([0]))[0])  # independent of batching
    assert not np.array_equal(rnd(np.array([0]))[0], rnd(np.array([1]))[0])
    assert not np.array_equal(rnd(np.array([0]))[0], reference_scorer("random", data, seed=2)(np.array([0]))[0])
    items = np.array([[3, 0], [2, 2]])
    assert np.array_equal(
        rnd.score_items(np.array([0, 2]), items), np.take_along_axis(rnd(np.array([0, 2])), items, axis=1)
    )
    with pytest.raises(ValueError, match="unknown reference ranker"):
        reference_scorer("bpr", data)


# ---------------------------------------------------------------------- statistics
def test_bootstrap_ci_contains_mean_and_handles_degenerate_groups():
    data = random_data(n_users=60, seed=1)
    res = evaluate(data, reference_scorer("random", data, seed=0), ks=(50,))
    s, ci = res.summary(), res.ci(n_resamples=500)
    for m, (lo, hi) in ci.items():
        assert lo <= s[m] <= hi and hi > lo, m
    # deterministic given the seed
    assert ci == res.ci(n_resamples=500)
    wider = res.ci(level=0.99, n_resamples=500)
    assert wider["hr@50"][0] <= ci["hr@50"][0] and wider["hr@50"][1] >= ci["hr@50"][1]
    js = res.to_json("valid")
    for key in (
        "valid",
        "valid_ci",
        "valid_warm",
        "valid_cold",
        "valid_warm_ci",
        "valid_cold_ci",
        "n_users",
        "valid_n_users",
        "valid_warm_n_users",
        "valid_cold_n_users",
        "tie_policy",
    ):
        assert key in js, key
    assert js["tie_policy"] == "expected over random tie orders"
    json.dumps(js)
    # all-equal values: the interval collapses onto the value
    const = EvalResult(
        pd.DataFrame({"user": [0, 1], "n_targets": [1, 1], "hr@1": [1.0, 1.0]}), pd.DataFrame(), pd.DataFrame()
    )
    assert const.ci()["hr@1"] == [1.0, 1.0]
    assert np.isnan(const.ci("warm")["hr@1"]).all() and np.isnan(const.summary("cold")["hr@1"])
    assert const.to_json(ci=True)["test_warm_ci"]["hr@1"] == [None, None]


def test_paired_test():
    data = random_data(n_users=60, seed=2)
    a = evaluate(data, reference_scorer("pop", data), ks=(50,))
    same = paired_test(a, a, "ndcg@50")
    assert same["mean_diff"] == 0 and same["n"] == 60 and same["t_pvalue"] == 1.0 and same["wilcoxon_pvalue"] == 1.0
    b = evaluate(data, reference_scorer("random", data, seed=0), ks=(50,))
    d = paired_test(a, b, "hr@50")
    assert d["mean_diff"] == pytest.approx(a.summary()["hr@50"] - b.summary()["hr@50"])
    assert 0 <= d["t_pvalue"] <= 1 and 0 <= d["wilcoxon_pvalue"] <= 1
    # alignment is by user id, not by row order
    shuffled = EvalResult(b.per_user.sample(frac=1, random_state=0), b.per_user_warm, b.per_user_cold)
    assert paired_test(a, shuffled, "hr@50")["mean_diff"] == pytest.approx(d["mean_diff"])
    partial = EvalResult(b.per_user.iloc[:30], b.per_user_warm, b.per_user_cold)
    p = paired_test(a, partial, "hr@50")
    assert p["n"] == 30 and p["n_only_a"] == 30
    with pytest.raises(KeyError, match="mrr@10"):
        paired_test(a, b, "mrr@10")


@pytest.mark.parametrize("protocol,mask_history", [("full", "train"), ("full", "all"), ("sampled", "train")])
def test_a_kept_cache_gives_the_same_result_as_none(protocol, mask_history):
    data = random_data(n_test=2, seed=7)
    S = np.random.default_rng(7).normal(size=(data.n_users, data.n_items)).astype(np.float32)
    cache: dict = {}
    kw = dict(split="test", protocol=protocol, mask_history=mask_history, ks=(5, 20))
    plain = evaluate(data, matrix_scorer(S), **kw)
    for _ in range(2):  # the first call fills the cache, the second reads it
        cached = evaluate(data, matrix_scorer(S), cache=cache, **kw)
        pd.testing.assert_frame_equal(cached.per_user, plain.per_user)
        pd.testing.assert_frame_equal(cached.per_user_cold, plain.per_user_cold)
    assert ("pairs", "test") in cache
    assert any(key[0] == "mask" for key in cache) == (protocol == "full")
