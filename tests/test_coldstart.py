"""Cold-start experiments: splits, server-side cold-item rules, the content ranker, restricted ranking, private-only
local training of joining users, sparsity buckets, and the ``coldstart`` command end to end."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from _shared import shared_data

from fedvlr_plus.coldstart.content import ContentRanker, RestrictedScorer
from fedvlr_plus.coldstart.experiment import EvalSpec, local_private_training, sparsity_table, summarise, train_selected
from fedvlr_plus.coldstart.ridge import RidgeMap, choose_lambda, ridge_fit
from fedvlr_plus.coldstart.rules import make_rule
from fedvlr_plus.coldstart.splits import cold_item_loo, cold_user_holdout, support_query
from fedvlr_plus.datasets import InteractionData
from fedvlr_plus.datasets.core import TEST, TRAIN, VALID
from fedvlr_plus.evaluation import reference_scorer
from fedvlr_plus.federation.config import FedConfig
from fedvlr_plus.federation.synthetic import synthetic_data


def tiny(n_users=4, n_items=6, rows=None, split=None):
    """Hand-made data: ``rows`` = (user, item, timestamp)."""
    rows = np.asarray(rows)
    return InteractionData(
        "tiny",
        np.arange(n_users),
        np.arange(n_items),
        pd.DataFrame(
            {
                "user": rows[:, 0].astype(np.int64),
                "item": rows[:, 1].astype(np.int64),
                "rating": np.ones(len(rows), np.float32),
                "timestamp": rows[:, 2].astype(np.float64),
                "split": np.asarray(split if split is not None else [-1] * len(rows), np.int8),
            }
        ),
    )


# ---------------------------------------------------------------------- splits
def test_cold_item_loo_holds_items_out_and_splits_the_warm_rest_leave_one_out():
    data = synthetic_data(60, 80, 12.0, groups=4, seed=1)
    out = cold_item_loo(data, 0.25, seed=3)
    inter = out.inter
    # the draw: round(0.25 * 80) = 20 items of a seeded permutation, the first half for validation
    drawn = np.random.default_rng(3).permutation(np.unique(data.inter["item"]))[:20]
    item, split = inter["item"].to_numpy(), inter["split"].to_numpy()
    assert (split[np.isin(item, drawn[:10])] == VALID).all() and (split[np.isin(item, drawn[10:])] == TEST).all()
    assert out.cold_items()[drawn].all()
    on_cold = np.isin(item, drawn)
    assert set(inter["split"].to_numpy()[on_cold]) <= {VALID, TEST}
    warm = inter[~on_cold]
    for _, g in warm.groupby("user"):
        if len(g) >= 3:  # the latest warm row is test, the one before valid
            g = g.sort_values("timestamp", kind="stable")
            assert list(g["split"].to_numpy()[-2:]) == [VALID, TEST]
            assert (g["split"].to_numpy()[:-2] == TRAIN).all()
    with pytest.raises(ValueError, match="fraction"):
        cold_item_loo(data, 1.5)


def test_support_query_takes_the_first_n_by_time():
    data = tiny(rows=[(0, 0, 5), (0, 1, 1), (0, 2, 3), (0, 3, 9), (1, 4, 2), (1, 5, 1), (2, 0, 1)])
    sq = support_query(data, np.array([0, 1]), 2)
    tr = sq.train().groupby("user")["item"].apply(set).to_dict()
    te = sq.test().groupby("user")["item"].apply(set).to_dict()
    assert tr == {0: {1, 2}, 1: {5, 4}} and te == {0: {0, 3}}  # user 1 has no query left; user 2 absent
    assert 2 not in set(sq.inter["user"])


def test_cold_user_holdout_removes_users_entirely():
    data = synthetic_data(50, 60, 10.0, groups=3, seed=2)
    data = data.replace(inter=data.inter.assign(split=-1))
    warm, held = cold_user_holdout(data, 0.2, seed=0, min_history=6)
    assert len(held) == 10
    assert not np.isin(warm.inter["user"].to_numpy(), held).any()
    counts = np.bincount(data.inter["user"], minlength=data.n_users)
    assert (counts[held] >= 6).all()


# ---------------------------------------------------------------------- cold-item rules
def test_ridge_recovers_an_exact_linear_map():
    g = np.random.default_rng(0)
    x = g.standard_normal((40, 5))
    w_true, b_true = g.standard_normal((5, 3)), np.array([1.0, -2.0, 0.5])
    w, b = ridge_fit(x, x @ w_true + b_true, 1e-9)
    assert np.allclose(w, w_true, atol=1e-6) and np.allclose(b, b_true, atol=1e-6)
    # more features than rows: the dual form gives the same solution as the primal one
    xw = g.standard_normal((6, 10))
    y = g.standard_normal((6, 2))
    wd, bd = ridge_fit(xw, y, 0.5)
    xc, yc = xw - xw.mean(0), y - y.mean(0)
    assert np.allclose(wd, np.linalg.solve(xc.T @ xc + 0.5 * np.eye(10), xc.T @ yc), atol=1e-8)
    lam, errs = choose_lambda(x, x @ w_true, (1e-6, 100.0))
    assert lam == 1e-6 and errs[1e-6] < errs[100.0]


def _ridge_from_scratch(x, y, lam):
    xc, yc = x - x.mean(0), y - y.mean(0)
    w = np.linalg.solve(xc.T @ xc + lam * np.eye(x.shape[1]), xc.T @ yc)
    return w, y.mean(0) - x.mean(0) @ w


def test_a_kept_ridge_map_refits_exactly_as_a_fit_from_scratch():
    g = np.random.default_rng(1)
    x = g.standard_normal((60, 8))
    ridge = RidgeMap(x, seed=3)
    for _ in range(2):  # a study refits for every seed: the second fit reads the kept Gram matrices
        y = g.standard_normal((60, 4))
        lam, w, b = ridge.fit(y)
        perm = np.random.default_rng(3).permutation(60)
        hold, rest = perm[:12], perm[12:]
        errs = {}
        for cand in ridge.lambdas:
            wr, br = _ridge_from_scratch(x[rest], y[rest], cand)
            errs[cand] = float(((x[hold] @ wr + br - y[hold]) ** 2).mean())
        assert lam == min(errs, key=errs.get)
        w0, b0 = _ridge_from_scratch(x, y, lam)
        assert np.array_equal(w, w0) and np.array_equal(b, b0)
    assert {"rest_inputs", "all_inputs"} <= set(vars(ridge))  # formed at the first fit, read at the second


def test_rules_fill_only_cold_rows():
    # item content = one-hot group (4 groups) ; ID rows = a linear function of the content
    grp = np.arange(12) % 4
    views = {"t": np.eye(4)[grp]}
    cold = np.zeros(12, bool)
    cold[[8, 9]] = True  # groups 0 and 1
    table = torch.as_tensor(np.eye(4)[grp] @ np.array([[1.0, 0], [0, 1], [2, 2], [-1, 3]]), dtype=torch.float32)
    table[8] = table[9] = 100.0  # untrained noise in the cold rows
    nb = make_rule("neighbours", views, cold, k=2)(table)
    assert torch.equal(nb[~torch.as_tensor(cold)], table[~torch.as_tensor(cold)])
    assert torch.allclose(nb[8], torch.tensor([1.0, 0.0])) and torch.allclose(nb[9], torch.tensor([0.0, 1.0]))
    mp = make_rule("mapping", views, cold)(table)
    assert torch.allclose(mp[8], torch.tensor([1.0, 0.0]), atol=0.05)  # ridge shrinks a little
    both = make_rule("both", views, cold, k=2)(table)
    assert torch.allclose(both[9], 0.5 * (nb[9] + mp[9]))
    assert torch.equal(make_rule("none", views, cold)(table), table)
    with pytest.raises(ValueError, match="rule"):
        make_rule("magic", views, cold)


def test_a_study_rule_replaces_the_layers_cold_rule_and_touches_only_cold_items():
    from fedvlr_plus.adapters import make_backbone
    from fedvlr_plus.fedvlr import ColdItemRule, FusionLayer

    g = np.random.default_rng(0)
    views = {"text": g.standard_normal((20, 6)).astype(np.float32)}
    cold = np.zeros(20, bool)
    cold[[2, 7]] = True
    bb = FusionLayer(make_backbone("fedavg", 20, 4), views, mode="sum", cold_items=ColdItemRule(cold, 3))
    sp = bb.init_server(0)
    before = bb.fused_views(sp)
    after = bb.fused_views(sp, cold_rule=make_rule("mapping", views, cold))
    again = bb.fused_views(sp)
    changed = (before - after).abs().sum(1) > 1e-6
    assert changed[[2, 7]].all() and not changed[~cold].any()
    assert torch.equal(before, again)  # the default behaviour is back


def test_a_fused_rule_estimates_the_layers_output_rows_of_cold_items_from_their_neighbours():
    from fedvlr_plus.adapters import make_backbone
    from fedvlr_plus.coldstart.experiment import fused_with_rule
    from fedvlr_plus.fedvlr import FusionLayer

    g = np.random.default_rng(0)
    views = {"text": g.standard_normal((20, 6)).astype(np.float32)}
    cold = np.zeros(20, bool)
    cold[[2, 7]] = True
    bb = FusionLayer(make_backbone("fedavg", 20, 4), views, mode="fedvlr", content_preference=True)
    fused = bb.fused_views(bb.init_server(0))
    rule = make_rule("fused-neighbours", views, cold, k=3)
    assert rule.on_fused and rule.name == "fused-neighbours" and rule.rule == "neighbours"
    out = fused_with_rule(bb, fused, rule)
    cols = len(bb.experts) * bb.d
    assert out.shape == fused.shape and cols < fused.shape[1]
    assert torch.equal(out[~cold], fused[~cold])  # warm items as broadcast
    assert torch.equal(out[:, cols:], fused[:, cols:])  # the content-preference block is content's own
    for k, item in enumerate(np.flatnonzero(cold)):  # every expert's block: the neighbours' mean
        assert torch.allclose(out[item, :cols], fused[rule.neighbours[k], :cols].mean(0))
        assert not cold[rule.neighbours[k]].any()


def test_a_fused_rule_is_refused_for_a_model_without_fused_views():
    from types import SimpleNamespace

    from fedvlr_plus.coldstart.experiment import rules_for, shared_with_rule
    from fedvlr_plus.coldstart.rules import FUSED_RULES, RULES

    assert rules_for(False) == RULES and rules_for(True) == RULES + FUSED_RULES
    views = {"text": np.eye(4)[np.arange(8) % 4]}
    run = SimpleNamespace(bb=object(), shared={})
    with pytest.raises(ValueError, match="fused views"):
        shared_with_rule(run, make_rule("fused-mapping", views, np.arange(8) == 3))


# ---------------------------------------------------------------------- rankers and restricted ranking
def test_content_ranker_is_the_cosine_with_the_mean_profile():
    data = tiny(
        2, 3, rows=[(0, 0, 1), (0, 1, 2), (1, 2, 1), (0, 2, 3), (1, 0, 4)], split=[TRAIN, TRAIN, TRAIN, TEST, TEST]
    )
    views = {"a": np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])}
    s = ContentRanker(data, views)(np.array([0, 1]))
    # user 0: profile (1,1)/sqrt2 -> cos with items: 1/sqrt2, 1/sqrt2, 1 ; user 1: profile = item 2
    assert np.allclose(s[0], [2**-0.5, 2**-0.5, 1.0], atol=1e-6)
    assert np.allclose(s[1], [2**-0.5, 2**-0.5, 1.0], atol=1e-6)


def test_restricted_ranking_counts_only_cold_candidates():
    # 6 items, items 4 and 5 never trained (cold); user 0 trains on 0 and tests on 5, user 1 trains on 1-3, tests on 4
    data = tiny(
        2,
        6,
        rows=[(0, 0, 1), (0, 5, 2), (1, 1, 1), (1, 2, 2), (1, 3, 3), (1, 4, 4)],
        split=[TRAIN, TEST, TRAIN, TRAIN, TRAIN, TEST],
    )
    scores = np.array([[9.0, 8.0, 7.0, 6.0, 0.0, 1.0], [9.0, 8.0, 7.0, 6.0, 5.0, 1.0]])
    scorer = lambda users: scores[np.asarray(users)]  # noqa: E731
    spec = EvalSpec(ks=(1, 3), metrics=("hr",), keys=("hr@1", "hr@3"))
    cold = data.cold_items()
    assert cold.tolist() == [False, False, False, False, True, True]
    among_all = spec.run(data, scorer, "test").frame("cold").set_index("user")
    among_cold = spec.run(data, RestrictedScorer(scorer, cold), "test").frame("cold").set_index("user")
    # among all items (training items masked): user 0's target has items 1, 2, 3 above it -> miss at 3;
    # user 1's target has item 0 above it -> rank 2: miss at 1, hit at 3
    assert among_all.loc[0, "hr@3"] == 0.0
    assert (among_all.loc[1, "hr@1"], among_all.loc[1, "hr@3"]) == (0.0, 1.0)
    # among cold items only, each target beats the other cold item -> rank 1 for both
    assert among_cold.loc[0, "hr@1"] == 1.0 and among_cold.loc[1, "hr@1"] == 1.0


def test_summarise_averages_users_over_seeds_and_gives_an_interval():
    f1 = pd.DataFrame({"user": [0, 1, 2], "hr@10": [1.0, 0.0, 1.0]})
    f2 = pd.DataFrame({"user": [0, 1, 2], "hr@10": [0.0, 0.0, 1.0]})
    s = summarise([f1, f2], ["hr@10"])["hr@10"]
    assert s["mean"] == pytest.approx(0.5) and s["n_users"] == 3  # users: 0.5, 0, 1
    assert s["sd_seeds"] == pytest.approx(np.std([2 / 3, 1 / 3], ddof=1))
    assert s["ci"][0] <= 0.5 <= s["ci"][1]


def test_sparsity_table_buckets_by_training_interactions():
    f = pd.DataFrame({"user": [0, 1, 2, 3], "hr@10": [1.0, 0.0, 1.0, 1.0]})
    counts = np.array([3, 10, 11, 250])
    rows = sparsity_table([f], counts, ["hr@10"], reference=[f.assign(**{"hr@10": 0.0})])
    got = {r["bucket"]: (r["n_users"], r["model"]["hr@10"]["mean"]) for r in rows}
    assert got == {"1-10": (2, 0.5), "11-20": (1, 1.0), "201-500": (1, 1.0)}
    assert all(r["pop"]["hr@10"] == 0.0 for r in rows)


# ---------------------------------------------------------------------- joining users train private parts only
def _toy_views(data, seed=0):
    g = np.random.default_rng(seed)
    grp = np.arange(data.n_items) % 4
    return {"text": np.hstack([np.eye(4)[grp], 0.3 * g.standard_normal((data.n_items, 6))]).astype(np.float32)}


@pytest.mark.parametrize("fusion", [False, True])
def test_joining_users_train_only_private_parts(fusion):
    from fedvlr_plus.adapters import make_backbone
    from fedvlr_plus.fedvlr import FusionLayer

    full = synthetic_data(40, 120, 12.0, groups=4, seed=0)
    full = full.replace(inter=full.inter.assign(split=-1))
    warm, held = cold_user_holdout(full, 0.2, seed=0, min_history=4)
    views = _toy_views(full)
    model = (
        FusionLayer(make_backbone("fcf", full.n_items, 8), views, mode="fedvlr", router_hidden=8) if fusion else "fcf"
    )
    cfg = FedConfig(rounds=2, local_epochs=1, batch_size=16, dim=8, lr=0.1, server_lr=0.5, seed=0)
    run = train_selected(warm, model, cfg)
    sq = support_query(full, held, 3)
    shared_before = {k: v.clone() for k, v in run.shared.items()}
    score = local_private_training(run, sq, held, epochs=3)  # asserts inside that shared state is frozen
    assert all(torch.equal(shared_before[k], run.shared[k]) for k in shared_before)
    trained = torch.as_tensor(score(held[:2]))
    # the untrained private state of the same users (init) scores differently: local training took effect
    init = run.sim.scores(held[:2], run.shared)
    assert trained.shape == (2, full.n_items) and not torch.allclose(trained, init)


@pytest.mark.parametrize("fusion", [False, True])
def test_population_start_is_the_trained_clients_mean_private_state(fusion):
    from fedvlr_plus.adapters import make_backbone
    from fedvlr_plus.coldstart.population import population_state, start_from
    from fedvlr_plus.federation.state.store import MemoryStore
    from fedvlr_plus.fedvlr import FusionLayer

    full = synthetic_data(40, 120, 12.0, groups=4, seed=1)
    full = full.replace(inter=full.inter.assign(split=-1))
    warm, held = cold_user_holdout(full, 0.2, seed=0, min_history=4)
    model = (
        FusionLayer(make_backbone("fedavg", full.n_items, 8), _toy_views(full), mode="fedvlr", router_hidden=8)
        if fusion
        else "fedavg"
    )
    cfg = FedConfig(rounds=2, local_epochs=1, batch_size=16, dim=8, lr=0.1, seed=0)
    run = train_selected(warm, model, cfg)
    mean = population_state(run.bb, run.store, run.eligible)
    for name, value in mean.items():
        rows = torch.stack([run.store.load(int(c))[name] for c in run.eligible])
        assert torch.allclose(value, rows.mean(0), atol=1e-6), name
    store = MemoryStore()
    start_from(store, held[:2], mean)
    assert all(torch.equal(store.load(int(u))[k], mean[k]) for u in held[:2] for k in mean)
    # the joining users' training starts there: same support, another start, other scores
    sq = support_query(full, held, 1)
    fresh = torch.as_tensor(local_private_training(run, sq, held, epochs=2)(held[:3]))
    pop = torch.as_tensor(local_private_training(run, sq, held, epochs=2, start="population")(held[:3]))
    assert pop.shape == fresh.shape and not torch.allclose(pop, fresh)
    # no local epochs: every joining user is served by the start itself, the same scores for each of them
    start = torch.as_tensor(local_private_training(run, sq, held, epochs=0, start="population")(held[:3]))
    assert torch.equal(start[0], start[1]) and torch.equal(start[0], start[2]) and not torch.allclose(start, pop)


def test_population_router_routes_every_input_to_the_trained_users_mean_mixture():
    from fedvlr_plus.adapters import make_backbone
    from fedvlr_plus.coldstart.population import population_router, population_state
    from fedvlr_plus.fedvlr import FusionLayer
    from fedvlr_plus.fedvlr.report import router_report
    from fedvlr_plus.fedvlr.router import router_weights

    full = synthetic_data(40, 120, 12.0, groups=4, seed=1)
    full = full.replace(inter=full.inter.assign(split=-1))
    warm, _ = cold_user_holdout(full, 0.2, seed=0, min_history=4)
    layer = FusionLayer(make_backbone("fedavg", full.n_items, 8), _toy_views(full), mode="fedvlr", router_hidden=8)
    run = train_selected(warm, layer, FedConfig(rounds=4, local_epochs=5, batch_size=16, dim=8, lr=1.0, seed=0))
    mean = population_state(run.bb, run.store, run.eligible)
    start = population_router(run, mean)
    want = torch.tensor(router_report(run)["mean_weights"], dtype=torch.float32)
    assert not torch.allclose(want, torch.full_like(want, 1 / len(want)), atol=1e-4)  # trained away from uniform
    x = torch.randn(5, start["router.w1"].shape[0])
    got = router_weights(x, start, layer.temperature)
    assert torch.allclose(got, want.expand_as(got), atol=1e-5)
    # the rest of the state is still the parameter mean, and a backbone without a router is left as it is
    assert all(torch.equal(start[k], mean[k]) for k in mean if k not in ("router.w2", "router.b2"))
    plain = train_selected(warm, "fedavg", FedConfig(rounds=1, local_epochs=1, batch_size=16, dim=8, seed=0))
    plain_mean = population_state(plain.bb, plain.store, plain.eligible)
    assert population_router(plain, plain_mean) is plain_mean


# ---------------------------------------------------------------------- the command
def _feature_folder(path, n_users=30, n_items=110, seed=0):
    """A FedVLR-layout folder whose items 106-109 occur only in valid/test (natural cold targets); 110 items so
    that the engine's sampled-99 test protocol has enough negatives."""
    g = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        items = g.choice(n_items - 4, size=5, replace=False)
        for t, i in enumerate(items):
            rows.append((u, int(i), 1, t, 0))
        rows.append((u, int(g.integers(0, n_items)), 1, 10, 1))
        rows.append((u, int(n_items - 4 + u % 4), 1, 11, 2))
    path.mkdir(parents=True)
    (path / "inter.csv").write_text(
        "userID,itemID,rating,timestamp,split_label\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)
    )
    grp = np.arange(n_items) % 4
    np.save(path / "text_features.npy", np.hstack([np.eye(4)[grp], g.standard_normal((n_items, 4))]).astype(np.float16))
    np.save(path / "image_features.npy", g.standard_normal((n_items, 8)).astype(np.float16))
    return path


def test_coldstart_command_natural_cold_targets(tmp_path, capsys):
    from fedvlr_plus.cli import main

    folder = _feature_folder(tmp_path / "fx")
    out = tmp_path / "report"
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fcf",
            "--fusion",
            "fedvlr",
            "--with-backbone",
            "--rounds",
            "2",
            "--seeds",
            "1",
            "--dim",
            "8",
            "--local-epochs",
            "1",
            "--no-progress",
            "--metrics",
            "hr@5,ndcg@5",
            "--cold-select",
            "ndcg@5",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("cold_among_cold", "cold_among_all", "warm", "baselines", "variants", "sparsity", "backbone_alone"):
        assert key in res, key
    assert res["n_cold_items"] >= 4 and res["test_cold_targets"] == 30
    assert set(res["baselines"]) == {"pop", "random", "antipop", "content"}
    assert res["cold_rule"] in (
        "none",
        "neighbours",
        "mapping",
        "both",
        "fused-neighbours",
        "fused-mapping",
        "fused-both",
    )
    assert res["backbone_alone"]["cold_rule"] == "none"
    # the layer is scored under every rule in both forms, the backbone alone under the plain rules only
    assert set(res["variants"]) == {
        "trained",
        "none",
        "neighbours",
        "mapping",
        "both",
        "fused-neighbours",
        "fused-mapping",
        "fused-both",
    }
    assert set(res["backbone_alone"]["variants"]) == {"trained", "none", "neighbours", "mapping", "both"}
    # antipop puts the never-trained items first: among all items it equals its figure among cold items
    anti = res["baselines"]["antipop"]
    assert anti["cold_among_all"]["hr@5"]["mean"] == pytest.approx(anti["cold_among_cold"]["hr@5"]["mean"])
    lo, hi = res["cold_among_cold"]["ndcg@5"]["ci"]
    assert lo <= res["cold_among_cold"]["ndcg@5"]["mean"] <= hi
    for name in ("cold_items.csv", "cold_items.png", "sparsity.csv", "sparsity.png", "report.md", "result.json"):
        assert (out / name).exists(), name
    assert "Item cold-start" in (out / "report.md").read_text()
    # the layer's headline paired with the backbone alone's every variant and content only, over the same users
    paired = res["paired_cold_items"]
    assert set(paired) == {"content only", "backbone alone, trained"} | {
        f"backbone alone, {r}" for r in ("none", "neighbours", "mapping", "both")
    }
    test = paired["content only"]["cold_among_cold"]["ndcg@5"]
    head, content = res["cold_among_cold"]["ndcg@5"], res["baselines"]["content"]["cold_among_cold"]["ndcg@5"]
    assert test["n"] == head["n_users"] and test["mean_diff"] == pytest.approx(head["mean"] - content["mean"])
    assert "Paired over the same users" in (out / "report.md").read_text()
    # every variant's users are kept in the layout `experiment paired` reads, so that draws can be pooled
    items = out / "cold_items"
    assert {p.name for p in items.iterdir()} >= {
        "fcf+fedvlr-headline",
        "fcf+fedvlr-content-only",
        "fcf-alone-both",
        "fcf-alone-trained",
    }
    capsys.readouterr()
    assert (
        main(
            [
                "experiment",
                "paired",
                str(items / "fcf+fedvlr-headline" / "cold_among_cold"),
                str(items / "fcf-alone-both" / "cold_among_cold"),
                "--json",
            ]
        )
        == 0
    )
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tests"]["ndcg@5"]
    want = paired["backbone alone, both"]["cold_among_cold"]["ndcg@5"]
    assert again["n"] == want["n"] and again["mean_diff"] == pytest.approx(want["mean_diff"])


def test_coldstart_command_fixed_fused_rule_gives_the_backbone_its_plain_rule(tmp_path, capsys):
    from fedvlr_plus.cli import main

    folder = _feature_folder(tmp_path / "fx")
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fcf",
            "--fusion",
            "fedvlr",
            "--with-backbone",
            "--cold-rule",
            "fused-both",
            "--rounds",
            "1",
            "--seeds",
            "1",
            "--dim",
            "8",
            "--local-epochs",
            "1",
            "--no-progress",
            "--metrics",
            "hr@5,ndcg@5",
            "--cold-select",
            "ndcg@5",
            "--json",
        ]
    )
    assert code == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["cold_rule"] == "fused-both" and res["cold_rule_selected_on"] == "fixed by --cold-rule"
    assert res["backbone_alone"]["cold_rule"] == "both"
    assert res["cold_among_cold"] == res["variants"]["fused-both"]["cold_among_cold"]


def test_coldstart_command_user_cold_start(tmp_path, capsys):
    from fedvlr_plus.cli import main

    folder = _feature_folder(tmp_path / "fx")
    out = tmp_path / "report"
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fedavg",
            "--cold-users",
            "0.2",
            "--support",
            "1,3",
            "--support-epochs",
            "2",
            "--rounds",
            "2",
            "--seeds",
            "1",
            "--dim",
            "8",
            "--local-epochs",
            "1",
            "--no-progress",
            "--metrics",
            "hr@5,ndcg@5",
            "--cold-select",
            "ndcg@5",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out.strip().splitlines()[-1])
    uc = res["user_coldstart"]
    assert uc["supports"] == [1, 3] and uc["held_out_users"] == 6 and uc["new_user_start"] == "population"
    # the trained users by history length, with pop on the same users beside the model
    assert res["sparsity"] and all(isinstance(row["pop"]["ndcg@5"], float) for row in res["sparsity"])
    assert "pop –" not in captured.err and "pop: the popularity ranker" in captured.err
    # it says what it wrote and how to repeat it
    assert f"wrote {out}: report.md" in captured.err and f"--config {out / 'config.toml'}" in captured.err
    assert (out / "config.toml").exists()
    assert set(uc["curves"]) == {"model", "pop", "random", "content"}
    assert uc["query_targets"]["1"] == 6 * 6 and uc["query_targets"]["3"] == 6 * 4
    assert (out / "user_coldstart.png").exists() and (out / "user_coldstart.csv").exists()
    # each support size's joining users, one row per user, in the layout `experiment paired` reads
    per_user = pd.read_csv(out / "joining" / "fedavg-N1" / "per_user_test.csv")
    assert list(per_user.columns) == ["user", "hr@5", "ndcg@5"] and len(per_user) == 6
    assert per_user["ndcg@5"].mean() == pytest.approx(uc["curves"]["model"]["1"]["ndcg@5"]["mean"])
    assert (
        main(["experiment", "paired", str(out / "joining" / "fedavg-N1"), str(out / "joining" / "fedavg-N3"), "--json"])
        == 0
    )
    paired = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert paired["tests"]["ndcg@5"]["n"] == 6


def _without_content(folder):
    for name in ("text_features.npy", "image_features.npy"):
        (folder / name).unlink()
    return folder


def test_coldstart_without_item_content_studies_joining_users_without_the_content_row(tmp_path, capsys):
    from fedvlr_plus.cli import main

    folder = _without_content(_feature_folder(tmp_path / "fx"))
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fedavg",
            "--cold-users",
            "0.2",
            "--support",
            "1",
            "--support-epochs",
            "2",
            "--rounds",
            "1",
            "--seeds",
            "1",
            "--dim",
            "8",
            "--local-epochs",
            "1",
            "--no-progress",
            "--metrics",
            "hr@5,ndcg@5",
            "--cold-select",
            "ndcg@5",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    res = json.loads(captured.out.strip().splitlines()[-1])
    assert set(res["user_coldstart"]["curves"]) == {"model", "pop", "random"} and res["views"] == []
    assert "no item content" in captured.err


def test_coldstart_without_item_content_ranks_natural_cold_targets_as_trained(tmp_path, capsys):
    from fedvlr_plus.cli import main

    folder = _without_content(_feature_folder(tmp_path / "fx"))
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fcf",
            "--rounds",
            "1",
            "--seeds",
            "1",
            "--dim",
            "8",
            "--local-epochs",
            "1",
            "--no-progress",
            "--metrics",
            "hr@5,ndcg@5",
            "--cold-select",
            "ndcg@5",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    res = json.loads(captured.out.strip().splitlines()[-1])
    assert res["n_cold_items"] >= 4 and set(res["variants"]) == {"trained"}
    assert set(res["baselines"]) == {"pop", "random", "antipop"}
    assert res["cold_rule_selected_on"] == "no item content: the model as trained"


def test_coldstart_cold_items_without_item_content_is_one_line_naming_the_flag(tmp_path, capsys):
    from fedvlr_plus.cli import main

    folder = _without_content(_feature_folder(tmp_path / "fx"))
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fedavg",
            "--cold-items",
            "0.2",
            "--rounds",
            "1",
            "--seeds",
            "1",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("error: --cold-items: fx has no item content") and "--cold-users" in err[-1]


# ---------------------------------------------------------------------- real data
def test_ku_natural_cold_targets_reference_figures():
    """KU: 16 cold items hold 88 test targets; antipop and pop tie all 16 at the top / among themselves, so a
    cold target's HR@10 among cold items is exactly 10/16 for both (ties scored by their expectation)."""
    from fedvlr_plus.coldstart.experiment import _parts
    from fedvlr_plus.datasets import load

    ku = load(str(shared_data("ku")))
    cold = ku.cold_items()
    assert cold.sum() == 16
    spec = EvalSpec(ks=(10,), metrics=("hr",), keys=("hr@10",))
    anti = _parts(spec, ku, reference_scorer("antipop", ku), cold)
    pop = _parts(spec, ku, reference_scorer("pop", ku), cold)
    assert len(anti["cold_among_cold"]) == 88
    assert anti["cold_among_cold"]["hr@10"].mean() == pytest.approx(10 / 16)
    assert anti["cold_among_all"]["hr@10"].mean() == pytest.approx(10 / 16)
    assert pop["cold_among_cold"]["hr@10"].mean() == pytest.approx(10 / 16)
    assert pop["cold_among_all"]["hr@10"].mean() == 0.0


def test_coldstart_support_epochs_auto_chooses_on_validation_users_and_reports_the_others(tmp_path, capsys):
    from fedvlr_plus.cli import main

    folder = _feature_folder(tmp_path / "fx")
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fedavg",
            "--cold-users",
            "0.2",
            "--support",
            "1,3",
            "--support-epochs",
            "auto",
            "--rounds",
            "2",
            "--seeds",
            "2",
            "--dim",
            "8",
            "--local-epochs",
            "1",
            "--no-progress",
            "--metrics",
            "hr@5,ndcg@5",
            "--cold-select",
            "ndcg@5",
            "--json",
        ]
    )
    assert code == 0
    uc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["user_coldstart"]
    se = uc["support_epochs"]
    assert (se["valid_users"], se["reported_users"]) == (2, 4) and se["metric"] == "ndcg@5"
    for n in ("1", "3"):
        assert [c["seed"] for c in se["chosen"][n]] == [0, 1]
        for c in se["chosen"][n]:
            scores = {int(e): v for e, v in c["valid"].items()}
            tried = sorted(scores)
            assert tried[:4] == [0, 1, 5, 20] and tried[4:] in ([], [50], [50, 100])
            for i in range(4, len(tried)):  # an extension count only while the longest tried was the best
                before = {e: scores[e] for e in tried[:i]}
                assert max(before, key=lambda e: (before[e], -e)) == tried[i - 1]
            assert c["epochs"] == min(e for e, v in scores.items() if v == max(scores.values()))
        # every reported figure, the reference rankers' too, is over the users that did not choose
        assert {curve[n]["ndcg@5"]["n_users"] for curve in uc["curves"].values()} == {4}


def test_joining_users_split_is_seeded_and_disjoint():
    from fedvlr_plus.coldstart.support_epochs import choose_epochs, split_joining_users

    held = np.array([9, 3, 5, 7, 1, 11])
    valid, rest = split_joining_users(held, seed=4)
    assert len(valid) == 2 and not set(valid) & set(rest) and set(valid) | set(rest) == set(held)
    again, _ = split_joining_users(held, seed=4)
    assert np.array_equal(valid, again)
    best, scorer, scores = choose_epochs(lambda e: e, lambda s: {0: 0.1, 1: 0.2, 5: 0.4, 20: 0.4}[s])
    assert (best, scorer) == (5, 5) and scores == {0: 0.1, 1: 0.2, 5: 0.4, 20: 0.4}  # a tie keeps the shorter


def test_choose_epochs_goes_past_the_grid_only_while_its_top_count_is_best():
    from fedvlr_plus.coldstart.support_epochs import choose_epochs

    rising = {0: 0.0, 1: 0.1, 5: 0.2, 20: 0.3, 50: 0.5, 100: 0.4}
    best, _, scores = choose_epochs(lambda e: e, lambda e: rising[e])
    assert best == 50 and scores == rising  # 20 was best, so 50; 50 was best, so 100
    peaked = {0: 0.0, 1: 0.1, 5: 0.3, 20: 0.2, 50: 0.9}
    best, _, scores = choose_epochs(lambda e: e, lambda e: peaked[e])
    assert best == 5 and sorted(scores) == [0, 1, 5, 20]  # 20 was not the best: 50 is never trained
    best, _, scores = choose_epochs(lambda e: e, lambda e: 1.0, extension=())
    assert best == 0 and sorted(scores) == [0, 1, 5, 20]


@pytest.mark.parametrize("epochs", ["auto", "2"])
def test_coldstart_tune_chooses_the_layer_recipe_on_validation_joining_users(tmp_path, capsys, epochs):
    from fedvlr_plus.cli import main
    from fedvlr_plus.coldstart.support_epochs import split_joining_users
    from fedvlr_plus.fedvlr.tuning import RECIPES

    folder = _feature_folder(tmp_path / "fx")
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fedavg",
            "--fusion",
            "fedvlr",
            "--with-backbone",
            "--cold-users",
            "0.2",
            "--support",
            "1",
            "--support-epochs",
            epochs,
            "--rounds",
            "2",
            "--seeds",
            "1",
            "--dim",
            "8",
            "--local-epochs",
            "1",
            "--no-progress",
            "--metrics",
            "hr@5,ndcg@5",
            "--cold-select",
            "ndcg@5",
            "--tune",
            "--json",
        ]
    )
    assert code == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tune = res["tuning"]
    assert [c["name"] for c in tune["candidates"]] == [r.name for r in RECIPES if not (r.unit_scale or r.residual_gate)]
    best = max(c["valid"] for c in tune["candidates"])
    assert tune["selected"] == next(c["name"] for c in tune["candidates"] if c["valid"] == best)
    assert "joining" in tune["split"] and tune["metric"].startswith("ndcg@5")
    users, alone = res["user_coldstart"], res["backbone_alone"]["user_coldstart"]
    if epochs == "auto":  # the chosen recipe, retrained on the same seed, scores what it was chosen by
        assert max(users["support_epochs"]["chosen"]["1"][0]["valid"].values()) == pytest.approx(best, abs=1e-9)
    # the validation third is left out of both models' reported figures, with a fixed epoch count too
    n_valid = len(split_joining_users(np.arange(users["held_out_users"]), 0)[0])
    # paired over the same reported users: the difference is the difference of the two curves' means
    test = users["paired_vs_backbone"]["1"]["ndcg@5"]
    assert test["n"] == users["reported_users"] and 0.0 <= test["t_pvalue"] <= 1.0
    assert test["mean_diff"] == pytest.approx(
        users["curves"]["model"]["1"]["ndcg@5"]["mean"] - alone["curves"]["model"]["1"]["ndcg@5"]["mean"], abs=1e-12
    )
    assert "_per_user" not in users and "_per_user" not in alone
    assert n_valid >= 1 and users["reported_users"] == alone["reported_users"] == users["held_out_users"] - n_valid


def test_item_study_tune_chooses_the_recipe_on_the_figure_it_reports(tmp_path, capsys):
    """In an item study --tune rates each recipe by its validation cold-select metric among cold items under the
    best cold rule, which is how the study then picks its headline rule: the kept recipe's score reappears."""
    from fedvlr_plus.cli import main

    folder = _feature_folder(tmp_path / "fx")
    code = main(
        [
            "coldstart",
            str(folder),
            "--backbone",
            "fcf",
            "--fusion",
            "fedvlr",
            "--fusion-residual",
            "--content-preference",
            "--tune",
            "--rounds",
            "2",
            "--seeds",
            "1",
            "--dim",
            "8",
            "--local-epochs",
            "1",
            "--no-progress",
            "--metrics",
            "hr@5,ndcg@5",
            "--cold-select",
            "ndcg@5",
            "--json",
        ]
    )
    assert code == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    tune = res["tuning"]
    assert "among cold items" in tune["metric"]
    assert [c["name"] for c in tune["candidates"]] == ["default", "fast", "default+dropout", "fast+dropout"]
    kept = next(c["valid"] for c in tune["candidates"] if c["name"] == tune["selected"])
    rules = ("none", "neighbours", "mapping", "both", "fused-neighbours", "fused-mapping", "fused-both")
    assert kept == pytest.approx(max(res["variants"][r]["valid_ndcg_at_5_among_cold"] for r in rules))
    assert res["variants"][res["cold_rule"]]["valid_ndcg_at_5_among_cold"] == pytest.approx(kept)


def test_the_summary_keeps_a_gap_after_its_longest_label_and_names_pop():
    from fedvlr_plus.coldstart.report import format_summary

    cell = {"ndcg@10": {"mean": 0.1, "ci": [0.05, 0.15], "n_users": 3}, "hr@10": {"mean": 0.2, "ci": [0.1, 0.3]}}
    block = {part: cell for part in ("cold_among_cold", "cold_among_all", "warm")}
    result = {
        "dataset": "toy",
        "model": "pfedrec+fedvlr",
        "seeds": [0],
        "metrics": ["hr@10", "ndcg@10"],
        "split": "cold-items",
        "n_cold_items": 4,
        "test_cold_targets": 3,
        "test_targets": 9,
        "cold_rule": "fused-neighbours",
        "cold_rule_selected_on": "valid",
        **block,
        "baselines": {"pop": block},
        "variants": {"none": block, "fused-neighbours": block},
        "sparsity": [{"bucket": "1-10", "n_users": 3, "model": cell, "pop": {"ndcg@10": 0.05}}],
    }
    text = format_summary(result)
    longest = "pfedrec+fedvlr, cold rule fused-neighbours *"
    assert len(longest) > 40  # longer than the column the labels were once padded to
    assert f"{longest}  hr@10 0.2000" in text
    assert "pop: the popularity ranker" in text and "pop 0.0500" in text


def test_an_eval_spec_reads_each_data_objects_targets_once_and_never_a_stale_copy():
    data = synthetic_data(n_users=30, n_items=40, seed=0)
    spec = EvalSpec()
    scorer = reference_scorer("pop", data, seed=0)
    first = spec.run(data, scorer, "test").frame("all")
    pairs = spec._cache["evaluator"][("pairs", "test")]
    again = spec.run(data, scorer, "test").frame("all")
    assert spec._cache["evaluator"][("pairs", "test")] is pairs  # read from the cache, not afresh
    pd.testing.assert_frame_equal(first, again)
    # another data object with fewer test targets: its own targets, not the kept ones
    test = data.inter.index[data.inter["split"].to_numpy() == TEST]
    fewer = data.replace(inter=data.inter.drop(test[::2]).reset_index(drop=True))
    other = spec.run(fewer, reference_scorer("pop", fewer, seed=0), "test").frame("all")
    assert other["n_targets"].sum() == len(fewer.test()) < len(data.test())
