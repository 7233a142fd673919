import math

import numpy as np
import pandas as pd
import pytest
import torch

from fedvlr_plus.alignment.fedmpt import method as M


def _task(n=120, L=4, d=16, T=5, N=3, seed=0, signal=2.0):
    """Synthetic items whose tokens point towards their labels' prompt directions (learnable), plus noise."""
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((L, d)).astype(np.float32)
    labels = (rng.random((n, L)) < 0.3).astype(np.float32)
    labels[labels.sum(1) == 0, 0] = 1
    tokens = rng.standard_normal((n, T, d)).astype(np.float32)
    for i in range(n):
        for c in np.flatnonzero(labels[i]):
            tokens[i, rng.integers(T)] += signal * dirs[c]
    mask = np.ones((n, T), bool)
    mask[::3, -1] = False
    tokens[~mask] = 0
    prompt = (dirs[None] + 0.3 * rng.standard_normal((N, L, d))).astype(np.float32)
    return M.TaggingTask(
        tokens=tokens,
        token_mask=mask,
        side={"pop": rng.standard_normal((n, 2)).astype(np.float32)},
        labels=labels,
        label_names=[f"l{j}" for j in range(L)],
        prompt_emb=prompt,
        base_prompt_emb=dirs.copy(),
        condition_names=[f"c{k}" for k in range(N)],
    )


def test_asymmetric_loss_hand_computed():
    logits = torch.zeros(1, 2)
    y = torch.tensor([[1.0, 0.0]])
    # positive: -(1 - .5)^1 log .5; negative: p_m = .45, -(.45)^2 log(.55)
    expected = 0.5 * math.log(2) - 0.45**2 * math.log(0.55)
    assert M.asymmetric_loss(logits, y).item() == pytest.approx(expected, rel=1e-6)


def test_average_precision_and_metrics_hand_computed():
    assert M.average_precision(np.array([0.9, 0.8, 0.7, 0.6]), np.array([1, 0, 1, 0])) == pytest.approx((1 + 2 / 3) / 2)
    labels = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 1], [1, 0, 1]], np.float32)
    scores = np.array([[0.9, 0.8, 0.1], [0.7, 0.6, 0.2], [0.3, 0.1, 0.9], [0.8, 0.2, 0.4]])
    m = M.multilabel_metrics(scores, labels, co_label={1: 0})
    # predictions (> .5): [1,1,0], [1,1,0], [0,0,1], [1,0,0]
    # label 0: tp 3/3 pred, 3/3 true; label 1: tp 1, pred 2, true 1; label 2: tp 1, pred 1, true 2
    cp, cr = (1 + 0.5 + 1) / 3, (1 + 1 + 0.5) / 3
    assert m["CP"] == pytest.approx(cp) and m["CR"] == pytest.approx(cr)
    assert m["CF1"] == pytest.approx(2 * cp * cr / (cp + cr))
    assert m["OP"] == pytest.approx(5 / 6) and m["OR"] == pytest.approx(5 / 6)
    # spurious: label 1 absent while its co-label 0 present -> items 1 and 3; label 1 fires on item 1 only
    assert m["spurious_eligible"] == 2 and m["spurious_rate"] == pytest.approx(0.5)
    # label 1's score on its positive (.8) beats both co-label-only items (.6, .2): AUC 1
    assert m["co_label_auc"] == pytest.approx(1.0)
    m2 = M.multilabel_metrics(scores, labels, co_label={2: 0})
    # label 2: positives score .9 and .4; co-label-only items (0 and 1) score .1 and .2 -> AUC 1
    assert m2["co_label_auc"] == pytest.approx(1.0)
    m3 = M.multilabel_metrics(np.where(np.arange(3) == 2, [[0.5], [0.5], [0.1], [0.5]], scores), labels, {2: 0})
    # now label 2 scores .5, .5 on the co-label-only items and .1, .5 on its positives: (0 + .5 + 0 + .5) / 4
    assert m3["co_label_auc"] == pytest.approx(0.25)
    # rank-matched: label 1 (one positive) is predicted on its top-1 item, item 0, a true positive -> 0 of 2;
    # label 2 (two positives) in m3 on its top-2, items 0 and 1 (tie at .5 broken by order), both co-label-only
    assert m["spurious_rate_at_r"] == 0.0 and m3["spurious_rate_at_r"] == pytest.approx(1.0)
    ap0 = 1.0
    ap1 = 1.0  # the only positive of label 1 ranks first
    ap2 = (1 / 1 + 2 / 2) / 2  # scores .9 (pos), .4 (pos) rank 1 and 2
    assert m["mAP"] == pytest.approx((ap0 + ap1 + ap2) / 3)


def test_usual_co_labels_and_kmeans_clients():
    y = np.array([[1, 1, 0]] * 6 + [[0, 0, 1]] * 6, np.float32)
    assert M.usual_co_labels(y, min_count=5) == {0: 1, 1: 0}
    assign = M.kmeans_label_clients(y, 2, seed=0)
    assert len(set(assign[:6])) == 1 and len(set(assign[6:])) == 1 and assign[0] != assign[6]
    with pytest.raises(ValueError):
        M.kmeans_label_clients(y, 13)


def test_kmeans_clients_with_fewer_distinct_label_vectors_than_clients_fills_every_cluster():
    """A catalogue whose items carry one of three labels each, dealt to five clients: two clusters start empty,
    and filling the second used to empty the first again (a NaN centre, numpy warnings, a client without items)."""
    import warnings

    y = np.repeat(np.eye(3, dtype=np.float32), [10, 6, 4], axis=0)
    for seed in range(5):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assign = M.kmeans_label_clients(y, 5, seed=seed)
        assert sorted(set(assign)) == [0, 1, 2, 3, 4]
        # a cluster holds one label vector: splitting identical items never mixes two labels in one client
        assert all(len({tuple(r) for r in y[assign == j]}) == 1 for j in range(5))


@pytest.mark.parametrize("variant", M.VARIANTS)
def test_forward_shapes_and_ot_marginals(variant):
    task = _task()
    cfg = M.MPTConfig(variant=variant, rank=4, ot_tol=1e-4, ot_iter=200)
    p = M.init_params(task, cfg, 0)
    logits, diag = M.forward(p, task, np.arange(10), cfg)
    assert logits.shape == (10, 4) and torch.isfinite(logits).all()
    if variant in ("prompts_ot", "fedmpt"):
        assert diag["ot_marginal_error"] < 1e-4
    if variant in ("prompts_gate", "fedmpt"):
        # a zero-initialised gate starts uniform over the 3 conditions
        assert diag["gate_entropy"] == pytest.approx(math.log(3), abs=1e-5)
    n_cond = p["adapter_down"].shape[0]
    assert n_cond == (1 if variant == "baseline" else 3)


@pytest.mark.parametrize("raters", [False, True])
def test_upload_carries_parameters_only(raters):
    task = _task(n=37)
    if raters:  # rater tokens are inputs too: only their shared map travels
        task.raters = np.random.default_rng(2).standard_normal((37, 6, 5)).astype(np.float32)
        task.rater_mask = np.ones((37, 6), bool)
    cfg = M.MPTConfig(variant="fedmpt", rank=4)
    p = M.init_params(task, cfg, 0)
    client = M.TaggingClient(3, task, np.arange(37), cfg)
    up = client.fit(p, {"round": 0})
    assert set(up.arrays) == set(p) == set(M.param_specs(task, cfg))
    assert ("rater_w" in up.arrays) == raters
    for k, v in up.arrays.items():
        assert tuple(v.shape) == tuple(p[k].shape)  # nothing per item, no tokens, no labels
    assert up.rows == {} and up.num_examples == 37
    msg = up.to_message()
    assert not any(a.shape and a.shape[0] == 37 for a in msg["arrays"].values())
    assert any(not torch.equal(up.arrays[k], p[k]) for k in p)  # it did train
    ev = client.evaluate(up.arrays, {})
    assert 0 <= ev["mAP"] <= 1 and ev["n"] == 37


def test_federated_training_learns_the_synthetic_labels():
    task = _task(n=200, signal=3.0)
    ids = np.arange(200)
    train, test = M.split_items(ids, 0.25, 0)
    assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == 200
    prior = task.labels[test].mean(0).mean()
    res = M.train_federated(
        task, train, test, M.MPTConfig(variant="fedmpt", rank=4, lr=1e-2), n_clients=3, rounds=6, seed=0
    )
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    assert res.test["mAP"] > prior + 0.3  # far above what chance ranking gives
    assert 0 < res.test["gate_entropy"] <= math.log(3) + 1e-6


def _tiny_data():
    from fedvlr_plus.datasets import InteractionData

    users = [0, 0, 1, 1, 2, 2, 2]
    items = [0, 1, 1, 2, 0, 2, 3]
    d = InteractionData.from_raw("tiny", users, items, rating=[5, 3, 4, 1, 2, 5, 4], timestamp=np.arange(7))
    d.items = pd.DataFrame(
        {
            "title": ["Blue Sky", "Red Sun", "", "Grey Rain"],
            "description": ["", "", "a film about dogs", ""],
            "categories": [["A", "B"], ["A"], ["B", "C"], ["C"]],
            "release_year": [1990, 1985, "unknown", 2001],
        }
    )
    return d


def test_build_task_with_stub_encoders():
    data = _tiny_data()
    seen = []

    def tokens(texts):
        seen.extend(texts)
        return [np.ones((len(t.split()) + 2, 8), np.float32) for t in texts]

    def sentences(texts):
        return np.random.default_rng(0).standard_normal((len(texts), 8)).astype(np.float32)

    task, ids = M.build_task(data, tokens, sentences, proj_dim=None, min_count=2)
    assert task.label_names == ["A", "B", "C"]
    np.testing.assert_array_equal(task.labels, [[1, 1, 0], [1, 0, 0], [0, 1, 1], [0, 0, 1]])
    assert seen[2] == "a film about dogs"  # no title -> description
    assert task.token_mask.sum(1).tolist() == [4, 4, 6, 4]
    assert task.prompt_emb.shape == (5, 3, 8) and task.base_prompt_emb.shape == (3, 8)
    assert set(task.side) >= {"year", "ratings", "popularity"}
    assert list(ids) == [0, 1, 2, 3]
    # labels never feed the side features: permuting categories leaves them unchanged
    data2 = _tiny_data()
    data2.items["categories"] = [["C"], ["B", "C"], ["A"], ["A", "B"]]
    task2, _ = M.build_task(data2, tokens, sentences, proj_dim=None)
    for g in task.side:
        np.testing.assert_array_equal(task.side[g], task2.side[g])


def test_too_few_labels_is_a_clear_error():
    data = _tiny_data()
    data.items["categories"] = [["A"], ["A"], ["A"], []]
    with pytest.raises(ValueError, match="fewer than 2 usable labels"):
        M.item_label_matrix(data)


def test_shipped_conditions_and_real_ml100k_labels():
    spec = M.load_conditions()
    assert len(spec["conditions"]) >= 4 and "{label}" in spec["baseline"]
    from fedvlr_plus import datasets

    data = datasets.load("ml-100k")
    y, names = M.item_label_matrix(data)
    assert len(names) == 19 and y.shape == (1682, 19)
    co = M.usual_co_labels(y)
    assert names[co[names.index("Animation")]] == "Children's"
    cond, base = M.prompt_sentences(names, spec)
    assert len(cond) == len(spec["conditions"]) and "science fiction" in " ".join(base)


def test_condition_file_is_checked(tmp_path):
    good = tmp_path / "c.json"
    good.write_text(
        '{"baseline": "a {label} magazine", "conditions": [{"name": "topic", "template": "{label} topics"}]}'
    )
    assert M.load_conditions(good)["conditions"][0]["name"] == "topic"
    bad = tmp_path / "b.json"
    bad.write_text('{"baseline": "x", "conditions": [{"name": "t", "template": "no placeholder"}]}')
    with pytest.raises(ValueError, match="conditions\\[0\\]"):
        M.load_conditions(bad)
    (tmp_path / "n.json").write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        M.load_conditions(tmp_path / "n.json")


def test_global_local_score_reduces_to_the_pooled_score_without_the_ot_term():
    task = _task()
    idx = np.arange(12)
    full = M.MPTConfig(variant="fedmpt", rank=4, local_weight=0.0)
    gate_only = M.MPTConfig(variant="prompts_gate", rank=4)
    p = M.init_params(task, full, 0)
    # same parameter set (both gated); with local_weight 0 the OT term vanishes and only the pooled score is left
    assert set(p) == set(M.init_params(task, gate_only, 0))
    assert torch.allclose(M.forward(p, task, idx, full)[0], M.forward(p, task, idx, gate_only)[0], atol=1e-6)
    # local_weight 1 adds the OT score on top; without the global token the score is the OT score alone
    both = M.forward(p, task, idx, M.MPTConfig(variant="fedmpt", rank=4, local_weight=1.0))[0]
    local = M.forward(p, task, idx, M.MPTConfig(variant="fedmpt", rank=4, global_local=False))[0]
    pooled = M.forward(p, task, idx, gate_only)[0]
    b = p["bias"]
    assert torch.allclose(both - b, (pooled - b) + (local - b), atol=1e-5)
    assert not torch.allclose(both, pooled, atol=1e-3)


def test_cached_encoders_reuse_and_key_on_the_texts(tmp_path):
    calls = []

    def tok(texts):
        calls.append(("t", list(texts)))
        return [np.full((len(t), 3), float(len(t)), np.float32) for t in texts]

    def sen(texts):
        calls.append(("s", list(texts)))
        return np.arange(len(texts) * 3, dtype=np.float32).reshape(-1, 3)

    t1, s1 = M.cached_encoders(tok, sen, tmp_path)
    a = t1(["ab", "xyz"])
    b = s1(["ab", "xyz"])
    t2, s2 = M.cached_encoders(tok, sen, tmp_path)  # a fresh wrapper reads what the first one wrote
    a2, b2 = t2(["ab", "xyz"]), s2(["ab", "xyz"])
    assert len(calls) == 2  # the second round came from the cache
    assert [x.shape for x in a2] == [(2, 3), (3, 3)] and all(np.array_equal(x, y) for x, y in zip(a, a2))
    assert np.array_equal(b, b2)
    t2(["ab", "xyw"])  # other texts: encoded afresh
    assert len(calls) == 3 and calls[-1] == ("t", ["ab", "xyw"])
    assert not list(tmp_path.glob(".*tmp*"))  # no temp files left behind


def test_f1_thresholds_from_summed_client_counts_hand_computed():
    grid = np.array([0.3, 0.5, 0.7])
    # label 0: two clients' counts sum to pred (6, 4, 1), tp (3, 3, 1), 4 positives -> F1 0.6, 0.75, 0.4 -> 0.5
    # label 1: pred (2, 1, 0), tp (2, 1, 0), 2 positives -> F1 1.0, 0.667, 0 -> 0.3; label 2: no positive -> 0.5
    c1 = {
        "pred": np.array([[4, 1, 0], [3, 1, 0], [1, 0, 0.0]]),
        "tp": np.array([[2, 1, 0], [2, 1, 0], [1, 0, 0.0]]),
        "pos": np.array([3, 1, 0.0]),
    }
    c2 = {
        "pred": np.array([[2, 1, 0], [1, 0, 0], [0, 0, 0.0]]),
        "tp": np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0.0]]),
        "pos": np.array([1, 1, 0.0]),
    }
    thr = M.f1_thresholds([c1, c2], grid)
    np.testing.assert_allclose(thr, [0.5, 0.3, 0.5])
    # per-label thresholds in the metrics: item 0 scores (0.4, 0.4) with thresholds (0.5, 0.3) predicts label 1 only
    out = M.multilabel_metrics(
        np.array([[0.4, 0.4], [0.6, 0.2]]), np.array([[0, 1], [1, 0.0]]), {}, threshold=np.array([0.5, 0.3])
    )
    assert out["OP"] == 1.0 and out["OR"] == 1.0


def test_threshold_counts_and_both_decision_rules_are_reported():
    task = _task(n=90)
    cfg = M.MPTConfig(variant="baseline", rank=4, threshold="f1")
    p = M.init_params(task, cfg, 0)
    train = np.arange(60)
    cl = [M.TaggingClient(c, task, train[c::2], cfg) for c in range(2)]
    counts = [c.threshold_counts(p, M.THRESHOLD_GRID) for c in cl]
    np.testing.assert_allclose(sum(c["pos"] for c in counts), task.labels[train].sum(0))
    assert all((c["tp"] <= c["pred"]).all() and c["pred"].shape == (len(M.THRESHOLD_GRID), 4) for c in counts)
    # predicted counts cannot grow with the threshold
    assert all((np.diff(c["pred"], axis=0) <= 0).all() for c in counts)
    res = M.train_federated(task, train, np.arange(60, 90), cfg, n_clients=2, rounds=1, seed=0)
    assert res.test["decision_rule"] == "f1" and set(res.test["rules"]) == {"fixed", "f1"}
    assert res.test["CF1"] == res.test["rules"]["f1"]["CF1"] and len(res.test["thresholds"]) == 4
    with pytest.raises(ValueError):
        M.MPTConfig(threshold="best")


def test_column_side_tokens_one_token_per_feature_column():
    task = _task(n=20)
    task.side["age"] = np.random.default_rng(1).standard_normal((20, 3)).astype(np.float32)
    cfg = M.MPTConfig(variant="fedmpt", rank=4, side_tokens="column")
    p = M.init_params(task, cfg, 0)
    idx = np.array([2, 5, 7])
    tok, mask = M.item_tokens(p, task, idx)
    assert tok.shape == (3, 5 + 2 + 3, 16) and mask[:, 5:].all()
    # the 4th side token is column 1 of "age": x_k e_k + f_k
    want = torch.from_numpy(task.side["age"][idx, 1])[:, None] * p["side_e.age"][1] + p["side_f.age"][1]
    assert torch.allclose(tok[:, 5 + 2 + 1], want)
    assert M.forward(p, task, idx, cfg)[0].shape == (3, 4)
    grouped = M.item_tokens(M.init_params(task, M.MPTConfig(rank=4), 0), task, idx)[0]
    assert grouped.shape == (3, 5 + 2, 16)


def test_label_local_weight_starts_at_lambda_and_is_learned_per_label():
    task = _task(n=40)
    fixed = M.MPTConfig(variant="fedmpt", rank=4, local_weight=0.7)
    per = M.MPTConfig(variant="fedmpt", rank=4, local_weight=0.7, label_local_weight=True)
    p = M.init_params(task, per, 0)
    assert torch.allclose(p["local_w"], torch.full((4,), 0.7))
    q = {k: v for k, v in p.items() if k != "local_w"}
    idx = np.arange(12)
    assert torch.allclose(M.forward(p, task, idx, per)[0], M.forward(q, task, idx, fixed)[0], atol=1e-6)
    up = M.TaggingClient(0, task, np.arange(40), per).fit(p, {"round": 0})
    assert not torch.allclose(up.arrays["local_w"], p["local_w"])  # trained, one value per label
    assert "local_w" not in M.param_specs(task, M.MPTConfig(variant="baseline", label_local_weight=True))


def test_both_side_tokens_feed_columns_to_ot_and_groups_to_the_pool():
    task = _task(n=20)
    task.side["age"] = np.random.default_rng(1).standard_normal((20, 3)).astype(np.float32)
    both = M.MPTConfig(variant="fedmpt", rank=4, side_tokens="both", ot_tol=1e-4, ot_iter=200)
    p = M.init_params(task, both, 0)
    assert {"side_w.age", "side_e.age"} <= set(p)
    assert "side_e.age" not in M.param_specs(task, M.MPTConfig(variant="baseline", side_tokens="both"))
    idx = np.arange(6)
    # the pooled-only score (lambda 0) ignores the column tokens: it equals the group-token model's
    zero = M.MPTConfig(variant="fedmpt", rank=4, side_tokens="both", local_weight=0.0)
    group = M.MPTConfig(variant="fedmpt", rank=4, side_tokens="group", local_weight=0.0)
    q = {k: v for k, v in p.items() if not k.startswith(("side_e.", "side_f."))}
    assert torch.allclose(M.forward(p, task, idx, zero)[0], M.forward(q, task, idx, group)[0], atol=1e-6)
    # the OT term reads the column tokens: changing a column direction moves the full score
    p2 = dict(p, **{"side_e.age": p["side_e.age"] + 1.0})
    assert not torch.allclose(M.forward(p, task, idx, both)[0], M.forward(p2, task, idx, both)[0])
    assert M.forward(p, task, idx, both)[1]["ot_marginal_error"] < 1e-4


def test_unbalanced_ot_keeps_the_token_marginal_and_changes_the_score():
    task = _task(n=20)
    bal = M.MPTConfig(variant="fedmpt", rank=4, ot_tol=1e-5, ot_iter=500, ot_rho=None)
    unb = M.MPTConfig(variant="fedmpt", rank=4, ot_tol=1e-5, ot_iter=500, ot_rho=0.1)
    p = M.init_params(task, bal, 0)
    idx = np.arange(8)
    lb, db = M.forward(p, task, idx, bal)
    lu, du = M.forward(p, task, idx, unb)
    assert du["ot_marginal_error"] < 1e-5 and db["ot_marginal_error"] < 1e-5
    assert not torch.allclose(lb, lu)


def test_rater_tokens_one_token_per_rater_label_free():
    data = _tiny_data()
    tok, mask = M.rater_tokens(data, max_raters=4, dim=32)
    assert tok.shape == (4, 4, 3) and mask.sum(1).tolist() == [2, 2, 2, 1]  # rank capped at min(users, items) - 1
    # last column: the rating centred on its rater's mean, standardised over all interactions
    dev = np.array([5 - 4, 3 - 4, 4 - 2.5, 1 - 2.5, 2 - 11 / 3, 5 - 11 / 3, 4 - 11 / 3])
    z = (dev - dev.mean()) / dev.std()
    np.testing.assert_allclose(tok[0, :2, -1], [z[0], z[4]], rtol=1e-5)  # item 0: users 0 and 2, in row order
    np.testing.assert_allclose(tok[3, 0, -1], z[6], rtol=1e-5)
    assert not tok[3, 1:].any()  # padding stays zero
    # the user part is the rater's own embedding, the same in every item it rated
    np.testing.assert_array_equal(tok[0, 0, :-1], tok[1, 0, :-1])  # user 0 in items 0 and 1
    assert np.abs(tok[0, 0, :-1] - tok[0, 1, :-1]).max() > 1e-3  # users 0 and 2 differ
    # capped: a seeded sample of the raters
    tok1, mask1 = M.rater_tokens(data, max_raters=1)
    assert mask1.sum(1).tolist() == [1, 1, 1, 1]
    assert any(np.allclose(tok1[0, 0], t) for t in tok[0, :2])
    # labels never enter: permuting the categories leaves the tokens unchanged
    data2 = _tiny_data()
    data2.items["categories"] = [["C"], ["B", "C"], ["A"], ["A", "B"]]
    np.testing.assert_array_equal(M.rater_tokens(data2, max_raters=4)[0], tok)


def test_rater_tokens_feed_every_variant_and_can_be_switched_off():
    task = _task(n=30)
    rng = np.random.default_rng(1)
    task.raters = rng.standard_normal((30, 6, 5)).astype(np.float32)
    task.rater_mask = np.ones((30, 6), bool)
    task.rater_mask[:, 4:] = False  # every item has 4 raters
    idx = np.arange(8)
    for variant in ("baseline", "fedmpt"):
        on = M.MPTConfig(variant=variant)
        p = M.init_params(task, on, seed=0)
        assert p["rater_w"].shape == (task.dim, 5)
        tok, mask = M.item_tokens(p, task, idx)
        plain = M.item_tokens(M.init_params(task, M.MPTConfig(variant=variant, rater_tokens=False), 0), task, idx)
        assert tok.shape[1] == plain[0].shape[1] + 4 and mask[:, -4:].all()  # batch-wide padding trimmed
        # the rater tokens are a shared linear map of the rater rows
        want = torch.from_numpy(task.raters[idx, :4]) @ p["rater_w"].T + p["rater_b"]
        torch.testing.assert_close(tok[:, -4:], want)
        logits, _ = M.forward(p, task, idx, on)
        assert logits.shape == (8, task.labels.shape[1]) and torch.isfinite(logits).all()


def test_align_fedmpt_command_end_to_end_with_rater_tokens(tmp_path, capsys, monkeypatch):
    """The command on the real ml-100k (inside the recbole wheel) with stub text encoders: the JSON contract."""
    import json

    from _shared import stub_minilm_encoders

    from fedvlr_plus.cli import main

    stub_minilm_encoders(monkeypatch, M)
    out = tmp_path / "mpt.json"
    assert (
        main(
            [
                "align",
                "fedmpt",
                "ml-100k",
                "--rounds",
                "1",
                "--no-ablation",
                "--raters",
                "4",
                "--proj-dim",
                "0",
                "--cache-dir",
                "",
                "--json",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["raters"] == 4 and rep["ot_rho"] == 1.0 and rep["evaluated_on"] == "test"
    for row in ("baseline", "fedmpt"):
        for k in ("mAP", "CF1", "OF1", "spurious_rate"):
            assert 0.0 <= rep[row][k] <= 1.0
    assert rep["ablation"] == {"prompts+ot+gate": rep["fedmpt"]}
    assert json.loads(out.read_text())["fedmpt"] == rep["fedmpt"]  # --out holds the same report
