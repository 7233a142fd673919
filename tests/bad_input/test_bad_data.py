"""Bad and doubtful data through the CLI (``data stats`` and ``run``): a fault is one ``error:`` line naming the
file and line (exit 2, nothing written); a doubtful but usable set loads with one ``warning:`` line per finding,
and the same findings, with counts, in the JSON (``warnings`` in ``data stats``, ``data_warnings`` in ``run``)."""

from __future__ import annotations

import json
import time

import _shared as fx
import numpy as np
import pytest
from _bad_input import assert_user_error, files_under, run_cli

HEADER = "userID,itemID,rating,timestamp,split_label\n"
# Two users, each with two train rows, one valid and one test row, over four items; user 0's test item (3)
# is cold (never in train), user 1's (0) is warm, so every part of the run report has users.
CLEAN = [
    (0, 0, 1, 10, 0),
    (0, 1, 1, 20, 0),
    (0, 2, 1, 30, 1),
    (0, 3, 1, 40, 2),
    (1, 1, 1, 11, 0),
    (1, 2, 1, 21, 0),
    (1, 3, 1, 31, 1),
    (1, 0, 1, 41, 2),
]


def folder_with(tmp_path, rows, *, features: int | None = None):
    """A FedVLR feature folder holding ``rows``; with ``features``, float16 image/text files of that many rows."""
    folder = tmp_path / "ff"
    fx.write(folder / "inter.csv", HEADER + "".join(",".join(map(str, r)) + "\n" for r in rows))
    if features is not None:
        rng = np.random.default_rng(0)
        for name in ("image_features.npy", "text_features.npy"):
            np.save(folder / name, rng.standard_normal((features, 3)).astype(np.float16))
    return folder


def stats_json(folder) -> tuple[dict, list[str]]:
    res = run_cli("data", "stats", folder, "--json")
    assert res.code == 0, res.err
    assert "Traceback" not in res.err
    return json.loads(res.out.strip().splitlines()[-1]), [l for l in res.err.splitlines() if l.startswith("warning:")]


def run_json(folder, *extra) -> tuple[dict, list[str]]:
    res = run_cli("run", folder, "--backbone", "pop", "--json", "--metrics", "hr@2,ndcg@2", *extra)
    assert res.code == 0, res.err
    assert "Traceback" not in res.err
    return json.loads(res.out.strip().splitlines()[-1]), [l for l in res.err.splitlines() if l.startswith("warning:")]


def by_code(found: list[dict]) -> dict[str, dict]:
    return {f["code"]: f for f in found}


# ------------------------------------------------------------------------------------------ warnings
def test_duplicate_rows_in_a_predefined_split_are_counted_and_kept(tmp_path):
    rows = CLEAN + [(0, 1, 1, 25, 0), (1, 2, 1, 22, 0), (1, 0, 1, 42, 2)]  # two train repeats, one test repeat
    folder = folder_with(tmp_path, rows)
    stats, warned = stats_json(folder)
    dup = by_code(stats["warnings"])["duplicate_rows"]
    assert dup["count"] == 3 and dup["splits"] == {"train": 2, "test": 1}
    assert len(warned) == 1 and "duplicate (user, item) rows within one split: 3" in warned[0]
    assert str(folder) in warned[0]
    result, warned = run_json(folder)
    assert by_code(result["data_warnings"])["duplicate_rows"]["count"] == 3
    assert len(warned) == 1  # printed once when the data is loaded for the run


def test_duplicate_rows_of_unsplit_data_are_dropped_by_the_split_keeping_the_earliest(tmp_path):
    folder = tmp_path / "ml"
    fx.write(
        folder / "ratings.csv",
        "userId,movieId,rating,timestamp\n"
        "1,1,4,100\n1,2,4,200\n1,3,4,300\n1,4,4,400\n1,2,5,50\n"
        "2,3,3,100\n2,4,3,200\n2,1,3,300\n",
    )
    stats, warned = stats_json(folder)
    assert by_code(stats["warnings"])["duplicate_rows"]["splits"] == {"unsplit": 1}
    assert "splitting (leave-one-out, ratio, cold) drops them" in warned[0]
    result, warned = run_json(folder, "--split", "loo")
    dropped = by_code(result["data_warnings"])
    assert list(dropped) == ["duplicates_dropped"] and dropped["duplicates_dropped"]["count"] == 1
    assert dropped["duplicates_dropped"]["kept"] == "earliest"
    assert len(warned) == 1 and "duplicate (user, item) rows dropped: 1" in warned[0]


def test_train_test_leak_is_reported_and_the_split_kept(tmp_path):
    rows = [r for r in CLEAN if r[:2] != (1, 0)] + [(1, 1, 1, 41, 2)]  # user 1's test item is a train item
    folder = folder_with(tmp_path, rows)
    stats, warned = stats_json(folder)
    leak = by_code(stats["warnings"])["train_leak"]
    assert leak["count"] == 1 and leak["splits"] == {"valid": 0, "test": 1}
    assert stats["splits"]["test"]["interactions"] == 2  # kept: the data owner's split
    assert len(warned) == 1 and "also in train: 1" in warned[0]
    result, _ = run_json(folder)
    assert by_code(result["data_warnings"])["train_leak"]["count"] == 1 and result["n_users"] == 2


def test_user_with_only_held_out_rows(tmp_path):
    folder = folder_with(tmp_path, CLEAN + [(2, 1, 1, 50, 1), (2, 2, 1, 60, 2)])
    stats, warned = stats_json(folder)
    found = by_code(stats["warnings"])
    assert found["users_without_train"]["count"] == 1 and list(found) == ["users_without_train"]
    assert "no training row: 1" in warned[0]
    result, _ = run_json(folder)
    assert by_code(result["data_warnings"])["users_without_train"]["count"] == 1


def test_clean_data_has_no_warnings(tmp_path):
    stats, warned = stats_json(folder_with(tmp_path, CLEAN))
    assert stats["warnings"] == [] and warned == []


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("column,row", [("userID", (999_999_999, 1, 1, 50, 0)), ("itemID", (1, 999_999_999, 1, 50, 0))])
def test_absurd_id_without_a_mapping_fails_fast_naming_the_line(tmp_path, column, row):
    rows = CLEAN[:3] + [row] + CLEAN[3:]
    folder = folder_with(tmp_path, rows)
    before = files_under(tmp_path)
    start = time.perf_counter()
    res = run_cli("data", "stats", folder)
    took = time.perf_counter() - start
    assert_user_error(res, "inter.csv: line 5", f"{column} 999999999", "far beyond")
    assert took < 3.0, f"took {took:.1f} s: the id should be refused before anything is sized by it"
    assert files_under(tmp_path) == before


def test_sparse_ids_within_the_bound_load(tmp_path):
    # ids 0 and 500 for two users: gaps, but far below 10 x distinct ids + 1000, so this is accepted
    rows = [(500 if u == 1 else u, *rest) for u, *rest in CLEAN]
    stats, _ = stats_json(folder_with(tmp_path, rows))
    assert stats["users"] == 501 and stats["interactions"] == 8


def test_absurd_id_in_the_mapping_file_names_the_first_missing_row(tmp_path):
    folder = folder_with(tmp_path, CLEAN)
    fx.write(folder / "u_id_mapping.csv", "user_id,userID\nA,0\nB,1\nZ,999999999\n")
    start = time.perf_counter()
    res = run_cli("data", "stats", folder)
    assert_user_error(res, "u_id_mapping.csv", "no row for userID 2")
    assert time.perf_counter() - start < 3.0


@pytest.mark.parametrize("layout", ["feature-folder", "movielens-csv"])
def test_bad_byte_on_line_51_is_reported_on_line_51(tmp_path, layout):
    if layout == "feature-folder":
        lines = [HEADER.strip()] + [f"{u % 7},{u % 5},1,{u},{(0, 0, 0, 1, 2)[u % 5]}" for u in range(80)]
        path = tmp_path / "ff" / "inter.csv"
    else:
        lines = ["userId,movieId,rating,timestamp"] + [f"{u % 7},{u % 5},4,{u}" for u in range(80)]
        path = tmp_path / "ml" / "ratings.csv"
    data = "\n".join(lines).encode() + b"\n"
    parts = data.split(b"\n")
    parts[50] += b"\xff"  # line 51 as an editor counts (the header is line 1)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\n".join(parts))
    assert_user_error(run_cli("data", "stats", path.parent), f"{path.name}: line 51", "not valid utf-8")


@pytest.mark.parametrize(
    "text,needles",
    [
        ("", ("inter.csv", "the file is empty")),
        (HEADER, ("inter.csv", "no interactions", "header but no data rows")),
        ("userID,rating,timestamp,split_label\n0,1,10,0\n", ("inter.csv: line 1", "missing column 'itemID'")),
        (HEADER + "0,0,1,10,0\n0,1,high,20,2\n", ("inter.csv: line 3", "'rating'", "'high'", "not a finite number")),
    ],
    ids=["empty-file", "header-only", "missing-column", "non-numeric-rating"],
)
def test_unreadable_interactions(tmp_path, text, needles):
    folder = tmp_path / "ff"
    fx.write(folder / "inter.csv", text)
    before = files_under(tmp_path)
    assert_user_error(run_cli("data", "stats", folder), *needles)
    assert_user_error(run_cli("run", folder, "--backbone", "pop", "--json"), *needles)
    assert files_under(tmp_path) == before


def test_nan_feature_row(tmp_path):
    folder = folder_with(tmp_path, CLEAN, features=4)
    arr = np.load(folder / "text_features.npy")
    arr[2, 1] = np.nan
    np.save(folder / "text_features.npy", arr)
    assert_user_error(
        run_cli("run", folder, "--backbone", "pop", "--json"), "text_features.npy", "row 2 (item 2)", "NaN"
    )


def test_feature_rows_not_matching_the_catalogue(tmp_path):
    folder = folder_with(tmp_path, CLEAN, features=4)
    np.save(folder / "image_features.npy", np.zeros((6, 3), np.float16))  # text has 4 rows, image 6
    assert_user_error(run_cli("data", "stats", folder), "text_features.npy", "4 rows", "6 items")
    np.save(folder / "image_features.npy", np.zeros((3, 3), np.float16))  # item 3 has no image row
    assert_user_error(run_cli("data", "stats", folder), "inter.csv: line 5", "itemID 3", "image_features.npy", "3 rows")


# ------------------------------------------------------------------------------------------ honest stats
def test_data_stats_lists_only_content_fields_that_hold_values(tmp_path):
    folder = fx.make_atomic(tmp_path)  # titles for all 4 items, class for 3, no description or image field
    text = (folder / "shop.item").read_text().splitlines()
    text[0] += "\tdescription:token_seq\timage:token"
    text[1:] = [line + "\t\t" for line in text[1:]]  # both present in the header, empty for every item
    fx.write(folder / "shop.item", "\n".join(text) + "\n")
    stats, _ = stats_json(folder)
    assert stats["content_coverage"] == {"title": 4, "categories": 3, "price": 4, "emb": 3}
    assert "description" not in stats["content"] and "image" not in stats["content"]
    res = run_cli("data", "stats", folder)
    line = next(l for l in res.out.splitlines() if "item content" in l)
    assert "title 4/4" in line and "categories 3/4" in line and "description" not in line and "image" not in line
