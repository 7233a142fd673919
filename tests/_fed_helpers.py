"""Helpers for the federation tests: small real data slices."""

from __future__ import annotations

import numpy as np
import pandas as pd
from _shared import shared_data

from fedvlr_plus.datasets import InteractionData, load
from fedvlr_plus.datasets.splits import dedup, leave_one_out


def load_ml100k(n_users: int | None = None) -> InteractionData:
    """ML-100K from the recbole wheel (every rating a positive), optionally its first ``n_users`` users,
    leave-one-out by time."""
    data = load("ml-100k")
    if n_users is not None:
        raw_users = data.user_ids[data.inter["user"].to_numpy()]
        keep = pd.unique(raw_users)[:n_users]
        sel = np.isin(raw_users, keep)
        data = InteractionData.from_raw(
            f"ml-100k-{n_users}u",
            raw_users[sel],
            data.item_ids[data.inter["item"].to_numpy()[sel]],
            timestamp=data.inter["timestamp"].to_numpy()[sel],
        )
    return leave_one_out(dedup(data))


def load_ku() -> InteractionData:
    return load(str(shared_data("ku")))
