"""Every loader on tiny files in the exact original format, with hand-computed expectations."""

from __future__ import annotations

import _shared as fx
import numpy as np
import pandas as pd
import pytest

from fedvlr_plus.datasets import (
    DataError,
    detect_format,
    load,
    load_amazon,
    load_feature_folder,
    load_ml1m,
    load_movielens_csv,
    read_atomic,
    write_atomic,
)


def _pairs(d):
    """(raw user, raw item, rating, timestamp, split) per interaction row."""
    return [
        (d.user_ids[u], d.item_ids[i], float(r), float(t), int(s))
        for u, i, r, t, s in d.inter[["user", "item", "rating", "timestamp", "split"]].itertuples(index=False)
    ]


# ------------------------------------------------------------------------------------------ MovieLens
def test_movielens_csv(tmp_path):
    folder = fx.make_ml_latest(tmp_path / "ml-latest-small")
    assert detect_format(folder) == "movielens-csv"
    assert detect_format(folder / "ratings.csv") == "movielens-csv"
    d = load(folder)
    assert d.format == "movielens-csv" and d.name == "ml-latest-small"
    assert list(d.item_ids) == [1, 3, 7, 50, 99]  # catalogue order; 7 and 99 have no rating but are kept
    assert list(d.user_ids) == [1, 2, 3]
    assert _pairs(d) == [
        (1, 1, 4.0, 964982703, -1),
        (1, 3, 4.5, 964981247, -1),
        (2, 1, 3.0, 1445714835, -1),
        (2, 50, 5.0, 1445714836, -1),
        (3, 3, 0.5, 1306463578, -1),
    ]
    assert d.items["title"].tolist() == [
        "Toy Story (1995)",
        "American President, The (1995)",
        "Sabrina (1995)",
        "Usual Suspects, The (1995)",
        "Some Film (2000)",
    ]
    assert d.items.loc[0, "categories"] == ["Adventure", "Animation", "Children", "Comedy", "Fantasy"]
    assert d.items.loc[4, "categories"] == []  # "(no genres listed)"
    assert d.items["image"].isna().all() and (d.items["description"] == "").all()
    rated = load_movielens_csv(folder, keep_unrated_items=False)
    assert list(rated.item_ids) == [1, 3, 50]
    assert rated.items["title"].tolist()[2] == "Usual Suspects, The (1995)"
    assert rated.inter["item"].tolist() == [0, 1, 0, 2, 1]


def test_movielens_csv_without_movies_file(tmp_path):
    fx.write(tmp_path / "r" / "ratings.csv", fx.ML_LATEST_RATINGS)
    d = load(tmp_path / "r")
    assert list(d.item_ids) == [1, 3, 50]  # first appearance
    assert (d.items["title"] == "").all() and len(d.items) == 3


def test_ml1m_latin1(tmp_path):
    folder = fx.make_ml1m(tmp_path / "ml-1m")
    assert detect_format(folder) == "movielens-1m"
    d = load_ml1m(folder)
    assert list(d.item_ids) == [661, 1193, 73] and list(d.user_ids) == [1, 2]
    assert _pairs(d) == [(1, 1193, 5.0, 978300760, -1), (1, 661, 3.0, 978302109, -1), (2, 1193, 4.0, 978298413, -1)]
    assert d.items.loc[2, "title"] == "Misérables, Les (1995)"  # Latin-1 'é' decoded
    assert d.items.loc[0, "categories"] == ["Animation", "Children's", "Musical"]
    assert d.users.to_dict("list") == {
        "gender": ["F", "M"],
        "age": [1, 56],
        "occupation": [10, 16],
        "zip_code": ["48067", "70072"],
    }


def test_ml100k_raw(tmp_path):
    folder = fx.make_ml100k_raw(tmp_path / "ml-100k")
    assert detect_format(folder) == "movielens-100k-raw"
    d = load(folder)
    assert d.format == "movielens-100k-raw"
    assert list(d.item_ids) == [242, 302, 1] and list(d.user_ids) == [186, 196]  # u.item / u.user order
    assert _pairs(d) == [(196, 242, 3.0, 881250949, -1), (186, 302, 3.0, 891717742, -1), (196, 302, 4.0, 881251000, -1)]
    assert d.items["title"].tolist() == ["Kolya (1996)", "L.A. Confidential (1997)", "Toy Story (1995)"]
    assert d.items.loc[1, "categories"] == ["Crime", "Film-Noir", "Mystery", "Thriller"]
    assert d.items.loc[2, "categories"] == ["Animation", "Children's", "Comedy"]
    assert d.items.loc[0, "release_date"] == "24-Jan-1997"
    assert d.users.to_dict("list") == {
        "age": [39, 49],
        "gender": ["F", "M"],
        "occupation": ["executive", "writer"],
        "zip_code": ["00000", "55105"],
    }


def test_ml100k_raw_genre_names_from_u_genre(tmp_path):
    folder = fx.make_ml100k_raw(tmp_path / "ml-100k")
    names = [f"g{k}" for k in range(19)]
    fx.write(folder / "u.genre", "".join(f"{n}|{k}\n" for k, n in enumerate(names)) + "\n")
    d = load(folder)
    assert d.items.loc[0, "categories"] == ["g5"]


# ------------------------------------------------------------------------------------------ Amazon
def test_amazon_2014_python_literal_metadata(tmp_path):
    reviews = fx.make_amazon_2014(tmp_path)
    assert detect_format(reviews) == "amazon-2014"
    assert detect_format(tmp_path) == "amazon-2014"  # one reviews file in the folder: unambiguous
    d = load(reviews)
    assert d.format == "amazon-2014" and d.name == "reviews_Home_5"
    # (U1, A2) twice: the earlier review (line 4, 2 stars) is kept, rows stay in file order
    assert _pairs(d) == [
        ("U1", "A1", 5.0, 1400000000, -1),
        ("U2", "A2", 3.0, 1300000000, -1),
        ("U1", "A2", 2.0, 1340000000, -1),
        ("U3", "A3", 1.0, 1200000000, -1),
    ]
    a1 = d.items.loc[0].to_dict()
    assert a1 == {
        "title": 'Mug & "Cup"',
        "description": "It's a big mug. Really.",
        "categories": ["Home & Kitchen", "Kitchen", "Dining"],
        "image": "http://ecx.images-amazon.com/images/I/a1.jpg",
        "brand": "Acme",
    }
    assert d.items.loc[1, "title"] == "Plate & Bowl"
    assert d.items.loc[2].to_dict() == {"title": "", "description": "", "categories": [], "image": None, "brand": ""}
    assert load_amazon(reviews, dedup=False).n_inter == 5
    assert (load_amazon(reviews, meta=False).items["title"] == "").all()


# Amazon "ratings only" ids: users start with A, products are ASINs (B...) or ISBN-10s
_RATINGS_ONLY = [
    ("A2SUAM1J3GNN3B", "B000JMLBHU", 5.0, 1400000000),
    ("A1EE2E3N7PW666", "B000JMLBHU", 4.0, 1300000000),
    ("A2SUAM1J3GNN3B", "030758836X", 2.0, 1340000000),
]


def test_amazon_ratings_only_csv_2014_user_first_and_2018_asin_first(tmp_path):
    rows = "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in _RATINGS_ONLY)
    swapped = "".join(f"{i},{u},{r},{t}\n" for u, i, r, t in _RATINGS_ONLY)
    old = fx.write(tmp_path / "2014" / "ratings_Books.csv", rows)
    fx.write(
        tmp_path / "2014" / "meta_Books.json",
        "{'asin': '030758836X', 'title': 'A Book', 'categories': [['Books', 'Fiction']]}\n",
    )
    new = fx.write(tmp_path / "2018" / "Books.csv", swapped)
    assert detect_format(old) == "amazon-2014" and detect_format(tmp_path / "2014") == "amazon-2014"
    assert detect_format(new) == "amazon-2018"
    want = [(u, i, r, t, -1) for u, i, r, t in _RATINGS_ONLY]
    d_old, d_new = load(old), load(new)
    assert _pairs(d_old) == want and _pairs(d_new) == want
    assert d_old.name == "ratings_Books" and d_new.name == "Books"
    # the metadata beside it is found under the category's name, without the ratings_ prefix
    assert d_old.items.loc[1, "title"] == "A Book" and d_old.items.loc[1, "categories"] == ["Books", "Fiction"]
    assert d_old.items.loc[0, "title"] == "" and (d_new.items["title"] == "").all()


def test_amazon_ratings_only_csv_bad_rows_name_their_line(tmp_path):
    rows = "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in _RATINGS_ONLY)
    path = fx.write(tmp_path / "ratings_Books.csv", rows + "A3AAAAAAAAAAAA,B000JMLBHU,five,1\n")
    with pytest.raises(DataError, match=r"ratings_Books.csv: line 4.*'rating'.*'five'"):
        load(path)
    # plain numeric ids say neither column holds product ids: not taken for an Amazon file
    path = fx.write(tmp_path / "Books.csv", "1,2,5.0,100\n3,4,4.0,200\n")
    with pytest.raises(DataError, match=r"Books.csv: line 1 is neither .* nor a ratings-only row"):
        load(path)


def _check_2023(d):
    assert _pairs(d) == [
        ("UA", "P1", 5.0, 1588615855070, -1),
        ("UB", "P1", 4.0, 1588615855000, -1),
        ("UA", "P2", 2.0, 1600000000000, -1),
    ]
    assert d.items.loc[0].to_dict() == {
        "title": "Stacking Blocks",
        "description": "Ten blocks. Ages 3+.",
        "categories": ["Toys & Games"],
        "image": "L_main.jpg",
        "brand": "BlockCo",
    }
    assert d.items.loc[1].to_dict() == {
        "title": "Puzzle",
        "description": "",
        "categories": ["Toys & Games", "Puzzles"],
        "image": "p_l.jpg",
        "brand": "",
    }


def test_amazon_2023_jsonl(tmp_path):
    reviews = fx.make_amazon_2023_jsonl(tmp_path)
    assert detect_format(reviews) == "amazon-2023"
    d = load(reviews)
    assert d.format == "amazon-2023"
    _check_2023(d)


def test_amazon_2023_csv_gz(tmp_path):
    reviews = fx.make_amazon_2023_csv(tmp_path)
    assert detect_format(reviews) == "amazon-2023"
    d = load(reviews)
    _check_2023(d)


def test_amazon_2023_images_in_column_form_and_explicit_meta(tmp_path):
    reviews = fx.write(tmp_path / "a" / "Toys.jsonl", fx.jsonl(fx.AMAZON_2023_REVIEWS))
    meta = fx.write(
        tmp_path / "elsewhere.jsonl",
        fx.jsonl(
            [
                {
                    "parent_asin": "P1",
                    "title": "Blocks",
                    "categories": [],
                    "images": {
                        "thumb": ["t0", "t1"],
                        "large": ["l0", "l1"],
                        "variant": ["PT01", "MAIN"],
                        "hi_res": [None, None],
                    },
                }
            ]
        ),
    )
    d = load(reviews, meta=meta)
    assert d.items.loc[0, "image"] == "l1" and d.items.loc[0, "title"] == "Blocks"
    assert d.items.loc[1, "title"] == ""  # P2 has no metadata in this file


def test_amazon_2018_image_urls(tmp_path):
    rows = [
        {"overall": 5.0, "verified": True, "reviewerID": "R1", "asin": "X1", "unixReviewTime": 1},
        {"overall": 4.0, "verified": True, "reviewerID": "R1", "asin": "X2", "unixReviewTime": 2},
    ]
    reviews = fx.write(tmp_path / "Cat_5.json.gz", fx.jsonl(rows))
    fx.write(
        tmp_path / "meta_Cat.json.gz",
        fx.jsonl(
            [
                {
                    "asin": "X1",
                    "title": " Magazines\" />",
                    "image": ["https://h/I/41abc._SX38_SY50_CR,0,0,38,50_.jpg"],
                    "category": ["Books &amp; More"],
                    "description": ["<b>Bold</b> text", ""],
                },
                {
                    "asin": "X2",
                    "title": "<span class=\"a-size-medium\"",
                    "main_cat": "Magazines",
                    "imageURL": ["https://h/I/51x._SX38_.jpg"],
                    "imageURLHighRes": ["https://h/I/51x.jpg", "https://h/I/52y.jpg"],
                },
            ]
        ),
    )
    d = load(reviews)
    assert d.format == "amazon-2018"
    assert d.items.loc[0].to_dict() == {
        "title": "",
        "description": "Bold text",
        "categories": ["Books & More"],
        "image": "https://h/I/41abc.jpg",
        "brand": "",
    }
    assert d.items.loc[1, "image"] == "https://h/I/51x.jpg"
    assert d.items.loc[1, "categories"] == ["Magazines"] and d.items.loc[1, "title"] == ""


# ------------------------------------------------------------------------------------------ RecBole atomic
def test_recbole_atomic_token_seq(tmp_path):
    folder = fx.make_atomic(tmp_path)
    assert detect_format(folder) == "recbole-atomic"
    assert detect_format(folder / "shop.inter") == "recbole-atomic"
    d = load(folder)
    assert d.name == "shop" and d.format == "recbole-atomic"
    assert list(d.user_ids) == ["u2", "u1", "u3"] and list(d.item_ids) == ["i9", "i1", "i2", "i3"]
    assert _pairs(d) == [
        ("u1", "i1", 5.0, 100, -1),
        ("u2", "i1", 3.0, 90, -1),
        ("u1", "i2", 4.5, 110, -1),
        ("u3", "i3", 1.0, 50, -1),
    ]
    assert d.items["title"].tolist() == ["Unrated Thing", "The Blue Cup", "Plate", "Knife"]
    assert d.items["categories"].tolist() == [["Misc"], ["Kitchen", "Dining"], [], ["Kitchen"]]
    assert d.items["price"].tolist() == [1.5, 3.0, 2.25, 7.0]
    assert d.items["emb"].tolist() == [[0.5, 0.25], [1.0, 2.0], [], [-1.0, 0.0]]
    assert d.users.to_dict("list") == {"age": [30.0, 41.0, 25.0], "gender": ["F", "M", "F"]}


def test_recbole_atomic_ids_missing_from_item_file_are_appended(tmp_path):
    folder = fx.make_atomic(tmp_path)
    with open(folder / "shop.inter", "a") as f:
        f.write("u4\tnew\t2\t120\n")
    d = read_atomic(folder)
    assert list(d.item_ids) == ["i9", "i1", "i2", "i3", "new"] and list(d.user_ids)[-1] == "u4"
    assert d.items.loc[4, "title"] == "" and np.isnan(d.items.loc[4, "price"])


def _content_data():
    """A split dataset whose content has every awkward case: quotes, spaces in categories, None, ints."""
    from fedvlr_plus.datasets import InteractionData

    d = InteractionData.from_raw(
        "awk",
        [10, 20, 10, 30, 20, 10],
        ["a", "b", "b", "c", "a", "d"],
        rating=[5, 4, 3, 2, 1, 0.1],
        timestamp=[1.5, 2, 3, 1e12 + 0.25, 5, 6],
        split=[0, 0, 1, 0, 2, 2],
    )
    items = pd.DataFrame(
        {
            "title": ['"Quoted" start', "Tab\tand\nnewline", "", "Plain"],
            "description": ["", "Long  text  here", "x", ""],
            "categories": [["Gift Cards", "Home & Kitchen"], [], ["One"], ["a_b", "c-d"]],
            "image": ["http://x/a.jpg", None, "/local path/b.png", None],
            "year": [1995, 2001, 0, -3],
            "vec": [[0.5, 1.0], [0.25, 0.1], [], [3.0]],
            "tags": [["x y"], [], ["z"], []],
        }
    )
    users = pd.DataFrame({"gender": ["F", "M", ""], "score": [0.1, 2.0, 3.5]})
    return d.replace(items=items, users=users).validate()


def test_write_atomic_round_trip(tmp_path):
    d = _content_data()
    folder = write_atomic(d, tmp_path / "awk")
    assert sorted(p.name for p in folder.iterdir()) == [
        "awk.inter",
        "awk.item",
        "awk.test.inter",
        "awk.train.inter",
        "awk.user",
        "awk.valid.inter",
    ]
    header = (folder / "awk.item").read_text().splitlines()[0].split("\t")
    assert header == [
        "item_id:token",
        "title:token_seq",
        "description:token_seq",
        "categories:token_seq",
        "image:token",
        "year:float",
        "vec:float_seq",
        "tags:token_seq",
    ]
    assert "nan" not in (folder / "awk.item").read_text().lower()
    back = read_atomic(folder)
    assert list(back.user_ids) == ["10", "20", "30"] and list(back.item_ids) == ["a", "b", "c", "d"]
    assert back.inter.equals(d.inter)  # rows, order, float32 ratings, float64 timestamps, split labels
    expected = d.items.copy()
    expected.loc[1, "title"] = "Tab and newline"  # text is whitespace-normalised
    expected.loc[1, "description"] = "Long text here"
    assert back.items["title"].tolist() == expected["title"].tolist()
    assert back.items["description"].tolist() == expected["description"].tolist()
    assert back.items["categories"].tolist() == d.items["categories"].tolist()  # "Gift Cards" stays one category
    assert back.items["image"].tolist() == d.items["image"].tolist()
    assert back.items["year"].tolist() == [1995.0, 2001.0, 0.0, -3.0]
    assert back.items["vec"].tolist() == d.items["vec"].tolist()
    assert back.items["tags"].tolist() == d.items["tags"].tolist()
    assert back.users.to_dict("list") == {"gender": ["F", "M", ""], "score": [0.1, 2.0, 3.5]}
    # a second write of the same data gives identical files
    again = write_atomic(back, tmp_path / "again", "awk")
    for p in folder.iterdir():
        assert (again / p.name).read_bytes() == p.read_bytes()


def test_write_atomic_unsplit_and_stale_split_files(tmp_path):
    d = _content_data()
    folder = write_atomic(d, tmp_path / "awk")
    keep = folder / "notes.txt"
    keep.write_text("mine")
    write_atomic(d, folder, splits=False)  # rewriting without splits removes the old split files
    assert sorted(p.name for p in folder.iterdir()) == ["awk.inter", "awk.item", "awk.user", "notes.txt"]
    back = read_atomic(folder)
    assert (back.inter["split"] == -1).all() and back.n_inter == 6
    assert keep.read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_write_atomic_of_each_fixture_reads_back(tmp_path):
    for make in (fx.make_ml_latest, fx.make_ml1m, fx.make_ml100k_raw):
        d = load(make(tmp_path / make.__name__))
        back = read_atomic(write_atomic(d, tmp_path / "out" / d.name, "x"))
        assert [str(i) for i in d.item_ids] == list(back.item_ids)
        assert back.inter.equals(d.inter)
        assert back.items["title"].tolist() == d.items["title"].tolist()
        assert back.items["categories"].tolist() == d.items["categories"].tolist()


# ------------------------------------------------------------------------------------------ feature folder
def test_feature_folder_fedvlr_layout(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "toy")
    assert detect_format(folder) == "feature-folder"
    d = load(folder)
    assert (d.n_users, d.n_items, d.n_inter) == (3, 4, 8)  # item 3 is never rated but has feature rows
    assert d.inter["split"].tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    assert d.inter["item"].tolist() == [0, 1, 2, 1, 0, 2, 0, 2]  # the file's ids, unchanged
    assert list(d.item_ids) == ["X0", "X1", "X2", "X3"] and list(d.user_ids) == ["U0", "U1", "U2"]
    img = np.load(folder / "image_features.npy")
    assert d.features["image"].dtype == np.float32 and np.array_equal(d.features["image"], img.astype(np.float32))
    assert set(d.features) == {"image", "text"}


def test_feature_folder_mmrec_layout(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "toy", mmrec=True, n_items=5)
    assert detect_format(folder) == "feature-folder"
    assert detect_format(folder / "toy.inter") == "feature-folder"
    d = load_feature_folder(folder)
    assert d.n_items == 5 and d.inter["split"].tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    assert d.features["text"].shape == (5, 3) and d.item_ids[4] == "X4"


def test_feature_folder_without_mappings_or_features(tmp_path):
    folder = fx.make_feature_folder(tmp_path / "toy", mapping=False)
    for f in ("image_features.npy", "text_features.npy"):
        (folder / f).unlink()
    d = load(folder)
    assert d.n_items == 3 and list(d.item_ids) == [0, 1, 2] and d.features == {}


def test_missing_path_and_unknown_folder(tmp_path):
    with pytest.raises(DataError, match="no such file or folder"):
        load(tmp_path / "nope")
    (tmp_path / "junk").mkdir()
    fx.write(tmp_path / "junk" / "readme.txt", "hello")
    with pytest.raises(DataError) as e:
        detect_format(tmp_path / "junk")
    for looked_for in ("inter.csv", ".inter", "ratings.csv", "ratings.dat", "u.data", "Amazon reviews"):
        assert looked_for in str(e.value)


def test_amazon_2014_reviews_as_python_literals(tmp_path):
    fx.make_amazon_2014(tmp_path)
    path = fx.write(tmp_path / "reviews_Home_5.json", "".join(repr(r) + "\n" for r in fx.AMAZON_2014_REVIEWS))
    assert detect_format(path) == "amazon-2014"
    d = load(path)
    assert d.n_inter == 4 and d.items.loc[0, "brand"] == "Acme"


def test_ml100k_lookup_does_not_import_recbole():
    import subprocess
    import sys

    code = (
        "import sys; from fedvlr_plus.datasets import load_ml100k; d = load_ml100k(); "
        "assert d.n_inter == 100000; print(sorted(m for m in sys.modules if m.split('.')[0] == 'recbole'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")  # RecBole 1.2.1 on pandas 2.x
def test_recbole_reads_what_write_atomic_writes(tmp_path, monkeypatch):
    """RecBole 1.2.1 itself loads the written folder with benchmark_filename and the content fields."""
    from fedvlr_plus._compat import patch_recbole

    patch_recbole()
    from recbole.config import Config
    from recbole.data import create_dataset

    d = _content_data()
    write_atomic(d, tmp_path / "data" / "awk")
    monkeypatch.chdir(tmp_path)  # RecBole writes ./log
    config = Config(
        model="BPR",
        dataset="awk",
        config_dict={
            "data_path": str(tmp_path / "data"),
            "benchmark_filename": ["train", "valid", "test"],
            "load_col": {
                "inter": ["user_id", "item_id", "rating", "timestamp"],
                "item": ["item_id", "title", "categories", "image", "year", "vec"],
            },
            "use_gpu": False,
            "show_progress": False,
            "save_dataset": False,
            "save_dataloaders": False,
            "eval_args": {"order": "TO", "split": None, "group_by": "user", "mode": "full"},
        },
    )
    ds = create_dataset(config)
    assert (ds.user_num, ds.item_num, ds.inter_num) == (3 + 1, 4 + 1, 6)  # RecBole adds [PAD]
    assert ds.file_size_list == [3, 1, 2]
    tokens = list(ds.field2id_token["categories"])
    assert "Gift\u00a0Cards" in tokens and "Gift" not in tokens  # one category, one token
    title_tokens = list(ds.field2id_token["title"])
    assert '"Quoted"' in title_tokens  # the quoted field was unquoted correctly
