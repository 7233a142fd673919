"""Preprocessing and splits on small hand-built data, where every expected label is known."""

import numpy as np
import pytest

from fedvlr_plus.datasets import TEST, TRAIN, UNSPLIT, VALID, DataError, InteractionData, splits


def make(rows, name="toy"):
    """rows: (raw user, raw item, rating, timestamp)."""
    u, i, r, t = zip(*rows)
    return InteractionData.from_raw(name, u, i, rating=r, timestamp=t).validate()


def labels_by(data):
    inter = data.inter
    return {(data.user_ids[u], data.item_ids[i]): s for u, i, s in zip(inter["user"], inter["item"], inter["split"])}


def test_from_raw_keeps_first_appearance_order_and_raw_ids():
    d = make([("b", "x", 5, 1), ("a", "y", 3, 2), ("b", "y", 4, 3)])
    assert list(d.user_ids) == ["b", "a"] and list(d.item_ids) == ["x", "y"]
    assert d.inter["user"].tolist() == [0, 1, 0] and d.inter["item"].tolist() == [0, 1, 1]
    assert d.inter["split"].tolist() == [UNSPLIT] * 3 and not d.is_split


def test_leave_one_out_uses_time_not_row_order():
    d = make(
        [("u", "a", 1, 30), ("u", "b", 1, 10), ("u", "c", 1, 20), ("u", "d", 1, 5), ("v", "a", 1, 1), ("v", "b", 1, 2)]
    )
    out = splits.leave_one_out(d)
    lab = labels_by(out)
    assert lab[("u", "a")] == TEST and lab[("u", "c")] == VALID
    assert lab[("u", "b")] == TRAIN and lab[("u", "d")] == TRAIN
    # v has 2 interactions < min_train + 2 = 3: kept in train, not evaluated
    assert lab[("v", "a")] == TRAIN and lab[("v", "b")] == TRAIN
    assert d.inter["split"].tolist() == [UNSPLIT] * 6  # the input is not modified


def test_leave_one_out_time_ties_break_by_row_order():
    d = make([("u", "a", 1, 5), ("u", "b", 1, 5), ("u", "c", 1, 5)])
    lab = labels_by(splits.leave_one_out(d))
    assert (lab[("u", "a")], lab[("u", "b")], lab[("u", "c")]) == (TRAIN, VALID, TEST)


def test_leave_one_out_with_no_eligible_user_is_an_error():
    with pytest.raises(DataError, match="test split empty"):
        splits.leave_one_out(make([("u", "a", 1, 1), ("v", "a", 1, 1)]))


def test_implicit_threshold_and_dedup_keep_earliest_or_latest():
    d = make([("u", "a", 5, 3), ("u", "a", 2, 1), ("u", "b", 1, 2), ("v", "a", 4, 9)])
    imp = splits.implicit(d, threshold=4)
    assert len(imp.inter) == 2 and set(imp.inter["rating"]) == {1.0}
    first = splits.dedup(d, keep="first")
    assert len(first.inter) == 3
    ua = first.inter[(first.inter["user"] == 0) & (first.inter["item"] == 0)]
    assert ua["timestamp"].tolist() == [1.0] and ua["rating"].tolist() == [2.0]
    last = splits.dedup(d, keep="last")
    ua = last.inter[(last.inter["user"] == 0) & (last.inter["item"] == 0)]
    assert ua["timestamp"].tolist() == [3.0]


def test_k_core_is_iterative_and_renumbers():
    # u1 has 2 items; after removing item c (only 1 user), u2 falls below 2 and must go too.
    rows = [
        ("u1", "a", 1, 1),
        ("u1", "b", 1, 2),
        ("u3", "a", 1, 3),
        ("u3", "b", 1, 4),
        ("u2", "a", 1, 5),
        ("u2", "c", 1, 6),
    ]
    out = splits.k_core(make(rows), k=2)
    assert sorted(out.user_ids) == ["u1", "u3"] and sorted(out.item_ids) == ["a", "b"]
    assert out.inter["user"].max() == 1 and out.inter["item"].max() == 1
    out.validate()
    (note,) = [f for f in out.sanity() if f["code"] == "k_core_cut"]
    assert note["count"] == 2 and note["message"] == (
        "the 2-core filter cut users from 3 to 2, items from 3 to 2, interactions from 6 to 4"
    )
    again = splits.k_core(out, k=2)  # nothing left to cut: no second note
    assert [f["code"] for f in again.sanity()].count("k_core_cut") == 1


def test_a_k_core_cut_is_told_as_a_note_with_its_counts(capsys):
    from _bad_input import run_cli

    res = run_cli("run", "ml-100k", "--k-core", "20", "--backbone", "pop")
    assert res.code == 0, res.err
    assert "note: " in res.err and "the 20-core filter cut users from 943 to " in res.err
    assert "items from 1,682 to " in res.err and "warning" not in res.err


def test_ratio_split_per_user_by_time():
    rows = [("u", f"i{k}", 1, 100 - k) for k in range(10)]  # i9 is the earliest
    lab = labels_by(splits.ratio_split(make(rows), (0.8, 0.1, 0.1)))
    assert lab[("u", "i0")] == TEST and lab[("u", "i1")] == VALID
    assert sum(v == TRAIN for v in lab.values()) == 8


def test_ratio_split_global_time_cut():
    rows = [
        ("u", "a", 1, 1),
        ("v", "b", 1, 2),
        ("u", "c", 1, 3),
        ("v", "d", 1, 4),
        ("u", "e", 1, 5),
        ("v", "f", 1, 6),
        ("u", "g", 1, 7),
        ("v", "h", 1, 8),
        ("u", "i", 1, 9),
        ("v", "j", 1, 10),
    ]
    lab = labels_by(splits.ratio_split(make(rows), (0.8, 0.1, 0.1), by="time"))
    assert lab[("v", "j")] == TEST and lab[("u", "i")] == VALID and lab[("v", "h")] == TRAIN


def test_cold_item_split_holds_items_out_of_training():
    rng = np.random.default_rng(0)
    rows = [
        (f"u{u}", f"i{i}", 1, k) for k, (u, i) in enumerate(zip(rng.integers(0, 30, 400), rng.integers(0, 40, 400)))
    ]
    d = splits.dedup(make(rows))
    out = splits.cold_item_split(d, 0.25, seed=3)
    train_items = set(out.train()["item"])
    held = set(out.valid()["item"]) | set(out.test()["item"])
    assert held and not (train_items & held)
    assert abs(len(held) - 0.25 * d.n_items) <= 1
    assert set(out.valid()["item"]).isdisjoint(out.test()["item"])
    assert out.cold_items()[list(held)].all()
    again = splits.cold_item_split(d, 0.25, seed=3)
    assert again.inter["split"].tolist() == out.inter["split"].tolist()


def test_cold_user_split_holds_users_out_of_training():
    rows = [(f"u{u}", f"i{(u * 7 + k) % 13}", 1, k) for u in range(20) for k in range(4)]
    out = splits.cold_user_split(splits.dedup(make(rows)), 0.3, seed=1)
    held = set(out.valid()["user"]) | set(out.test()["user"])
    assert len(held) == 6 and held.isdisjoint(out.train()["user"])


def test_predefined_requires_every_label():
    d = make([("u", "a", 1, 1), ("u", "b", 1, 2)])
    with pytest.raises(DataError, match="no split label"):
        splits.predefined(d)


def test_validate_names_the_bad_row():
    d = make([("u", "a", 1, 1), ("u", "b", 1, 2)])
    bad = d.replace(inter=d.inter.assign(item=[0, 5]))
    with pytest.raises(DataError, match=r"row 1: item id 5 out of range"):
        bad.validate()
    bad_feat = d.replace(features={"text": np.array([[1.0, np.nan], [0.0, 1.0]])})
    with pytest.raises(DataError, match=r"feature 'text': row 0 .*NaN"):
        bad_feat.validate()
    with pytest.raises(DataError, match="3 rows but the catalogue has 2 items"):
        d.replace(features={"img": np.zeros((3, 2))}).validate()


def test_stats_count_cold_targets():
    d = make(
        [("u", "a", 1, 1), ("u", "b", 1, 2), ("u", "c", 1, 3), ("v", "a", 1, 1), ("v", "b", 1, 2), ("v", "d", 1, 3)]
    )
    s = splits.leave_one_out(d).stats()
    assert s["users"] == 2 and s["items"] == 4 and s["interactions"] == 6
    assert s["splits"]["test"]["interactions"] == 2
    # only "a" is in train: b (valid for both), c and d (test) are cold
    assert s["cold_items"] == 3 and s["test_cold_targets"] == 2 and s["valid_cold_targets"] == 2
    assert abs(s["sparsity"] - (1 - 6 / 8)) < 1e-12
