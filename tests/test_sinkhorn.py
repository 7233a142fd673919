import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from fedvlr_plus.alignment.sinkhorn import sinkhorn_log


def _naive_sinkhorn(C, a, b, eps, iters=5000):
    """The textbook scaling form u <- a / (K v), v <- b / (K^T u) in float64 (fine for a moderate eps)."""
    K = np.exp(-C / eps)
    v = np.ones_like(b)
    for _ in range(iters):
        u = a / (K @ v)
        v = b / (K.T @ u)
    return u[:, None] * K * v[None, :]


def test_both_marginals_within_1e3_on_a_batch_with_padding():
    g = torch.Generator().manual_seed(0)
    cost = torch.rand(4, 3, 7, 5, generator=g)
    a = torch.softmax(torch.randn(4, 3, 7, generator=g), -1)
    a[..., 5:] = 0.0  # two padding tokens
    a = a / a.sum(-1, keepdim=True)
    b = torch.full((4, 3, 5), 0.2)
    res = sinkhorn_log(cost, a, b, eps=0.1, max_iter=500, tol=1e-4)
    assert (res.plan.sum(-1) - a).abs().max() < 1e-3
    assert (res.plan.sum(-2) - b).abs().max() < 1e-3
    assert res.plan[..., 5:, :].abs().max() < 1e-12  # padding carries no mass
    assert torch.isfinite(res.plan).all()


def test_matches_the_textbook_scaling_iterations():
    rng = np.random.default_rng(1)
    C = rng.random((6, 4))
    a = rng.random(6)
    a /= a.sum()
    b = rng.random(4)
    b /= b.sum()
    expected = _naive_sinkhorn(C, a, b, eps=0.2)
    got = sinkhorn_log(torch.tensor(C), torch.tensor(a), torch.tensor(b), eps=0.2, max_iter=5000, tol=1e-12).plan
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-9)


def test_small_eps_recovers_the_exact_assignment():
    # uniform marginals on a square cost: the unregularised optimum is a permutation / n (scipy's Hungarian solver)
    rng = np.random.default_rng(2)
    C = rng.random((5, 5))
    rows, cols = linear_sum_assignment(C)
    exact = np.zeros_like(C)
    exact[rows, cols] = 1 / 5
    a = torch.full((5,), 0.2, dtype=torch.float64)
    plan = sinkhorn_log(torch.tensor(C), a, a.clone(), eps=0.002, max_iter=20000, tol=1e-9).plan.numpy()
    np.testing.assert_allclose(plan, exact, atol=2e-3)
    assert (plan * C).sum() == pytest.approx(C[rows, cols].sum() / 5, abs=1e-3)


def test_hand_computed_two_by_two():
    # C = [[0, 1], [1, 0]], a = b = (1/2, 1/2): by symmetry T = [[x, 1/2 - x], [1/2 - x, x]] with
    # x / (1/2 - x) = exp(1/eps) (the Gibbs ratio), i.e. x = e / (2 (1 + e)) with e = exp(1/eps)
    eps = 0.5
    e = np.exp(1 / eps)
    x = e / (2 * (1 + e))
    C = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    h = torch.tensor([0.5, 0.5], dtype=torch.float64)
    plan = sinkhorn_log(C, h, h.clone(), eps=eps, tol=1e-12, max_iter=1000).plan
    np.testing.assert_allclose(plan.numpy(), [[x, 0.5 - x], [0.5 - x, x]], atol=1e-10)


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="equal mass"):
        sinkhorn_log(torch.zeros(2, 2), torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.2]))
    with pytest.raises(ValueError, match="eps"):
        sinkhorn_log(torch.zeros(2, 2), torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]), eps=0)
    with pytest.raises(ValueError, match="does not match"):
        sinkhorn_log(torch.zeros(2, 3), torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]))


def test_unbalanced_limits_and_row_marginal():
    g = torch.Generator().manual_seed(1)
    cost = torch.rand(2, 6, 4, generator=g, dtype=torch.float64)
    a = torch.softmax(torch.randn(2, 6, generator=g, dtype=torch.float64), -1)
    b = torch.full((2, 4), 0.25, dtype=torch.float64)
    bal = sinkhorn_log(cost, a, b, eps=0.1, max_iter=2000, tol=1e-10)
    big = sinkhorn_log(cost, a, b, eps=0.1, max_iter=2000, tol=1e-10, rho=1e6)
    assert torch.allclose(big.plan, bal.plan, atol=1e-5)  # rho -> inf: the balanced plan
    tiny = sinkhorn_log(cost, a, b, eps=0.1, max_iter=2000, tol=1e-10, rho=1e-9)
    # rho -> 0: each row spreads its mass by softmax over columns of -C / eps, whatever b says
    want = a.unsqueeze(-1) * torch.softmax(-cost / 0.1, -1)
    assert torch.allclose(tiny.plan, want, atol=1e-6)
    mid = sinkhorn_log(cost, a, b, eps=0.1, max_iter=2000, tol=1e-10, rho=0.5)
    assert (mid.plan.sum(-1) - a).abs().max() < 1e-8  # the row marginal is still enforced
    # the column marginals lie between the free (rho -> 0) and the enforced (b) ones
    col_err = lambda r: float((r.plan.sum(-2) - b).abs().sum())  # noqa: E731
    assert col_err(bal) < col_err(mid) < col_err(tiny)
    with pytest.raises(ValueError):
        sinkhorn_log(cost, a, b, rho=0.0)


@pytest.mark.parametrize("rho", [None, 0.1, 1.0])
def test_reported_error_is_the_plans_row_error_at_every_stop(rho):
    # the row error is read off the next f update instead of a pass over the plan; it must equal the plan's own
    g = torch.Generator().manual_seed(3)
    cost = torch.rand(3, 6, 4, generator=g, dtype=torch.float64)
    a = torch.softmax(torch.randn(3, 6, generator=g, dtype=torch.float64), -1)
    a[:, -1] = 0.0  # one padding row
    a = a / a.sum(-1, keepdim=True)
    b = torch.full((3, 4), 0.25, dtype=torch.float64)
    for max_iter in (1, 2, 5, 50):
        res = sinkhorn_log(cost, a, b, eps=0.1, max_iter=max_iter, tol=0.0, rho=rho)  # never early
        assert res.n_iter == max_iter
        assert res.marginal_error == pytest.approx(float((res.plan.sum(-1) - a).abs().max()), rel=1e-6, abs=1e-12)
    loose = sinkhorn_log(cost, a, b, eps=0.1, max_iter=500, tol=1e-3, rho=rho)
    assert loose.marginal_error < 1e-3 and loose.n_iter < 500
    assert float((loose.plan.sum(-1) - a).abs().max()) < 1e-3
