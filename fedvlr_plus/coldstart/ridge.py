"""Ridge regression from item content to an ID (or fused) space, for the ``mapping`` cold-item rule.

A cold-start study refits the map for every seed and every rule that uses it, always from the same content rows:
only the targets (the trained item rows) change. :class:`RidgeInputs` keeps what depends on the content alone
(its centring and Gram matrix), so a refit costs one solve. The figures are those of a fit from scratch: the kept
arrays are computed by the same operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

LAMBDAS = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


@dataclass(frozen=True)
class RidgeInputs:
    """The inputs ``x`` of a ridge fit, centred, with the Gram matrix of the smaller form.

    ``primal``: ``gram = xc^T xc`` (features <= rows), else the dual ``gram = xc xc^T``, so a 384-d content space
    with 1,000 warm items is cheap either way.
    """

    mean: np.ndarray
    centred: np.ndarray
    gram: np.ndarray
    primal: bool

    @classmethod
    def of(cls, x: np.ndarray) -> RidgeInputs:
        x = np.asarray(x, np.float64)
        mean = x.mean(0)
        xc = x - mean
        primal = xc.shape[1] <= xc.shape[0]
        return cls(mean, xc, xc.T @ xc if primal else xc @ xc.T, primal)

    def fit(self, y: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` minimising ``||x W + b - y||² + lam ||W||²`` (intercept not penalised)."""
        y = np.asarray(y, np.float64)
        my = y.mean(0)
        yc = y - my
        ridge = self.gram + lam * np.eye(len(self.gram))
        if self.primal:
            w = np.linalg.solve(ridge, self.centred.T @ yc)
        else:  # dual: W = X^T (X X^T + λI)^-1 Y
            w = self.centred.T @ np.linalg.solve(ridge, yc)
        return w, my - self.mean @ w


def ridge_fit(x: np.ndarray, y: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """``(W, b)`` minimising ``||x W + b - y||² + lam ||W||²`` (intercept not penalised)."""
    return RidgeInputs.of(x).fit(y, lam)


class RidgeMap:
    """Ridge maps from fixed content rows ``x`` to any targets, λ chosen on a random fifth of the rows.

    The hold-out fifth depends on the number of rows and ``seed`` only, so the inputs of both fits (on the other
    four fifths, to choose λ, then on every row) are formed once, at their first use.
    """

    def __init__(self, x: np.ndarray, lambdas: tuple = LAMBDAS, seed: int = 0):
        self.x, self.lambdas = x, tuple(lambdas)
        perm = np.random.default_rng(seed).permutation(len(x))
        cut = max(2, len(x) // 5)
        self.hold, self.rest = perm[:cut], perm[cut:]

    @cached_property
    def rest_inputs(self) -> RidgeInputs:
        """The inputs of the fit that chooses λ (every row but the held-out fifth)."""
        return RidgeInputs.of(self.x[self.rest])

    @cached_property
    def all_inputs(self) -> RidgeInputs:
        """The inputs of the fit on every row."""
        return RidgeInputs.of(self.x)

    def choose_lambda(self, y: np.ndarray) -> tuple[float, dict]:
        """λ with the lowest mean squared error on the held-out fifth, and every λ's error."""
        if len(self.x) < 10:
            return float(self.lambdas[len(self.lambdas) // 2]), {}
        y = np.asarray(y, np.float64)
        y_rest, x_hold, y_hold = y[self.rest], self.x[self.hold], y[self.hold]
        errs = {}
        for lam in self.lambdas:
            w, b = self.rest_inputs.fit(y_rest, lam)
            errs[float(lam)] = float(((x_hold @ w + b - y_hold) ** 2).mean())
        return min(errs, key=errs.get), errs

    def fit(self, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """``(λ, W, b)``: the map to ``y`` with λ chosen on the held-out fifth."""
        lam, _ = self.choose_lambda(y)
        w, b = self.all_inputs.fit(y, lam)
        return lam, w, b


def choose_lambda(x: np.ndarray, y: np.ndarray, lambdas=LAMBDAS, seed: int = 0) -> tuple[float, dict]:
    """λ with the lowest mean squared error on a random fifth of the rows, fitted on the rest."""
    return RidgeMap(np.asarray(x, np.float64), lambdas, seed).choose_lambda(y)
