"""Test helpers: locating the shared real data, and tiny dataset files in their original formats.

Real data lives in ``../shared/data`` beside the checkout (or ``$FEDVLR_SHARED_DATA``); tests that need it
skip with a clear reason when it is absent. The writers below produce small files byte-for-byte in each
source's published layout, with contents chosen so the expected numbers can be worked out by hand.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest


def shared_data_root() -> Path:
    env = os.environ.get("FEDVLR_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_data(name: str) -> Path:
    """``<shared data>/<name>``, or skip the test when it is not on this machine."""
    path = shared_data_root() / name
    if not path.exists():
        pytest.skip(f"real data {name!r} not found at {path} (set FEDVLR_SHARED_DATA to the shared data folder)")
    return path


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding=encoding, newline="") as f:
            f.write(text)
    else:
        path.write_bytes(text.encode(encoding))
    return path


def jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# ------------------------------------------------------------------------------------------ MovieLens
ML_LATEST_RATINGS = """userId,movieId,rating,timestamp
1,1,4.0,964982703
1,3,4.5,964981247
2,1,3.0,1445714835
2,50,5.0,1445714836
3,3,0.5,1306463578
"""
ML_LATEST_MOVIES = """movieId,title,genres
1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy
3,"American President, The (1995)",Comedy|Drama|Romance
7,Sabrina (1995),Comedy|Romance
50,"Usual Suspects, The (1995)",Crime|Mystery|Thriller
99,Some Film (2000),(no genres listed)
"""


def make_ml_latest(folder: Path) -> Path:
    """ml-latest-small layout: 3 users, 5 catalogue movies (7 and 99 unrated), 5 ratings."""
    write(folder / "ratings.csv", ML_LATEST_RATINGS)
    write(folder / "movies.csv", ML_LATEST_MOVIES)
    return folder


ML1M_RATINGS = "1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978298413\n"
ML1M_MOVIES = (
    "661::James and the Giant Peach (1996)::Animation|Children's|Musical\n"
    "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n"
    "73::Misérables, Les (1995)::Drama|War\n"
)
ML1M_USERS = "1::F::1::10::48067\n2::M::56::16::70072\n"


def make_ml1m(folder: Path) -> Path:
    """ml-1m layout, Latin-1: 2 users, 3 movies (73, with a non-ASCII title, unrated), 3 ratings."""
    write(folder / "ratings.dat", ML1M_RATINGS, "latin-1")
    write(folder / "movies.dat", ML1M_MOVIES, "latin-1")
    write(folder / "users.dat", ML1M_USERS, "latin-1")
    return folder


def _flags(*on: int) -> str:
    return "|".join("1" if g in on else "0" for g in range(19))


ML100K_DATA = "196\t242\t3\t881250949\n186\t302\t3\t891717742\n196\t302\t4\t881251000\n"
ML100K_ITEM = (
    f"242|Kolya (1996)|24-Jan-1997||http://us.imdb.com/M/title-exact?Kolya%20(1996)|{_flags(5)}\n"
    "302|L.A. Confidential (1997)|01-Jan-1997||http://us.imdb.com/M/title-exact?L%2EA%2E+Confidential+(1997)|"
    f"{_flags(6, 10, 13, 16)}\n"
    f"1|Toy Story (1995)|01-Jan-1995||http://us.imdb.com/M/title-exact?Toy%20Story%20(1995)|{_flags(3, 4, 5)}\n"
)
ML100K_USER = "186|39|F|executive|00000\n196|49|M|writer|55105\n"


def make_ml100k_raw(folder: Path) -> Path:
    """Original ml-100k layout: 2 users, 3 movies (1 unrated), 3 ratings; no u.genre (default names)."""
    write(folder / "u.data", ML100K_DATA, "latin-1")
    write(folder / "u.item", ML100K_ITEM, "latin-1")
    write(folder / "u.user", ML100K_USER, "latin-1")
    return folder


# ------------------------------------------------------------------------------------------ Amazon
AMAZON_2014_REVIEWS = [
    {
        "reviewerID": "U1",
        "asin": "A1",
        "reviewerName": "Ann",
        "helpful": [0, 0],
        "reviewText": "ok",
        "overall": 5.0,
        "summary": "good",
        "unixReviewTime": 1400000000,
        "reviewTime": "05 13, 2014",
    },
    {
        "reviewerID": "U2",
        "asin": "A2",
        "reviewerName": "Bob",
        "helpful": [1, 2],
        "reviewText": "meh",
        "overall": 3.0,
        "summary": "fine",
        "unixReviewTime": 1300000000,
        "reviewTime": "03 13, 2011",
    },
    {
        "reviewerID": "U1",
        "asin": "A2",
        "reviewerName": "Ann",
        "helpful": [0, 0],
        "reviewText": "nice",
        "overall": 4.0,
        "summary": "nice",
        "unixReviewTime": 1350000000,
        "reviewTime": "10 12, 2012",
    },
    # the same (user, item) again, earlier in time: dedup keeps this one and drops line 3
    {
        "reviewerID": "U1",
        "asin": "A2",
        "reviewerName": "Ann",
        "helpful": [0, 0],
        "reviewText": "again",
        "overall": 2.0,
        "summary": "again",
        "unixReviewTime": 1340000000,
        "reviewTime": "06 18, 2012",
    },
    {
        "reviewerID": "U3",
        "asin": "A3",
        "reviewerName": "Cy",
        "helpful": [0, 1],
        "reviewText": "x",
        "overall": 1.0,
        "summary": "x",
        "unixReviewTime": 1200000000,
        "reviewTime": "01 10, 2008",
    },
]
AMAZON_2014_META = [
    {"asin": "A9", "title": "Never reviewed", "categories": [["Home"]]},
    {
        "asin": "A1",
        "title": 'Mug & "Cup"',
        "price": 9.99,
        "imUrl": "http://ecx.images-amazon.com/images/I/a1.jpg",
        "related": {"also_bought": ["A2"]},
        "salesRank": {"Home": 12},
        "categories": [["Home & Kitchen", "Kitchen"], ["Home & Kitchen", "Dining"]],
        "description": "It's a big  mug.\nReally.",
        "brand": "Acme",
    },
    {"asin": "A2", "title": "Plate &amp; Bowl", "categories": [["Home & Kitchen"]]},
    {"asin": "A1", "title": "A later duplicate entry", "categories": [["Other"]]},
]


def make_amazon_2014(folder: Path) -> Path:
    """Amazon 2014: strict-JSON reviews; metadata as Python dict literals (repr), gzip. A3 has no metadata."""
    reviews = write(folder / "reviews_Home_5.json", jsonl(AMAZON_2014_REVIEWS))
    write(folder / "meta_Home.json.gz", "".join(repr(d) + "\n" for d in AMAZON_2014_META))
    return reviews


AMAZON_2023_REVIEWS = [
    {
        "rating": 5.0,
        "title": "Great",
        "text": "Loved it",
        "images": [],
        "asin": "B01V1",
        "parent_asin": "P1",
        "user_id": "UA",
        "timestamp": 1588615855070,
        "helpful_vote": 2,
        "verified_purchase": True,
    },
    {
        "rating": 4.0,
        "title": "Good",
        "text": "Fine",
        "images": [],
        "asin": "B01V2",
        "parent_asin": "P1",
        "user_id": "UB",
        "timestamp": 1588615855000,
        "helpful_vote": 0,
        "verified_purchase": True,
    },
    {
        "rating": 2.0,
        "title": "Hmm",
        "text": "No",
        "images": [],
        "asin": "B02",
        "parent_asin": "P2",
        "user_id": "UA",
        "timestamp": 1600000000000,
        "helpful_vote": 0,
        "verified_purchase": False,
    },
    # UA reviews another variant of P1 later: after dedup only the first P1 review of UA stays
    {
        "rating": 1.0,
        "title": "Again",
        "text": "Again",
        "images": [],
        "asin": "B01V2",
        "parent_asin": "P1",
        "user_id": "UA",
        "timestamp": 1610000000000,
        "helpful_vote": 0,
        "verified_purchase": True,
    },
]
AMAZON_2023_META = [
    {
        "main_category": "Toys & Games",
        "title": "Stacking <b>Blocks</b>",
        "average_rating": 4.5,
        "rating_number": 10,
        "features": ["wood"],
        "description": ["Ten blocks.", "Ages 3+."],
        "price": 12.0,
        "images": [
            {"thumb": "t1.jpg", "large": "L_side.jpg", "variant": "PT01", "hi_res": "H_side.jpg"},
            {"thumb": "t0.jpg", "large": "L_main.jpg", "variant": "MAIN", "hi_res": None},
        ],
        "videos": [],
        "store": "BlockCo",
        "categories": [],
        "details": {},
        "parent_asin": "P1",
        "bought_together": None,
    },
    {
        "main_category": "Toys & Games",
        "title": "Puzzle",
        "description": [],
        "images": [{"thumb": "p_t.jpg", "large": "p_l.jpg", "variant": "PT02", "hi_res": None}],
        "store": None,
        "categories": ["Toys & Games", "Puzzles"],
        "parent_asin": "P2",
    },
]


def make_amazon_2023_jsonl(folder: Path) -> Path:
    reviews = write(folder / "Toys.jsonl", jsonl(AMAZON_2023_REVIEWS))
    write(folder / "meta_Toys.jsonl", jsonl(AMAZON_2023_META))
    return reviews


def make_amazon_2023_csv(folder: Path) -> Path:
    """The 2023 benchmark CSV layout (gzip) with the JSONL metadata beside it."""
    lines = ["user_id,parent_asin,rating,timestamp"] + [
        f"{r['user_id']},{r['parent_asin']},{r['rating']},{r['timestamp']}" for r in AMAZON_2023_REVIEWS
    ]
    reviews = write(folder / "Toys.csv.gz", "\n".join(lines) + "\n")
    write(folder / "meta_Toys.jsonl.gz", jsonl(AMAZON_2023_META))
    return reviews


# ------------------------------------------------------------------------------------------ RecBole atomic
def make_atomic(folder: Path, name: str = "shop") -> Path:
    """A RecBole atomic folder with token_seq, float and float_seq fields; item i9 is never rated."""
    d = folder / name
    write(
        d / f"{name}.inter",
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
        "u1\ti1\t5\t100\nu2\ti1\t3\t90\nu1\ti2\t4.5\t110\nu3\ti3\t1\t50\n",
    )
    write(
        d / f"{name}.item",
        "item_id:token\tmovie_title:token_seq\tclass:token_seq\tprice:float\temb:float_seq\n"
        "i9\tUnrated Thing\tMisc\t1.5\t0.5 0.25\n"
        "i1\tThe  Blue Cup\tKitchen Dining\t3\t1 2\n"
        "i2\tPlate\t\t2.25\t\n"
        "i3\tKnife\tKitchen\t7\t-1 0\n",
    )
    write(d / f"{name}.user", "user_id:token\tage:float\tgender:token\nu2\t30\tF\nu1\t41\tM\nu3\t25\tF\n")
    return d


# ------------------------------------------------------------------------------------------ feature folder
def make_feature_folder(
    folder: Path, *, n_items: int = 4, dim: int = 3, mmrec: bool = False, mapping: bool = True
) -> Path:
    """FedVLR layout (or MMRec's with ``mmrec``): 3 users, ``n_items`` items (item 3 never rated), float16."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        (0, 0, 1, 10, 0),
        (0, 1, 1, 20, 1),
        (0, 2, 1, 30, 2),
        (1, 1, 1, 15, 0),
        (1, 0, 1, 25, 1),
        (1, 2, 1, 35, 2),
        (2, 0, 1, 11, 0),
        (2, 2, 1, 12, 0),
    ]
    if mmrec:
        text = "userID\titemID\trating\ttimestamp\tx_label\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows)
        write(folder / "toy.inter", text)
    else:
        text = "userID,itemID,rating,timestamp,split_label\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)
        write(folder / "inter.csv", text)
    rng = np.random.default_rng(0)
    img = rng.standard_normal((n_items, dim)).astype(np.float16)
    txt = rng.standard_normal((n_items, dim)).astype(np.float16)
    np.save(folder / ("image_feat.npy" if mmrec else "image_features.npy"), img)
    np.save(folder / ("text_feat.npy" if mmrec else "text_features.npy"), txt)
    if mapping:
        sep = "\t" if mmrec else ","
        write(folder / "i_id_mapping.csv", f"asin{sep}itemID\n" + "".join(f"X{i}{sep}{i}\n" for i in range(n_items)))
        write(folder / "u_id_mapping.csv", f"user_id{sep}userID\n" + "".join(f"U{u}{sep}{u}\n" for u in range(3)))
    return folder


def stub_minilm_encoders(monkeypatch, module) -> None:
    """Replace ``module.minilm_encoders`` (FedMPT's offline text encoders) by small deterministic stubs."""
    import zlib

    import numpy as np

    def tokens(texts):
        return [
            np.random.default_rng(len(t)).standard_normal((min(len(t.split()), 6) + 2, 12)).astype(np.float32)
            for t in texts
        ]

    def sentences(texts):
        # crc32, not hash(): str hashes change with every process, and the stub must give the same vectors
        return np.stack([np.random.default_rng(zlib.crc32(t.encode())).standard_normal(12) for t in texts]).astype(
            np.float32
        )

    monkeypatch.setattr(module, "minilm_encoders", lambda device="cpu": (tokens, sentences))
