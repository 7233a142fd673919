"""A plain interactions table (``user_id,item_id,...`` in a .csv or .tsv): found by its column names, read with
its ids as written and its times as seconds, and trained on by ``run`` like any other source."""

from __future__ import annotations

import json

import _shared as fx
import numpy as np
import pytest
from _bad_input import assert_user_error, run_cli

from fedvlr_plus.datasets import DataError, detect_format, load
from fedvlr_plus.datasets.splits import leave_one_out

PLAIN = "user_id,item_id,rating,timestamp\n007,a,5,30\n007,b,3,10\n12,a,4,20\n007,c,1,20\n"


def test_a_plain_csv_is_read_with_ids_as_written(tmp_path):
    path = fx.write(tmp_path / "log.csv", PLAIN)
    assert detect_format(path) == "interactions-table"
    d = load(path)
    assert d.name == "log" and d.format == "interactions-table"
    assert list(d.user_ids) == ["007", "12"]  # first appearance; the leading zeros kept
    assert list(d.item_ids) == ["a", "b", "c"]
    rows = d.inter[["user", "item", "rating", "timestamp"]].to_numpy().tolist()
    assert rows == [[0, 0, 5, 30], [0, 1, 3, 10], [1, 0, 4, 20], [0, 2, 1, 20]]
    assert d.items["title"].tolist() == ["", "", ""]  # a table holds no item content


def test_header_names_are_matched_without_case_or_separators_and_dates_read(tmp_path):
    text = "Movie Id\tUser ID\tStars\tDate\nm1\tu1\t5\t2023-01-02\nm2\tu1\t4\t2023-01-01T12:00:00Z\n"
    d = load(fx.write(tmp_path / "export.tsv", text))
    assert list(d.user_ids) == ["u1"] and list(d.item_ids) == ["m1", "m2"]
    assert d.inter["rating"].tolist() == [5.0, 4.0]
    day = 86400.0
    assert d.inter["timestamp"].tolist() == [19359 * day, 19358 * day + day / 2]  # 2023-01-02 and 01-01 noon


def test_without_a_time_column_the_split_follows_file_order(tmp_path):
    d = load(fx.write(tmp_path / "t.csv", "user;item\nu;x\nu;y\nu;z\nv;x\nv;z\nv;y\n"))
    assert (d.inter["timestamp"] == 0).all() and (d.inter["rating"] == 1).all()
    split = leave_one_out(d)
    test = split.test()
    assert sorted(zip(split.user_ids[test["user"]], split.item_ids[test["item"]])) == [("u", "z"), ("v", "y")]


def test_a_folder_holding_one_table_and_a_ratings_csv_of_other_columns(tmp_path):
    folder = tmp_path / "shop"
    fx.write(folder / "ratings.csv", PLAIN)  # not MovieLens' userId,movieId header
    fx.write(folder / "notes.csv", "a,b\n1,2\n")  # not a table: ignored
    assert detect_format(folder) == "interactions-table"
    assert detect_format(folder / "ratings.csv") == "interactions-table"
    assert load(folder).n_inter == 4


def test_run_trains_on_a_table(tmp_path):
    rng = np.random.default_rng(0)
    rows = [f"u{u},i{rng.integers(30)},{rng.integers(1, 6)},{t}" for u in range(12) for t in range(8)]
    path = fx.write(tmp_path / "log.csv", "user_id,item_id,rating,timestamp\n" + "\n".join(rows) + "\n")
    res = run_cli("run", path, "--backbone", "fedavg", "--rounds", "2", "--json", "--no-progress")
    assert res.code == 0, res.err
    out = json.loads(res.out.strip().splitlines()[-1])
    assert out["dataset"] == "log" and out["n_users"] == 12 and out["rounds_run"] == 2
    assert 0.0 <= out["test"]["ndcg@10"] <= 1.0


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "name, text, needles",
    [
        ("two.csv", "user,user_id,item\n1,2,3\n", ["two.csv", "line 1", "'user', 'user_id'", "user column"]),
        ("rating.csv", "user_id,item_id,rating\n1,2,5\n1,3,x\n", ["rating.csv", "line 3", "'rating'", "'x'"]),
        ("date.tsv", "user\titem\ttime\nu\ta\t2023-01-01\nu\tb\tsoon\n", ["date.tsv", "line 3", "'soon'", "date"]),
        ("num.csv", "user,item,ts\nu,a,10\nu,b,later\n", ["num.csv", "line 3", "'later'", "number"]),
        ("inf.csv", "user,item,ts\nu,a,1e400\n", ["inf.csv", "line 2", "'1e400'", "finite number"]),
        ("empty_id.csv", "user_id,item_id\n1,\n", ["empty_id.csv", "line 2", "'item_id' is empty"]),
        ("fields.csv", "user_id,item_id\n1,2,3\n", ["fields.csv", "line 2", "expected 2 fields"]),
        ("cols.tsv", "a\tb\n1\t2\n", ["cols.tsv", "not an interactions table", "no user or item column"]),
        ("neither.csv", "a,b\n1,2\n", ["neither.csv", "Amazon", "nor is it an interactions table"]),
    ],
)
def test_a_bad_table_is_one_line_naming_file_line_and_field(tmp_path, name, text, needles):
    path = fx.write(tmp_path / name, text)
    assert_user_error(run_cli("data", "stats", path), *needles)


def test_a_folder_with_two_tables_asks_for_one(tmp_path):
    folder = tmp_path / "two"
    fx.write(folder / "a.csv", PLAIN)
    fx.write(folder / "b.tsv", PLAIN.replace(",", "\t"))
    with pytest.raises(DataError, match="several interactions tables; pass one of them"):
        detect_format(folder)


def test_fusion_on_a_table_says_where_content_goes(tmp_path):
    path = fx.write(tmp_path / "log.csv", PLAIN)
    res = run_cli("run", path, "--backbone", "fedavg", "--fusion", "fedvlr", "--no-tune", "--rounds", "1")
    assert_user_error(res, "--fusion fedvlr", "plain interactions table", "feature folder")
