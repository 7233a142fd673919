"""The federated round, one definition for every trainer in the package (the recommender engine and the alignment
methods).

A round ``r``: the server picks its cohort (``sample``) and the round's message and config (``configure``) -> every
client of the cohort fits (``fit``: by default each client's ``fit(message, config)``) -> the server turns the uploads
into its next state and the round's record (``aggregate``) -> the private store prepares -> evaluation (every
``eval_every`` rounds and at ``last_round``) -> checkpoint -> the private store commits -> ``on_round``.

The loop owns the order, nothing else: what a client receives, how uploads are combined and what a record holds
stay with the method, so each method draws its random numbers exactly where it always did. The store commits only
after the checkpoint, so a crash between the two leaves the checkpointed round's client states (:mod:`.store`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .messages import ClientUpdate


def fit_each(cohort: Sequence, message: dict, config: dict) -> list[ClientUpdate]:
    """Every client of the cohort fits in turn, in cohort order."""
    return [c.fit(message, config) for c in cohort]


def over_the_wire(fit: Callable) -> Callable:
    """``fit`` whose uploads the server receives as a real deployment would: serialised and read back, so a method
    can only use what a message can carry."""

    def fit_serialised(cohort, message, config):
        return [ClientUpdate.from_message(u.to_message()) for u in fit(cohort, message, config)]

    return fit_serialised


@dataclass
class RoundLoop:
    """``aggregate(r, state, updates, config) -> (state, record)`` is the server's step; ``state`` is whatever the
    server carries from round to round (the shared arrays, or a server-side model). Optional hooks:
    ``sample(r) -> cohort`` (default: every client), ``configure(r, state) -> (message, config)`` (default:
    ``(state, {"round": r})``), ``evaluate(r, state) -> dict`` merged into the record, ``checkpoint(r, state,
    record)``, ``on_round(r, state, record)``; ``store``: the private-state store (``begin_round`` / ``prepare`` /
    ``commit``)."""

    clients: Sequence
    aggregate: Callable[[int, Any, list, dict], tuple[Any, dict]]
    fit: Callable[[Sequence, dict, dict], list] = fit_each
    sample: Callable[[int], Sequence] | None = None
    configure: Callable[[int, Any], tuple[dict, dict]] | None = None
    evaluate: Callable[[int, Any], dict] | None = None
    eval_every: int = 1
    last_round: int | None = None
    store: Any = None
    checkpoint: Callable[[int, Any, dict], None] | None = None
    on_round: Callable[[int, Any, dict], None] | None = None

    def step(self, r: int, state) -> tuple[Any, dict]:
        """Run round ``r`` from ``state``; return the new state and the round's record."""
        cohort = self.clients if self.sample is None else self.sample(r)
        message, config = (state, {"round": r}) if self.configure is None else self.configure(r, state)
        if self.store is not None:
            self.store.begin_round(r)
        updates = self.fit(cohort, message, config)
        state, record = self.aggregate(r, state, updates, config)
        if self.store is not None:
            self.store.prepare(r)
        if self.evaluate is not None and (r % self.eval_every == 0 or r == self.last_round):
            record.update(self.evaluate(r, state))
        if self.checkpoint is not None:
            self.checkpoint(r, state, record)
        if self.store is not None:
            self.store.commit()
        if self.on_round is not None:
            self.on_round(r, state, record)
        return state, record

    def run(self, state, rounds: Iterable[int]) -> tuple[Any, list[dict]]:
        """Every round of ``rounds`` in turn; return the final state and the records."""
        history = []
        for r in rounds:
            state, record = self.step(r, state)
            history.append(record)
        return state, history
