"""Regularised canonical correlation analysis (CCA), closed form: the learned pre-fusion operator.

Hotelling, "Relations between two sets of variates", Biometrika 1936; the ridge term follows Vinod,
"Canonical ridge and econometrics of joint production", J. Econometrics 1976.

Fitted on the server from catalogue signals only - an item's own two modalities (image and text, or
title and metadata for text-only catalogues) - so that the projections make the two modalities of the
same item agree as much as possible. The view is the consensus of the two projections:
``normalise(((a - mu_a) P_a + (b - mu_b) P_b) / 2)``.

Closed form: with ridge-regularised covariances ``C_aa + r_a I`` and ``C_bb + r_b I`` (``r = reg *
trace(C) / d``, so ``reg`` is relative to the mean variance), whiten both sides, take the SVD of the
whitened cross-covariance ``W_a C_ab W_b = U S V^T``; ``P_a = W_a U_k``, ``P_b = W_b V_k``, and ``S_k``
are the (regularised) canonical correlations. ``k = min(dim, d_a, d_b, n - 1)``. The ridge matters:
with fewer items than dimensions (148 Gift Cards, 512-d CLIP) plain CCA finds perfect, meaningless
correlations.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from .errors import ViewStoreError


def _inv_sqrt(c: np.ndarray) -> np.ndarray:
    w, v = scipy.linalg.eigh(c)
    w = np.maximum(w, 1e-12 * max(w.max(), 1e-30))
    return (v / np.sqrt(w)) @ v.T


def fit_cca(a: np.ndarray, b: np.ndarray, *, dim: int = 128, reg: float = 0.1) -> dict:
    """Fit on paired rows ``a [n, d_a]``, ``b [n, d_b]``; return the parameters (float32 arrays + k)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    n = len(a)
    if n != len(b):
        raise ViewStoreError(f"cca: {n} rows of the first input but {len(b)} of the second")
    if n < 3:
        raise ViewStoreError(f"cca: needs at least 3 items with both inputs present, got {n}")
    if reg <= 0:
        raise ViewStoreError("cca: reg must be > 0 (unregularised CCA is degenerate when n <= d)")
    k = int(min(dim, a.shape[1], b.shape[1], n - 1))
    mu_a, mu_b = a.mean(0), b.mean(0)
    ac, bc = a - mu_a, b - mu_b
    caa = ac.T @ ac / (n - 1)
    cbb = bc.T @ bc / (n - 1)
    cab = ac.T @ bc / (n - 1)
    caa += reg * np.trace(caa) / len(caa) * np.eye(len(caa))
    cbb += reg * np.trace(cbb) / len(cbb) * np.eye(len(cbb))
    wa, wb = _inv_sqrt(caa), _inv_sqrt(cbb)
    u, s, vt = scipy.linalg.svd(wa @ cab @ wb, full_matrices=False)
    # Fix the SVD's sign freedom so a refit on the same data gives the same projections.
    signs = np.sign(u[np.abs(u).argmax(0), np.arange(u.shape[1])])
    signs[signs == 0] = 1
    u, vt = u * signs, vt * signs[:, None]
    return {
        "mu_a": mu_a.astype(np.float32),
        "mu_b": mu_b.astype(np.float32),
        "proj_a": (wa @ u[:, :k]).astype(np.float32),
        "proj_b": (wb @ vt[:k].T).astype(np.float32),
        "correlations": s[:k].astype(np.float32),
        "k": k,
        "reg": float(reg),
    }


def apply_cca(a: np.ndarray, b: np.ndarray, params: dict) -> np.ndarray:
    """Consensus projection ``[n, k]`` (not yet normalised) of new or old rows with fixed parameters."""
    za = (np.asarray(a, np.float32) - params["mu_a"]) @ params["proj_a"]
    zb = (np.asarray(b, np.float32) - params["mu_b"]) @ params["proj_b"]
    return (za + zb) / 2
