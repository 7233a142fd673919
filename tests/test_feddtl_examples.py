"""FedDTL's label skew over examples (``--split examples``): each class's examples dealt to clients, the clients
training on the examples they hold, every method judged by its global model, and the report of the split."""

import numpy as np
import pytest
from test_feddtl_skew import _folder

from fedvlr_plus.alignment.feddtl import method as T
from fedvlr_plus.alignment.feddtl.classes import class_weights
from fedvlr_plus.alignment.feddtl.examples import deal_examples, example_skew, home_clients
from fedvlr_plus.alignment.feddtl.table import markdown


def _task(n_users=60, n_items=30, d=6, seed=0):
    """Users with 2-9 train items each; 3 item classes (item id mod 3); 30 warm items, no cold ones."""
    rng = np.random.default_rng(seed)
    content = rng.standard_normal((n_items, d)).astype(np.float32)
    content /= np.linalg.norm(content, axis=1, keepdims=True)
    hist = [np.sort(rng.choice(n_items, size=int(rng.integers(2, 10)), replace=False)) for _ in range(n_users)]
    hist[0] = np.array([4])  # one train item: no example (it needs another item as input)
    task = T.RecTask(
        content=content,
        histories=hist,
        warm_target=np.full(n_users, -1),
        cold_target=np.full(n_users, -1),
        warm_items=np.arange(n_items),
        cold_items=np.zeros(0, np.int64),
        user_genre=np.zeros(n_users, np.int64),
        item_class=np.arange(n_items) % 3,
    )
    return task


def test_every_example_goes_to_exactly_one_client_and_the_draw_is_seeded():
    task = _task()
    held = deal_examples(task, task.item_class, 4, alpha=0.1, seed=3)
    again = deal_examples(task, task.item_class, 4, alpha=0.1, seed=3)
    assert all(held)
    assert all(a.keys() == b.keys() and all(np.array_equal(a[u], b[u]) for u in a) for a, b in zip(held, again))
    for u, h in enumerate(task.histories):
        pieces = [users[u] for users in held if u in users]
        if len(h) < 2:
            assert not pieces
        else:
            assert np.array_equal(np.sort(np.concatenate(pieces)), h)  # each train item once, on one client
    other = deal_examples(task, task.item_class, 4, alpha=0.1, seed=4)
    assert any(set(a) != set(b) for a, b in zip(held, other))


def test_a_small_alpha_skews_each_clients_class_mix_and_a_large_one_does_not():
    task = _task(n_users=300)
    weights = class_weights(task.item_class)
    skewed = example_skew(weights, deal_examples(task, task.item_class, 4, alpha=0.05, seed=0))
    even = example_skew(weights, deal_examples(task, task.item_class, 4, alpha=1000.0, seed=0))
    assert np.mean(skewed) > 0.3 and max(even) < 0.1


def test_only_labelled_items_are_examples_in_the_few_shot_regime():
    task = _task()
    task.labelled = [h[:1] for h in task.histories]
    held = deal_examples(task, task.item_class, 3, alpha=1.0, seed=0)
    for users in held:
        for u, items in users.items():
            assert set(items) <= set(task.labelled[u])


def test_home_client_and_skew_hand_computed():
    held = [{0: np.array([1, 2]), 1: np.array([3])}, {0: np.array([4]), 2: np.array([5])}]
    assert home_clients(held, 4).tolist() == [0, 0, 1, 0]  # user 3 holds nothing: client 0
    weights = class_weights(np.array([0, 0, 0, 1, 1, 1]))
    # client 0 holds items 1, 2, 3 (classes 0, 0, 1), client 1 items 4, 5 (1, 1); all: 2 of class 0, 3 of class 1
    assert example_skew(weights, held) == pytest.approx([abs(2 / 3 - 2 / 5), 2 / 5])


def test_clients_train_on_the_examples_they_hold_and_every_method_is_judged_by_its_global_model():
    task = _task()
    cfg = T.DTLConfig(rank=2, per_user=3, server_steps=1, prototypes="example")
    clients, home = T.make_clients(task, cfg, split="examples", n_clients=3, alpha=0.3, seed=1)
    held = deal_examples(task, task.item_class, 3, alpha=0.3, seed=1)
    assert np.array_equal(home, home_clients(held, len(task.histories)))
    for c, users in zip(clients, held):
        assert c.users.tolist() == sorted(users)
        _, cols = c.examples(0)
        assert set(task.warm_items[cols]) <= set(np.concatenate(list(users.values())))
    for method in T.METHODS:
        res = T.train(task, method, cfg, n_clients=3, alpha=0.3, rounds=2, sft_rounds=1, seed=1, split="examples")
        assert res.test["warm"] == res.test["global_model"]["warm"]
        assert np.array_equal(res.assign, home)


def test_the_split_over_examples_needs_item_classes_and_a_known_split_name():
    task = _task()
    cfg = T.DTLConfig()
    with pytest.raises(ValueError, match="split must be one of"):
        T.make_clients(task, cfg, split="items", n_clients=2, alpha=0.1, seed=0)
    task.item_class = None
    with pytest.raises(ValueError, match="item classes"):
        T.make_clients(task, cfg, split="examples", n_clients=2, alpha=0.1, seed=0)


def test_the_report_carries_the_split_its_examples_and_skew_and_the_table_says_so(tmp_path):
    folder, _ = _folder(tmp_path)
    cfg = T.DTLConfig(per_user=2, server_steps=2)
    rep = T.run_feddtl(
        str(folder),
        cfg,
        seeds=[0, 1],
        clients=3,
        alpha=0.1,
        rounds=2,
        sft_rounds=1,
        cold_share=0.2,
        dominant="count",
        content="vec",
        classes=3,
        novel=1,
        split="examples",
        log=lambda s: None,
    )
    assert rep["split"] == "examples"
    for row in rep["per_seed"]:
        assert len(row["client_examples"]) == 3 and min(row["client_examples"]) >= 1
        assert row["client_class_tv"]["max"] >= row["client_class_tv"]["mean"] >= row["client_class_tv"]["min"]
        for m in T.METHODS:
            assert row[m]["warm"] == row[m]["global_model"]["warm"]
    md = markdown(rep, "fedvlr-plus align feddtl x --split examples")
    assert "each class's training examples dealt by Dirichlet alpha 0.1" in md
    assert "every method's global model" in md and "examples [" in md


@pytest.mark.parametrize("split", ["users", "examples"])
def test_more_clients_than_a_split_can_fill_is_one_line_naming_the_flags(split):
    from fedvlr_plus.errors import ConfigError

    task = _task(n_users=6)
    with pytest.raises(ConfigError, match=r"--clients 40 --alpha 0.1: no draw of 100 gave every .*fewer clients"):
        T.make_clients(task, T.DTLConfig(), split=split, n_clients=40, alpha=0.1, seed=0)


def test_alpha_zero_deals_each_class_wholly_to_one_client_and_every_client_gets_one():
    """The Dirichlet's limit (the pathological split): a class's examples, or its users, all on one client."""
    from fedvlr_plus.alignment.feddtl.task import dirichlet_split

    task = _task(n_users=90)
    task.item_class = np.arange(30) % 5  # 5 classes over 3 clients: 2, 2 and 1 of them
    held = deal_examples(task, task.item_class, 3, alpha=0.0, seed=1)
    owner = {}
    for c, users in enumerate(held):
        for items in users.values():
            for k in np.unique(task.item_class[items]):
                assert owner.setdefault(int(k), c) == c  # never on two clients
    assert sorted(owner) == [0, 1, 2, 3, 4] and sorted(np.bincount(list(owner.values()))) == [1, 2, 2]
    labels = np.repeat(np.arange(4), 5)
    assign = dirichlet_split(labels, 2, 0.0, seed=2)
    assert all(len(set(assign[labels == g])) == 1 for g in range(4)) and set(assign) == {0, 1}
    assert np.array_equal(assign, dirichlet_split(labels, 2, 0.0, seed=2))


def test_alpha_zero_with_fewer_classes_than_clients_is_one_line_naming_the_flags():
    from fedvlr_plus.errors import ConfigError

    task = _task()  # 3 classes
    with pytest.raises(ConfigError, match=r"--alpha 0 --clients 4: each class goes to one client, and only 3 "):
        T.make_clients(task, T.DTLConfig(), split="examples", n_clients=4, alpha=0.0, seed=0)


def test_the_table_says_alpha_zero_is_the_pathological_split():
    from fedvlr_plus.alignment.feddtl.table import _split

    assert "all at one client (alpha 0, the pathological split)" in _split({"split": "examples", "alpha": 0.0})
    assert "Dirichlet alpha 0.1" in _split({"split": "examples", "alpha": 0.1})
    assert "users all at one client (alpha 0" in _split({"split": "users", "alpha": 0.0, "dominant": "count"})
