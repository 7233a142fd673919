"""Server-side views: item encoders -> pre-fusion operators -> a persistent FAISS ViewStore.

>>> from fedvlr_plus.views import build_store, ViewStore          # doctest: +SKIP
>>> store, report = build_store(data, "stores/ku")                  # precomputed CLIP features
>>> store.knn(item=3, k=10, view="image").ids
>>> store.get([0, 1, 2], view="balanced")                           # float32 [3, 512] for a client

The OpenCLIP and sentence-transformers encoders import torch lazily, on first use.
"""
from .build import BuildReport, build_store, item_titles
from .embeddings import Embeddings, complete, l2_normalise
from .encoders import ENCODERS, HashingTextEncoder, ItemEncoder, PrecomputedEncoder, make_encoder, modality_name
from .errors import CorruptStoreError, EncoderUnavailable, ViewStoreError
from .operators import OPERATORS, ViewOperator, ViewSpec, apply_views, default_views, fit_views, named_views, parse_views
from .store import INDEX_TYPES, Neighbours, ViewStore, index_config, load_store
from .text import COMBINED_TEMPLATE, combined_texts, field_texts

__all__ = [
    "BuildReport", "build_store", "item_titles",
    "Embeddings", "complete", "l2_normalise",
    "ENCODERS", "HashingTextEncoder", "ItemEncoder", "PrecomputedEncoder", "make_encoder", "modality_name",
    "OpenClipEncoder", "SentenceEncoder", "resolve_sentence_model",
    "CorruptStoreError", "EncoderUnavailable", "ViewStoreError",
    "OPERATORS", "ViewOperator", "ViewSpec", "apply_views", "default_views", "fit_views", "named_views", "parse_views",
    "INDEX_TYPES", "Neighbours", "ViewStore", "index_config", "load_store",
    "COMBINED_TEMPLATE", "combined_texts", "field_texts",
]


def __getattr__(name):  # heavy encoders on demand (torch, open_clip, transformers)
    if name == "OpenClipEncoder":
        from .open_clip_encoder import OpenClipEncoder

        return OpenClipEncoder
    if name in ("SentenceEncoder", "resolve_sentence_model"):
        from . import sentence_encoder

        return getattr(sentence_encoder, name)
    raise AttributeError(f"module 'fedvlr_plus.views' has no attribute {name!r}")
