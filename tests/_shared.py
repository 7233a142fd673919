"""Locate the shared real-data folder (``../shared/data`` beside the checkout, or ``$FEDVLR_SHARED_DATA``)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_data(name: str = "") -> Path:
    """Path of ``shared/data/<name>``; skips the calling test with a clear reason when it is absent."""
    env = os.environ.get("FEDVLR_SHARED_DATA")
    root = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    path = root / name if name else root
    if not path.exists():
        pytest.skip(f"shared data folder {path} is absent (set FEDVLR_SHARED_DATA to its location)")
    return path
