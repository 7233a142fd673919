"""The layer's recipe chosen for joining users, on joining users set aside for validation.

In a new-user study the quantity of interest is how well users who join with 1, 3 or 5 interactions are served,
and the warm users' validation split does not measure it: on lfm2k the recipe that ranks warm users best (the
plain mixture, no ID path past the fusion) serves one-interaction users worst, because a new user's ranking leans
on popularity and the fusion's LayerNorm leaves little of it in the item vectors (docs/coldstart.md). So with
``--tune`` a user study scores each recipe of the grid by its validation joining users (the seeded third that
:mod:`.support_epochs` sets aside; no reported user takes part): trained on the warm users on the first seed, each
recipe lets the validation users join with every support size, and its score is their mean ``select_metric``
over the support sizes (with ``--support-epochs auto`` at the best epoch count of each size).
"""

from __future__ import annotations

import numpy as np


def joining_valid_score(
    run, joins: dict, valid_users: np.ndarray, spec, *, epochs, start: str, metric: str, prior=None
) -> float:
    """Mean over support sizes of the validation users' ``metric`` after they join ``run``; ``joins`` maps each
    support size to its support/query data; ``prior``: the popularity prior the users are served with (its
    weight chosen as the study chooses it, :mod:`.popularity_prior`), or None."""
    from .experiment import joining_epochs

    per_support = []
    for data in joins.values():
        best, _, scores = joining_epochs(
            run, data, valid_users, valid_users, spec, start=start, metric=metric, epochs=epochs, prior=prior
        )
        per_support.append(scores[best])
    return float(np.mean(per_support))
