"""A joining user's start conditioned on its support items (``--new-user-start items``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.coldstart.experiment import local_private_training, train_selected
from fedvlr_plus.coldstart.item_start import item_mean_states, item_start_states
from fedvlr_plus.coldstart.population import population_router, population_state
from fedvlr_plus.coldstart.splits import cold_user_holdout, support_query
from fedvlr_plus.federation.config import FedConfig
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import FusionLayer
from fedvlr_plus.fedvlr.report import user_weights
from fedvlr_plus.fedvlr.router import router_weights


def _views(data):
    g = np.random.default_rng(0)
    grp = np.arange(data.n_items) % 4
    return {"text": np.hstack([np.eye(4)[grp], 0.3 * g.standard_normal((data.n_items, 6))]).astype(np.float32)}


def _trained(fusion: bool):
    full = synthetic_data(40, 120, 12.0, groups=4, seed=1)
    full = full.replace(inter=full.inter.assign(split=-1))
    warm, held = cold_user_holdout(full, 0.2, seed=0, min_history=4)
    model = (
        FusionLayer(make_backbone("fedavg", full.n_items, 8), _views(full), mode="fedvlr", router_hidden=8)
        if fusion
        else "fedavg"
    )
    run = train_selected(warm, model, FedConfig(rounds=3, local_epochs=2, batch_size=16, dim=8, lr=0.5, seed=0))
    return full, held, run


@pytest.mark.parametrize("fusion", [False, True])
def test_each_items_mean_is_its_trained_users_mean_pulled_to_the_population(fusion):
    full, _, run = _trained(fusion)
    pop = population_state(run.bb, run.store, run.eligible)
    means = item_mean_states(run, pop, prior_users=2.0)
    users_of = {i: [] for i in range(full.n_items)}
    for u in run.eligible:
        for i in run.indices[run.indptr[u] : run.indptr[u + 1]]:
            users_of[int(i)].append(int(u))
    weights = user_weights(run, run.eligible) if fusion else None
    row_of = {int(u): r for r, u in enumerate(run.eligible)}
    for i in (0, 7, 55, 119):
        n = len(users_of[i])
        for name in ("head_w", "head_b"):
            total = sum((run.store.load(u)[name].double() for u in users_of[i]), torch.zeros_like(pop[name].double()))
            want = (total + 2.0 * pop[name].double()) / (n + 2.0)
            assert torch.allclose(means[name][i].double(), want, atol=1e-6), (i, name)
        if fusion:
            mix = weights[[row_of[u] for u in users_of[i]]].sum(0) + 2.0 * weights.mean(0)
            assert torch.allclose(means["router.weights"][i], mix / (n + 2.0), atol=1e-9)
    assert ("router.weights" in means) == fusion
    assert not any(k.startswith("router.") for k in means if k != "router.weights")  # the router: function space


def test_a_newcomer_starts_from_its_support_items_means_and_routes_to_their_mixture():
    full, held, run = _trained(True)
    pop = population_router(run, population_state(run.bb, run.store, run.eligible))
    means = item_mean_states(run, pop)
    sq = support_query(full, held, 3)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(sq.train()["user"], minlength=full.n_users))])
    indices = sq.train().sort_values("user", kind="stable")["item"].to_numpy()
    starts = item_start_states(run, pop, means, indptr, indices, held[:2])
    for u, state in starts.items():
        items = torch.from_numpy(indices[indptr[u] : indptr[u + 1]].astype(np.int64))
        assert len(items) == 3
        assert torch.allclose(state["head_w"], means["head_w"][items].mean(0))
        w = means["router.weights"][items].mean(0).float()
        got = router_weights(torch.randn(4, state["router.w1"].shape[0]), state, run.bb.temperature)
        assert torch.allclose(got, w.expand_as(got), atol=1e-5)
        assert torch.equal(state["router.w1"], pop["router.w1"])


@pytest.mark.parametrize("fusion", [False, True])
def test_newcomers_with_other_items_start_apart_and_train_from_there(fusion):
    full, held, run = _trained(fusion)
    sq = support_query(full, held, 1)
    start = torch.as_tensor(local_private_training(run, sq, held, epochs=0, start="items")(held[:3]))
    population = torch.as_tensor(local_private_training(run, sq, held, epochs=0, start="population")(held[:3]))
    assert torch.equal(population[0], population[1])  # the population start is the same for everyone
    assert not torch.allclose(start[0], start[1]) and not torch.allclose(start, population)
    trained = torch.as_tensor(local_private_training(run, sq, held, epochs=2, start="items")(held[:3]))
    assert not torch.allclose(trained, start)


@pytest.mark.parametrize("fusion", [False, True])
def test_the_auto_start_keeps_whichever_start_its_validation_users_rank_better(fusion):
    from fedvlr_plus.coldstart.experiment import EvalSpec, _start_of, joining_epochs

    full, held, run = _trained(fusion)
    sq = support_query(full, held, 1)
    valid = np.sort(held)[: len(held) // 2]
    spec = EvalSpec(ks=(10,), metrics=("ndcg",), keys=("ndcg@10",))
    scores = {}
    for start in ("population", "items"):
        _, _, by_epochs = joining_epochs(run, sq, held, valid, spec, start=start, metric="ndcg@10", epochs=0)
        scores[start] = by_epochs[0]
    assert scores["population"] != scores["items"]
    _, scorer, by_epochs = joining_epochs(run, sq, held, valid, spec, start="auto", metric="ndcg@10", epochs=0)
    assert by_epochs[0] == max(scores.values())
    assert _start_of(scorer) == max(scores, key=scores.get)


def test_the_auto_start_needs_validation_joining_users(tmp_path):
    from _bad_input import assert_user_error, run_cli

    assert_user_error(
        run_cli(
            "coldstart",
            "synthetic:40x120",
            "--cold-users",
            "0.2",
            "--support",
            "1",
            "--support-epochs",
            "20",
            "--backbone",
            "fedavg",
            "--new-user-start",
            "auto",
            "--out",
            str(tmp_path / "o"),
        ),
        "--new-user-start auto",
    )


def test_a_runs_starts_are_computed_once_and_score_as_computed_afresh(monkeypatch):
    from fedvlr_plus.coldstart import population
    from fedvlr_plus.coldstart.population import PopulationStarts

    full, held, run = _trained(True)
    sq = support_query(full, held, 3)
    fresh = {
        s: torch.as_tensor(local_private_training(run, sq, held, epochs=1, start=s)(held))
        for s in ("population", "mean-params", "items")
    }
    calls = {"state": 0, "router": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(population, "population_state", counted("state", population.population_state))
    monkeypatch.setattr(population, "population_router", counted("router", population.population_router))
    starts = PopulationStarts(run)
    for _ in range(2):
        for s in ("population", "mean-params", "items"):
            shared = torch.as_tensor(local_private_training(run, sq, held, epochs=1, start=s, starts=starts)(held))
            assert torch.equal(shared, fresh[s]), s
    assert calls == {"state": 1, "router": 1}
