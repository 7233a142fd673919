"""Server-side views: item encoders -> pre-fusion operators -> a persistent FAISS ViewStore.

>>> from fedvlr_plus.views import build_store, ViewStore          # doctest: +SKIP
>>> store, report = build_store(data, "stores/ku")                  # precomputed CLIP features
>>> store.knn(item=3, k=10, view="image").ids
>>> store.get([0, 1, 2], view="balanced")                           # float32 [3, 512] for a client

The OpenCLIP and sentence-transformers encoders import torch lazily, on first use.
"""

from importlib import import_module

# Everything is imported on first use (PEP 562): the command-line parser imports fedvlr_plus.cli.views,
# which must not pull in numpy, pandas, scipy or FAISS just to print --help.
_WHERE = {
    "build": ("BuildReport", "build_store", "item_titles"),
    "embeddings": ("Embeddings", "complete", "l2_normalise"),
    "encoders": (
        "ENCODERS",
        "HashingTextEncoder",
        "ItemEncoder",
        "PrecomputedEncoder",
        "make_encoder",
        "modality_name",
    ),
    "open_clip_encoder": ("OpenClipEncoder",),
    "sentence_encoder": ("SentenceEncoder", "resolve_sentence_model"),
    "errors": ("CorruptStoreError", "EncoderUnavailable", "ViewStoreError"),
    "operators": (
        "OPERATORS",
        "ViewOperator",
        "ViewSpec",
        "apply_views",
        "default_views",
        "fit_views",
        "named_views",
        "parse_views",
    ),
    "store": ("INDEX_TYPES", "Neighbours", "ViewStore", "index_config", "load_store"),
    "text": ("COMBINED_TEMPLATE", "combined_texts", "field_texts"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = [
    "BuildReport",
    "build_store",
    "item_titles",
    "Embeddings",
    "complete",
    "l2_normalise",
    "ENCODERS",
    "HashingTextEncoder",
    "ItemEncoder",
    "PrecomputedEncoder",
    "make_encoder",
    "modality_name",
    "OpenClipEncoder",
    "SentenceEncoder",
    "resolve_sentence_model",
    "CorruptStoreError",
    "EncoderUnavailable",
    "ViewStoreError",
    "OPERATORS",
    "ViewOperator",
    "ViewSpec",
    "apply_views",
    "default_views",
    "fit_views",
    "named_views",
    "parse_views",
    "INDEX_TYPES",
    "Neighbours",
    "ViewStore",
    "index_config",
    "load_store",
    "COMBINED_TEMPLATE",
    "combined_texts",
    "field_texts",
]


def __getattr__(name):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'fedvlr_plus.views' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
