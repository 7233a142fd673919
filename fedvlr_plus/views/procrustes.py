"""Orthogonal Procrustes alignment of two equal-dimension modalities, closed form.

Schönemann, "A generalized solution of the orthogonal Procrustes problem", Psychometrika 1966.

``R = argmin_{R^T R = I} ||B R - A||_F`` (solved by the SVD of ``B^T A``) rotates the second modality
(e.g. image) onto the first (e.g. text) using only the catalogue's paired rows; the view is
``normalise(A + B R)``. A rotation keeps norms and angles within each modality, so it only removes the
offset between the two clouds (CLIP's "modality gap") before they are summed.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from .errors import ViewStoreError


def fit_procrustes(a: np.ndarray, b: np.ndarray) -> dict:
    if a.shape[1] != b.shape[1]:
        raise ViewStoreError(f"procrustes: needs equal dimensions, got {a.shape[1]} and {b.shape[1]} (use cca)")
    if len(a) < 2:
        raise ViewStoreError(f"procrustes: needs at least 2 items with both inputs present, got {len(a)}")
    r, _ = scipy.linalg.orthogonal_procrustes(np.asarray(b, np.float64), np.asarray(a, np.float64))
    return {"rotation": r.astype(np.float32)}


def apply_procrustes(a: np.ndarray, b: np.ndarray, params: dict) -> np.ndarray:
    return np.asarray(a, np.float32) + np.asarray(b, np.float32) @ params["rotation"]
