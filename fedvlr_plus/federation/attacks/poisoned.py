"""A simulator with fake clients: the real clients' uploads plus those of malicious ones, each round.

``PoisonedSimulator`` wraps any simulator of the engine (batched, sequential, module) and appends the uploads of
its attackers (clients on the ordinary contract, e.g. :class:`~.promotion_attack.PromotionAttacker`) to every
round's real uploads, so the aggregation strategy sees them as it would see any client. Attackers take part at
the round's participation rate (all of them when every real client trains), drawn by (seed, round). Scoring and
evaluation are the real users' only: attackers have no test data.
"""

from __future__ import annotations

import numpy as np

TAG_ATTACK_SAMPLE = 7303


def attacker_count(fraction: float, n_real: int) -> int:
    """Fake clients for an attacker ``fraction`` of the real population (``round(fraction * n_real)``, at least
    one for any positive fraction)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"attacker fraction must be in [0, 1), got {fraction}")
    return 0 if fraction == 0 else max(1, int(round(fraction * n_real)))


class PoisonedSimulator:
    def __init__(self, inner, attackers: list, n_eligible: int, seed: int):
        self.inner, self.attackers = inner, list(attackers)
        self.n_eligible, self.seed = int(n_eligible), int(seed)
        self.name = getattr(inner, "name", "batched")

    def taking_part(self, round_index: int, n_real: int) -> list:
        """The attackers of this round, at the real clients' participation rate."""
        if n_real >= self.n_eligible or not self.attackers:
            return self.attackers
        k = int(round(len(self.attackers) * n_real / self.n_eligible))
        g = np.random.default_rng([self.seed, int(round_index), TAG_ATTACK_SAMPLE])
        return [self.attackers[i] for i in np.sort(g.choice(len(self.attackers), size=k, replace=False))]

    def fit(self, cids, shared, config):
        updates = list(self.inner.fit(cids, shared, config))
        for attacker in self.taking_part(int(config["round"]), len(cids)):
            updates.append(attacker.fit(shared, config))
        return updates

    def scores(self, users, shared, *args, **kw):
        return self.inner.scores(users, shared, *args, **kw)

    def __getattr__(self, name):  # everything else (client lookup, chunk sizes) is the real simulator's
        # but not its chunked training: a round streamed through the real simulator's chunks would leave the
        # attackers' uploads out, so the engine must call ``fit``
        if name in ("inner", "fit_chunks", "sums_chunks"):
            raise AttributeError(name)
        return getattr(self.inner, name)
