"""Coordinate-wise trimmed mean of the clients' parameters (unweighted).

For each coordinate, sort the uploaded values, drop the ``floor(β k)`` smallest and largest of the ``k`` values
and average the rest (for item tables ``k`` counts the clients that touched the row). If trimming would leave
nothing, the median is used.

Reference: Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical
Rates", ICML 2018.
"""

from __future__ import annotations

from .base import Strategy
from .robust import robust_aggregate


class TrimmedMean(Strategy):
    name = "trimmed-mean"
    upload = "params"

    def __init__(self, beta: float = 0.1, chunk_floats: int = 1 << 24):
        if not 0.0 <= beta < 0.5:
            raise ValueError(f"trim fraction must be in [0, 0.5), got {beta}")
        self.beta = float(beta)
        self.chunk_floats = int(chunk_floats)

    def aggregate(self, shared, updates, specs):
        return robust_aggregate(shared, updates, specs, trim=self.beta, chunk_floats=self.chunk_floats)
