"""A popularity prior for joining users (``--new-user-prior popularity``), its weight chosen on validation users.

A user who joins with one to five interactions has too little data to rank by its own taste, and on ml-100k the
population's item counts alone rank newcomers better than either trained model (docs/coldstart.md). So with this
prior a joining user's scores are its model's logits plus ``λ · log(1 + c_i)`` (centred), ``c_i`` the trained
users' interaction count of item ``i``: a log prior over items that the user's own logits update, as a softmax
model reads it. In a federation the counts are one aggregate of the clients' item counts (secure aggregation
sees no single client's). ``λ`` is chosen among :data:`PRIOR_WEIGHTS` with the local epoch count, per support
size and seed, on the validation joining users (:mod:`.support_epochs`); ``λ = 0`` is the model alone, and a tie
keeps the smaller weight. A best weight at the grid's top is not an optimum, only the largest weight tried: there
the grid goes on with :data:`PRIOR_EXTENSION`, one weight at a time, while the largest weight tried is still the
best (as the epoch grid does), up to the weight where the prior alone orders the items. The prior is the
same for every model, so the layer and its backbone each get it only as far as their own validation users ask
for it. Off (``none``) by default.
"""

from __future__ import annotations

import numpy as np
import torch

#: ``none``: the model's own scores; ``popularity``: plus the weighted log-popularity prior
PRIORS = ("none", "popularity")
#: the prior's weights a joining user's validation may choose among (0: no prior); logits are O(1) in size
PRIOR_WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0)
#: tried in order after the grid, each only while the largest weight tried so far is the best. Past about 32 the
#: prior's spread (centred log counts span units) is tens of times the logits', and each doubling leaves the model
#: fewer ties to break: at 1024 a logit gap of 10 outweighs only a count ratio under 1%, so the ranking is
#: popularity's with the model as the tie-breaker, the end of the grid
PRIOR_EXTENSION = (8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)


def log_popularity(counts) -> torch.Tensor:
    """``[N]``: ``log(1 + c_i)`` minus its mean (a constant shift changes no ranking; centred, it leaves the
    logits' level alone)."""
    x = torch.log1p(torch.as_tensor(np.asarray(counts, np.float64)))
    return (x - x.mean()).to(torch.float32)


class WithPrior:
    """A scorer whose logits get ``weight · prior`` added (the weight kept for the report)."""

    def __init__(self, scorer, prior: torch.Tensor, weight: float):
        self.scorer, self.prior, self.weight = scorer, prior, float(weight)

    def __call__(self, users):
        scores = torch.as_tensor(self.scorer(users))
        return scores + self.weight * self.prior.to(scores.dtype) if self.weight else scores


def best_weight(scorer, prior: torch.Tensor, score_valid, weights=PRIOR_WEIGHTS, extension=PRIOR_EXTENSION):
    """(the weight whose prior-added ``scorer`` has the best ``score_valid``, that scorer, its score): each weight
    of ``weights``, then each of ``extension`` while the largest weight tried is the best; a tie keeps the smaller
    weight."""
    best, tried = None, []
    for w in (*sorted(weights), *extension):
        # extending only past a best at the top: an inner optimum needs no larger weights
        if w in extension and best[0] != max(tried):
            break
        candidate = WithPrior(scorer, prior, w)
        value = float(score_valid(candidate))
        tried.append(float(w))
        if best is None or value > best[2]:
            best = (float(w), candidate, value)
    return best
