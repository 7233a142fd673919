"""Pre-fusion operators, text templates and the missing-content fallback, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedvlr_plus.views import (
    OPERATORS,
    Embeddings,
    ViewOperator,
    ViewSpec,
    ViewStore,
    ViewStoreError,
    apply_views,
    combined_texts,
    complete,
    default_views,
    field_texts,
    fit_views,
    parse_views,
)
from fedvlr_plus.views.cca import apply_cca, fit_cca
from fedvlr_plus.views.procrustes import fit_procrustes


def emb2(t, i, kind="multimodal", **flags) -> Embeddings:
    t = np.asarray(t, np.float32)
    i = np.asarray(i, np.float32)
    return Embeddings({"text": t, "image": i}, {k: np.asarray(v) for k, v in flags.items()}, kind).check()


def unit(x):
    x = np.asarray(x, np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_mean_weighted_concat_by_hand():
    e = emb2([[1, 0], [0.6, 0.8]], [[0, 1], [0.6, 0.8]])
    specs = [
        ViewSpec("balanced", "mean", ("text", "image")),
        ViewSpec("text_heavy", "weighted", ("text", "image"), {"weights": [0.75, 0.25]}),
        ViewSpec("concat", "concat", ("text", "image")),
    ]
    v = apply_views(e, specs, fit_views(e, specs))
    h = 1 / np.sqrt(2)
    np.testing.assert_allclose(v["balanced"][0], [h, h], atol=1e-7)
    np.testing.assert_allclose(v["balanced"][1], [0.6, 0.8], atol=1e-7)  # equal inputs: unchanged
    np.testing.assert_allclose(v["text_heavy"][0], [0.75 / np.sqrt(0.625), 0.25 / np.sqrt(0.625)], atol=1e-6)
    np.testing.assert_allclose(v["concat"][0], [h, 0, 0, h], atol=1e-7)
    # concat's inner product is the mean of the per-modality cosines: (0.6 + 0.8) / 2 for these two rows.
    assert abs(float(v["concat"][0] @ v["concat"][1]) - (0.6 + 0.8) / 2) < 1e-6


def test_opposite_inputs_give_a_clear_error():
    e = emb2([[1, 0]], [[-1, 0]])
    with pytest.raises(ViewStoreError, match="row 0 is zero or not finite after 'mean'"):
        apply_views(e, [ViewSpec("b", "mean", ("text", "image"))], {})


def test_cca_one_dimensional_closed_form():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    a = x[:, None]
    b = (0.5 * x + rng.normal(size=200))[:, None]
    rho = np.corrcoef(a[:, 0], b[:, 0])[0, 1]
    reg = 0.1
    p = fit_cca(a, b, dim=8, reg=reg)
    assert p["k"] == 1
    # Whitened cross-covariance of 1-D inputs is rho / (1 + reg); the projections are 1 / sd / sqrt(1 + reg).
    assert abs(float(p["correlations"][0]) - abs(rho) / (1 + reg)) < 1e-5
    assert abs(abs(float(p["proj_a"][0, 0])) - 1 / np.sqrt(a.var(ddof=1) * (1 + reg))) < 1e-5
    assert abs(abs(float(p["proj_b"][0, 0])) - 1 / np.sqrt(b.var(ddof=1) * (1 + reg))) < 1e-5


def test_cca_finds_the_shared_latent_and_is_deterministic():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(500, 2))
    a = z @ rng.normal(size=(2, 6)) + 0.05 * rng.normal(size=(500, 6))
    b = z @ rng.normal(size=(2, 5)) + 0.05 * rng.normal(size=(500, 5))
    b[:, 4] = rng.normal(size=500)  # a dimension unrelated to a
    p = fit_cca(a, b, dim=4, reg=1e-3)
    assert p["k"] == 4
    assert p["correlations"][1] > 0.95 and p["correlations"][2] < 0.3
    za = (a - p["mu_a"]) @ p["proj_a"]
    zb = (b - p["mu_b"]) @ p["proj_b"]
    assert np.corrcoef(za[:, 0], zb[:, 0])[0, 1] > 0.99
    q = fit_cca(a, b, dim=4, reg=1e-3)
    assert all(np.array_equal(p[k], q[k]) for k in ("proj_a", "proj_b"))
    np.testing.assert_allclose(apply_cca(a[:3], b[:3], p), (za[:3] + zb[:3]) / 2, atol=1e-5)
    with pytest.raises(ViewStoreError, match="at least 3 items"):
        fit_cca(a[:2], b[:2])


def test_procrustes_recovers_a_rotation():
    rng = np.random.default_rng(2)
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    a = unit(rng.normal(size=(50, 6)))
    b = (a @ q.T).astype(np.float32)  # image = text rotated
    r = fit_procrustes(a, b)["rotation"]
    np.testing.assert_allclose(r, q, atol=1e-5)
    e = emb2(a, b)
    spec = [ViewSpec("procrustes", "procrustes", ("text", "image"))]
    v = apply_views(e, spec, fit_views(e, spec))["procrustes"]
    np.testing.assert_allclose(v, a, atol=1e-5)  # a + b R = 2a, normalised


def test_learned_operators_ignore_imputed_rows():
    rng = np.random.default_rng(3)
    t = unit(rng.normal(size=(30, 4)))
    i = unit(t + 0.3 * rng.normal(size=(30, 4)))
    flags = np.zeros(30, bool)
    flags[[2, 5, 11]] = True
    i_garbage = i.copy()
    i_garbage[flags] = unit(np.ones((3, 4)))
    spec = [ViewSpec("cca", "cca", ("text", "image"), {"dim": 3})]
    with_flags = fit_views(emb2(t, i_garbage, image=flags), spec)["cca"]
    subset = fit_cca(t[~flags], i[~flags], dim=3)
    assert np.array_equal(with_flags["proj_a"], subset["proj_a"])


def test_registry_is_open_and_views_parse(tmp_path, monkeypatch):
    monkeypatch.setitem(OPERATORS, "maxpool", ViewOperator(lambda xs, o, p: np.maximum(*xs), doc="element max"))
    e = emb2([[1, 0], [0, 1], [0.6, 0.8]], [[0, 1], [0, 1], [0.8, 0.6]])
    specs = parse_views("text, mx=maxpool(text,image)", e)
    assert [s.name for s in specs] == ["text", "mx"] and specs[1].inputs == ("text", "image")
    store = ViewStore.create(tmp_path / "s", e, specs)
    np.testing.assert_allclose(
        store.get([0, 2], "mx"), [[np.sqrt(0.5), np.sqrt(0.5)], [0.8 / np.hypot(0.8, 0.8)] * 2], atol=1e-6
    )
    with pytest.raises(ViewStoreError, match="unknown view 'nope'; available here: text, image, balanced"):
        parse_views("nope", e)
    with pytest.raises(ViewStoreError, match="input 'title' is not an encoded modality"):
        parse_views("t=identity(title)", e)
    with pytest.raises(ViewStoreError, match="unknown operator 'zz'"):
        parse_views("t=zz(text)", e)


def test_default_views_by_kind():
    e = emb2(np.eye(3), np.eye(3))
    assert [(s.name, s.op, s.inputs) for s in default_views(e)] == [
        ("text", "identity", ("text",)),
        ("image", "identity", ("image",)),
        ("balanced", "mean", ("text", "image")),
        ("cca", "cca", ("text", "image")),
    ]
    f = Embeddings({"title": unit(np.eye(3)), "metadata": unit(np.eye(3)[::-1])}, {}, "text-fields")
    assert [(s.name, s.inputs) for s in default_views(f)] == [
        ("title", ("title",)),
        ("metadata", ("metadata",)),
        ("balanced", ("title", "metadata")),
        ("cca", ("title", "metadata")),
    ]
    mixed = Embeddings({"text": unit(np.eye(3)), "image": unit(np.eye(4)[:3])}, {}, "multimodal")
    assert {s.name: s.op for s in default_views(mixed)}["balanced"] == "concat"  # dims differ
    single = Embeddings({"text": unit(np.eye(3))}, {}, "precomputed")
    assert [s.name for s in default_views(single)] == ["text"]


def test_text_templates_by_hand():
    items = pd.DataFrame(
        {
            "title": ["Toy Story (1995)", None, "  Spaced   out "],
            "description": [None, ["Great card.", "Never expires"], float("nan")],
            "categories": [["Animation", "Children's", "Animation"], ["Gift Cards", "Gift Cards"], []],
            "year": ["1995", None, None],
        }
    )
    assert combined_texts(items) == [
        "Toy Story (1995). Animation, Children's.",
        "Gift Cards. Great card. Never expires.",
        "Spaced out.",
    ]
    f = field_texts(items)
    assert f["title"] == ["Toy Story (1995)", None, "Spaced out"]
    assert f["description"] == [None, "Great card. Never expires", None]
    assert f["metadata"] == ["Categories: Animation, Children's. Year: 1995.", "Categories: Gift Cards.", None]
    assert combined_texts(pd.DataFrame({"title": [None]})) == [None]
    assert "description" not in field_texts(items.drop(columns="description"))


def test_fallback_shared_space_then_mean():
    t = np.array([[1, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 0]], np.float32)
    i = np.array([[0, 2, 0], [0, 0, 3], [0, 0, 0], [0, 0, 0]], np.float32)
    present_t = np.array([True, False, False, True])
    present_i = np.array([True, True, False, False])
    e = complete({"text": t, "image": i}, {"text": present_t, "image": present_i}, shared_space=True, kind="multimodal")
    # Row 1 has no text: it borrows its image. Row 2 has nothing: the modality mean. Row 3 borrows its text.
    np.testing.assert_allclose(e.modalities["text"][1], [0, 0, 1])
    np.testing.assert_allclose(e.modalities["text"][2], unit([1, 1, 0]), atol=1e-7)  # mean of present rows 0, 3
    np.testing.assert_allclose(e.modalities["image"][3], [0, 1, 0])
    np.testing.assert_allclose(e.modalities["image"][2], unit([0, 1, 1]), atol=1e-7)  # present rows 0, 1
    assert e.imputed["text"].tolist() == [False, True, True, False]
    assert e.imputed["image"].tolist() == [False, False, True, True]
    # Without a shared space, every missing row gets the mean of the present rows of that modality.
    e = complete({"text": t, "image": i}, {"text": present_t, "image": present_i}, shared_space=False, kind="x")
    np.testing.assert_allclose(e.modalities["image"][3], unit([0, 1, 1]), atol=1e-7)
    # A modality that no item has is dropped, not imputed.
    e = complete({"text": t, "image": i}, {"text": present_t, "image": np.zeros(4, bool)}, shared_space=True, kind="x")
    assert e.names == ["text"]
