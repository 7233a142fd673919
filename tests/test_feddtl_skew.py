"""FedDTL on a class-skewed split: k-means item classes, novel classes kept out of training, the reported skew and
the paired tests of the table."""

import json

import numpy as np
import pytest
from scipy.stats import ttest_rel

from fedvlr_plus import datasets
from fedvlr_plus.alignment.feddtl import method as T
from fedvlr_plus.alignment.feddtl.classes import class_weights, kmeans_classes, novel_classes
from fedvlr_plus.alignment.feddtl.table import markdown, paired_tests
from fedvlr_plus.alignment.paired_seeds import paired


def _folder(tmp_path, n_users=40, n_items=30, d=8, seed=0):
    """A feature folder without timestamps: items in 3 content clusters, each user mostly in one cluster."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((3, d)) * 3
    cluster = np.arange(n_items) % 3
    vec = (centres[cluster] + rng.standard_normal((n_items, d)) * 0.3).astype(np.float32)
    rows = []
    for u in range(n_users):
        own = np.flatnonzero(cluster == u % 3)
        items = set(rng.choice(own, size=6, replace=False)) | set(rng.choice(n_items, size=3, replace=False))
        rows += [f"{u},{i},1" for i in sorted(items)]
    (tmp_path / "inter.csv").write_text("userID,itemID,rating\n" + "\n".join(rows) + "\n")
    np.save(tmp_path / "vec.npy", vec)
    return tmp_path, cluster


def test_kmeans_classes_are_seeded_and_find_the_clusters(tmp_path):
    folder, cluster = _folder(tmp_path)
    vec = datasets.load(str(folder)).features["vec"]
    a, b = kmeans_classes(vec, 3, seed=4), kmeans_classes(vec, 3, seed=4)
    assert np.array_equal(a, b)
    # the same partition as the generating clusters (up to the ids), numbered by size
    assert len({(x, y) for x, y in zip(a, cluster)}) == 3
    assert np.all(np.diff(np.bincount(a)) <= 0)


def _classed(tmp_path):
    """The test folder's data, item vectors, 3 k-means classes and one novel class (seed 0)."""
    folder, _ = _folder(tmp_path)
    data = datasets.load(str(folder))
    vec = data.features["vec"]
    item_class = kmeans_classes(vec, 3, seed=0)
    return data, vec, item_class, novel_classes(item_class, 1, seed=0)


def test_novel_classes_never_train_and_their_items_are_the_cold_ones(tmp_path):
    data, vec, item_class, novel = _classed(tmp_path)
    assert np.array_equal(novel, novel_classes(item_class, 1, seed=0))
    task = T.build_task(data, vec, seed=0, item_class=item_class, novel=novel)
    in_novel = np.isin(item_class, novel)
    assert np.array_equal(np.sort(task.cold_items), np.flatnonzero(in_novel))
    assert not any(in_novel[h].any() for h in task.histories)  # no novel item is ever trained on
    assert not in_novel[task.warm_items].any()
    assert in_novel[task.cold_target[task.cold_target >= 0]].all()
    assert not in_novel[task.warm_target[task.warm_target >= 0]].any()
    # the clients' examples and prototypes come from the histories: no novel item in an upload either
    client = T.DTLClient(0, task, np.arange(len(task.histories)), T.DTLConfig(), seed=0)
    up = client.fit(T.init_params(task.dim, 4, 0), {"round": 0, "stage": "sft"})
    assert not in_novel[up.rows["proto"].numpy()].any()


def test_valid_mode_drops_the_test_targets(tmp_path):
    data, vec, item_class, novel = _classed(tmp_path)
    test = T.build_task(data, vec, seed=1, item_class=item_class, novel=novel)
    val = T.build_task(data, vec, seed=1, item_class=item_class, novel=novel, valid=True)
    for u in range(len(test.histories)):
        for t in (test.warm_target[u], test.cold_target[u]):
            if t >= 0:
                assert t not in val.histories[u] and t not in (val.warm_target[u], val.cold_target[u])
    assert (val.warm_target >= 0).any() and (val.cold_target >= 0).any()


def test_without_timestamps_the_held_out_target_is_a_seeded_draw(tmp_path):
    folder, _ = _folder(tmp_path)
    data = datasets.load(str(folder))
    vec = data.features["vec"]
    a, b = T.build_task(data, vec, seed=2), T.build_task(data, vec, seed=2)
    assert np.array_equal(a.warm_target, b.warm_target)
    # not simply the largest item id of the user's warm items (what a sort on equal timestamps would give)
    largest = [max(set(a.histories[u]) | {a.warm_target[u]}) for u in range(len(a.histories)) if a.warm_target[u] >= 0]
    assert any(t != m for t, m in zip(a.warm_target[a.warm_target >= 0], largest))


def test_reported_split_skew_and_paired_tests_come_from_the_run(tmp_path):
    folder, _ = _folder(tmp_path)
    cfg = T.DTLConfig(per_user=2, server_steps=2)
    rep = T.run_feddtl(
        str(folder),
        cfg,
        seeds=[0, 1, 2],
        clients=3,
        alpha=0.1,
        rounds=2,
        sft_rounds=1,
        cold_share=0.2,
        dominant="count",
        content="vec",
        classes=3,
        novel=1,
        log=lambda s: None,
    )
    data = datasets.load(str(folder))
    vec = data.features["vec"]
    for seed, row in zip(rep["seeds"], rep["per_seed"]):
        item_class = kmeans_classes(vec, 3, seed)
        task = T.build_task(data, vec, seed=seed, item_class=item_class, novel=novel_classes(item_class, 1, seed))
        assign = T.dirichlet_split(task.user_genre, 3, 0.1, seed)
        tv = T.label_skew(class_weights(item_class), task, assign)
        assert row["client_genre_tv"] == [round(x, 4) for x in tv]
        assert row["client_class_tv"] == {"mean": np.mean(tv), "min": min(tv), "max": max(tv)}
        assert row["client_users"] == np.bincount(assign, minlength=3).tolist()
    a = [s["feddtl"]["cold"]["hr@10"] for s in rep["per_seed"]]
    b = [s["fedavg_both"]["cold"]["hr@10"] for s in rep["per_seed"]]
    got = rep["paired"]["FedDTL - FedAvg both"]["cold hr@10"]
    assert got["diff"] == pytest.approx(np.subtract(a, b).tolist())
    assert got["higher"] == int((np.subtract(a, b) > 0).sum())
    if got["p"] not in (0.0, 1.0):
        assert got["p"] == pytest.approx(ttest_rel(a, b).pvalue)
    assert json.loads(json.dumps(rep))["evaluated_on"] == "test"


def test_paired_matches_a_hand_computed_t_test():
    a, b = [0.30, 0.34, 0.31, 0.36, 0.33], [0.28, 0.30, 0.32, 0.31, 0.30]
    d = np.subtract(a, b)
    t = d.mean() / (d.std(ddof=1) / np.sqrt(5))
    from scipy.stats import t as student

    got = paired(a, b)
    assert got["mean"] == pytest.approx(d.mean()) and got["higher"] == 4 and got["n"] == 5
    assert got["sem"] == pytest.approx(d.std(ddof=1) / np.sqrt(5))
    assert got["p"] == pytest.approx(2 * student.sf(abs(t), df=4))
    assert paired([0.1, 0.2], [0.1, 0.2])["p"] == 1.0


def test_table_shows_the_per_seed_numbers_and_the_tests():
    def fig(w, c):
        return {"warm": {"hr@10": w, "ndcg@10": w / 2}, "cold": {"hr@10": c, "ndcg@10": c / 2}}

    per_seed = [
        {
            "fedavg_both": fig(0.30, 0.10 + 0.01 * s),
            "decoupled_sft": fig(0.29, 0.12),
            "feddtl": fig(0.31, 0.13 + 0.02 * s),
            "client_users": [3, 4],
            "client_class_tv": {"mean": 0.3, "min": 0.1, "max": 0.5},
        }
        for s in range(3)
    ]
    rep = {
        "seeds": [0, 1, 2],
        "per_seed": per_seed,
        "source": "x",
        "n_warm_items": 5,
        "n_cold_items": 2,
        "classes": "k",
        "clients": 2,
        "alpha": 0.1,
        "dominant": "count",
        "evaluated_on": "test",
        "paired": paired_tests(per_seed),
    }
    md = markdown(rep, "fedvlr-plus align feddtl x")
    assert "0.1300 / 0.1500 / 0.1700 (**0.1500**)" in md
    row = rep["paired"]["FedDTL - FedAvg both"]["cold hr@10"]
    assert row["mean"] == pytest.approx(0.04) and f"{row['mean']:+.4f}" in md and "3/3" in md
    assert "TV 0.300 / 0.100 / 0.500" in md


def test_the_few_shot_regime_is_reported_and_limits_each_items_training_examples(tmp_path):
    folder, _ = _folder(tmp_path)
    cfg = T.DTLConfig(per_user=2, server_steps=2)
    kw = dict(
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
        log=lambda s: None,
    )
    full = T.run_feddtl(str(folder), cfg, **kw)
    few = T.run_feddtl(str(folder), cfg, shots=1, **kw)
    assert full["shots"] == 0 and "labelled_examples" not in full["per_seed"][0]
    data = datasets.load(str(folder))
    for seed, row in zip(few["seeds"], few["per_seed"]):
        item_class = kmeans_classes(data.features["vec"], 3, seed)
        task = T.build_task(
            data, data.features["vec"], seed=seed, item_class=item_class, novel=novel_classes(item_class, 1, seed)
        )
        assert row["labelled_examples"] == len(np.unique(np.concatenate(task.histories)))  # one per trained item
        assert row["client_genre_tv"] == full["per_seed"][few["seeds"].index(seed)]["client_genre_tv"]
    assert few["feddtl"] != full["feddtl"]
    md = markdown(few, "fedvlr-plus align feddtl x --shots 1")
    counts = [r["labelled_examples"] for r in few["per_seed"]]
    assert f"at most 1 training example per item ({min(counts)}-{max(counts)} in all)" in md
