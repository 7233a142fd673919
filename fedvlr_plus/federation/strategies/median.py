"""Coordinate-wise median of the clients' parameters (unweighted).

Each coordinate of the new shared state is the median of that coordinate over the uploads (for item tables: over
the clients that touched the row; rows nobody touched keep their value). With an even count the two middle
values are averaged. Robust to a minority of arbitrarily corrupted uploads.

Reference: Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical
Rates", ICML 2018.
"""

from __future__ import annotations

from .base import Strategy
from .robust import robust_aggregate


class CoordinateMedian(Strategy):
    name = "median"
    upload = "params"

    def __init__(self, chunk_floats: int = 1 << 24):
        self.chunk_floats = int(chunk_floats)

    def aggregate(self, shared, updates, specs):
        return robust_aggregate(shared, updates, specs, trim=None, chunk_floats=self.chunk_floats)
