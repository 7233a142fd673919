"""Metric formulas: hand-computed examples and brute-force enumeration of every tie order."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from fedvlr_plus.datasets import InteractionData
from fedvlr_plus.evaluation import evaluate, expected_metrics, metric_columns

LOG2 = math.log2


def make_data(rows, n_users, n_items):
    """rows: (user, item, split) with split 0 train, 1 valid, 2 test."""
    u, i, s = (np.asarray(x) for x in zip(*rows))
    inter = pd.DataFrame(
        {
            "user": u.astype(np.int64),
            "item": i.astype(np.int64),
            "rating": np.ones(len(u), np.float32),
            "timestamp": np.arange(len(u), dtype=np.float64),
            "split": s.astype(np.int8),
        }
    )
    return InteractionData("toy", np.arange(n_users), np.arange(n_items), inter)


def matrix_scorer(S):
    S = np.asarray(S, dtype=np.float64)
    return lambda users: S[np.asarray(users)]


def row(result, user, which="all"):
    f = result.frame(which)
    return f[f["user"] == user].iloc[0]


def brute_force(scores, candidates, targets, k):
    """Mean HR/Recall/NDCG/MRR@k over every ordering of tied candidates (targets may be non-candidates)."""
    by_value = {}
    for it in candidates:
        by_value.setdefault(scores[it], []).append(it)
    groups = [by_value[v] for v in sorted(by_value, reverse=True)]
    idcg = sum(1 / LOG2(p + 1) for p in range(1, min(len(targets), k) + 1))
    totals = np.zeros(4)
    n = 0
    for combo in itertools.product(*(itertools.permutations(g) for g in groups)):
        order = [it for grp in combo for it in grp]
        hits = [p for p, it in enumerate(order[:k], start=1) if it in targets]
        totals += [
            bool(hits),
            len(hits) / len(targets),
            sum(1 / LOG2(p + 1) for p in hits) / idcg,
            1 / hits[0] if hits else 0.0,
        ]
        n += 1
    return dict(zip(("hr", "recall", "ndcg", "mrr"), totals / n))


# ---------------------------------------------------------------------- hand-computed examples
def test_single_target_no_ties():
    # user 0: train item 4 (masked); test item 2. Candidate order by score: 0 (.9), 2 (.7), 1 (.5), 3 (.1)
    data = make_data([(0, 4, 0), (0, 2, 2)], 1, 5)
    S = [[0.9, 0.5, 0.7, 0.1, 5.0]]  # the masked item would be first if it were a candidate
    r = row(evaluate(data, matrix_scorer(S), ks=(1, 2, 3)), 0)
    assert r["hr@1"] == 0 and r["recall@1"] == 0 and r["ndcg@1"] == 0 and r["mrr@1"] == 0
    assert r["hr@2"] == 1 and r["recall@2"] == 1
    assert r["ndcg@2"] == pytest.approx(1 / LOG2(3))  # rank 2, IDCG = 1
    assert r["mrr@2"] == pytest.approx(0.5)
    assert r["ndcg@3"] == pytest.approx(1 / LOG2(3)) and r["mrr@3"] == pytest.approx(0.5)
    assert r["n_targets"] == 1


def test_two_targets():
    # targets 1 and 3; order: 0 (.9), 1 (.8), 2 (.7), 3 (.6), 4 (.5)
    data = make_data([(0, 1, 2), (0, 3, 2), (1, 0, 0), (1, 1, 2)], 2, 5)
    S = [[0.9, 0.8, 0.7, 0.6, 0.5], [0, 0, 0, 0, 0]]
    r = row(evaluate(data, matrix_scorer(S), ks=(1, 2, 3, 4)), 0)
    assert r["n_targets"] == 2
    assert (r["hr@1"], r["hr@2"]) == (0, 1)
    assert (r["recall@2"], r["recall@3"], r["recall@4"]) == (0.5, 0.5, 1.0)
    assert r["mrr@1"] == 0 and r["mrr@4"] == pytest.approx(0.5)
    idcg2 = 1 + 1 / LOG2(3)
    assert r["ndcg@2"] == pytest.approx((1 / LOG2(3)) / idcg2)
    assert r["ndcg@4"] == pytest.approx((1 / LOG2(3) + 1 / LOG2(5)) / idcg2)
    # IDCG uses min(#targets, K) positions: at K=1 it is 1, and no target is first
    assert r["ndcg@1"] == 0


def test_tie_at_k_boundary_closed_form():
    # item 0 above; target 2 tied with items 1 and 3 (r = 1, g = 3); K = 2 -> one of three tie slots is inside
    data = make_data([(0, 2, 2), (0, 4, 0)], 1, 5)
    S = [[2.0, 1.0, 1.0, 1.0, 0.0]]
    r = row(evaluate(data, matrix_scorer(S), ks=(1, 2, 3, 4)), 0)
    assert r["hr@1"] == 0
    assert r["hr@2"] == pytest.approx(1 / 3) and r["recall@2"] == pytest.approx(1 / 3)
    assert r["ndcg@2"] == pytest.approx((1 / 3) / LOG2(3))
    assert r["mrr@2"] == pytest.approx((1 / 3) * (1 / 2))
    assert r["hr@3"] == pytest.approx(2 / 3)
    assert r["mrr@4"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    assert r["hr@4"] == 1.0
    # and the same numbers by enumerating the 3! orders
    bf = brute_force(S[0], [0, 1, 2, 3], {2}, 2)
    assert r["hr@2"] == pytest.approx(bf["hr"]) and r["mrr@2"] == pytest.approx(bf["mrr"])
    assert r["ndcg@2"] == pytest.approx(bf["ndcg"])


def test_two_targets_in_one_tie_group_closed_form():
    # 4 items all tied, targets 0 and 1, K = 1: P(hit) = 1 - C(2,1)/C(4,1) = 1/2; K = 2: 1 - C(2,2)/C(4,2) = 5/6
    data = make_data([(0, 0, 2), (0, 1, 2), (1, 0, 0)], 2, 4)
    S = np.zeros((2, 4))
    r = row(evaluate(data, matrix_scorer(S), ks=(1, 2, 3)), 0)
    assert r["hr@1"] == pytest.approx(1 / 2) and r["hr@2"] == pytest.approx(5 / 6) and r["hr@3"] == 1.0
    assert r["recall@2"] == pytest.approx(1 / 2)  # each target inside with probability 2/4
    # first target at position 1 w.p. 1/2, 2 w.p. 1/3, 3 w.p. 1/6
    assert r["mrr@3"] == pytest.approx(1 / 2 + (1 / 3) / 2 + (1 / 6) / 3)
    assert r["mrr@1"] == pytest.approx(1 / 2)


def test_masked_target_is_a_miss_and_counts():
    # user 0: items 1 and 3 in test; item 3 is also in train, so it is masked (a miss), still one of 2 targets
    data = make_data([(0, 3, 0), (0, 1, 2), (0, 3, 2)], 1, 5)
    S = [[0.0, 0.5, 0.1, 1.0, 0.2]]
    r = row(evaluate(data, matrix_scorer(S), ks=(1, 5)), 0)
    assert r["n_targets"] == 2
    assert r["hr@1"] == 1 and r["recall@1"] == 0.5 and r["recall@5"] == 0.5
    assert r["ndcg@5"] == pytest.approx(1 / (1 + 1 / LOG2(3)))
    # only-masked target: every metric is 0
    data1 = make_data([(0, 3, 0), (0, 3, 2)], 1, 5)
    r1 = row(evaluate(data1, matrix_scorer(S), ks=(1, 5)), 0)
    assert r1[metric_columns((1, 5), ("hr", "ndcg", "recall", "mrr"))].sum() == 0


def test_k_larger_than_catalogue():
    # 4 candidates all tied, K = 100: always a hit; NDCG = mean over positions 1..4 of 1/log2(p+1)
    data = make_data([(0, 4, 0), (0, 1, 2)], 1, 5)
    r = row(evaluate(data, matrix_scorer(np.zeros((1, 5))), ks=(100,)), 0)
    assert r["hr@100"] == 1.0 and r["recall@100"] == 1.0
    assert r["ndcg@100"] == pytest.approx(np.mean([1 / LOG2(p + 1) for p in range(1, 5)]))
    assert r["mrr@100"] == pytest.approx(np.mean([1 / p for p in range(1, 5)]))


def test_item_zero_is_rankable_and_masked_only_for_its_own_user():
    # user 0: train {0}, test 1; user 1: test 0; user 2: test 1. Scorer puts item 0 first for everybody.
    data = make_data([(0, 0, 0), (0, 1, 2), (1, 2, 0), (1, 0, 2), (2, 3, 0), (2, 1, 2)], 3, 5)
    S = np.tile([5.0, 4.0, 3.0, 2.0, 1.0], (3, 1))
    res = evaluate(data, matrix_scorer(S), ks=(1, 2))
    assert row(res, 0)["hr@1"] == 1  # item 0 masked for user 0 only, so item 1 is first
    assert row(res, 1)["hr@1"] == 1 and row(res, 1)["mrr@1"] == 1  # item 0 can be ranked first
    assert row(res, 2)["hr@1"] == 0 and row(res, 2)["hr@2"] == 1  # item 0 is still a candidate for user 2
    assert list(res.meta["n_candidates"]) == [4, 4, 4]


def test_valid_item_stays_candidate_at_test_unless_mask_all():
    # user 0: train 0, valid 1, test 2; valid item scored highest
    data = make_data([(0, 0, 0), (0, 1, 1), (0, 2, 2)], 1, 4)
    S = [[0.0, 9.0, 5.0, 1.0]]
    train_only = row(evaluate(data, matrix_scorer(S), ks=(1, 2)), 0)
    assert train_only["hr@1"] == 0 and train_only["hr@2"] == 1
    masked = row(evaluate(data, matrix_scorer(S), ks=(1, 2), mask_history="all"), 0)
    assert masked["hr@1"] == 1
    # at valid, "all" means train only: the test item stays a candidate
    S2 = [[0.0, 5.0, 9.0, 1.0]]
    at_valid = row(evaluate(data, matrix_scorer(S2), split="valid", ks=(1, 2), mask_history="all"), 0)
    assert at_valid["hr@1"] == 0 and at_valid["hr@2"] == 1
    # "none" leaves the train item in as well
    S3 = [[10.0, 0.0, 5.0, 1.0]]
    assert row(evaluate(data, matrix_scorer(S3), ks=(1,), mask_history="none"), 0)["hr@1"] == 0
    assert row(evaluate(data, matrix_scorer(S3), ks=(1,)), 0)["hr@1"] == 1


# ---------------------------------------------------------------------- enumeration of tie orders
@pytest.mark.parametrize("case", range(40))
def test_matches_enumeration_of_all_tie_orders(case):
    rng = np.random.default_rng(1000 + case)
    n_items = 7
    values = np.array([0.0, 1.0, 2.0]) if case % 2 else np.array([-np.inf, 0.0, 1.0, np.inf])
    scores = values[rng.integers(0, len(values), n_items)]  # infinite scores must tie like any other value
    masked = set(rng.choice(n_items, rng.integers(0, 3), replace=False).tolist())
    targets = set(rng.choice(n_items, rng.integers(1, 4), replace=False).tolist())
    rows = [(0, i, 0) for i in sorted(masked)] + [(0, i, 2) for i in sorted(targets)] + [(1, 0, 0)]
    data = make_data(rows, 2, n_items)
    ks = (1, 2, 3, 5, 10)
    res = evaluate(data, matrix_scorer(np.tile(scores, (2, 1))), ks=ks)
    r = row(res, 0)
    candidates = [i for i in range(n_items) if i not in masked]
    for k in ks:
        bf = brute_force(scores, candidates, targets, k)
        for m in ("hr", "recall", "ndcg", "mrr"):
            assert r[f"{m}@{k}"] == pytest.approx(bf[m], abs=1e-12), (m, k, scores, masked, targets)


def test_expected_metrics_direct_and_validation():
    # one user, target r=0, g=2, K=1: HR 1/2, NDCG 1/2, MRR 1/2
    out = expected_metrics(np.array([0]), np.array([0]), np.array([2]), np.array([1]), (1,), ("hr", "ndcg", "mrr"))
    assert list(out) == ["hr@1", "ndcg@1", "mrr@1"]
    assert out["hr@1"][0] == pytest.approx(0.5) and out["ndcg@1"][0] == pytest.approx(0.5)
    # a user with no targets gets zeros, and is not confused with others
    out = expected_metrics(np.array([1]), np.array([0]), np.array([1]), np.array([0, 1]), (1,), ("hr",))
    assert list(out["hr@1"]) == [0.0, 1.0]
    with pytest.raises(ValueError, match="unknown metric"):
        expected_metrics(np.array([0]), np.array([0]), np.array([1]), np.array([1]), (1,), ("auc",))
    with pytest.raises(ValueError, match="K must be >= 1"):
        expected_metrics(np.array([0]), np.array([0]), np.array([1]), np.array([1]), (0,), ("hr",))
    with pytest.raises(ValueError, match="more .* pairs than n_targets"):
        expected_metrics(np.array([0, 0]), np.array([0, 1]), np.array([1, 1]), np.array([1]), (1,), ("hr",))
