"""Timing of the view pipeline: encode + index N items with a text encoder, then kNN latency.

The catalogue is MovieLens-100K's 1,682 movies (shipped in the recbole wheel) tiled to ``n_items``:
copy ``c > 0`` of a movie gets the title ``"<title> (copy c)"`` so that every title is a distinct text.
Metadata texts (genres + year) repeat across copies and are embedded once each - the pipeline
de-duplicates identical strings, as it would on a real catalogue - the report gives both counts.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .build import build_store


def movielens_items(n_items: int) -> pd.DataFrame:
    """Items frame (title, categories, year) of ml-100k tiled to ``n_items`` rows."""
    import importlib.util

    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("recbole is not installed: the benchmark catalogue is its bundled ml-100k")
    f = Path(list(spec.submodule_search_locations)[0]) / "dataset_example" / "ml-100k" / "ml-100k.item"
    raw = pd.read_csv(f, sep="\t", dtype=str, keep_default_na=False)
    raw.columns = [c.split(":")[0] for c in raw.columns]
    base = pd.DataFrame({
        "title": [f"{t} ({y})" if y.isdigit() else t for t, y in zip(raw["movie_title"], raw["release_year"])],
        "categories": [c.split() for c in raw["class"]],
        "year": raw["release_year"],
    })
    reps = -(-n_items // len(base))
    tiled = pd.concat([base] * reps, ignore_index=True).iloc[:n_items].copy()
    copy = np.arange(n_items) // len(base)
    tiled["title"] = [t if c == 0 else f"{t} (copy {c})" for t, c in zip(tiled["title"], copy)]
    return tiled.reset_index(drop=True)


class _Catalogue:
    def __init__(self, items: pd.DataFrame):
        self.name = f"ml-100k-tiled-{len(items)}"
        self.items = items
        self.item_ids = np.arange(len(items))
        self.n_items = len(items)
        self.features = {}
        self.source = ""


def bench_views(n_items: int = 10_000, *, encoder: str = "sentence", queries: int = 1000, k: int = 10,
                out: str | os.PathLike | None = None, index: str = "flat", device: str | None = None,
                batch_size: int = 64, seed: int = 0, progress: bool = False) -> dict:
    """Build a store for ``n_items`` tiled MovieLens items and time encode, index, load and kNN."""
    items = movielens_items(n_items)
    data = _Catalogue(items)
    tmp = None
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="fedvlr-bench-views-")
        out = Path(tmp.name) / "store"
    try:
        t0 = time.perf_counter()
        store, report = build_store(data, out, encoder=encoder, index=index, device=device,
                                    batch_size=batch_size, progress=progress, overwrite=True)
        total = time.perf_counter() - t0
        t1 = time.perf_counter()
        store = type(store)(store.path)  # reload with full verification
        load_s = time.perf_counter() - t1
        rng = np.random.default_rng(seed)
        rows = rng.integers(0, n_items, size=queries)
        view = store.default_view
        store.knn(item=int(rows[0]), k=k, view=view)  # warm the index
        lat = []
        for r in rows:
            t = time.perf_counter()
            store.knn(item=int(r), k=k, view=view)
            lat.append(time.perf_counter() - t)
        lat_ms = np.asarray(lat) * 1e3
        q = store.get(rows, view)
        t = time.perf_counter()
        store.search(q, k, view)
        batch_s = time.perf_counter() - t
        uniq = {f: len(set(v)) for f, v in _field_counts(items).items()}
        return {
            "n_items": n_items,
            "encoder": report.encoder,
            "model": store.manifest["encoder"].get("model"),
            "device": device or "auto",
            "torch_threads": _torch_threads(),
            "views": store.dims,
            "index": store.manifest["index"]["type"],
            "unique_texts": uniq,
            "seconds": {**{k_: round(v, 3) for k_, v in report.seconds.items()}, "total_build": round(total, 3),
                        "load_verify": round(load_s, 3)},
            "items_per_second_encode": round(n_items / max(report.seconds["encode"], 1e-9), 1),
            "knn_ms": {"view": view, "k": k, "queries": queries, "mean": round(float(lat_ms.mean()), 4),
                       "p50": round(float(np.percentile(lat_ms, 50)), 4),
                       "p95": round(float(np.percentile(lat_ms, 95)), 4)},
            "batch_search": {"queries": queries, "seconds": round(batch_s, 4),
                             "queries_per_second": round(queries / max(batch_s, 1e-9), 1)},
            "store_bytes": store.info()["bytes"],
        }
    finally:
        if tmp is not None:
            tmp.cleanup()


def _field_counts(items: pd.DataFrame) -> dict[str, list]:
    from .text import field_texts

    return {k: [t for t in v if t is not None] for k, v in field_texts(items).items()}


def _torch_threads() -> int | None:
    try:
        import torch

        return int(torch.get_num_threads())
    except Exception:
        return None
