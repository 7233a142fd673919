"""How long a joining user trains its private parts, chosen on validation users (``--support-epochs auto``).

One interaction can train a user vector, a head and (with the FedVLR layer) a router for one epoch or twenty;
which is best depends on the model and on how many interactions the user brings, so neither fixed number suits
every row. ``auto`` sets a seeded third of the joining users aside as validation users: every model trains them
for each epoch count of :data:`EPOCH_GRID` and keeps, per support size and seed, the count whose validation users
rank their own query best. Every figure reported then comes from the other joining users only (the reference
rankers' too), so the choice never sees a reported user.

The grid starts at 0: no local training, the joining user served by where its state starts (the population's
mean user and mixture). With one to five interactions, training can fit noise as easily as taste; on ml-100k,
where popularity alone beats both models for newcomers, the validation users chose 0 in 10 of the 18 choices
(two models, support sizes 1, 3, 5, three seeds).

A best count at the grid's top edge is not an optimum, only the longest training tried: there the grid goes on
with :data:`EPOCH_EXTENSION`, one count at a time, while the longest count tried is still the best. Without it a
model that needs longer local training than another (on KU the layer's joining users kept 20, the top, at every
support size and seed while the backbone alone kept 1-20) was compared at a cut-off that suits only the other.
"""

from __future__ import annotations

import numpy as np

#: the local epoch counts ``auto`` chooses among (0: the start alone)
EPOCH_GRID = (0, 1, 5, 20)
#: tried in order after the grid, each only while the longest count tried so far is the best
EPOCH_EXTENSION = (50, 100)
#: share of the joining users that choose the epoch count (and are left out of every reported figure)
VALID_SHARE = 1 / 3


def split_joining_users(held_out: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(validation users, reported users) of the held-out users: a seeded draw, the same for every model."""
    users = np.sort(np.asarray(held_out, np.int64))
    g = np.random.default_rng([seed, 0x5E])
    n_valid = max(1, int(round(VALID_SHARE * len(users)))) if len(users) > 1 else 0
    valid = np.sort(g.choice(users, size=n_valid, replace=False)) if n_valid else users[:0]
    return valid, np.setdiff1d(users, valid)


def only(frame, users: np.ndarray):
    """The rows of a per-user frame that belong to ``users``."""
    return frame[frame["user"].isin(users)].reset_index(drop=True)


def choose_epochs(train, score_valid, grid=EPOCH_GRID, extension=EPOCH_EXTENSION):
    """``train(epochs) -> scorer`` for each count of ``grid``, scored by ``score_valid(scorer)``, then for each
    count of ``extension`` while the longest count tried is the best; returns (the best count, its scorer, every
    tried count's validation score). A tie keeps the shorter training."""
    best, best_scorer, scores = None, None, {}
    for epochs in (*grid, *extension):
        if epochs in extension and best != max(scores):
            break
        scorer = train(int(epochs))
        scores[int(epochs)] = float(score_valid(scorer))
        if best is None or scores[int(epochs)] > scores[best]:
            best, best_scorer = int(epochs), scorer
    return best, best_scorer, scores
