"""A run's settings checked against the data it trains on, once that is loaded and before any round: a count
larger than the population or the catalogue is one line naming the flag; a cut-off that every item passes is a
note, because the figure is still defined (every user scores 1 at it) but says nothing.

Every command that trains (``run``, ``coldstart``, the experiments) and the Python API build a
:class:`~fedvlr_plus.federation.engine.FederatedRun`, which calls :func:`check_against_data` first.
"""

from __future__ import annotations

from ..errors import ConfigError
from .state.choice import say_once


def check_against_data(cfg, data) -> None:
    """Refuse what cannot mean anything on ``data``; note cut-offs at or above its catalogue."""
    n_users, n_items = int(data.n_users), int(data.n_items)
    per_round = cfg.clients_per_round
    if isinstance(per_round, int) and not isinstance(per_round, bool) and per_round > n_users:
        raise ConfigError(
            f"--clients-per-round {per_round}",
            f"is more than the {n_users:,} users of {data.name}",
            f"give at most {n_users}, or 1.0 for every user each round",
        )
    if cfg.negatives >= n_items:
        raise ConfigError(
            f"--negatives {cfg.negatives}",
            f"draws at least as many negatives per positive as {data.name} has items ({n_items:,})",
            "use a handful; the default is 1",
        )
    _note_large_cutoffs(cfg, data.name, n_items)


def _note_large_cutoffs(cfg, name: str, n_items: int) -> None:
    valid_k = int(cfg.valid_metric.split("@")[1])
    too_big = sorted(k for k in {*cfg.ks, valid_k} if k >= n_items)
    if not too_big:
        return
    chooses = valid_k >= n_items
    say_once(
        f"note: cut-off {', '.join(map(str, too_big))} is at least the catalogue of {name} ({n_items:,} items): "
        "every item is in that top list, so the figure says nothing"
        + (f"; --valid-metric {cfg.valid_metric} cannot choose a round" if chooses else "")
        + f" (use cut-offs below {n_items})"
    )
