"""Client-level (ε, δ) of clipped, noised uploads, from Google's ``dp-accounting`` RDP accountant.

The mechanism (:mod:`.privacy`): every round the server picks a fixed number ``m`` of the ``N`` eligible clients
uniformly without replacement (``FederatedRun.sample_clients``); each picked client clips its contribution to L2
norm ``C`` and adds ``N(0, (σC)²)`` to every uploaded entry. Two neighbouring federations differ in the data of
one client (it stays a client; ``N`` is public), the *replace-one* relation, under which the clipped
contribution's L2 sensitivity is ``2C``: the accountant's noise multiplier (noise std / sensitivity) is ``σ / 2``.

Three figures, all from the library (no hand-written formula):

- ``epsilon``: the sampled-without-replacement Gaussian (``SampledWithoutReplacementDpEvent(N, m, σ/2)``,
  replace-one, Wang, Balle & Kasiviswanathan, AISTATS 2019), self-composed over the rounds (or ``epsilon_server``
  where that is smaller: the subsampling bound is loose at small σ). It is what an observer
  of the aggregated models learns who does not know which clients were picked and does not see single uploads;
- ``epsilon_poisson``: the Poisson-subsampled Gaussian (rate ``q = m / N``, noise multiplier ``σ``, add-or-remove
  one client), the figure DP-FedAvg papers report (McMahan et al., ICLR 2018). The package does not sample
  Poisson (a fixed ``m`` per round), so this figure is given for comparison only;
- ``epsilon_server``: against the server itself, which picks the clients and sees each upload, so sampling
  amplifies nothing: the Gaussian with multiplier ``σ / 2`` composed over every round (a client picked each
  round, the worst case).

δ defaults to ``1 / N^1.1``: below ``1 / N`` (a δ near ``1 / N`` allows releasing one client's data outright) and
shrinking with the population, as in McMahan et al.
"""

from __future__ import annotations

import logging
import math

from ...errors import ConfigError

ACCOUNTANT = "dp-accounting RDP, sampled without replacement (replace-one)"


def _dp():
    """The ``dp_accounting`` package, imported on first use: about 2 s of imports (SciPy's signal and stats)
    that a run without upload noise never needs (every Flower message starts a process that builds a run)."""
    import dp_accounting

    return dp_accounting


def default_delta(population: int) -> float:
    """``1 / N^1.1`` for ``N`` clients."""
    return 1.0 / float(max(int(population), 2)) ** 1.1


def _epsilon(event, delta: float, relation) -> float:
    # the accountant logs a warning for every RDP order it cannot evaluate and leaves out; the bound it returns
    # from the remaining orders is still valid, so the warnings are quietened here
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from dp_accounting.rdp import RdpAccountant

        acc = RdpAccountant(neighboring_relation=relation)
        acc.compose(event)
        return float(acc.get_epsilon(delta))
    finally:
        log.setLevel(level)


def epsilon_sampled(sigma: float, sample_size: int, population: int, rounds: int, delta: float) -> float:
    """ε of ``rounds`` rounds, ``sample_size`` of ``population`` clients each, noise multiplier ``sigma``
    (of the clip), replace-one; ``inf`` without noise."""
    dp_accounting = _dp()
    if sigma <= 0:
        return math.inf
    round_event = dp_accounting.SampledWithoutReplacementDpEvent(
        int(population), int(sample_size), dp_accounting.GaussianDpEvent(sigma / 2.0)
    )
    sampled = _epsilon(
        dp_accounting.SelfComposedDpEvent(round_event, int(rounds)),
        delta,
        dp_accounting.NeighboringRelation.REPLACE_ONE,
    )
    # the subsampling bound is not tight: at small sigma it exceeds the bound without sampling, which holds too
    return min(sampled, epsilon_server(sigma, rounds, delta))


def epsilon_poisson(sigma: float, q: float, rounds: int, delta: float) -> float:
    """ε of the Poisson-subsampled Gaussian at rate ``q`` (add-or-remove one client)."""
    dp_accounting = _dp()
    if sigma <= 0:
        return math.inf
    round_event = dp_accounting.PoissonSampledDpEvent(float(q), dp_accounting.GaussianDpEvent(sigma))
    return _epsilon(
        dp_accounting.SelfComposedDpEvent(round_event, int(rounds)),
        delta,
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )


def epsilon_server(sigma: float, rounds: int, delta: float) -> float:
    """ε against the server (no amplification by sampling; a client uploading every round)."""
    dp_accounting = _dp()
    if sigma <= 0:
        return math.inf
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / 2.0), int(rounds))
    return _epsilon(event, delta, dp_accounting.NeighboringRelation.REPLACE_ONE)


def noise_for_epsilon(
    target: float, sample_size: int, population: int, rounds: int, delta: float, *, rel_tol: float = 1e-3
) -> float:
    """The smallest noise multiplier σ whose ``epsilon_sampled`` is at most ``target``, by bisection on the
    accountant (ε falls as σ grows). Raises ConfigError for a target no σ below 10^4 reaches."""
    if not target > 0:
        raise ConfigError(f"--target-epsilon {target}", "must be positive")

    def eps(s):
        return epsilon_sampled(s, sample_size, population, rounds, delta)

    lo, hi = 0.0, 1.0
    while eps(hi) > target:
        lo, hi = hi, hi * 2.0
        if hi > 1e4:
            raise ConfigError(
                f"--target-epsilon {target:g}",
                f"no noise multiplier up to 1e4 reaches it (delta {delta:g}, {rounds} rounds)",
                "ask for a larger epsilon or fewer rounds",
            )
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if eps(mid) <= target else (mid, hi)
    return hi


def _finite(x: float):
    return None if math.isinf(x) else float(x)


def privacy_block(
    sigma: float,
    clip: float,
    sample_size: int,
    population: int,
    rounds: int,
    delta: float | None = None,
    target_epsilon: float | None = None,
) -> dict:
    """The result's ``privacy`` entry: (ε, δ) of a run (ε null: no noise, no guarantee)."""
    delta = float(delta if delta is not None else default_delta(population))
    q = float(sample_size) / float(population)
    out = {
        "epsilon": _finite(epsilon_sampled(sigma, sample_size, population, rounds, delta)),
        "delta": delta,
        "sigma": float(sigma),
        "clip": float(clip),
        "q": q,
        "clients_per_round": int(sample_size),
        "population": int(population),
        "rounds": int(rounds),
        "accountant": ACCOUNTANT,
        "epsilon_poisson": _finite(epsilon_poisson(sigma, q, rounds, delta)),
        "epsilon_server": _finite(epsilon_server(sigma, rounds, delta)),
        "protects": "the values of each client's uploaded arrays (client level); not which item rows it "
        "uploads, its example count or its loss (docs/privacy.md)",
    }
    if target_epsilon is not None:
        out["target_epsilon"] = float(target_epsilon)
    return out


def run_noise(cfg, population: int, per_round: int) -> float:
    """The noise multiplier a run uses: ``cfg.upload_noise``, or with ``cfg.target_epsilon`` the σ that reaches
    it over ``cfg.rounds`` rounds (early stopping only spends less)."""
    if cfg.target_epsilon is None:
        return float(cfg.upload_noise)
    delta = cfg.dp_delta if cfg.dp_delta is not None else default_delta(population)
    return noise_for_epsilon(cfg.target_epsilon, per_round, population, cfg.rounds, delta)


#: the L2 clip of every upload when noise is on and no ``upload_clip`` is given
DEFAULT_UPLOAD_CLIP = 1.0


def run_clip(cfg, sigma: float) -> float:
    """The clip a run uses: ``cfg.upload_clip``, else :data:`DEFAULT_UPLOAD_CLIP` with noise and none without."""
    return float(cfg.upload_clip or (DEFAULT_UPLOAD_CLIP if sigma > 0 else 0.0))


def run_privacy(cfg, sigma: float, clip: float, population: int, per_round: int, rounds_run: int) -> dict | None:
    """A run's ``privacy`` entry over the rounds it ran, or None when its uploads carry no noise."""
    if sigma <= 0:
        return None
    return privacy_block(sigma, clip, per_round, population, rounds_run, cfg.dp_delta, cfg.target_epsilon)
