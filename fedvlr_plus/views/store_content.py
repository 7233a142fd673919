"""What a ViewStore's manifest records when the store is created or grown: items, views, row flags, history.

Reading and checking a manifest is :mod:`.manifest`; writing the files it lists is :class:`.store.ViewStore`.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import numpy as np

from .embeddings import Embeddings
from .errors import ViewStoreError
from .manifest import FORMAT, FORMAT_VERSION
from .operators import ViewSpec, view_imputed


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def json_id(x: Any) -> Any:
    """A raw item id as JSON keeps it: integers and strings as they are, anything else as its text."""
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (int, str)):
        return x
    if isinstance(x, (np.str_, bytes)):
        return str(x)
    return str(x)


def library_versions() -> dict:
    out = {}
    for dist in ("fedvlr-plus", "faiss-cpu", "numpy", "scipy", "torch", "open_clip_torch", "sentence-transformers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def new_manifest(
    embeddings: Embeddings,
    specs: list[ViewSpec],
    views: dict[str, np.ndarray],
    *,
    item_ids: list,
    titles: Sequence[str | None] | None,
    encoder: dict | None,
    catalogue: str,
    dtype: str,
    index: dict,
) -> dict:
    """The manifest of a new store, without its ``views`` entries (see :func:`view_entries`) and files."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": now(),
        "updated": now(),
        "catalogue": catalogue,
        "encoder": encoder or {"encoder": "unknown"},
        "embedding_kind": embeddings.kind,
        "modalities": {m: {"dim": int(a.shape[1])} for m, a in embeddings.modalities.items()},
        "n_items": embeddings.n,
        "item_ids": item_ids,
        "titles": None if titles is None else [None if t is None else str(t) for t in titles],
        "dtype": dtype,
        "metric": "inner_product",
        "normalised": True,
        "index": index,
        "default_view": "balanced" if "balanced" in views else specs[0].name,
        "views": [],
        "row_flags": {
            "imputed": {m: np.flatnonzero(f).tolist() for m, f in embeddings.imputed.items()},
            "imputed_views": {s.name: np.flatnonzero(view_imputed(embeddings, s)).tolist() for s in specs},
        },
        "additions": [],
        "library_versions": library_versions(),
    }


def view_entries(
    specs: list[ViewSpec], params: dict[str, dict], views: dict[str, np.ndarray]
) -> tuple[list[dict], dict[str, np.ndarray]]:
    """The manifest entry of every view (scalar parameters inline) and the array parameters, keyed
    ``"<view>/<param>"`` for operators.npz."""
    entries, arrays = [], {}
    for spec in specs:
        scalars, keys = {}, []
        for k, v in params[spec.name].items():
            if isinstance(v, np.ndarray):
                arrays[f"{spec.name}/{k}"] = v
                keys.append(k)
            else:
                scalars[k] = v.item() if isinstance(v, np.generic) else v
        entries.append({**spec.to_json(), "dim": int(views[spec.name].shape[1]), "params": scalars, "arrays": keys})
    return entries, arrays


def grown_manifest(
    manifest: dict, new_ids: list, titles: Sequence[str | None] | None, embeddings: Embeddings, specs: list[ViewSpec]
) -> dict:
    """A copy of ``manifest`` with ``new_ids`` appended: ids, titles, row flags and the addition's record."""
    n_old, n_new = int(manifest["n_items"]), len(new_ids)
    manifest = json.loads(json.dumps(manifest))
    manifest["n_items"] = n_old + n_new
    manifest["item_ids"] = manifest["item_ids"] + new_ids
    if manifest.get("titles") is not None or titles is not None:
        old_t = manifest.get("titles") or [None] * n_old
        new_t = list(titles) if titles is not None else [None] * n_new
        if len(new_t) != n_new:
            raise ViewStoreError(f"add_items: {len(new_t)} titles for {n_new} items")
        manifest["titles"] = old_t + [None if t is None else str(t) for t in new_t]
    flags = manifest.setdefault("row_flags", {"imputed": {}, "imputed_views": {}})
    for m, f in embeddings.imputed.items():
        flags["imputed"].setdefault(m, []).extend((np.flatnonzero(f) + n_old).tolist())
    for spec in specs:
        flags["imputed_views"].setdefault(spec.name, []).extend(
            (np.flatnonzero(view_imputed(embeddings, spec)) + n_old).tolist()
        )
    manifest["updated"] = now()
    manifest.setdefault("additions", []).append({"time": manifest["updated"], "items": n_new})
    manifest["library_versions"] = library_versions()
    return manifest
