"""MovieLens in its original GroupLens layouts (Harper & Konstan, "The MovieLens Datasets: History and
Context", ACM TiiS 2015).

- ``movielens-csv``: ``ml-latest-small``, ``ml-latest``, ``ml-20m``, ``ml-25m``, ``ml-32m`` folders:
  ``ratings.csv`` (``userId,movieId,rating,timestamp``), optional ``movies.csv`` (``movieId,title,genres``
  with genres joined by ``|``; UTF-8).
- ``movielens-1m``: ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``), optional ``movies.dat``
  (``MovieID::Title::Genres``, Latin-1) and ``users.dat`` (``UserID::Gender::Age::Occupation::Zip-code``;
  age and occupation are the release's integer codes).
- ``movielens-100k-raw``: ``u.data`` (tab-separated ``user item rating timestamp``), optional ``u.item``
  (``|``-separated, Latin-1: id, title, release date, video release date, IMDb URL, 19 genre flags; genre
  names from ``u.genre`` when present) and ``u.user`` (``id|age|gender|occupation|zip``).

Raw ids are kept as int64; timestamps are Unix seconds. The catalogue files decide the internal id order
and are kept whole: **movies in the catalogue with no rating are kept** as items (in catalogue order;
they are the natural cold-start items), unless ``keep_unrated_items=False``; users in a users file
are kept likewise. Without a catalogue file, ids follow first appearance in the ratings. A rating whose
movie or user is missing from a catalogue that is present is an error naming the ratings line.
Item content: ``title`` (as written, year included), ``categories`` (genres; ``(no genres listed)``
gives none), empty ``description``, no ``image``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd

from ._io import Table, assemble, check_nonempty, empty_content, read_table, squash
from .core import DataError, InteractionData

ML100K_GENRES = (
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
)


def _dat_table(path: Path, names: list[str], *, encoding: str, integers=(), numbers=(), nonempty=()) -> Table:
    """A ``::``-separated .dat file: read as text, '::' turned into tabs so pandas' C parser can split it."""
    try:
        text = path.read_text(encoding=encoding)
    except UnicodeDecodeError as e:
        lineno = path.read_bytes()[: e.start].count(b"\n") + 1
        raise DataError(f"{path}: line {lineno}: not valid {encoding} text") from None
    if "\t" in text:
        lineno = text[: text.index("\t")].count("\n") + 1
        raise DataError(f"{path}: line {lineno}: unexpected tab character (fields are separated by '::')")
    return read_table(
        path,
        sep="\t",
        names=names,
        integers=integers,
        numbers=numbers,
        nonempty=nonempty,
        quoting=csv.QUOTE_NONE,
        text=text.replace("::", "\t"),
    )


def _finish(
    name: str,
    ratings: Table,
    ucol: str,
    icol: str,
    rcol: str,
    tcol: str,
    *,
    movies: Table | None,
    mcol: str,
    users: Table | None,
    ucat: str,
    keep_unrated_items: bool,
    content: pd.DataFrame | None,
    attributes: pd.DataFrame | None,
    folder: Path,
    format: str,
) -> InteractionData:
    r = ratings.frame
    raw_u = r[ucol].to_numpy()
    raw_i = r[icol].to_numpy()
    item_order = None
    if movies is not None:
        item_order = movies.frame[mcol].to_numpy()
        if not keep_unrated_items:
            keep = pd.Index(item_order).isin(raw_i)
            item_order = item_order[keep]
            content = content[keep].reset_index(drop=True)
    user_order = users.frame[ucat].to_numpy() if users is not None else None
    data = assemble(
        name,
        raw_u,
        raw_i,
        rating=r[rcol].to_numpy(),
        timestamp=r[tcol].to_numpy(),
        user_order=user_order,
        item_order=item_order,
        user_catalogue=str(users.path) if users is not None else "",
        item_catalogue=str(movies.path) if movies is not None else "",
        where=ratings.where,
        source=str(folder),
        format=format,
    )
    check_nonempty(data, ratings.path)
    if content is None:
        content = empty_content(data.n_items)
    data = data.replace(
        items=content.reset_index(drop=True),
        users=attributes.reset_index(drop=True) if attributes is not None else pd.DataFrame(),
    )
    return data.validate()


def _genres(text: str) -> list[str]:
    return [g for g in (squash(x) for x in text.split("|")) if g and g != "(no genres listed)"]


def load_movielens_csv(folder: str | Path, *, keep_unrated_items: bool = True) -> InteractionData:
    """``ml-latest-small`` / ``ml-25m``-style folder (``ratings.csv`` + optional ``movies.csv``)."""
    folder = Path(folder)
    ratings = read_table(
        folder / "ratings.csv",
        sep=",",
        required=("userId", "movieId", "rating", "timestamp"),
        integers=("userId", "movieId"),
        numbers=("rating", "timestamp"),
    )
    movies = content = None
    if (folder / "movies.csv").exists():
        movies = read_table(
            folder / "movies.csv", sep=",", required=("movieId", "title", "genres"), integers=("movieId",)
        )
        f = movies.frame
        content = empty_content(len(f))
        content["title"] = [squash(t) for t in f["title"]]
        content["categories"] = [_genres(g) for g in f["genres"]]
    return _finish(
        folder.name,
        ratings,
        "userId",
        "movieId",
        "rating",
        "timestamp",
        movies=movies,
        mcol="movieId",
        users=None,
        ucat="",
        keep_unrated_items=keep_unrated_items,
        content=content,
        attributes=None,
        folder=folder,
        format="movielens-csv",
    )


def load_ml1m(folder: str | Path, *, keep_unrated_items: bool = True) -> InteractionData:
    """``ml-1m``-style folder (``ratings.dat`` + optional ``movies.dat``, ``users.dat``)."""
    folder = Path(folder)
    ratings = _dat_table(
        folder / "ratings.dat",
        ["UserID", "MovieID", "Rating", "Timestamp"],
        encoding="latin-1",
        integers=("UserID", "MovieID"),
        numbers=("Rating", "Timestamp"),
    )
    movies = content = users = attributes = None
    if (folder / "movies.dat").exists():
        movies = _dat_table(
            folder / "movies.dat", ["MovieID", "Title", "Genres"], encoding="latin-1", integers=("MovieID",)
        )
        f = movies.frame
        content = empty_content(len(f))
        content["title"] = [squash(t) for t in f["Title"]]
        content["categories"] = [_genres(g) for g in f["Genres"]]
    if (folder / "users.dat").exists():
        users = _dat_table(
            folder / "users.dat",
            ["UserID", "Gender", "Age", "Occupation", "Zip-code"],
            encoding="latin-1",
            integers=("UserID", "Age", "Occupation"),
        )
        f = users.frame
        attributes = pd.DataFrame(
            {
                "gender": f["Gender"].to_numpy(),
                "age": f["Age"].to_numpy(np.int64),
                "occupation": f["Occupation"].to_numpy(np.int64),
                "zip_code": f["Zip-code"].to_numpy(),
            }
        )
    return _finish(
        folder.name,
        ratings,
        "UserID",
        "MovieID",
        "Rating",
        "Timestamp",
        movies=movies,
        mcol="MovieID",
        users=users,
        ucat="UserID",
        keep_unrated_items=keep_unrated_items,
        content=content,
        attributes=attributes,
        folder=folder,
        format="movielens-1m",
    )


def _ml100k_genre_names(folder: Path) -> tuple[str, ...]:
    path = folder / "u.genre"
    if not path.exists():
        return ML100K_GENRES
    t = read_table(
        path, sep="|", names=["genre", "index"], integers=("index",), encoding="latin-1", quoting=csv.QUOTE_NONE
    )
    order = np.argsort(t.frame["index"].to_numpy(), kind="stable")
    names = tuple(t.frame["genre"].to_numpy()[order])
    if list(t.frame["index"].to_numpy()[order]) != list(range(len(names))):
        raise DataError(f"{path}: genre indices must be 0..{len(names) - 1}")
    return names


def load_ml100k_raw(folder: str | Path, *, keep_unrated_items: bool = True) -> InteractionData:
    """The original ``ml-100k`` release (``u.data`` + optional ``u.item``, ``u.user``, ``u.genre``)."""
    folder = Path(folder)
    ratings = read_table(
        folder / "u.data",
        sep="\t",
        names=["user_id", "item_id", "rating", "timestamp"],
        integers=("user_id", "item_id"),
        numbers=("rating", "timestamp"),
        encoding="latin-1",
        quoting=csv.QUOTE_NONE,
    )
    movies = content = users = attributes = None
    if (folder / "u.item").exists():
        genres = _ml100k_genre_names(folder)
        names = ["movie_id", "title", "release_date", "video_release_date", "imdb_url", *genres]
        movies = read_table(
            folder / "u.item",
            sep="|",
            names=names,
            integers=("movie_id", *genres),
            encoding="latin-1",
            quoting=csv.QUOTE_NONE,
        )
        f = movies.frame
        flags = f[list(genres)].to_numpy()
        content = empty_content(len(f))
        content["title"] = [squash(t) for t in f["title"]]
        content["categories"] = [[g for g, on in zip(genres, row) if on] for row in flags]
        content["release_date"] = f["release_date"].to_numpy()
        content["imdb_url"] = f["imdb_url"].to_numpy()
    if (folder / "u.user").exists():
        users = read_table(
            folder / "u.user",
            sep="|",
            names=["user_id", "age", "gender", "occupation", "zip_code"],
            integers=("user_id", "age"),
            encoding="latin-1",
            quoting=csv.QUOTE_NONE,
        )
        f = users.frame
        attributes = f[["age", "gender", "occupation", "zip_code"]].copy()
    return _finish(
        folder.name,
        ratings,
        "user_id",
        "item_id",
        "rating",
        "timestamp",
        movies=movies,
        mcol="movie_id",
        users=users,
        ucat="user_id",
        keep_unrated_items=keep_unrated_items,
        content=content,
        attributes=attributes,
        folder=folder,
        format="movielens-100k-raw",
    )


MOVIELENS_FORMATS = {
    "ratings.csv": ("movielens-csv", load_movielens_csv),
    "ratings.dat": ("movielens-1m", load_ml1m),
    "u.data": ("movielens-100k-raw", load_ml100k_raw),
}


def load_movielens(folder: str | Path, *, keep_unrated_items: bool = True) -> InteractionData:
    """Any of the three MovieLens layouts, recognised by its ratings file."""
    folder = Path(folder)
    for fname, (_, loader) in MOVIELENS_FORMATS.items():
        if (folder / fname).is_file():
            return loader(folder, keep_unrated_items=keep_unrated_items)
    raise DataError(f"{folder}: not a MovieLens folder (looked for {', '.join(MOVIELENS_FORMATS)})")
