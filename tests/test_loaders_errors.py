"""Bad input: every case is a DataError naming the file and the 1-based line (as an editor shows it) or field."""

from __future__ import annotations

import _shared as fx
import numpy as np
import pandas as pd
import pytest

from fedvlr_plus.datasets import (
    DataError,
    InteractionData,
    detect_format,
    load,
    load_amazon,
    load_feature_folder,
    read_atomic,
    write_atomic,
)


def raises(fn, *parts):
    """Call ``fn``; it must raise DataError whose message contains every one of ``parts``."""
    with pytest.raises(DataError) as e:
        fn()
    msg = str(e.value)
    for p in parts:
        assert p in msg, f"{p!r} not in {msg!r}"
    return msg


def ml_csv(tmp_path, ratings: str):
    folder = tmp_path / "ml"
    fx.write(folder / "ratings.csv", ratings)
    fx.write(folder / "movies.csv", fx.ML_LATEST_MOVIES)
    return folder


# ------------------------------------------------------------------------------------------ delimited files
def test_missing_column_names_it_and_the_columns_found(tmp_path):
    folder = ml_csv(tmp_path, "userId,movieId,timestamp\n1,1,964982703\n")
    raises(lambda: load(folder), "ratings.csv", "line 1", "'rating'", "columns found: userId, movieId, timestamp")


def test_too_many_fields(tmp_path):
    folder = ml_csv(tmp_path, "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,3,4.5,964981247,9\n")
    raises(lambda: load(folder), "ratings.csv: line 3", "expected 4 fields, found 5")


def test_too_many_fields_on_the_first_data_line(tmp_path):
    # pandas alone would take the extra field as an index column and shift everything silently
    folder = ml_csv(tmp_path, "userId,movieId,rating,timestamp\n1,1,4.0,964982703,7\n1,3,4.5,964981247,9\n")
    raises(lambda: load(folder), "ratings.csv: line 2", "expected 4 fields, found 5")


def test_two_extra_fields_on_the_first_data_line(tmp_path):
    # here pandas would only warn and drop data; the warning is turned into an error with the line
    folder = ml_csv(tmp_path, "userId,movieId,rating,timestamp\n1,1,4.0,964982703,7,8\n1,3,4.5,964981247\n")
    raises(lambda: load(folder), "ratings.csv: line 2", "expected 4 fields, found 6")


def test_too_few_fields(tmp_path):
    folder = ml_csv(tmp_path, "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n2,1,3.0\n")
    raises(lambda: load(folder), "ratings.csv: line 3", "expected 4 fields, found 3")


def test_too_few_fields_in_a_string_column_file(tmp_path):
    folder = ml_csv(tmp_path, fx.ML_LATEST_RATINGS)
    fx.write(folder / "movies.csv", "movieId,title,genres\n1,Toy Story (1995),Comedy\n3,Alone\n50,X,Drama\n")
    raises(lambda: load(folder), "movies.csv: line 3", "expected 3 fields, found 2")


def test_unparsable_number(tmp_path):
    folder = ml_csv(
        tmp_path, "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,3,4.5,964981247\n2,1,abc,1445714835\n"
    )
    raises(lambda: load(folder), "ratings.csv: line 4", "'rating'", "'abc'")


def test_line_numbers_count_blank_lines(tmp_path):
    folder = ml_csv(tmp_path, "userId,movieId,rating,timestamp\n\n1,1,4.0,964982703\n\n\n2,1,nan,1445714835\n")
    raises(lambda: load(folder), "ratings.csv: line 6", "'rating'", "not a finite number")


def test_non_integer_id(tmp_path):
    folder = ml_csv(tmp_path, "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1.5,3,4.5,964981247\n")
    raises(lambda: load(folder), "ratings.csv: line 3", "'userId'", "whole number")


def test_invalid_utf8(tmp_path):
    folder = ml_csv(tmp_path, fx.ML_LATEST_RATINGS)
    (folder / "movies.csv").write_bytes(b"movieId,title,genres\n1,Toy Story,Comedy\n3,Caf\xe9,Drama\n")
    raises(lambda: load(folder), "movies.csv: line 3", "not valid utf-8")


def test_rating_for_a_movie_not_in_the_catalogue(tmp_path):
    folder = ml_csv(tmp_path, "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,404,4.5,964981247\n")
    raises(lambda: load(folder), "ratings.csv: line 3", "404", "movies.csv")


def test_empty_files(tmp_path):
    folder = ml_csv(tmp_path, "")
    raises(lambda: load(folder), "ratings.csv", "empty")
    folder = ml_csv(tmp_path, "userId,movieId,rating,timestamp\n")
    raises(lambda: load(folder), "ratings.csv", "no interactions")


def test_ml1m_malformed_line(tmp_path):
    folder = fx.make_ml1m(tmp_path / "ml-1m")
    fx.write(folder / "ratings.dat", "1::1193::5::978300760\n1::661::3\n", "latin-1")
    raises(lambda: load(folder), "ratings.dat: line 2", "expected 4 fields, found 3")
    fx.write(folder / "ratings.dat", "1::1193::5::978300760\n1::661::three::978302109\n", "latin-1")
    raises(lambda: load(folder), "ratings.dat: line 2", "'Rating'", "'three'")
    fx.write(folder / "ratings.dat", fx.ML1M_RATINGS, "latin-1")
    fx.write(folder / "users.dat", "1::F::1::10::48067\n", "latin-1")  # user 2 is missing
    raises(lambda: load(folder), "ratings.dat: line 3", "user 2", "users.dat")


def test_ml100k_raw_wrong_genre_flag_count(tmp_path):
    folder = fx.make_ml100k_raw(tmp_path / "ml-100k")
    lines = fx.ML100K_ITEM.splitlines()
    lines[1] = lines[1].rsplit("|", 1)[0]  # 18 genre flags instead of 19
    fx.write(folder / "u.item", "\n".join(lines) + "\n", "latin-1")
    raises(lambda: load(folder), "u.item: line 2", "expected 24 fields, found 23")


# ------------------------------------------------------------------------------------------ Amazon
def test_amazon_broken_json_review(tmp_path):
    rows = fx.jsonl(fx.AMAZON_2023_REVIEWS).splitlines()
    rows[2] = rows[2][:40]
    path = fx.write(tmp_path / "Toys.jsonl", "\n".join(rows) + "\n")
    raises(lambda: load(path), "Toys.jsonl: line 3", "broken JSON")


def test_amazon_broken_json_on_line_1_and_gzip(tmp_path):
    path = fx.write(tmp_path / "Cat_5.json.gz", '{"reviewerID": "A", "asin": \n')
    raises(lambda: detect_format(path), "Cat_5.json.gz: line 1", "broken JSON")
    bad = tmp_path / "Bad_5.json.gz"
    bad.write_bytes(b"not gzip at all")
    raises(lambda: load_amazon(bad), "Bad_5.json.gz", "gzip")


def test_amazon_missing_field_and_bad_number(tmp_path):
    rows = [dict(r) for r in fx.AMAZON_2014_REVIEWS]
    del rows[1]["overall"]
    path = fx.write(tmp_path / "reviews_Home_5.json", fx.jsonl(rows))
    raises(lambda: load(path), "reviews_Home_5.json: line 2", "missing field 'overall'")
    rows = [dict(r) for r in fx.AMAZON_2014_REVIEWS]
    rows[3]["unixReviewTime"] = "soon"
    path = fx.write(tmp_path / "reviews_Home_5.json", fx.jsonl(rows))
    raises(lambda: load(path), "reviews_Home_5.json: line 4", "'unixReviewTime'", "'soon'")


def test_amazon_broken_metadata_line(tmp_path):
    reviews = fx.make_amazon_2014(tmp_path)
    lines = [repr(d) for d in fx.AMAZON_2014_META]
    lines[2] = lines[2][:-3]  # A2's entry, cut off
    fx.write(tmp_path / "meta_Home.json.gz", "\n".join(lines) + "\n")
    raises(lambda: load(reviews), "meta_Home.json.gz: line 3", "neither JSON nor a Python literal")


def test_amazon_2018_broken_metadata_json(tmp_path):
    rows = [{"overall": 5.0, "verified": True, "reviewerID": "R1", "asin": "X1", "unixReviewTime": 1}]
    reviews = fx.write(tmp_path / "Cat_5.json.gz", fx.jsonl(rows))
    fx.write(tmp_path / "meta_Cat.json.gz", '{"asin": "X0"}\n{"asin": "X1", "title": "T",\n')
    raises(lambda: load(reviews), "meta_Cat.json.gz: line 2")


def test_amazon_2023_csv_errors(tmp_path):
    path = fx.write(tmp_path / "Toys.csv", "user_id,parent_asin,rating\nUA,P1,5\n")
    raises(lambda: load(path, version="amazon-2023"), "Toys.csv: line 1", "'timestamp'")
    path = fx.write(tmp_path / "Toys.csv", "user_id,parent_asin,rating,timestamp\nUA,P1,5,1\n,P2,4,2\n")
    raises(lambda: load(path), "Toys.csv: line 3", "'user_id'", "empty")


def test_amazon_empty_and_not_a_review_file(tmp_path):
    path = fx.write(tmp_path / "Empty_5.json", "")
    raises(lambda: load_amazon(path), "Empty_5.json", "empty")
    meta = fx.write(tmp_path / "Toys.jsonl", fx.jsonl(fx.AMAZON_2023_META))
    raises(lambda: load(meta), "Toys.jsonl: line 1", "not an Amazon review", "metadata")


# ------------------------------------------------------------------------------------------ RecBole atomic
def test_atomic_bad_header_and_values(tmp_path):
    folder = fx.make_atomic(tmp_path)
    text = (folder / "shop.inter").read_text()
    fx.write(folder / "shop.inter", text.replace("rating:float", "rating:number"))
    raises(lambda: read_atomic(folder), "shop.inter: line 1", "'rating'", "unknown type 'number'")
    fx.write(folder / "shop.inter", text.replace("user_id:token", "uid:token"))
    raises(lambda: read_atomic(folder), "shop.inter: line 1", "missing field 'user_id'", "uid")
    fx.write(folder / "shop.inter", text.replace("u2\ti1\t3\t90", "u2\ti1\tthree\t90"))
    raises(lambda: read_atomic(folder), "shop.inter: line 3", "'rating:float'", "'three'")
    fx.write(folder / "shop.inter", text.replace("u2\ti1\t3\t90", "u2\ti1\t3"))
    raises(lambda: read_atomic(folder), "shop.inter: line 3", "expected 4 fields, found 3")
    fx.write(folder / "shop.inter", text)
    item = (folder / "shop.item").read_text()
    fx.write(folder / "shop.item", item.replace("0.5 0.25", "0.5 x"))
    raises(lambda: read_atomic(folder), "shop.item: line 2", "'emb'")
    fx.write(folder / "shop.item", item + "i1\tAgain\tX\t1\t1\n")
    raises(lambda: read_atomic(folder), "shop.item: line 6", "i1", "more than once")


def test_atomic_empty_split_file(tmp_path):
    d = InteractionData.from_raw("s", ["a", "b", "a"], ["x", "y", "y"], split=[0, 0, 2])
    folder = write_atomic(d, tmp_path / "s")
    fx.write(folder / "s.test.inter", "user_id:token\titem_id:token\trating:float\ttimestamp:float\n")
    raises(lambda: read_atomic(folder), "s.test.inter", "empty split")
    (folder / "s.test.inter").unlink()
    raises(lambda: read_atomic(folder), "s.test.inter", "missing")
    assert read_atomic(folder, splits=False).n_inter == 3


def test_atomic_split_files_must_partition_the_inter_file(tmp_path):
    d = InteractionData.from_raw("s", ["a", "b", "a"], ["x", "y", "y"], split=[0, 0, 2])
    folder = write_atomic(d, tmp_path / "s")
    with open(folder / "s.inter", "a") as f:
        f.write("c\tz\t1\t0\n")
    raises(lambda: read_atomic(folder), "s.inter: line 5", "none of the split files")


def test_atomic_ambiguous_folder(tmp_path):
    folder = fx.make_atomic(tmp_path)
    (folder / "other.inter").write_text((folder / "shop.inter").read_text())
    (folder.rename(tmp_path / "both"))
    raises(lambda: load(tmp_path / "both"), "several atomic datasets", "other", "shop")
    assert load(tmp_path / "both", name="shop").n_inter == 4


def test_write_atomic_refuses_and_writes_nothing(tmp_path):
    d = InteractionData.from_raw("w", ["a\tb", "c"], ["x", "y"])
    raises(lambda: write_atomic(d, tmp_path / "w"), "user id", "tab")
    assert not (tmp_path / "w").exists()
    d = InteractionData.from_raw("w", ["a", "c"], ["x", "y"])
    d = d.replace(items=pd.DataFrame({"score": [1.0, float("nan")]}))
    raises(lambda: write_atomic(d, tmp_path / "w"), "'score'", "row 1", "NaN")
    assert not (tmp_path / "w").exists() and list(tmp_path.iterdir()) == []
    part = InteractionData.from_raw("w", ["a", "c"], ["x", "y"], split=[0, -1])
    raises(lambda: write_atomic(part, tmp_path / "w"), "row 1", "no split label")


def test_failed_write_leaves_existing_folder_untouched(tmp_path):
    good = InteractionData.from_raw("w", ["a", "c"], ["x", "y"])
    folder = write_atomic(good, tmp_path / "w")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    bad = good.replace(items=pd.DataFrame({"score": [1.0, float("inf")]}))
    raises(lambda: write_atomic(bad, folder), "'score'")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# ------------------------------------------------------------------------------------------ feature folder
def test_feature_item_id_beyond_feature_rows(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "f", mapping=False)
    with open(folder / "inter.csv", "a") as f:
        f.write("2,7,1,40,0\n")  # itemID 7, but the feature files have 4 rows
    raises(lambda: load_feature_folder(folder), "inter.csv: line 10", "itemID 7", "image_features.npy", "4 rows")


def test_feature_negative_id(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "f")
    text = (folder / "inter.csv").read_text().splitlines()
    text[4] = "-1,1,1,15,0"
    fx.write(folder / "inter.csv", "\n".join(text) + "\n")
    raises(lambda: load_feature_folder(folder), "inter.csv: line 5", "userID -1", "negative")


def test_feature_row_count_mismatch(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "f", mapping=False)
    np.save(folder / "text_features.npy", np.zeros((6, 3), np.float16))  # image has 4 rows, text 6
    raises(lambda: load_feature_folder(folder), "image_features.npy", "4 rows", "6 items")


def test_feature_nan_row(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "f")
    arr = np.load(folder / "text_features.npy")
    arr[2, 1] = np.nan
    np.save(folder / "text_features.npy", arr)
    raises(lambda: load_feature_folder(folder), "text_features.npy", "row 2", "NaN")


def test_feature_bad_split_label_and_empty_split(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "f")
    text = (folder / "inter.csv").read_text()
    fx.write(folder / "inter.csv", text.replace("0,2,1,30,2", "0,2,1,30,5"))
    raises(lambda: load_feature_folder(folder), "inter.csv: line 4", "split label 5")
    fx.write(folder / "inter.csv", text.replace(",2\n", ",1\n"))  # no test rows left
    raises(lambda: load_feature_folder(folder), "inter.csv", "test split is empty")
    fx.write(folder / "inter.csv", "userID,itemID,rating,timestamp,split_label\n")
    raises(lambda: load_feature_folder(folder), "inter.csv", "no interactions")


def test_feature_mapping_problems(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "f")
    fx.write(folder / "i_id_mapping.csv", "asin,itemID\nX0,0\nX1,1\nX1b,1\n")
    raises(lambda: load_feature_folder(folder), "i_id_mapping.csv: line 4", "itemID 1", "twice")
    fx.write(folder / "i_id_mapping.csv", "asin,itemID\nX0,0\nX1,1\nX3,3\n")
    raises(lambda: load_feature_folder(folder), "i_id_mapping.csv", "no row for itemID 2")


def test_feature_corrupt_npy(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "f")
    (folder / "image_features.npy").write_bytes(b"\x93NUMPY garbage")
    raises(lambda: load_feature_folder(folder), "image_features.npy", "not a readable .npy")
    np.save(folder / "image_features.npy", np.zeros(4, np.float16))
    raises(lambda: load_feature_folder(folder), "image_features.npy", "2-D")
