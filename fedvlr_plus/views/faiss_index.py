"""The FAISS index of one view: its configuration, building it over the stored vectors, search settings.

Vectors are L2-normalised, so an inner-product index returns cosines. The default, ``IndexIDMap2(IndexFlatIP)``,
is exact (Johnson, Douze & Jégou, "Billion-scale similarity search with GPUs", IEEE TBD 2019); ``hnsw``
(Malkov & Yashunin, TPAMI 2018) and ``ivf`` are approximate options for large catalogues.
"""

from __future__ import annotations

import numpy as np

from .choices import INDEX_TYPES
from .errors import ViewStoreError


def faiss_module():
    """FAISS, imported on first use (the command-line parser must not pay for it)."""
    import faiss

    return faiss


def index_config(kind: str = "flat", n_items: int = 0, **overrides) -> dict:
    """Index type and its parameters (HNSW: M=32, efConstruction=80, efSearch=64; IVF: nlist ~ 4 sqrt(n))."""
    if kind not in INDEX_TYPES:
        raise ViewStoreError(f"unknown index type '{kind}' (choose {', '.join(INDEX_TYPES)})")
    cfg: dict = {"type": kind, "metric": "inner_product"}
    if kind == "hnsw":
        cfg.update(hnsw_m=32, ef_construction=80, ef_search=64)
    elif kind == "ivf":
        # FAISS wants >= 39 training points per centroid; 4 sqrt(n) lists is the usual rule of thumb.
        nlist = max(1, min(int(4 * np.sqrt(max(n_items, 1))), n_items // 39))
        cfg.update(nlist=nlist, nprobe=min(nlist, 16), seed=0)
    cfg.update(overrides)
    return cfg


def build_index(vectors: np.ndarray, cfg: dict):
    """A new index over ``vectors`` (float32, unit rows) with ids 0..n-1."""
    faiss = faiss_module()
    n, d = vectors.shape
    kind = cfg["type"]
    if kind == "flat":
        inner = faiss.IndexFlatIP(d)
    elif kind == "hnsw":
        inner = faiss.IndexHNSWFlat(d, int(cfg["hnsw_m"]), faiss.METRIC_INNER_PRODUCT)
        inner.hnsw.efConstruction = int(cfg["ef_construction"])
        inner.hnsw.efSearch = int(cfg["ef_search"])
    elif kind == "ivf":
        nlist = int(cfg["nlist"])
        inner = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        inner.cp.seed = int(cfg.get("seed", 0))
        inner.train(vectors)
        inner.nprobe = int(cfg["nprobe"])
    else:
        raise ViewStoreError(f"unknown index type '{kind}' (choose {', '.join(INDEX_TYPES)})")
    index = faiss.IndexIDMap2(inner)
    index.add_with_ids(vectors, np.arange(n, dtype=np.int64))
    return index


def set_search_params(index, cfg: dict) -> None:
    """Search-time settings (efSearch, nprobe) are not saved in the index file: set them after reading it."""
    faiss = faiss_module()
    inner = faiss.downcast_index(index.index)
    if cfg["type"] == "hnsw":
        inner.hnsw.efSearch = int(cfg["ef_search"])
    elif cfg["type"] == "ivf":
        inner.nprobe = int(cfg["nprobe"])
