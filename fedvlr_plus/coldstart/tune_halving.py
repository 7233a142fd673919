"""``coldstart --tune`` by successive halving (:mod:`fedvlr_plus.fedvlr.halving`), the candidates kept in memory.

A cold-start study scores a recipe at its selected round's model: its cold rules among cold items, or its
validation joining users fine-tuned on their support. A run folder does not keep that model, so each candidate's
run stays in this process between budgets and trains on from where it stopped; its score is taken by
:meth:`~fedvlr_plus.federation.engine.FederatedRun.run`'s ``at_selected`` hook, while the selected round's model is
in place. A run trained on to more rounds is the run it would have been, trained straight. A stopped candidate's
run is freed at the next budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace


def in_memory_trainer(data, start: Callable, score: Callable, *, progress: bool = False, announce=None) -> Callable:
    """``train_to(recipes, rounds)`` for :func:`~fedvlr_plus.fedvlr.halving.successive_halving`: each recipe trained
    up to ``rounds``, continuing its own run; their scores at their selected rounds. ``start(recipe)``: the recipe's
    model and config (one seed); ``score(run)``: a run's score with its selected round's model in place;
    ``announce(recipe, rounds)``: hears each training as it starts."""
    from ..federation.engine import FederatedRun
    from .experiment import keepable

    runs, scores = {}, {}

    def train_to(recipes, rounds: int) -> list[float]:
        for name in set(runs) - {r.name for r in recipes}:  # stopped at the last cut: free its states
            del runs[name]
        for recipe in recipes:
            if announce is not None:
                announce(recipe, rounds)
            run = runs.get(recipe.name)
            if run is None:
                model, cfg = start(recipe)
                cfg = replace(keepable(cfg), rounds=rounds)
                run = runs[recipe.name] = FederatedRun(data, model, cfg, progress=progress)
            else:
                run.cfg = replace(run.cfg, rounds=rounds)
            run.run(at_selected=lambda r, name=recipe.name: scores.__setitem__(name, float(score(r))))
        return [scores[r.name] for r in recipes]

    return train_to
