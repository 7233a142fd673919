"""``coldstart --tune`` by successive halving (:mod:`fedvlr_plus.fedvlr.halving`).

A cold-start study scores a recipe at its selected round's model: its cold rules among cold items, or its
validation joining users fine-tuned on their support. Its score is taken by
:meth:`~fedvlr_plus.federation.engine.FederatedRun.run`'s ``at_selected`` hook, while the selected round's model is
in place. One after another (:func:`in_memory_trainer`), each candidate's run stays in this process between budgets
and trains on from where it stopped; a stopped candidate's run is freed at the next budget. Side by side
(:func:`folder_trainer`, ``--jobs``), each candidate trains in a worker process and goes on from its own folder's
checkpoint, which keeps its selected round's model. Either way a run trained on to more rounds is the run it would
have been, trained straight.
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


def folder_trainer(data, build, rate, root, workers: int, announce=None) -> Callable:
    """``train_to(recipes, rounds)`` as :func:`in_memory_trainer`'s, with each recipe's run in a worker process:
    it goes on from its own folder under ``root`` (its checkpoint at the end of each budget keeps its selected
    round's model), and its score is taken there at that model. ``build(recipe, data)``: the recipe's model and
    config (one seed); ``rate``: what a worker builds the scoring function from (its ``scorer()``: ``run ->
    score``). The same scores as in memory: a run resumed from its checkpoint goes on with the same numbers."""
    from ..federation.runs.parallel import map_jobs
    from ..fedvlr.halving import candidate_folder

    started = set()  # recipes trained before: their folders hold the checkpoint they go on from

    def train_to(recipes, rounds: int) -> list[float]:
        jobs = []
        for recipe in recipes:
            if announce is not None:
                announce(recipe, rounds)
            jobs.append(
                (data, build, recipe, rounds, candidate_folder(root, recipe.name), recipe.name in started, rate)
            )
            started.add(recipe.name)
        return map_jobs(_candidate_score, jobs, workers)

    return train_to


def _candidate_score(job: tuple) -> float:
    """One recipe ``(data, build, recipe, rounds, folder, goes_on, rate)`` trained up to ``rounds`` (from its folder's
    checkpoint where it ``goes_on``): its score at its selected round (NaN before any validation). Module level: a
    worker process calls it."""
    from ..federation.engine import FederatedRun
    from ..fedvlr.halving import budget_settings
    from .experiment import keepable

    data, build, recipe, rounds, folder, goes_on, rate = job
    model, cfg = build(recipe, data)
    cfg = replace(keepable(cfg), **budget_settings(rounds, temporary=True))
    run = FederatedRun(data, model, cfg, run_dir=folder, progress=False, keep_selected=True)
    if goes_on:
        run.load_checkpoint()
    score, seen = rate.scorer(), []
    run.run(at_selected=lambda r: seen.append(float(score(r))))
    return seen[-1] if seen else float("nan")
