"""``fedvlr-plus views build|info|knn|bench`` through register()/run(), with the loader stubbed by real data."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest

import fedvlr_plus.datasets as datasets
from fedvlr_plus.cli import views as views_cli
from fedvlr_plus.datasets import InteractionData
from fedvlr_plus.views import ViewStore


def parse(argv):
    parser = argparse.ArgumentParser(prog="fedvlr-plus")
    views_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def run(argv) -> int:
    return views_cli.run(parse(argv))


@pytest.fixture
def catalogue(monkeypatch):
    items = pd.DataFrame(
        {
            "title": ["Toy Story (1995)", "Toy Soldiers (1991)", "Heat (1995)", "Casino (1995)", "Babe (1995)"],
            "categories": [["Animation", "Comedy"], ["Action"], ["Action", "Crime"], ["Crime", "Drama"], ["Comedy"]],
        }
    )
    data = InteractionData.from_raw("toy-movies", [0, 0, 1, 1, 2], ["1", "2", "3", "4", "5"]).replace(items=items)
    seen = {}

    def load(source, **kw):
        seen["source"] = source
        return data

    # fedvlr_plus.datasets.load is written on another branch; the CLI only needs its contract.
    monkeypatch.setattr(datasets, "load", load, raising=False)
    return data, seen


def test_build_info_knn_json(tmp_path, catalogue, capsys):
    data, seen = catalogue
    out = tmp_path / "store"
    assert (
        run(["views", "build", "toy-movies", "--out", str(out), "--encoder", "hashing", "--no-progress", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert seen["source"] == "toy-movies" and report["encoder"] == "hashing" and report["n_items"] == 5
    assert report["views"] == ["title", "metadata", "balanced", "cca"]

    assert run(["views", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["items"] == 5 and info["catalogue"] == "toy-movies" and info["default_view"] == "balanced"
    assert [v["name"] for v in info["views"]] == report["views"]

    assert run(["views", "knn", str(out), "--item", "3", "--k", "2", "--view", "metadata", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    nb = ViewStore(out).knn(item="3", k=2, view="metadata")
    assert res["ids"] == nb.ids and np.allclose(res["scores"], nb.scores)
    assert res["item"] == {"id": "3", "row": 2, "title": "Heat (1995)"}
    assert res["neighbours"][0]["title"] in {"Toy Soldiers (1991)", "Casino (1995)"}  # the other Action / Crime films

    # Items can be named by title (exact or a unique prefix), and the plain output is readable.
    assert run(["views", "knn", str(out), "--item", "toy story", "--k", "1"]) == 0
    text = capsys.readouterr().out
    assert "neighbours of 1 (Toy Story (1995))" in text
    assert run(["views", "info", str(out)]) == 0
    assert "view balanced (default): mean(title, metadata) dim 256" in capsys.readouterr().out


def test_cli_errors_exit_2_with_one_line(tmp_path, catalogue, capsys):
    out = tmp_path / "store"
    assert run(["views", "build", "x", "--out", str(out), "--encoder", "hashing", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"next: pass --views {out} to run" in err and f"--fusion fedvlr --views {out}" in err
    assert run(["views", "build", "x", "--out", str(out), "--encoder", "hashing", "--no-progress"]) == 2
    assert "already exists (pass overwrite=True / --overwrite" in capsys.readouterr().err
    assert run(["views", "knn", str(out), "--item", "Toy", "--k", "1"]) == 2
    assert "matches 2 titles" in capsys.readouterr().err
    assert run(["views", "knn", str(out), "--item", "1", "--view", "image"]) == 2
    assert "no view 'image'" in capsys.readouterr().err
    (out / "views" / "title.faiss").write_bytes(b"garbage")
    assert run(["views", "info", str(out)]) == 2
    assert "title.faiss: checksum mismatch" in capsys.readouterr().err
    assert run(["views", "build", "x", "--out", str(tmp_path / "p"), "--encoder", "precomputed"]) == 2
    assert "has no precomputed features" in capsys.readouterr().err


def test_build_without_any_item_content_says_where_content_comes_from(tmp_path, monkeypatch, capsys):
    bare = InteractionData.from_raw("bare", [0, 0, 1], ["1", "2", "3"])
    monkeypatch.setattr(datasets, "load", lambda source, **kw: bare, raising=False)
    assert run(["views", "build", "x", "--out", str(tmp_path / "s"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        "error: views build x: bare has no item content to encode (no feature array, item "
        "text or image); add image_features.npy"
    )
    assert not (tmp_path / "s").exists()


def test_bench_reports_timings(capsys):
    assert run(["views", "bench", "--n", "300", "--encoder", "hashing", "--queries", "50", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_items"] == 300 and res["knn_ms"]["queries"] == 50
    from fedvlr_plus.views.bench import movielens_items

    # ml-100k itself lists a few films twice; otherwise every title is a distinct text.
    assert res["unique_texts"]["title"] == movielens_items(300)["title"].nunique() >= 295
    assert res["seconds"]["encode"] > 0 and res["knn_ms"]["p95"] >= res["knn_ms"]["p50"] > 0
