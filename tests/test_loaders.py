"""Loaders on the real data: ML-100K from the recbole wheel, KU (FedVLR), Amazon 2018 (Gift Cards, Magazines)."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from _shared import shared_data

from fedvlr_plus.datasets import (
    DataError,
    detect_format,
    load,
    load_amazon,
    load_feature_folder,
    load_ml100k,
    read_atomic,
    splits,
    write_atomic,
)


@pytest.fixture(scope="module")
def ml100k():
    return load_ml100k()


def test_ml100k_from_the_recbole_wheel(ml100k):
    d = ml100k
    assert (d.n_users, d.n_items, d.n_inter) == (943, 1682, 100_000)
    assert d.format == "recbole-atomic" and d.source.endswith("dataset_example/ml-100k")
    # ratings are integers 1..5, Unix seconds between 1997-09-20 and 1998-04-23
    assert set(np.unique(d.inter["rating"])) == {1, 2, 3, 4, 5}
    assert d.inter["timestamp"].min() >= 874_724_710 and d.inter["timestamp"].max() <= 893_286_638
    # the first line of ml-100k.inter is "196 242 3 881250949"
    first = d.inter.loc[0]
    assert d.user_ids[d.inter.loc[0, "user"]] == "196" and d.item_ids[d.inter.loc[0, "item"]] == "242"
    assert first["rating"] == 3 and first["timestamp"] == 881250949
    # item content: titles and the 19 genres ("Children's" is one token)
    assert d.items.loc[0, "title"] == "Toy Story" and d.item_ids[0] == "1"
    assert d.items.loc[0, "categories"] == ["Animation", "Children's", "Comedy"]
    genres = collections.Counter(g for gs in d.items["categories"] for g in gs)
    assert len(genres) == 19 and genres["Drama"] == 725 and genres["Comedy"] == 505
    assert (d.items["title"] != "").all()
    assert d.items.loc[0, "release_year"] == "1995"
    # user attributes
    assert list(d.users.columns) == ["age", "gender", "occupation", "zip_code"]
    assert d.users["age"].dtype == np.int64 and (d.users["age"].min(), d.users["age"].max()) == (7, 73)
    assert d.users["gender"].value_counts().to_dict() == {"M": 670, "F": 273}
    assert d.users["occupation"].nunique() == 21
    assert d.users.loc[0].to_dict() == {"age": 24, "gender": "M", "occupation": "technician", "zip_code": "85711"}


def test_load_string_ml100k_is_the_wheel_copy(ml100k, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder called ml-100k here
    assert detect_format("ml-100k") == "recbole-atomic"
    d = load("ml-100k")
    assert (d.n_users, d.n_items, d.n_inter) == (943, 1682, 100_000)
    assert d.users["age"].dtype == np.int64
    with pytest.raises(TypeError, match="no options"):
        load("ml-100k", dedup=True)


def test_ml100k_atomic_round_trip_with_splits(ml100k, tmp_path):
    d = splits.leave_one_out(ml100k)
    folder = write_atomic(d, tmp_path / "ml-100k")
    # the written .inter is the wheel's own file, byte for byte (same ids, same numbers, same order)
    written = (tmp_path / "ml-100k" / "ml-100k.inter").read_bytes()
    assert written == (Path(ml100k.source) / "ml-100k.inter").read_bytes()
    back = read_atomic(folder)
    assert list(back.user_ids) == list(d.user_ids) and list(back.item_ids) == list(d.item_ids)
    assert back.inter.equals(d.inter)
    assert back.items.equals(d.items)
    assert (back.users["age"].to_numpy() == d.users["age"].to_numpy()).all()
    assert back.users[["gender", "occupation", "zip_code"]].equals(d.users[["gender", "occupation", "zip_code"]])
    assert [len(back.part(s)) for s in ("train", "valid", "test")] == [98_114, 943, 943]


def test_ku_feature_folder():
    folder = shared_data("ku")
    d = load_feature_folder(folder)
    assert detect_format(folder) == "feature-folder"
    assert (d.n_users, d.n_items, d.n_inter) == (204, 560, 3489)
    assert [len(d.part(s)) for s in ("train", "valid", "test")] == [3081, 204, 204]
    assert d.features["image"].shape == (560, 512) and d.features["image"].dtype == np.float32
    raw = np.load(folder / "image_features.npy")
    assert np.array_equal(d.features["image"][17], raw[17].astype(np.float32))
    # internal ids are the file's ids; raw ids come from the mapping files
    first = (folder / "inter.csv").read_text().splitlines()[1].split(",")
    assert (d.inter.loc[0, "user"], d.inter.loc[0, "item"]) == (int(first[0]), int(first[1]))
    assert d.user_ids[0] == "95" and d.item_ids[0] == "2"
    st = d.stats()
    assert st["cold_items"] == 16 and st["test_cold_targets"] == 88


def test_amazon_2018_gift_cards():
    path = shared_data("amazon2018") / "Gift_Cards_5.json.gz"
    assert detect_format(path) == "amazon-2018"
    raw = load_amazon(path, dedup=False)
    assert raw.n_inter == 2972
    d = load(path)
    assert d.format == "amazon-2018"
    assert (d.n_inter, d.n_users, d.n_items) == (2965, 458, 148)
    assert (d.items["title"] != "").all()  # the metadata covers all 148 items
    assert d.items["image"].notna().sum() > 100
    assert all(url.startswith("https://") and "._S" not in url for url in d.items["image"].dropna())
    # the first review line: reviewer A31UBHTUUIFJUT, asin B004LLIKVU, 5 stars, 1529193600
    assert d.user_ids[d.inter.loc[0, "user"]] == "A31UBHTUUIFJUT"
    assert d.item_ids[d.inter.loc[0, "item"]] == "B004LLIKVU"
    assert (d.inter.loc[0, "rating"], d.inter.loc[0, "timestamp"]) == (5.0, 1529193600)
    with gzip.open(shared_data("amazon2018") / "meta_Gift_Cards.json.gz", "rt") as f:
        meta = {}
        for line in f:
            obj = json.loads(line)
            meta.setdefault(obj["asin"], obj)
    k = int(np.flatnonzero(d.item_ids == "B004LLIKVU")[0])
    assert d.items.loc[k, "title"] == " ".join(meta["B004LLIKVU"]["title"].split())


def test_amazon_2018_magazines_broken_html_and_duplicate_asins():
    path = shared_data("amazon2018") / "Magazine_Subscriptions_5.json.gz"
    d = load_amazon(path)
    assert (d.n_inter, d.n_users, d.n_items) == (2302, 348, 157)
    has_meta = (d.items["description"] != "") | d.items["categories"].map(bool)
    assert has_meta.sum() == 151  # 151 of the 157 items have metadata
    titles = d.items["title"]
    assert not titles.str.contains("[<>\"]").any()  # '<span class="a-size-medium ..."' is gone
    assert sorted(t for t in titles if t) == ["Gourmet (1-year)", "SmartMoney (1-year)", "Woman's Day"]
    assert not d.items["categories"].map(lambda cs: any("&amp;" in c for c in cs)).any()


def test_amazon_folder_with_several_review_files_is_refused():
    folder = shared_data("amazon2018")
    with pytest.raises(DataError) as e:
        load(folder)
    msg = str(e.value)
    assert "several Amazon review files" in msg
    for name in ("Gift_Cards_5.json.gz", "Magazine_Subscriptions_5.json.gz", "All_Beauty_5.json.gz"):
        assert name in msg
    assert "meta_Gift_Cards" not in msg
