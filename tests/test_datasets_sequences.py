"""S3Rec item-sequence files: ids, order, the leave-one-out split, the attribute view, and detection."""

import json

import numpy as np
import pytest
from _shared import shared_data, write

from fedvlr_plus.datasets import DataError, detect_format, load, splits
from fedvlr_plus.datasets.core import TEST, TRAIN, VALID

# users 7, 3, 9 (file order); items 1..5 and 12 (12: a gap in the id space); user 3 repeats nothing
SEQUENCES = "7 1 2 3 4\n3 5 1 2\n\n9 12 5 3 1 2\n"
ATTRIBUTES = {"1": [10, 20], "2": [20], "3": [10, 30, 40, 50], "4": [], "5": [30], "99": [10]}


def _folder(tmp_path, attributes=ATTRIBUTES):
    write(tmp_path / "Toy.txt", SEQUENCES)
    if attributes is not None:
        write(tmp_path / "Toy_item2attributes.json", json.dumps(attributes))
    return tmp_path


def _rows(data, user_raw):
    """(raw item, position, split) of one user's rows, in file order."""
    u = int(np.flatnonzero(data.user_ids == user_raw)[0])
    df = data.inter[data.inter["user"] == u]
    return [(int(data.item_ids[i]), int(t), int(s)) for i, t, s in zip(df["item"], df["timestamp"], df["split"])]


def test_ids_keep_file_order_for_users_and_id_order_for_items(tmp_path):
    data = load(_folder(tmp_path))
    assert data.format == "sequences" and data.name == "Toy"
    assert data.user_ids.tolist() == [7, 3, 9]
    assert data.item_ids.tolist() == [1, 2, 3, 4, 5, 12]
    assert (data.n_users, data.n_items, data.n_inter) == (3, 6, 12)
    assert _rows(data, 9) == [(12, 0, -1), (5, 1, -1), (3, 2, -1), (1, 3, -1), (2, 4, -1)]


def test_leave_one_out_takes_the_last_item_as_test_and_the_one_before_as_valid(tmp_path):
    data = splits.leave_one_out(load(_folder(tmp_path)))
    assert [s for _, _, s in _rows(data, 7)] == [TRAIN, TRAIN, VALID, TEST]
    test = {int(data.user_ids[u]): int(data.item_ids[i]) for u, i in zip(data.test()["user"], data.test()["item"])}
    valid = {int(data.user_ids[u]): int(data.item_ids[i]) for u, i in zip(data.valid()["user"], data.valid()["item"])}
    assert test == {7: 4, 3: 2, 9: 2} and valid == {7: 3, 3: 1, 9: 1}


def test_attributes_are_a_normalised_multi_hot_view(tmp_path):
    data = load(_folder(tmp_path))
    m = data.features["attributes"]
    assert m.dtype == np.float32 and m.shape == (6, 5)  # columns: attributes 10, 20, 30, 40, 50
    expected = np.zeros((6, 5), np.float32)
    for row, cols in ((0, [0, 1]), (1, [1]), (2, [0, 2, 3, 4]), (4, [2])):
        expected[row, cols] = 1 / np.sqrt(len(cols))
    np.testing.assert_allclose(m, expected, rtol=1e-6)
    notes = {n["code"]: n["count"] for n in data.notes}
    assert notes == {"items_without_attributes": 2, "attributes_unused": 1}  # items 4 ([]) and 12; item 99
    assert notes == {n["code"]: n["count"] for n in data.sanity() if n["code"] in notes}


def test_without_an_attributes_file_there_are_no_features(tmp_path):
    data = load(_folder(tmp_path, attributes=None))
    assert data.features == {} and data.notes == []


def test_the_file_itself_loads_like_its_folder(tmp_path):
    folder = _folder(tmp_path)
    a, b = load(folder), load(folder / "Toy.txt")
    assert detect_format(folder / "Toy.txt") == "sequences"
    assert a.inter.equals(b.inter) and np.array_equal(a.features["attributes"], b.features["attributes"])


@pytest.mark.parametrize(
    "name, text",
    [
        ("notes.txt", "This folder holds\nthe sequences\n"),
        ("counts.txt", "1 2\n3\n4 5\n"),  # a line with one number: not 'user item ...'
        ("scores.txt", "1 2.5 3\n"),  # a float
    ],
)
def test_other_txt_files_are_not_claimed(tmp_path, name, text):
    write(tmp_path / name, text)
    with pytest.raises(DataError, match="no recognised dataset"):
        detect_format(tmp_path)
    with pytest.raises(DataError, match="not a sequence file"):
        detect_format(tmp_path / name)


def test_a_readme_beside_the_sequences_does_not_get_in_the_way(tmp_path):
    write(tmp_path / "README.txt", "Toy sequences, one user a line\n")
    assert load(_folder(tmp_path)).n_users == 3


def test_real_amazon2014_toys():
    data = load(shared_data("amazon2014-toys"))
    assert (data.n_users, data.n_items, data.n_inter) == (19_412, 11_924, 167_597)
    m = data.features["attributes"]
    assert m.shape == (11_924, 1_027) and m.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(m, axis=1), 1.0, rtol=1e-5)  # every item has attributes
    split = splits.leave_one_out(data)
    assert len(split.test()) == len(split.valid()) == 19_412


def test_attributes_reach_the_fusion_views_and_the_content_ranker(tmp_path):
    from fedvlr_plus.coldstart.content import ContentRanker
    from fedvlr_plus.fedvlr.views import load_views

    data = splits.leave_one_out(load(_folder(tmp_path)))
    views = load_views(data, progress=False)
    assert list(views) == ["attributes"] and views["attributes"].shape == (6, 5)
    scores = ContentRanker(data, views)(np.arange(data.n_users))
    # user 3 trained on item 5 (attribute 30): item 3 shares attribute 30, item 2 shares nothing
    u3 = int(np.flatnonzero(data.user_ids == 3)[0])
    item = {int(raw): i for i, raw in enumerate(data.item_ids)}
    assert scores[u3, item[3]] > 0 and scores[u3, item[2]] == 0 and scores[u3, item[12]] == 0
