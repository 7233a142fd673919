"""MoR's routing headroom: the simplex grid, re-ranking hits, oracle weights, the rewards' rows and the own-group
summary."""

import numpy as np
import torch

from fedvlr_plus.alignment.mor.headroom import (
    best_weights,
    candidate_scores,
    own_fit,
    own_fit_row,
    rerank_bound,
    rerank_hits,
    reward_rows,
    simplex_grid,
)
from fedvlr_plus.alignment.mor.headroom_table import (
    REWARD_PAIRS,
    REWARD_ROWS,
    headroom_markdown,
    own_group_summary,
    summarise_headroom,
)
from fedvlr_plus.alignment.mor.router import Standardiser
from fedvlr_plus.alignment.pairs import PreferencePairs
from fedvlr_plus.federation.messages import ClientUpdate


def test_simplex_grid_sums_to_one_and_holds_uniform_and_the_corners():
    g = simplex_grid(3, 0.5)
    assert np.allclose(g.sum(1), 1) and (g >= 0).all()
    assert np.allclose(g[0], 1 / 3)
    assert len(g) == 1 + 6  # uniform + C(2 + 2, 2) multiples of 0.5
    for corner in np.eye(3):
        assert any(np.allclose(r, corner) for r in g)


def test_rerank_hits_by_hand():
    cand = np.array([[5, 6, 7], [1, 2, 3], [8, 9, 4]])
    scores = np.array([[0.0, 2.0, 1.0], [3.0, 2.0, 1.0], [1.0, 1.0, 1.0]])
    targets = np.array([7, 3, 0])  # rank 1 of 3; rank 2 of 3; not a candidate
    assert rerank_hits(scores, cand, targets, k=2).tolist() == [True, False, False]
    assert rerank_hits(scores, cand, targets, k=3).tolist() == [True, True, False]


def test_best_weights_find_the_client_that_ranks_the_targets_first():
    rng = np.random.default_rng(0)
    U, C = 40, 20
    cand = np.tile(np.arange(C), (U, 1))
    targets = rng.integers(0, C, U)
    good = rng.normal(size=(U, C))
    good[np.arange(U), targets] += 10  # client 1 knows the targets, client 0 puts them last
    bad = good.copy()
    bad[np.arange(U), targets] -= 30
    w = best_weights(np.stack([bad, good]), cand, targets, simplex_grid(2, 0.25))
    assert w.tolist() == [0.0, 1.0]


def test_oracle_rows_are_never_below_uniform_on_the_set_they_are_chosen_on():
    rng = np.random.default_rng(1)
    U, C = 60, 15
    cand = np.tile(np.arange(C), (U, 1))
    z = rng.normal(size=(3, U, C))
    t = {"valid": rng.integers(0, C, U), "test": rng.integers(0, C, U)}
    out = rerank_bound(z, cand, t, groups=rng.integers(0, 3, U))
    assert out["oracle_global"]["valid"] >= out["uniform"]["valid"]
    assert out["oracle_per_group"]["valid"] >= out["oracle_global"]["valid"]
    assert set(out["weights"]["oracle_per_group"]) == {0, 1, 2}


def _run(acc, seed=0):
    clients = [{"group": g} for g in ("a", "b", "c")]
    rer = {
        r: {"valid": 0.1 + 0.01 * seed, "test": 0.1}
        for r in (
            "reference",
            "uniform",
            "oracle_global",
            "oracle_per_group",
            "own_fit",
            "client_0",
            "client_1",
            "client_2",
        )
        + REWARD_ROWS
    }
    rer["mor_router"] = {"valid": 0.1, "test": 0.12 + 0.01 * seed}  # above the FedAvg reward on test
    return {"seed": seed, "clients": clients, "groups": ["a", "b", "c"], "group_accuracy": acc, "rerank": rer}


def test_own_group_summary_counts_clients_best_on_their_own_group():
    diag = [[0.9, 0.5, 0.5], [0.5, 0.9, 0.5], [0.5, 0.5, 0.9]]
    assert own_group_summary(_run(diag))["best_on_own"] == 3
    assert abs(own_group_summary(_run(diag))["own_gap"] - 0.4) < 1e-9
    one_strong = [[0.9, 0.9, 0.9], [0.5, 0.6, 0.5], [0.5, 0.5, 0.6]]  # client 0 best everywhere
    s = own_group_summary(_run(one_strong))
    assert s["best_on_own"] == 1 and abs(s["own_gap"] - (0.4 - 0.1 - 0.1) / 3) < 1e-9


def test_summary_tests_oracles_against_uniform_per_seed():
    runs = [_run([[0.9, 0.5, 0.5], [0.5, 0.9, 0.5], [0.5, 0.5, 0.9]], seed) for seed in range(3)]
    out = summarise_headroom(runs)
    rows = ("reference", "oracle_global", "oracle_per_group", "own_fit", "mor_router", "fedavg_reward")
    assert set(out["tests"]) == (
        {f"{r}-vs-uniform/{p}" for r in rows for p in ("valid", "test")}
        | {f"{a}-vs-{b}/{p}" for a, b in REWARD_PAIRS for p in ("valid", "test")}
    )
    assert abs(out["tests"]["mor_router-vs-fedavg_reward/test"]["mean_diff"] - 0.03) < 1e-9
    assert abs(out["stats"]["uniform/valid"]["mean"] - 0.11) < 1e-9 and len(out["own_group"]) == 3
    md = headroom_markdown({"seeds": [0, 1, 2], "summary": out}, "CMD")
    assert md.startswith("`CMD` (3 seeds)") and "| uniform | 11.00 ± 1.00 | 10.00 ± 0.00 | — |" in md
    assert "| client_2 |" in md and "3/3, 3/3, 3/3" in md
    assert "| kl_mor_router |" in md and "| mor_router − fedavg_reward | -1.00 (0.225) | +3.00 (0.0351) |" in md


class _SignClient:
    """Scores an item by its first feature times ``sign``: always right (+1) or always wrong (-1) on pairs whose
    chosen item has feature 1 and rejected 0."""

    def __init__(self, cid, sign):
        self.cid, self.sign = cid, sign

    def fit(self, shared, config):
        s = torch.as_tensor(np.asarray(shared["query.items"])[..., 0] * self.sign, dtype=torch.float32)
        return ClientUpdate(cid=self.cid, kind="params", arrays={"scores": s}, num_examples=1)


def test_own_fit_is_each_clients_accuracy_on_each_users_pairs_and_routes_to_the_better_one():
    n = 4
    pairs = PreferencePairs(
        context=np.zeros((n, 2), np.float32),
        chosen=np.ones((n, 1), np.float32),
        rejected=np.zeros((n, 1), np.float32),
        client=np.zeros(n, np.int64),
        group=np.zeros(n, np.int64),
        group_names=("g",),
        user=np.array([3, 3, 5, 5]),
    )
    std = Standardiser(torch.zeros(2), torch.ones(2))
    fit = own_fit(
        [_SignClient(0, 1.0), _SignClient(1, -1.0)],
        std,
        [pairs.take([0, 1]), pairs.take([2, 3])],
        users=np.array([3, 5, 7]),
    )
    assert fit.tolist() == [[1.0, 1.0, 0.5], [0.0, 0.0, 0.5]]
    cand = np.array([[0, 1, 2]])
    z = np.array([[[3.0, 0.0, 0.0]], [[-9.0, 1.0, 2.0]]])  # client 0 ranks the target (item 0) first, client 1 last
    out = own_fit_row(z, np.array([[1.0], [0.0]]), cand, {"valid": np.array([0]), "test": np.array([0])}, (0.1,))
    assert out["valid"] == 1.0 and out["temperature"] == 0.1


def test_reward_rows_rank_by_the_reward_and_by_its_kl_optimum_which_follows_the_reference_as_beta_grows():
    """One user, 12 candidates: the reference ranks the target (item 11) last, the reward ranks it first. Alone
    the reward hits; its KL-regularised optimum ref / T + R / beta hits only when beta is small."""
    feats = np.zeros((12, 1), np.float32)
    feats[11, 0] = 1.0
    ref = np.arange(12, 0, -1, dtype=np.float32)[None, :]
    cand, targets = np.arange(12)[None, :], {"valid": np.array([11]), "test": np.array([11])}
    std = Standardiser(torch.zeros(1), torch.ones(1))
    z = candidate_scores([_SignClient(0, 1.0)], std, np.zeros((1, 2), np.float32), feats, cand, None)
    reward = z.mean(0)  # one client: its standardised score
    for beta, hit in ((1.0, 0.0), (0.01, 1.0)):
        out = reward_rows(ref, beta, {"r": reward}, cand, targets)
        assert out["r"] == {"valid": 1.0, "test": 1.0}
        assert out["kl_r"] == {"valid": hit, "test": hit}
