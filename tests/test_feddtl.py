import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fedvlr_plus.alignment.feddtl import method as T
from fedvlr_plus.alignment.grpo import group_advantages


def _task(n_items=40, n_users=24, d=8, seed=0):
    """Users with a taste direction; their histories are the items closest to it (learnable structure)."""
    rng = np.random.default_rng(seed)
    content = rng.standard_normal((n_items, d)).astype(np.float32)
    content /= np.linalg.norm(content, axis=1, keepdims=True)
    warm, cold = np.arange(32), np.arange(32, 40)
    hist, wt, ct = [], np.full(n_users, -1), np.full(n_users, -1)
    for u in range(n_users):
        taste = rng.standard_normal(d)
        order = np.argsort(-(content @ taste))
        w = [i for i in order if i in set(warm)][:7]
        c = [i for i in order if i in set(cold)]
        hist.append(np.sort(np.array(w[1:], dtype=np.int64)))
        wt[u], ct[u] = w[0], c[0]
    return T.RecTask(
        content=content,
        histories=hist,
        warm_target=wt,
        cold_target=ct,
        warm_items=warm,
        cold_items=cold,
        user_genre=np.arange(n_users) % 3,
    )


def test_zero_noise_gives_no_advantage_signal_and_noise_gives_some():
    g = torch.Generator().manual_seed(0)
    u = F.normalize(torch.randn(64, 8, generator=g), dim=-1)
    items = F.normalize(torch.randn(100, 8, generator=g), dim=-1)
    target = torch.randint(0, 100, (64, 1), generator=g)
    a0 = T.noisy_candidates(u, items, 6, 0.0, g)
    assert (a0 == a0[:, :1]).all()  # every candidate is the argmax
    assert torch.all(group_advantages((a0 == target).float()) == 0)
    a1 = T.noisy_candidates(u, items, 6, 0.3, g)
    assert (a1 != a1[:, :1]).any()

    task = _task()
    cfg0 = T.DTLConfig(sigma=0.0, group=4, rl_candidates=10, lr=1e-2)
    p = T.init_params(task.dim, cfg0.rank, 0)
    c0 = T.DTLClient(0, task, np.arange(24), cfg0, seed=0)
    c0.fit(p, {"round": 0, "stage": "sft"})
    up = c0.fit(p, {"round": 1, "stage": "rl"})
    assert up.metrics["groups_with_signal"] == 0.0
    cfg1 = T.DTLConfig(sigma=0.5, group=8, rl_candidates=10, lr=1e-2)
    c1 = T.DTLClient(0, task, np.arange(24), cfg1, seed=0)
    assert c1.fit(p, {"round": 1, "stage": "rl"}).metrics["groups_with_signal"] > 0.0


def test_uplink_carries_adapters_and_normalised_prototypes_only():
    task = _task()
    cfg = T.DTLConfig(per_user=3)
    p = T.init_params(task.dim, cfg.rank, 0)
    users = np.arange(0, 24, 2)
    client = T.DTLClient(1, task, users, cfg, seed=0)
    up = client.fit(p, {"round": 0, "stage": "sft"})
    assert set(up.arrays) == {"user_down", "user_up", "proto", "proto_n"} and set(up.rows) == {"proto", "proto_n"}
    assert up.arrays["user_down"].shape == p["user_down"].shape
    proto, rows = up.arrays["proto"], up.rows["proto"].numpy()
    assert torch.allclose(proto.norm(dim=-1), torch.ones(len(proto)), atol=1e-5)
    trained = np.unique(np.concatenate([task.histories[u] for u in users]))
    assert set(rows) <= set(trained) and len(rows) == len(np.unique(rows))  # one row per item, never per user
    assert not set(rows) & set(task.cold_items)
    msg = up.to_message()
    assert set(msg["arrays"]) == {"user_down", "user_up", "proto", "proto_n"}
    assert up.num_examples == sum(min(3, len(task.histories[u])) for u in users)
    # one count per prototype (how many of the round's examples it averages), nothing per user
    assert up.arrays["proto_n"].shape == (len(rows),) and float(up.arrays["proto_n"].sum()) == up.num_examples
    both = client.fit(p, {"round": 0, "stage": "sft", "train_item_tower": True})
    assert set(both.arrays) == {"user_down", "user_up", "item_down", "item_up"} and both.rows == {}


def test_server_alignment_lowers_ce_on_uploaded_embeddings():
    task = _task()
    cfg = T.DTLConfig(server_steps=30, server_lr=5e-2)
    p = T.init_params(task.dim, cfg.rank, 0)
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(0, 32)
    proto = F.normalize(torch.randn(32, task.dim, generator=g), dim=-1)  # not yet aligned with the items
    warm = torch.from_numpy(task.content[task.warm_items])

    def ce(q):
        return float(F.cross_entropy(proto @ T.item_vectors(q, warm).T / cfg.tau, rows))

    q, losses = T.server_align(p, [(proto, rows)], task, cfg)
    assert ce(q) < ce(p) - 0.1 and losses[-1] < losses[0]
    for k in T.USER_PARAMS:
        assert torch.equal(q[k], p[k])  # the server trains its own tower only


def test_dirichlet_split_is_label_skewed_and_covers_every_client():
    labels = np.repeat(np.arange(4), 100)
    skewed = T.dirichlet_split(labels, 5, 0.1, seed=0)
    flat = T.dirichlet_split(labels, 5, 1000.0, seed=0)
    assert len(np.unique(skewed)) == 5 and len(np.unique(flat)) == 5

    def top_share(a):  # mean share of each label's users held by its largest client
        return np.mean([np.bincount(a[labels == g], minlength=5).max() / 100 for g in range(4)])

    assert top_share(skewed) > 0.6 > 0.3 > top_share(flat)


def test_evaluate_users_hand_computed():
    content = np.eye(4, dtype=np.float32)
    content[3] = [0.8, 0.6, 0, 0]
    task = T.RecTask(
        content=content,
        histories=[np.array([0])],
        warm_target=np.array([3]),
        cold_target=np.array([2]),
        warm_items=np.array([0, 1, 3]),
        cold_items=np.array([2]),
        user_genre=np.zeros(1, np.int64),
    )
    p = T.init_params(4, 2, 0)  # zero up-projections: both towers are the identity
    res = T.evaluate_users(p, task, np.array([0]), T.DTLConfig(), ks=(1, 2), among="all")
    # scores: item 0 masked, item 3 = .8, items 1 and 2 = 0 -> warm target 3 ranks first; cold target 2 has
    # one strictly better item (3) and a tie (1) -> rank 1 (ties counted optimistically by ">")
    assert res["warm"]["hr@1"] == 1.0 and res["warm"]["ndcg@1"] == 1.0
    assert res["cold"]["hr@1"] == 0.0 and res["cold"]["hr@2"] == 1.0
    assert res["cold"]["ndcg@2"] == pytest.approx(1 / np.log2(3))
    # base-to-novel protocol: the cold target competes with cold items only (here just itself) -> rank 0;
    # the warm target with warm items only (item 1 at 0 < .8) -> still rank 0
    own = T.evaluate_users(p, task, np.array([0]), T.DTLConfig(), ks=(1,))
    assert own["cold"]["hr@1"] == 1.0 and own["warm"]["hr@1"] == 1.0
    content2 = content.copy()
    content2[2] = [0.9, 0.1, 0, 0]  # a cold item closer to the user than the warm target
    task2 = T.RecTask(
        content=content2,
        histories=task.histories,
        warm_target=task.warm_target,
        cold_target=np.array([-1]),
        warm_items=task.warm_items,
        cold_items=task.cold_items,
        user_genre=task.user_genre,
    )
    assert T.evaluate_users(p, task2, np.array([0]), T.DTLConfig(), ks=(1,), among="all")["warm"]["hr@1"] == 0.0
    assert T.evaluate_users(p, task2, np.array([0]), T.DTLConfig(), ks=(1,))["warm"]["hr@1"] == 1.0
    with pytest.raises(ValueError):
        T.evaluate_users(p, task, np.array([0]), T.DTLConfig(), among="some")


@pytest.mark.parametrize("among", ["own", "all"])
def test_evaluation_in_blocks_of_users_gives_the_figures_of_one_block(among):
    task = _task(n_items=40, n_users=24)
    task.cold_target[::5] = -1  # some users without a cold target
    g = torch.Generator().manual_seed(1)
    p = {k: v + 0.2 * torch.randn(v.shape, generator=g) for k, v in T.init_params(task.dim, 4, 0).items()}
    users = np.arange(24)
    whole = T.evaluate_users(p, task, users, T.DTLConfig(), ks=(1, 5), among=among, block=len(users))
    for block in (1, 5, 7):
        assert T.evaluate_users(p, task, users, T.DTLConfig(), ks=(1, 5), among=among, block=block) == whole
    assert whole["cold"]["n"] == 19 and 0 < whole["warm"]["hr@5"] < 1


def test_build_task_keeps_cold_items_out_of_training():
    from fedvlr_plus.datasets import InteractionData

    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(6), 5)
    items = np.concatenate([rng.choice(10, 5, replace=False) for _ in range(6)])
    d = InteractionData.from_raw("toy", users, items, timestamp=np.arange(30), item_order=np.arange(10))
    d.items = pd.DataFrame(
        {
            "title": [f"m{i}" for i in range(10)],
            "categories": [["A"] if i < 5 else ["B", "C"] for i in range(10)],
            "release_year": [1990 + i for i in range(10)],
        }
    )
    content = rng.standard_normal((10, 4))
    task = T.build_task(d, content, cold_share=0.3, seed=0)
    cold = set(task.cold_items.tolist())
    assert len(cold) == 3 and not cold & set(task.warm_items.tolist())
    for u, h in enumerate(task.histories):
        assert not set(h.tolist()) & cold
        assert task.warm_target[u] == -1 or (task.warm_target[u] not in cold and task.warm_target[u] not in h)
        assert task.cold_target[u] == -1 or task.cold_target[u] in cold
    assert np.allclose(np.linalg.norm(task.content, axis=1), 1)
    assert T.item_texts(d)[6] == "m6. B, C. 1996"
    # dominant label: user with items only from A gets A's index
    dom = T.dominant_labels(d, [np.array([0, 1]), np.array([6, 7, 8])])
    assert dom[0] != dom[1]


@pytest.mark.parametrize("method", T.METHODS)
def test_every_method_trains_end_to_end(method):
    task = _task()
    cfg = T.DTLConfig(rl_candidates=10, group=4, sigma=0.3)
    res = T.train(task, method, cfg, n_clients=3, alpha=1.0, rounds=3, sft_rounds=1, seed=0)
    for kind in ("warm", "cold"):
        assert 0.0 <= res.test[kind]["hr@10"] <= 1.0 and res.test[kind]["n"] == 24
    stages = [h["stage"] for h in res.history]
    assert stages == (["sft", "rl", "rl"] if method == "feddtl" else ["sft"] * 3)
    if method != "fedavg_both":
        assert all(h["server_loss_last"] <= h["server_loss_first"] + 1e-6 for h in res.history)
    with pytest.raises(ValueError):
        T.train(task, "nope", cfg)


@pytest.mark.parametrize("method", T.METHODS)
def test_a_client_without_examples_trains_nothing_and_the_round_goes_on(method):
    """A tiny client of a many-client split can hold only users with one history item (no example to learn):
    it takes no step, and the round's loss and reward are the means of the clients that did."""
    task = _task()
    alone = task.user_genre == 2  # with alpha 0.01 and seed 0, client 0 holds exactly these users
    task.histories = [h[:1] if alone[u] else h for u, h in enumerate(task.histories)]
    assert set(T.dirichlet_split(task.user_genre, 3, 0.01, 0)[alone]) == {0}
    cfg = T.DTLConfig(rl_candidates=10, group=4, sigma=0.3)
    res = T.train(task, method, cfg, n_clients=3, alpha=0.01, rounds=3, sft_rounds=1, seed=0)
    assert all(np.isfinite(h["loss"]) and h["loss"] > 0 for h in res.history)
    if method == "feddtl":
        assert all(0.0 <= h["reward"] <= 1.0 for h in res.history if h["stage"] == "rl")
    assert res.test["warm"]["n"] == len(task.histories)


def test_round_means_skip_clients_that_took_no_step():
    ups = [
        T.ClientUpdate(0, "params", {}, metrics={"loss": 2.0, "steps": 3, "reward": 0.5}),
        T.ClientUpdate(1, "params", {}, metrics={"loss": 0.0, "steps": 0}),
        T.ClientUpdate(2, "params", {}, metrics={"loss": 4.0, "steps": 1, "reward": 0.1}),
    ]
    assert T._round_mean(ups, "loss") == pytest.approx(3.0)
    assert T._round_mean(ups, "reward") == pytest.approx(0.3)
    assert T._round_mean(ups[1:2], "reward") == 0.0


def test_pooled_weights_each_group_by_its_targets():
    a = {"warm": {"n": 3, "hr@10": 1.0}, "cold": {"n": 0, "hr@10": 0.0}}
    b = {"warm": {"n": 1, "hr@10": 0.0}, "cold": {"n": 2, "hr@10": 0.5}}
    out = T._pooled([a, b])
    assert out["warm"] == {"n": 4, "hr@10": 0.75} and out["cold"] == {"n": 2, "hr@10": 0.5}


@pytest.mark.parametrize("method", ["fedavg_both", "decoupled_sft"])
def test_fedavg_both_averages_the_client_tower_and_decoupling_keeps_it_local(method):
    task = _task()
    res = T.train(task, method, T.DTLConfig(per_user=4), n_clients=3, alpha=0.5, rounds=2, sft_rounds=2, seed=0)
    w = torch.tensor(res.client_examples, dtype=torch.float64)
    both = method == "fedavg_both"
    averaged = T.USER_PARAMS + (T.ITEM_PARAMS if both else ())
    for k in averaged:  # the global tower is the example-weighted mean of the clients' last local towers
        mean = sum(wi * c[k].double() for wi, c in zip(w, res.client_params)) / w.sum()
        assert torch.allclose(res.params[k].double(), mean, atol=1e-5), k
    assert set(res.client_params[0]) == set(averaged)
    # the client towers differ from one another (local training under skew) and from their average
    assert not torch.allclose(res.client_params[0]["user_up"], res.client_params[1]["user_up"])
    # headline: one global model for FedAvg of both towers; each client's own user tower when decoupled
    assert res.test["warm"] == (res.test["global_model"] if both else res.test["client_models"])["warm"]
    # the client models are evaluated on every user exactly once
    assert res.test["client_models"]["warm"]["n"] == res.test["global_model"]["warm"]["n"] == 24


def test_epochs_repeat_the_local_passes():
    task = _task()
    p = T.init_params(task.dim, 4, 0)
    one = T.DTLClient(0, task, np.arange(24), T.DTLConfig(per_user=4, batch_size=16), seed=0)
    three = T.DTLClient(0, task, np.arange(24), T.DTLConfig(per_user=4, batch_size=16, epochs=3), seed=0)
    s1 = one.fit(p, {"round": 0, "stage": "sft"}).metrics["steps"]
    s3 = three.fit(p, {"round": 0, "stage": "sft"}).metrics["steps"]
    assert s1 == 6 and s3 == 18  # 24 users x 4 examples / batch 16 = 6 steps per pass


def test_server_alignment_draws_prototypes_by_example_count():
    task = _task()
    cfg = T.DTLConfig(server_steps=3, server_lr=1e-3)
    p = T.init_params(task.dim, cfg.rank, 0)
    proto = F.normalize(torch.randn(2, task.dim, generator=torch.Generator().manual_seed(1)), dim=-1)
    rows = torch.tensor([0, 5])
    warm = torch.from_numpy(task.content[task.warm_items])
    ce0 = float(F.cross_entropy(proto[:1] @ T.item_vectors(p, warm).T / cfg.tau, torch.tensor([0])))
    # counts 4 and 0: every draw is the first prototype, so the first step's loss is its CE alone
    _, counted = T.server_align(p, [(proto, rows, torch.tensor([4.0, 0.0]))], task, cfg)
    assert counted[0] == pytest.approx(ce0, rel=1e-5)
    _, uniform = T.server_align(
        p,
        [(proto, rows, torch.tensor([4.0, 0.0]))],
        task,
        T.DTLConfig(server_steps=3, server_lr=1e-3, proto_weighting="uniform"),
    )
    ce_both = float(F.cross_entropy(proto @ T.item_vectors(p, warm).T / cfg.tau, rows))
    assert uniform[0] == pytest.approx(ce_both, rel=1e-5) and abs(ce_both - ce0) > 1e-3


def _genre_data():
    """Four users; genre A is on most items, so counting gives everyone A while lift finds each user's niche."""
    from fedvlr_plus.datasets import InteractionData

    cats = [["A"], ["A"], ["A"], ["A", "B"], ["B"], ["C"], ["A"], ["A"]]
    users = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3]
    items = [0, 1, 2, 4, 0, 1, 2, 5, 6, 7, 3, 0]
    d = InteractionData.from_raw("g", users, items, rating=[4] * 12, timestamp=np.arange(12))
    d.items = pd.DataFrame({"title": [f"t{i}" for i in range(8)], "categories": cats})
    return d


def test_dominant_genre_by_count_and_by_lift_hand_computed():
    d = _genre_data()
    hist = [np.array([0, 1, 2, 4]), np.array([0, 1, 2, 5]), np.array([3, 6, 7]), np.array([0])]
    # weights per user (A, B, C): u0 (3, 1, 0), u1 (3, 0, 1), u2 (2.5, 0.5, 0), u3 (1, 0, 0); global (9.5, 1.5, 1)
    count = T.dominant_labels(d, hist, "count")
    names = sorted({c for cs in d.items["categories"] for c in cs})
    first = {}
    for cs in d.items["categories"]:  # dominant_labels numbers genres by first appearance
        for c in cs:
            first.setdefault(c, len(first))
    a, b, c = first["A"], first["B"], first["C"]
    assert list(count) == [a, a, a, a] and names == ["A", "B", "C"]
    lift = T.dominant_labels(d, hist, "lift", min_share=0.1)
    # u0: share B 0.25 / global 1.5/12 -> lift 2.0 beats A's 0.75/0.79; u1: C 0.25 / (1/12) = 3.0;
    # u2: B 0.5/3 / 0.125 = 1.33 > A (2.5/3)/(9.5/12) = 1.05; u3 has only A
    assert list(lift) == [b, c, b, a]
    # a genre under min_share of the history cannot win: u2's B is 1/6 of its history
    assert T.dominant_labels(d, hist, "lift", min_share=0.2)[2] == a
    with pytest.raises(ValueError):
        T.dominant_labels(d, hist, "share")


def test_label_skew_is_total_variation_to_the_global_mix():
    task = T.RecTask(
        content=np.eye(4, dtype=np.float32),
        histories=[np.array([0, 1]), np.array([2, 3])],
        warm_target=np.full(2, -1),
        cold_target=np.full(2, -1),
        warm_items=np.arange(4),
        cold_items=np.zeros(0, np.int64),
        user_genre=np.zeros(2, np.int64),
    )
    genres = np.array([[1, 0], [1, 0], [0, 1], [0.5, 0.5]])
    # global mix (2.5, 1.5) / 4; client 0 (1, 0): TV 0.375; client 1 (0.25, 0.75): TV 0.375
    tv = T.label_skew(genres, task, np.array([0, 1]))
    assert tv == pytest.approx([0.375, 0.375])
    assert T.label_skew(genres, task, np.array([0, 0])) == pytest.approx([0.0])


@pytest.mark.parametrize("tower", ["fedavg", "private"])
def test_private_user_tower_is_restored_each_round(tower):
    task = _task()
    # lr 0: local training leaves the starting point unchanged, so the upload shows where the round started
    cfg = T.DTLConfig(per_user=2, lr=0.0, user_tower=tower)
    client = T.DTLClient(0, task, np.arange(8), cfg)
    s0, s1 = T.init_params(task.dim, cfg.rank, 0), T.init_params(task.dim, cfg.rank, 1)
    client.fit(s0, {"round": 0, "stage": "sft"})
    up = client.fit(s1, {"round": 1, "stage": "sft"})
    start = s0 if tower == "private" else s1
    for k in T.USER_PARAMS:
        assert torch.equal(up.arrays[k], start[k])
    assert ("own.user_down" in client.store.load(0)) == (tower == "private")
    # FedAvg of both towers trains both towers from the global model every round whatever user_tower says
    both = T.DTLClient(1, task, np.arange(8), cfg)
    both.fit(s0, {"round": 0, "stage": "sft", "train_item_tower": True})
    up = both.fit(s1, {"round": 1, "stage": "sft", "train_item_tower": True})
    assert torch.equal(up.arrays["user_down"], s1["user_down"])
    with pytest.raises(ValueError):
        T.DTLConfig(user_tower="mine")


def test_zero_server_steps_leave_the_item_tower_as_it_started():
    task = _task()
    start = T.init_params(task.dim, 4, 0)
    res = T.train(
        task, "decoupled_sft", T.DTLConfig(server_steps=0), n_clients=3, alpha=0.5, rounds=2, sft_rounds=2, seed=0
    )
    for k in T.ITEM_PARAMS:
        assert torch.equal(res.params[k], start[k]), k
    assert not any("server_loss_first" in h for h in res.history)
    assert not torch.equal(res.params["user_up"], start["user_up"])  # the user tower did train


def test_example_prototypes_upload_every_example_with_its_item():
    task = _task()
    cfg = T.DTLConfig(per_user=3, prototypes="example")
    p = T.init_params(task.dim, cfg.rank, 0)
    users = np.arange(0, 24, 2)
    client = T.DTLClient(1, task, users, cfg, seed=0)
    up = client.fit(p, {"round": 0, "stage": "sft"})
    ctx, tgt = client.examples(0)
    assert up.arrays["proto"].shape == (len(tgt), task.dim) == (up.num_examples, task.dim)
    assert np.array_equal(up.rows["proto"].numpy(), task.warm_items[tgt])
    assert float(up.arrays["proto_n"].sum()) == up.num_examples
    # the same user embeddings the item-level upload averages: its prototypes are their normalised means
    item = T.DTLClient(1, task, users, T.DTLConfig(per_user=3), seed=0).fit(p, {"round": 0, "stage": "sft"})
    first = int(item.rows["proto"][0])
    mean = F.normalize(up.arrays["proto"][up.rows["proto"] == first].sum(0), dim=0)
    assert torch.allclose(item.arrays["proto"][0], mean, atol=1e-5)
    res = T.train(task, "decoupled_sft", cfg, n_clients=3, alpha=0.5, rounds=2, sft_rounds=2, seed=0)
    assert all(h["server_loss_last"] <= h["server_loss_first"] + 1e-6 for h in res.history)
    with pytest.raises(ValueError):
        T.DTLConfig(prototypes="class")


def test_anchor_penalty_is_zero_at_the_start_and_holds_the_items_near_their_content():
    task = _task()
    p = T.init_params(task.dim, 4, 0)
    content = torch.from_numpy(task.content)
    assert abs(float(T.anchor_penalty(p, content))) < 1e-6  # up = 0: every item is its content
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(0, 32)
    proto = F.normalize(torch.randn(32, task.dim, generator=g), dim=-1)
    free, _ = T.server_align(p, [(proto, rows)], task, T.DTLConfig(server_steps=30, server_lr=5e-2))
    held, _ = T.server_align(
        p, [(proto, rows)], task, T.DTLConfig(server_steps=30, server_lr=5e-2, anchor_weight=100.0)
    )
    assert float(T.anchor_penalty(held, content)) < 0.5 * float(T.anchor_penalty(free, content))
    with pytest.raises(ValueError):
        T.DTLConfig(anchor_weight=-1.0)


def test_few_shot_keeps_at_most_k_labelled_examples_per_item_and_the_whole_history_as_input():
    task = _task(n_items=40, n_users=24)
    labelled = T.few_shot_targets(task.histories, 2, seed=3)
    assert len(labelled) == len(task.histories)
    per_item = np.bincount(np.concatenate(labelled), minlength=task.n_items)
    in_history = np.bincount(np.concatenate(task.histories), minlength=task.n_items)
    assert (per_item == np.minimum(in_history, 2)).all()  # K per item, or all an item has
    assert all(np.isin(x, h).all() for x, h in zip(labelled, task.histories))
    again = T.few_shot_targets(task.histories, 2, seed=3)
    other = T.few_shot_targets(task.histories, 2, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(labelled, again))
    assert not all(np.array_equal(a, b) for a, b in zip(labelled, other))
    task.labelled = labelled
    client = T.DTLClient(0, task, np.arange(24), T.DTLConfig(per_user=50), seed=0)
    ctx, tgt = client.examples(0)
    warm = task.warm_items
    assert np.array_equal(
        np.sort(warm[tgt]), np.sort(np.concatenate([x for u, x in enumerate(labelled) if len(task.histories[u]) >= 2]))
    )
    # the context of an example is still the mean of the user's other history items, labelled or not
    u = next(u for u in range(24) if len(task.histories[u]) >= 2 and len(labelled[u]))
    first = int(sum(len(x) for v, x in enumerate(labelled[:u]) if len(task.histories[v]) >= 2))
    h, i = task.histories[u], int(warm[tgt[first]])
    want = (task.content[h].sum(0) - task.content[i]) / (len(h) - 1)
    assert np.allclose(ctx[first], want, atol=1e-6)


@pytest.mark.parametrize("stage", ["sft", "rl"])
def test_frozen_item_tower_is_computed_once_with_the_same_numbers(stage, monkeypatch):
    """A decoupled client computes the item vectors once per fit instead of once per batch; the uploads and
    metrics are the ones the per-batch computation gives."""
    from fedvlr_plus.alignment.feddtl import client as dtl_client

    task = _task(n_items=40, n_users=24)
    cfg = T.DTLConfig(per_user=6, batch_size=8, rl_candidates=10, sigma=0.3)
    p = T.init_params(task.dim, cfg.rank, 0)
    p = {k: v + 0.05 for k, v in p.items()}  # a non-zero item adapter
    config = {"round": 2, "stage": stage}
    calls = []
    plain_tower = dtl_client.ItemContent.tower
    monkeypatch.setattr(dtl_client.ItemContent, "tower", lambda self, q: calls.append(1) or plain_tower(self, q))
    cached = T.DTLClient(0, task, np.arange(24), cfg, seed=3).fit(p, config)
    assert len(calls) == 1 and cached.metrics["steps"] > 2
    per_batch = T.DTLClient(0, task, np.arange(24), cfg, seed=3)
    plain_loss = per_batch._batch_loss
    monkeypatch.setattr(per_batch, "_batch_loss", lambda *a: plain_loss(*a[:6], None))
    reference = per_batch.fit(p, config)
    assert len(calls) > 1 + cached.metrics["steps"]  # the reference path recomputed them per batch
    assert cached.metrics == reference.metrics
    for k in reference.arrays:
        assert torch.equal(cached.arrays[k], reference.arrays[k]), k


def _bare_items(n=10):
    """Items with no title, category or year, and one shipped feature array."""
    from fedvlr_plus.datasets import InteractionData

    users, items = np.repeat(np.arange(6), 5), np.tile(np.arange(5), 6) * 2
    d = InteractionData.from_raw("bare", users, items, timestamp=np.arange(30), item_order=np.arange(n))
    items_frame = pd.DataFrame({"title": [""] * n, "categories": [[] for _ in range(n)]})
    return d.replace(items=items_frame, features={"tags": np.eye(n, 4, dtype=np.float32)})


def test_without_item_texts_content_text_reads_a_shipped_text_array_and_says_so():
    """KU ships CLIP text features as an array named "text" and no item texts: the default --content text used
    to be refused there with a hint naming "text" itself."""
    data = _bare_items()
    text = np.arange(40, dtype=np.float32).reshape(10, 4)
    data = data.replace(features={**data.features, "text": text})
    said = []
    got = T._content(data, "text", "cpu", None, log=said.append)
    assert np.array_equal(got, text)
    assert said == ["bare: no item texts to encode; --content text uses the data set's own 'text' feature array"]


def test_items_without_text_or_categories_are_refused_with_the_flag_that_fixes_it():
    from fedvlr_plus.errors import ConfigError

    data = _bare_items()
    # before this refusal every item read the MiniLM vector of "untitled" and every method scored HR@10 1.0
    with pytest.raises(
        ConfigError,
        match=r"--content text: the items of bare have no text .*--content NAME, one "
        r"of its feature arrays: tags",
    ):
        T._content(data, "text", "cpu", None)
    assert T._content(data, "tags", "cpu", None).shape == (10, 4)
    with pytest.raises(ConfigError, match=r"--classes 0: .* items of bare have fewer than two .*--classes K"):
        T._classes(data, np.eye(10, 4, dtype=np.float32), 0, "tags", 0)
    item_class, _, described = T._classes(data, np.eye(10, 4, dtype=np.float32), 2, "tags", 0)
    assert len(item_class) == 10 and "k-means (2)" in described


def test_items_without_text_or_feature_arrays_are_told_where_content_comes_from():
    """Without any array the hint used to read "one of its feature arrays: none"."""
    from fedvlr_plus.errors import ConfigError

    data = _bare_items().replace(features={})
    with pytest.raises(ConfigError, match=r"no text .*\(it ships no feature array either: add image_features\.npy"):
        T._content(data, "text", "cpu", None)


def test_classes_auto_takes_the_categories_where_they_serve_and_a_kmeans_where_they_do_not():
    from fedvlr_plus.cli.main import build_parser

    bare, said = _bare_items(), []
    assert T._resolve_classes(bare, "auto", 0, log=said.append) == T.AUTO_CLASSES
    assert said == [
        f"--classes auto: item classes are a k-means ({T.AUTO_CLASSES}) of the item vectors (the items "
        "of bare have fewer than two categories)"
    ]
    genres = _genre_data()
    assert T._resolve_classes(genres, "auto", 0, log=said.append) == 0  # the catalogue's categories
    assert T._resolve_classes(genres, "auto", 2, log=said.append) == T.AUTO_CLASSES
    assert said[-1].endswith("(--novel-classes needs them)")
    assert T._resolve_classes(bare, 0, 0) == 0 and T._resolve_classes(bare, 7, 0) == 7  # a number is kept
    parse = build_parser().parse_args
    assert parse(["align", "feddtl", "ml-100k"]).classes == "auto"
    assert parse(["align", "feddtl", "ml-100k", "--classes", "4"]).classes == 4
