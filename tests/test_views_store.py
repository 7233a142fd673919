"""ViewStore: exact kNN on KU's CLIP features, reload, checksums, corrupt stores, add_items, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _shared import shared_data

from fedvlr_plus.datasets import InteractionData
from fedvlr_plus.views import (
    CorruptStoreError,
    Embeddings,
    PrecomputedEncoder,
    ViewSpec,
    ViewStore,
    ViewStoreError,
    build_store,
)


def ku_data() -> InteractionData:
    ku = shared_data("ku")
    inter = pd.read_csv(ku / "inter.csv")
    data = InteractionData.from_raw(
        "ku",
        inter["userID"],
        inter["itemID"],
        split=inter["split_label"],
        item_order=range(560),
        source=str(ku),
        format="ku",
    )
    return data.replace(
        features={
            "image_features": np.load(ku / "image_features.npy"),
            "text_features": np.load(ku / "text_features.npy"),
        }
    )


def toy_embeddings(n: int = 40, d: int = 8, seed: int = 0, imputed_text_rows=()) -> Embeddings:
    rng = np.random.default_rng(seed)
    t = rng.normal(size=(n, d)).astype(np.float32)
    i = (t + 0.5 * rng.normal(size=(n, d))).astype(np.float32)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    i /= np.linalg.norm(i, axis=1, keepdims=True)
    flags = np.zeros(n, bool)
    flags[list(imputed_text_rows)] = True
    return Embeddings({"text": t, "image": i}, {"text": flags, "image": np.zeros(n, bool)}, "multimodal")


def toy_store(tmp_path, n=40, **kw) -> ViewStore:
    emb = toy_embeddings(n)
    specs = [
        ViewSpec("text", "identity", ("text",)),
        ViewSpec("image", "identity", ("image",)),
        ViewSpec("balanced", "mean", ("text", "image")),
        ViewSpec("cca", "cca", ("text", "image"), {"dim": 4}),
    ]
    return ViewStore.create(
        tmp_path / "store", emb, specs, item_ids=[f"i{r}" for r in range(n)], encoder={"encoder": "toy"}, **kw
    )


def brute_force(vectors: np.ndarray, row: int, k: int):
    x = vectors.astype(np.float32)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = x @ x[row]
    s[row] = -np.inf
    order = np.argsort(-s, kind="stable")[:k]
    return order, s[order]


# ---------------------------------------------------------------------------------------------- KU, exact kNN
def test_ku_store_reloads_and_knn_equals_brute_force_cosine(tmp_path):
    data = ku_data()
    store, report = build_store(data, tmp_path / "ku", progress=False)
    assert report.encoder == "precomputed" and "precomputed features" in report.reason
    assert store.views == ["text", "image", "balanced", "cca"]
    assert store.dims == {"text": 512, "image": 512, "balanced": 512, "cca": 128}

    again = ViewStore(tmp_path / "ku")  # full verification on load
    raw = {
        "text": np.load(shared_data("ku") / "text_features.npy"),
        "image": np.load(shared_data("ku") / "image_features.npy"),
    }
    k = 20
    for view in ("text", "image"):
        x = raw[view].astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        n_same = 0
        for row in range(560):
            nb = again.knn(item=row, k=k, view=view)
            want_rows, want_scores = brute_force(raw[view], row, k)
            # The k best cosines, in order, and every returned item really has the cosine reported for it.
            np.testing.assert_allclose(nb.scores, want_scores, atol=1e-6)
            np.testing.assert_allclose(x[nb.rows] @ x[row], nb.scores, atol=1e-6)
            assert row not in nb.rows and nb.ids == [int(r) for r in nb.rows]
            n_same += int((nb.rows == want_rows).sum())
        # Orders differ only where cosines tie to float precision (KU has duplicate items).
        assert n_same >= 0.99 * 560 * k
    # The balanced view is the normalised mean of the two normalised modalities.
    t = raw["text"].astype(np.float32)
    i = raw["image"].astype(np.float32)
    b = t / np.linalg.norm(t, axis=1, keepdims=True) + i / np.linalg.norm(i, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    got = again.get([5, 6, 7], "balanced")
    assert got.dtype == np.float32 and got.shape == (3, 512)
    np.testing.assert_allclose(got, b[[5, 6, 7]], atol=1e-6)
    nb = again.knn(item=42, k=10, view="balanced")
    want_rows, _ = brute_force(b, 42, 10)
    assert len(set(nb.rows) & set(want_rows)) >= 9


def test_ku_manifest_records_everything(tmp_path):
    store, _ = build_store(ku_data(), tmp_path / "ku", progress=False, dtype="float16")
    m = json.loads((tmp_path / "ku" / "manifest.json").read_text())
    assert m["encoder"]["encoder"] == "precomputed" and len(m["encoder"]["checkpoint_sha256"]) == 64
    assert m["n_items"] == 560 and m["item_ids"][:3] == [0, 1, 2]
    assert m["dtype"] == "float16" and m["index"]["type"] == "flat" and m["metric"] == "inner_product"
    assert m["modalities"] == {"text": {"dim": 512}, "image": {"dim": 512}}
    assert set(m["files"]) == {"operators.npz"} | {f"views/{v}.{e}" for v in store.views for e in ("npy", "faiss")}
    assert all(len(h) == 64 for h in m["files"].values())
    cca = next(v for v in m["views"] if v["name"] == "cca")
    assert cca["params"]["k"] == 128 and set(cca["arrays"]) == {"mu_a", "mu_b", "proj_a", "proj_b", "correlations"}
    assert {"numpy", "faiss-cpu"} <= set(m["library_versions"]) and m["created"]
    assert m["row_flags"]["imputed"] == {"text": [], "image": []}
    # float16 on disk, float32 out; the index was built from the rounded vectors, so self-match scores 1.
    assert np.load(tmp_path / "ku" / "views" / "text.npy").dtype == np.float16
    assert store.get([0], "text").dtype == np.float32
    rows, scores = store.search(store.get([10], "text"), 1, "text")
    assert rows[0, 0] == 10 and abs(scores[0, 0] - float(np.sum(store.get([10], "text") ** 2))) < 1e-6


# ---------------------------------------------------------------------------------------------- corrupt, mismatched
def test_flipped_byte_is_refused_naming_the_file(tmp_path):
    toy_store(tmp_path)
    f = tmp_path / "store" / "views" / "image.npy"
    raw = bytearray(f.read_bytes())
    raw[-3] ^= 0xFF
    f.write_bytes(bytes(raw))
    with pytest.raises(CorruptStoreError, match=r"image\.npy: checksum mismatch"):
        ViewStore(tmp_path / "store")


def test_missing_file_and_broken_manifest(tmp_path):
    toy_store(tmp_path)
    (tmp_path / "store" / "views" / "cca.faiss").unlink()
    with pytest.raises(CorruptStoreError, match=r"cca\.faiss: listed in the manifest but missing"):
        ViewStore(tmp_path / "store")
    (tmp_path / "store" / "manifest.json").write_text("{not json")
    with pytest.raises(CorruptStoreError, match=r"manifest\.json: not valid JSON"):
        ViewStore(tmp_path / "store")
    (tmp_path / "store" / "manifest.json").unlink()
    with pytest.raises(CorruptStoreError, match="manifest.json: missing"):
        ViewStore(tmp_path / "store")
    with pytest.raises(ViewStoreError, match="no such ViewStore folder"):
        ViewStore(tmp_path / "nowhere")


def _rewrite_manifest(path: Path, change) -> None:
    m = json.loads((path / "manifest.json").read_text())
    change(m)
    (path / "manifest.json").write_text(json.dumps(m))


def test_wrong_dims_are_refused(tmp_path):
    store = toy_store(tmp_path)
    # A manifest that disagrees with the files (e.g. edited by hand, or files from another build).
    _rewrite_manifest(store.path, lambda m: m["views"][0].update(dim=9))
    with pytest.raises(CorruptStoreError, match=r"text\.npy: shape \(40, 8\) but the manifest says \(40, 9\)"):
        ViewStore(store.path)
    _rewrite_manifest(store.path, lambda m: m["views"][0].update(dim=8))
    store = ViewStore(store.path)
    with pytest.raises(ViewStoreError, match="view 'text' has dimension 8"):
        store.knn(vector=np.ones(7, np.float32), view="text")
    bad = toy_embeddings(3, d=6)
    with pytest.raises(ViewStoreError, match="modality 'text' has dimension 6, the store expects 8"):
        store.add_items(["n0", "n1", "n2"], embeddings=bad)


def test_nan_vectors_are_refused(tmp_path):
    feats = np.random.default_rng(1).normal(size=(10, 4)).astype(np.float32)
    feats[7, 2] = np.nan
    with pytest.raises(ViewStoreError, match="row 7 .*NaN"):
        PrecomputedEncoder({"text": feats}).encode(None)
    # A NaN written into a stored file (with a matching checksum) is still caught on load, naming the row.
    store = toy_store(tmp_path)
    arr = np.load(store.path / "views" / "balanced.npy")
    arr[13, 0] = np.nan
    np.save(store.path / "views" / "balanced.npy", arr)
    from fedvlr_plus.views.encoders import sha256_file

    _rewrite_manifest(
        store.path,
        lambda m: m["files"].update({"views/balanced.npy": sha256_file(store.path / "views" / "balanced.npy")}),
    )
    with pytest.raises(CorruptStoreError, match=r"balanced\.npy: row 13 contains NaN"):
        ViewStore(store.path)
    with pytest.raises(ViewStoreError, match="NaN"):
        toy_store(tmp_path / "fresh").knn(vector=np.full(8, np.nan, np.float32), view="text")


def test_missing_rows_are_refused(tmp_path):
    store = toy_store(tmp_path)
    with pytest.raises(ViewStoreError, match=r"rows \[40, 99\] are outside \[0, 40\)"):
        store.get([0, 40, 99], "text")
    with pytest.raises(ViewStoreError, match="item 'zzz' is not in the store"):
        store.knn(item="zzz")
    with pytest.raises(ViewStoreError, match="3 item ids for 40 embedded items"):
        ViewStore.create(
            tmp_path / "other", toy_embeddings(), [ViewSpec("text", "identity", ("text",))], item_ids=["a", "b", "c"]
        )
    data = ku_data()
    short = data.replace(features={"text": data.features["text_features"][:500]})
    with pytest.raises(ViewStoreError, match="encoded 500 rows for 560 items"):
        build_store(short, tmp_path / "short", progress=False)
    assert not (tmp_path / "short").exists()


# ---------------------------------------------------------------------------------------------- add_items
def test_add_items_keeps_old_rows_bit_identical(tmp_path):
    store = toy_store(tmp_path)
    before = {v: np.load(store.path / "views" / f"{v}.npy") for v in store.views}
    params_before = {k: np.array(v) for k, v in store.params()["cca"].items() if isinstance(v, np.ndarray)}
    new = toy_embeddings(5, seed=9, imputed_text_rows=[1])
    store2 = store.add_items([f"new{r}" for r in range(5)], embeddings=new, titles=[None] * 5)
    assert store2.n_items == 45 and store2.item_ids[-1] == "new4"
    for v in store2.views:
        after = np.load(store2.path / "views" / f"{v}.npy")
        assert after.shape == (45, before[v].shape[1])
        assert after[:40].tobytes() == before[v].tobytes()  # bit-identical
        assert store2.index(v).ntotal == 45
    # The learned operator was applied with its stored parameters, never refitted.
    for k, v in params_before.items():
        assert np.array_equal(store2.params()["cca"][k], v)
    # A new item is its own nearest neighbour, and its imputed flag is recorded at its row.
    rows, _ = store2.search(store2.get([43], "image"), 1, "image")
    assert rows[0, 0] == 43
    assert store2.imputed("text")[41] and store2.imputed("text").sum() == 1
    assert store2.imputed("balanced")[41] and not store2.imputed("image")[41]
    assert store2.manifest["additions"][0]["items"] == 5
    ViewStore(store2.path)  # checksums were rewritten
    with pytest.raises(ViewStoreError, match="already in the store"):
        store2.add_items(["i3"], embeddings=toy_embeddings(1))


def test_add_items_with_encoder_checks_fingerprint(tmp_path):
    from fedvlr_plus.views import HashingTextEncoder

    items = pd.DataFrame(
        {
            "title": ["red apple pie", "green apple tart", "blue cheese"],
            "categories": [["Dessert"], ["Dessert"], ["Cheese"]],
        }
    )
    enc = HashingTextEncoder(64)
    emb = enc.encode(items)
    store = ViewStore.create(
        tmp_path / "s",
        emb,
        [ViewSpec("title", "identity", ("title",)), ViewSpec("metadata", "identity", ("metadata",))],
        item_ids=["a", "b", "c"],
        encoder=enc.fingerprint(),
        titles=list(items["title"]),
    )
    # New items without categories: the metadata field is imputed (flagged), the store keeps its modalities.
    new = pd.DataFrame({"title": ["apple crumble"], "categories": [None]})
    store = store.add_items(["d"], items=new, encoder=enc)
    assert store.title(3) == "apple crumble" and store.imputed("metadata")[3]
    assert store.knn(item="d", k=1, view="title").ids == ["a"] or store.knn(item="d", k=1, view="title").ids == ["b"]
    with pytest.raises(ViewStoreError, match="encoder differs"):
        store.add_items(["e"], items=new, encoder=HashingTextEncoder(32))


# ---------------------------------------------------------------------------------------------- atomic writes
def test_failed_write_leaves_the_old_store_intact(tmp_path, monkeypatch):
    store = toy_store(tmp_path)
    before = (store.path / "manifest.json").read_text()
    import faiss

    calls = {"n": 0}
    real = faiss.write_index

    def flaky(index, path):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        return real(index, path)

    monkeypatch.setattr(faiss, "write_index", flaky)
    from fedvlr_plus.errors import UserError

    # a full disk is one line naming the store (and the old store is untouched, below)
    with pytest.raises(UserError, match="store: cannot write .disk full"):
        store.add_items(["x"], embeddings=toy_embeddings(1, seed=3))
    assert (store.path / "manifest.json").read_text() == before
    assert ViewStore(store.path).n_items == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # no temporary folder left behind
    with pytest.raises(ViewStoreError, match="already exists"):
        toy_store(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(ViewStoreError, match="not a ViewStore; refusing"):
        ViewStore.create(
            tmp_path / "notes", toy_embeddings(), [ViewSpec("text", "identity", ("text",))], overwrite=True
        )
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


# ---------------------------------------------------------------------------------------------- index types
@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_indexes_find_each_item_first(tmp_path, kind):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    emb = Embeddings({"text": x}, {}, "precomputed")
    store = ViewStore.create(tmp_path / kind, emb, [ViewSpec("text", "identity", ("text",))], index=kind)
    store = ViewStore(store.path)
    assert store.manifest["index"]["type"] == kind
    rows, scores = store.search(x[:50], 1, "text")
    assert (rows[:, 0] == np.arange(50)).mean() >= 0.96
    store = store.add_items(
        list(range(400, 410)), embeddings=Embeddings({"text": x[:10][::-1].copy()}, {}, "precomputed")
    )
    assert store.index("text").ntotal == 410


def test_knn_by_vector_and_default_view(tmp_path):
    store = toy_store(tmp_path)
    assert store.default_view == "balanced"
    q = store.get([4], "text")[0] * 3.0  # any scale: the query is normalised
    nb = store.knn(vector=q, k=3, view="text")
    assert nb.rows[0] == 4 and abs(nb.scores[0] - 1.0) < 1e-5 and nb.ids[0] == "i4"
    nb = store.knn(item="i4", k=100, view="text")
    assert len(nb.rows) == 39 and 4 not in nb.rows
    assert np.all(np.diff(nb.scores) <= 1e-7)


def test_feature_folder_encoder_and_zero_rows(tmp_path):
    folder = tmp_path / "feats"
    folder.mkdir()
    text = np.array([[3, 4], [0, 0], [1, 0]], np.float32)  # row 1 is all zero: missing, mean-imputed
    np.save(folder / "text_feat.npy", text)
    np.save(folder / "image_features.npy", np.eye(3, dtype=np.float16))
    np.save(folder / "labels.npy", np.arange(3))  # not a float matrix: ignored
    enc = PrecomputedEncoder.from_folder(folder)
    assert list(enc.features) == ["text", "image"]
    emb = enc.encode(None)
    np.testing.assert_allclose(emb.modalities["text"][0], [0.6, 0.8])
    mean = np.array([0.6 + 1.0, 0.8]) / np.linalg.norm([1.6, 0.8])
    np.testing.assert_allclose(emb.modalities["text"][1], mean, atol=1e-6)
    assert emb.imputed["text"].tolist() == [False, True, False] and not emb.imputed["image"].any()
    assert enc.fingerprint()["model"] == "image[3],text[2]"
    with pytest.raises(ViewStoreError, match="features have 3 rows but the catalogue has 4 items"):
        enc.encode(pd.DataFrame({"title": list("abcd")}))
