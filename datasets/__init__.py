"""Data layer: loaders for every supported source, one in-memory type, preprocessing and splits.

Importable only as ``fedvlr_plus.datasets`` (never as a top-level ``datasets``).
"""
from .core import (CONTENT_COLUMNS, INTER_COLUMNS, SPLIT_CODES, SPLIT_NAMES, TEST, TRAIN, UNSPLIT, VALID,
                   DataError, InteractionData, check_features, compact)

__all__ = [
    "CONTENT_COLUMNS", "INTER_COLUMNS", "SPLIT_CODES", "SPLIT_NAMES", "TEST", "TRAIN", "UNSPLIT", "VALID",
    "DataError", "InteractionData", "check_features", "compact",
]
