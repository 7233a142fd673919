"""Full-sort rank counts by comparison (the compiled kernel) against the sorting path they replace."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from test_evaluation_metrics import matrix_scorer
from test_evaluation_protocols import random_data

from fedvlr_plus.evaluation import evaluate, metrics, protocols, reference_scorer, row_ranks
from fedvlr_plus.evaluation.protocols import _mask_tensor


@pytest.fixture
def kernel_always(monkeypatch):
    """The comparison kernel for every batch, however small."""
    pytest.importorskip("numba", reason="numba is not installed here: evaluation keeps its sorting path")
    monkeypatch.setattr(row_ranks, "KERNEL_FROM_SCORES", 0)


def _batch(dtype, seed=0, b_n=37, n=211):
    """Scores with many ties and infinities, a mask with a duplicate entry, and targets (some masked)."""
    g = np.random.default_rng(seed)
    scores = g.integers(0, 6, (b_n, n)).astype(dtype)
    scores[g.random((b_n, n)) < 0.05] = -np.inf
    scores[g.random((b_n, n)) < 0.02] = np.inf
    rows, cols = np.nonzero(g.random((b_n, n)) < 0.1)
    rows, cols = np.concatenate([rows, rows[:1]]), np.concatenate([cols, cols[:1]])  # one duplicate entry
    mask = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(b_n, n))
    mask.has_canonical_format = False  # as a matrix built without summing its duplicates would be
    pair_rows = np.sort(g.integers(0, b_n, 90))
    pair_items = g.integers(0, n, 90)
    pair_items[:5] = cols[np.searchsorted(rows, pair_rows[:5]).clip(0, len(cols) - 1)]
    return torch.from_numpy(scores), mask, pair_rows, pair_items


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compared_counts_equal_the_sorted_counts(dtype, kernel_always):
    for seed in range(4):
        scores, mask, pair_rows, pair_items = _batch(dtype, seed)
        canonical = mask.copy()
        canonical.sum_duplicates()
        want = metrics.masked_rank_counts(scores, _mask_tensor(canonical, scores), pair_rows, pair_items)
        got = row_ranks.compared_rank_counts(scores, mask, pair_rows, pair_items)
        assert got is not None
        for a, b in zip(got, want):
            assert np.array_equal(a, b)
        none = row_ranks.compared_rank_counts(scores, None, pair_rows, pair_items)
        want_none = metrics.masked_rank_counts(
            scores, torch.zeros(scores.shape, dtype=torch.bool), pair_rows, pair_items
        )
        for a, b in zip(none, want_none):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_counts_compared_in_torch_equal_the_sorted_counts(dtype):
    for seed in range(4):
        scores, mask, pair_rows, pair_items = _batch(dtype, seed)
        canonical = mask.copy()
        canonical.sum_duplicates()
        masked = _mask_tensor(canonical, scores)
        want = metrics.masked_rank_counts(scores, masked, pair_rows, pair_items)
        got = row_ranks.tensor_rank_counts(scores, masked, pair_rows, pair_items)
        for a, b in zip(got, want):
            assert np.array_equal(a, b)
        assert (want[1] == 0).any() and (want[0] > 0).any()  # masked targets and misses are in the batch


def test_the_sorting_path_stays_where_comparing_would_not_pay(kernel_always, monkeypatch):
    scores, mask, pair_rows, pair_items = _batch(np.float32)
    assert row_ranks.compared_rank_counts(scores.to(torch.bfloat16), mask, pair_rows, pair_items) is None
    many = np.repeat(np.arange(scores.shape[0]), 40)  # 40 targets per user
    assert row_ranks.compared_rank_counts(scores, mask, many, many % scores.shape[1]) is None
    monkeypatch.setattr(row_ranks, "KERNEL_FROM_SCORES", 1 << 21)
    assert row_ranks.compared_rank_counts(scores, mask, pair_rows, pair_items) is None  # a small batch
    # ... unless it is one batch of a large evaluation
    assert row_ranks.compared_rank_counts(scores, mask, pair_rows, pair_items, total_scores=1 << 21) is not None


@pytest.mark.parametrize("n_test,mask_history", [(1, "train"), (3, "all"), (2, "none")])
def test_full_protocol_gives_the_same_metrics_with_either_path(n_test, mask_history, monkeypatch):
    pytest.importorskip("numba", reason="numba is not installed here: evaluation keeps its sorting path")
    data = random_data(n_test=n_test, seed=n_test)
    S = np.random.default_rng(n_test).integers(0, 5, (data.n_users, data.n_items)).astype(np.float32)
    S[:, :15] = -np.inf
    monkeypatch.setattr(row_ranks, "KERNEL_FROM_SCORES", 1 << 40)
    sorted_ = evaluate(data, matrix_scorer(S), ks=(1, 10, 50), mask_history=mask_history, batch_size=16)
    calls = []
    real = row_ranks.compared_rank_counts

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(row_ranks, "KERNEL_FROM_SCORES", 0)
    monkeypatch.setattr("fedvlr_plus.evaluation.protocols.compared_rank_counts", counted)
    compared = evaluate(data, matrix_scorer(S), ks=(1, 10, 50), mask_history=mask_history, batch_size=16)
    assert calls and all(calls)
    pd.testing.assert_frame_equal(sorted_.per_user, compared.per_user)


def test_rows_with_both_infinities_are_not_taken_for_nan():
    data = random_data()
    S = np.zeros((data.n_users, data.n_items), np.float32)
    S[:, 0], S[:, 1] = np.inf, -np.inf  # every row sums to NaN without holding one
    result = evaluate(data, matrix_scorer(S))
    assert len(result.per_user) == data.test()["user"].nunique()


def test_full_protocol_batches_keep_a_large_catalogue_within_the_score_budget():
    assert protocols.users_per_batch("full", 1682) == 512
    assert protocols.users_per_batch("full", 18357) == protocols.SCORE_BATCH_FLOATS // 18357 < 512
    assert protocols.users_per_batch("full", 10**9) == 1
    assert protocols.users_per_batch("sampled", 10**9) == 512
    data = random_data(n_items=300)
    sizes = []
    scorer = matrix_scorer(np.zeros((data.n_users, data.n_items), np.float32))

    def recording(users):
        sizes.append(len(users))
        return scorer(users)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(protocols, "SCORE_BATCH_FLOATS", 300 * 7)
        evaluate(data, recording)
    assert max(sizes) == 7 and sum(sizes) == data.test()["user"].nunique()


def test_preparing_the_kernel_says_whether_it_exists(monkeypatch):
    monkeypatch.setattr(row_ranks._KERNELS, "module", False)  # as where numba does not import
    assert row_ranks.prepare_kernels() is False
    pytest.importorskip("numba", reason="numba is not installed here")
    monkeypatch.setattr(row_ranks._KERNELS, "module", None)
    assert row_ranks.prepare_kernels() is True


@pytest.mark.parametrize("ranker", ["pop", "random"])
def test_real_catalogue_gives_the_same_metrics_with_either_path(ranker, monkeypatch):
    """lfm2k (real data, 1,858 users): popularity's many ties and random scores, ranked both ways."""
    pytest.importorskip("numba", reason="numba is not installed here: evaluation keeps its sorting path")
    from _shared import shared_data

    from fedvlr_plus.run_data import load_and_split

    data = load_and_split(str(shared_data("lfm2k")))[0]
    scorer = reference_scorer(ranker, data)
    monkeypatch.setattr(row_ranks, "KERNEL_FROM_SCORES", 1 << 60)
    sorted_ = evaluate(data, scorer, ks=(10, 50), mask_history="all")
    monkeypatch.setattr(row_ranks, "KERNEL_FROM_SCORES", 0)
    compared = evaluate(data, scorer, ks=(10, 50), mask_history="all")
    pd.testing.assert_frame_equal(sorted_.per_user, compared.per_user)


def test_read_only_target_arrays_are_taken_without_a_warning():
    # a split's arrays are read-only; the sorting path (every GPU evaluation) copies them instead of warning once
    scores = torch.randn(4, 6)
    rows, items = np.array([0, 1, 1, 3]), np.array([2, 0, 5, 1])
    rows.flags.writeable = items.flags.writeable = False
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        greater, ties, n = metrics.masked_rank_counts(scores, torch.zeros(4, 6, dtype=torch.bool), rows, items)
    r, i = torch.tensor(rows), torch.tensor(items)
    want = (scores[r] > scores[r, i].unsqueeze(1)).sum(1)  # each target against the rest of its own row
    assert greater.tolist() == want.tolist()
