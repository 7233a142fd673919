"""Bad input around view stores: a damaged, edited or swapped store is refused on every open (views knn, views
info, run --views), and --views / --fusion mistakes get one line naming the file or flag, exit 2, nothing
half-written. Stores are built in tmp_path from small random arrays (no model is loaded)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _bad_input import assert_user_error, files_under, run_cli

from fedvlr_plus.views import Embeddings, ViewSpec, ViewStore

N_USERS, N_ITEMS, DIM = 6, 120, 8


def _unit(rng, n, d):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_store(path: Path, n: int = N_ITEMS) -> Path:
    rng = np.random.default_rng(0)
    mods = {"text": _unit(rng, n, DIM), "image": _unit(rng, n, DIM)}
    emb = Embeddings(mods, {k: np.zeros(n, bool) for k in mods}, "multimodal")
    specs = [
        ViewSpec("text", "identity", ("text",)),
        ViewSpec("image", "identity", ("image",)),
        ViewSpec("cca", "cca", ("text", "image"), {"dim": 2}),
    ]
    ViewStore.create(path, emb, specs, item_ids=[str(i) for i in range(n)], encoder={"encoder": "precomputed"})
    return path


def make_source(folder: Path, *, features: bool = True) -> Path:
    """A tiny KU-style folder: inter.csv with a split column, and (optionally) text/image features."""
    folder.mkdir()
    rows = ["userID,itemID,rating,timestamp,split_label"]
    for u in range(N_USERS):
        items = [(u + k) % N_ITEMS for k in range(4)]
        rows += [f"{u},{i},1,{t},{0 if t < 2 else t - 1}" for t, i in enumerate(items)]
    (folder / "inter.csv").write_text("\n".join(rows) + "\n")
    if features:
        rng = np.random.default_rng(1)
        np.save(folder / "text_features.npy", _unit(rng, N_ITEMS, DIM))
        np.save(folder / "image_features.npy", _unit(rng, N_ITEMS, DIM))
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {rel: (folder / rel).read_bytes() for rel in files_under(folder)}


def edit_manifest(store: Path, change) -> None:
    m = json.loads((store / "manifest.json").read_text())
    change(m)
    (store / "manifest.json").write_text(json.dumps(m))


def flip_byte(f: Path) -> None:
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))


def truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[:-40])


def swap_index(store: Path) -> None:
    shutil.copyfile(store / "views" / "image.faiss", store / "views" / "text.faiss")


def point_outside(store: Path) -> None:
    (store.parent / "x").write_bytes((store / "views" / "text.npy").read_bytes())

    def change(m):
        m["files"]["../x"] = m["files"].pop("views/text.npy")
        m["views"][0]["files"]["vectors"] = "../x"

    edit_manifest(store, change)


def point_absolute(store: Path) -> None:
    target = str((store / "views" / "text.npy").resolve())

    def change(m):
        m["files"][target] = m["files"].pop("views/text.npy")
        m["views"][0]["files"]["vectors"] = target

    edit_manifest(store, change)


def index_of_other_view(store: Path) -> None:
    edit_manifest(store, lambda m: m["views"][0]["files"].update(index="views/image.faiss"))


def rename_item(store: Path) -> None:
    edit_manifest(store, lambda m: m["item_ids"].__setitem__(3, "999"))


def duplicate_item(store: Path) -> None:
    edit_manifest(store, lambda m: m["item_ids"].__setitem__(3, "4"))


def change_dim(store: Path) -> None:
    edit_manifest(store, lambda m: m["views"][0].update(dim=DIM + 1))


def not_json(store: Path) -> None:
    (store / "manifest.json").write_text('{"format": "fedvlr-plus-viewstore", ')


# (fault, command, needles in the one error line). Each is a different way a store goes bad.
STORE_FAULTS = [
    (
        "flipped-byte-in-index",
        lambda s: flip_byte(s / "views" / "text.faiss"),
        "knn",
        ("views/text.faiss", "checksum mismatch"),
    ),
    (
        "truncated-vectors",
        lambda s: truncate(s / "views" / "image.npy"),
        "info",
        ("views/image.npy", "checksum mismatch"),
    ),
    ("index-swapped-for-another-views", swap_index, "knn", ("views/text.faiss", "checksum mismatch")),
    ("manifest-item-id-edited", rename_item, "knn", ("manifest.json", "manifest_sha256")),
    ("manifest-duplicate-item-ids", duplicate_item, "info", ("manifest.json", "duplicates")),
    ("manifest-path-outside-store", point_outside, "knn", ("manifest.json", "'../x'", "points outside the store")),
    ("manifest-absolute-path", point_absolute, "info", ("manifest.json", "is not relative to the store")),
    (
        "manifest-index-of-another-view",
        index_of_other_view,
        "knn",
        ("manifest.json", "views/image.faiss is also the index of view 'text'"),
    ),
    ("manifest-dim-changed", change_dim, "knn", ("views/text.npy", f"shape ({N_ITEMS}, {DIM})")),
    ("manifest-not-json", not_json, "info", ("manifest.json", "not valid JSON")),
    (
        "missing-operators-file",
        lambda s: (s / "operators.npz").unlink(),
        "knn",
        ("operators.npz", "listed in the manifest but missing"),
    ),
]


@pytest.mark.parametrize("fault, command, needles", [f[1:] for f in STORE_FAULTS], ids=[f[0] for f in STORE_FAULTS])
def test_damaged_store_is_refused_naming_the_file(tmp_path, fault, command, needles):
    store = make_store(tmp_path / "store")
    fault(store)
    before = snapshot(tmp_path)
    args = ["views", "knn", store, "--item", "1", "--k", "3"] if command == "knn" else ["views", "info", store]
    assert_user_error(run_cli(*args), *needles)
    assert snapshot(tmp_path) == before  # refusing a store never rewrites or removes its files


def test_intact_store_still_answers(tmp_path):
    # The same commands on an untouched store succeed, so the faults above are what the refusals detect.
    store = make_store(tmp_path / "store")
    res = run_cli("views", "knn", store, "--item", "1", "--k", "3", "--json")
    assert res.code == 0, res.err
    assert len(json.loads(res.out.splitlines()[-1])["ids"]) == 3
    assert run_cli("views", "info", store).code == 0


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--item", "zzz"], ("no item with id or title 'zzz'",)),
        (["--item", "1", "--view", "audio"], ("no view 'audio'", "text, image, cca")),
    ],
    ids=["unknown-item", "unknown-view"],
)
def test_knn_unknown_item_or_view(tmp_path, args, needles):
    store = make_store(tmp_path / "store")
    assert_user_error(run_cli("views", "knn", store, *args), str(store), *needles)


RUN = (
    "--backbone",
    "fedavg",
    "--fusion",
    "fedvlr",
    "--rounds",
    "1",
    "--local-epochs",
    "1",
    "--dim",
    "4",
    "--no-progress",
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("FEDVLR_CACHE", str(path))
    return path


def test_run_views_corrupt_store(tmp_path, cache):
    src = make_source(tmp_path / "data")
    store = make_store(tmp_path / "store")
    flip_byte(store / "views" / "image.npy")
    before = snapshot(tmp_path)
    assert_user_error(run_cli("run", src, *RUN, "--views", store), "views/image.npy", "checksum mismatch")
    assert snapshot(tmp_path) == before and not cache.exists()


def test_run_views_typo_of_an_existing_store(tmp_path, cache):
    src = make_source(tmp_path / "data")
    make_store(tmp_path / "store-ku")
    typo = tmp_path / "store-kv"
    line = assert_user_error(run_cli("run", src, *RUN, "--views", typo), f"--views {typo}", "no such view store")
    assert f"did you mean {tmp_path / 'store-ku'}?" in line
    assert not typo.exists() and not list(tmp_path.glob(".store-kv*"))


def test_run_views_parent_missing(tmp_path, cache):
    src = make_source(tmp_path / "data")
    target = tmp_path / "nowhere" / "store"
    assert_user_error(
        run_cli("run", src, *RUN, "--views", target),
        f"--views {target}",
        f"the folder {tmp_path / 'nowhere'} does not exist",
    )
    assert not (tmp_path / "nowhere").exists()


def test_run_views_folder_that_is_not_a_store(tmp_path, cache):
    src = make_source(tmp_path / "data")
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    assert_user_error(run_cli("run", src, *RUN, "--views", folder), f"--views {folder}", "not a view store")
    assert files_under(folder) == {"notes.txt"}


def test_run_fusion_without_content(tmp_path, cache):
    src = make_source(tmp_path / "data", features=False)
    before = snapshot(tmp_path)
    line = assert_user_error(
        run_cli("run", src, *RUN), "--fusion fedvlr", "has no item content", "--views DIR", "--fusion none"
    )
    assert "--encoder" not in line  # run has no --encoder flag
    assert snapshot(tmp_path) == before and not cache.exists()


def test_failed_build_leaves_no_half_written_store(tmp_path, cache, monkeypatch):
    # A build that fails while writing (here: the index step) leaves neither the store nor its temp folder.
    import fedvlr_plus.views.store as store_mod
    from fedvlr_plus.views import ViewStoreError

    def fail(*args, **kwargs):
        raise ViewStoreError("index build failed (simulated)")

    src = make_source(tmp_path / "data")
    monkeypatch.setattr(store_mod, "_build_index", fail)
    target = tmp_path / "new-store"
    assert_user_error(run_cli("run", src, *RUN, "--views", target), "index build failed")
    assert not target.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".new-store")]


def test_run_views_builds_a_missing_store_and_says_so(tmp_path, cache):
    # The intended case: a new folder in an existing parent is built there, announced before building,
    # and reused (verified) on the next run.
    src = make_source(tmp_path / "data")
    target = tmp_path / "new-store"
    first = run_cli("run", src, *RUN, "--views", target)
    assert first.code == 0, first.err
    assert f"views: building view store in {target}" in first.err
    assert "using the precomputed features of data" in first.err
    ViewStore(target)  # complete and verified
    second = run_cli("run", src, *RUN, "--views", target)
    assert second.code == 0 and f"views: reusing view store {target}" in second.err


def test_nocontent_remedy_names_where_each_format_keeps_content(tmp_path):
    # the advice in the "no item content" line must be one the user's loader will actually read
    from types import SimpleNamespace

    from fedvlr_plus.datasets.amazon import find_meta
    from fedvlr_plus.fedvlr.views import content_remedy

    for reviews, meta in (
        ("All_Beauty_5.json.gz", "meta_All_Beauty.json.gz"),
        ("reviews_Toys_and_Games.json.gz", "meta_Toys_and_Games.json.gz"),
    ):
        source = tmp_path / reviews
        amazon = SimpleNamespace(format="amazon-2018", source=str(source), name="x", n_items=85)
        line = content_remedy(amazon)
        assert f"{meta} " in line and str(source) in line, line
        assert find_meta(source, "amazon-2018") is None
        (tmp_path / meta).write_text("")  # the file the line names is the one the loader reads
        assert find_meta(source, "amazon-2018") == tmp_path / meta
    ratings = tmp_path / "ratings_Books.csv"  # a 2014 ratings-only file
    line = content_remedy(SimpleNamespace(format="amazon-2014", source=str(ratings), name="x", n_items=3))
    assert "meta_Books.json.gz " in line and str(ratings) in line, line
    atomic = SimpleNamespace(format="recbole-atomic", source="/d/x", name="x", n_items=9)
    assert "x.item" in content_remedy(atomic)
    folder = SimpleNamespace(format="feature-folder", source="/d/y", name="y", n_items=7)
    assert "image_features.npy" in content_remedy(folder) and "[7, d]" in content_remedy(folder)
