"""Catalogue -> encoder -> pre-fusion operators -> ViewStore, in one call.

>>> store = build_store(data, "stores/ml-100k", encoder="auto")      # doctest: +SKIP
>>> store.knn("1", k=5, view="title").ids                           # doctest: +SKIP
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .embeddings import Embeddings
from .encoders import ItemEncoder, PrecomputedEncoder, make_encoder
from .errors import ViewStoreError
from .operators import ViewSpec, parse_views
from .store import ViewStore
from .text import clean, field_texts

log = logging.getLogger(__name__)


@dataclass
class BuildReport:
    encoder: str
    reason: str
    n_items: int
    views: list[str]
    imputed: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)
    encoder_report: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def item_titles(data) -> list[str | None] | None:
    items = getattr(data, "items", None)
    if items is None or "title" not in getattr(items, "columns", []):
        return None
    return [clean(t) for t in items["title"]]


def build_store(
    data,
    out: str | os.PathLike,
    *,
    encoder: str | ItemEncoder = "auto",
    model: str | None = None,
    pretrained: str | None = None,
    views: str | list | None = None,
    dtype: str = "float32",
    index: str | dict = "flat",
    device: str | None = None,
    batch_size: int = 64,
    progress: bool = True,
    fetch_images: bool = False,
    image_root: str | None = None,
    overwrite: bool = False,
    announce: Callable[[str], None] | None = None,
) -> tuple[ViewStore, BuildReport]:
    """Encode every item of ``data`` (an InteractionData), derive the views, write the store to ``out``.

    ``announce`` (e.g. a print to stderr) is told, before any progress bar, what will be encoded with what.
    """
    t0 = time.perf_counter()
    if isinstance(encoder, str):
        enc, reason = make_encoder(encoder, data=data, model=model, pretrained=pretrained, device=device,
                                   batch_size=batch_size, progress=progress, fetch_images=fetch_images,
                                   image_root=image_root or _default_image_root(data))
    else:
        enc, reason = encoder, "encoder object given"
    if announce is not None:
        announce(f"{describe_encoding(enc, data)} ({reason})")
    if hasattr(enc, "load"):  # weights that load lazily are loaded here, so the timings separate load and encode
        enc.load()
    log.info("views: encoder %s (%s)", enc.name, reason)
    t1 = time.perf_counter()
    emb = _encode_catalogue(enc, data)
    t2 = time.perf_counter()
    specs: list[ViewSpec] = parse_views(views, emb)
    item_ids = getattr(data, "item_ids", None)
    store = ViewStore.create(
        out, emb, specs,
        item_ids=None if item_ids is None else list(item_ids),
        titles=item_titles(data),
        encoder=enc.fingerprint(),
        catalogue=getattr(data, "name", ""),
        dtype=dtype, index=index, overwrite=overwrite,
    )
    t3 = time.perf_counter()
    report = BuildReport(
        encoder=enc.name, reason=reason, n_items=emb.n, views=store.views,
        imputed={m: int(f.sum()) for m, f in emb.imputed.items()},
        seconds={"load_encoder": t1 - t0, "encode": t2 - t1, "views_and_index": t3 - t2},
        encoder_report=dict(getattr(enc, "report", {}) or {}),
    )
    return store, report


def _encode_catalogue(enc, data) -> Embeddings:
    """Every item of ``data`` encoded, one row per item (content rows must match the catalogue)."""
    items = getattr(data, "items", None)
    n_items = getattr(data, "n_items", None)
    if n_items is not None and items is not None and len(items) and len(items) != n_items:
        raise ViewStoreError(f"{getattr(data, 'name', 'catalogue')}: item content has {len(items)} rows "
                             f"for {n_items} items (missing rows)")
    emb = enc.encode(items if items is not None and len(items) else None)
    if n_items is not None and emb.n != n_items:
        raise ViewStoreError(f"{enc.name}: encoded {emb.n} rows for {n_items} items (missing rows)")
    return emb


def describe_encoding(enc, data) -> str:
    """What the build is about to encode and with which model, e.g. "encoding the text of 1,682 items
    (title, metadata) with sentence all-MiniLM-L6-v2"."""
    items = getattr(data, "items", None)
    name = getattr(data, "name", "the catalogue")
    n = getattr(data, "n_items", None) or (len(items) if items is not None else 0)
    if isinstance(enc, PrecomputedEncoder):
        shapes = ", ".join(f"{k}[{a.shape[0]:,}x{a.shape[1]}]" for k, a in enc.features.items())
        return f"using the precomputed features of {name}: {shapes}"
    model = getattr(enc, "model_name", None)
    what = f"{enc.name} {model}" if model else f"the {enc.name} encoder"
    fields = list(field_texts(items)) if items is not None and len(items) else []
    images = enc.name == "open_clip" and items is not None and "image" in getattr(items, "columns", [])
    content = ("images and text" if images else "text") + (f" ({', '.join(fields)})" if fields else "")
    return f"encoding the {content} of {n:,} items of {name} with {what}"


def _default_image_root(data) -> str | None:
    """Relative image paths resolve against the data source folder when the loader recorded one."""
    src = getattr(data, "source", "") or ""
    if src and os.path.isdir(src):
        return src
    if src and os.path.isfile(src):
        return os.path.dirname(os.path.abspath(src))
    return None
