"""``coldstart --tune``'s trainers: every recipe to the end, or through the budgets of successive halving with
``--halving`` (:mod:`fedvlr_plus.fedvlr.halving`).

A cold-start study scores a recipe at its selected round's model: its cold rules among cold items, or its
validation joining users fine-tuned on their support. Its score is taken by
:meth:`~fedvlr_plus.federation.engine.FederatedRun.run`'s ``at_selected`` hook, while the selected round's model is
in place. One after another (:func:`in_memory_trainer`), each candidate's run stays in this process between budgets
and trains on from where it stopped; a stopped candidate's run is freed at the next budget. From folders
(:func:`folder_trainer`: a study with ``--out``, or ``--jobs``), each candidate goes on from its own folder's
checkpoint, which keeps its selected round's model, in a worker process where there are several. Either way a
run trained on to more rounds is the run it would have been, trained straight.

A candidate's folder also keeps its score at each budget (:data:`BUDGET_SCORES`). A grid killed midway and run
again goes through the same cuts: a candidate scored at a budget before the kill gives that score back untrained,
even where it had trained on past that budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

#: the file in a candidate's folder with its score at each budget it reached (``{"rounds": score}``)
BUDGET_SCORES = "budget-scores.json"


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
    from ..fedvlr.halving import candidate_folder, candidate_job

    def train_to(recipes, rounds: int) -> list[float]:
        jobs = []
        for recipe in recipes:
            if announce is not None:
                announce(recipe, rounds)
            jobs.append((data, build, recipe, rounds, candidate_folder(root, recipe.name), rate))
        names = [candidate_job(recipe.name, rounds) for recipe in recipes]
        return map_jobs(_candidate_score, jobs, workers, names=names, what="tuning")

    return train_to


def _candidate_score(job: tuple) -> float:
    """One recipe ``(data, build, recipe, rounds, folder, rate)`` trained up to ``rounds``, going on from its
    folder's checkpoint where it has one: its score at its selected round (NaN before any validation), kept in the
    folder. Module level: a worker process calls it."""
    from ..federation.engine import FederatedRun
    from ..fedvlr.halving import budget_settings
    from .experiment import keepable

    data, build, recipe, rounds, folder, rate = job
    kept = _budget_scores(folder)
    reached = max(map(int, kept), default=0)  # the round of its checkpoint, where it went past this budget
    model, cfg = build(recipe, data)
    cfg = replace(keepable(cfg), **budget_settings(max(rounds, reached), temporary=True))
    run = FederatedRun(data, model, cfg, run_dir=folder, progress=False, keep_selected=True)
    run.resume_saved()  # (refused where the checkpoint was made under other settings)
    if str(rounds) in kept:  # scored at this budget before a kill: the cut goes as it went
        return kept[str(rounds)]
    score, seen = rate.scorer(), []
    run.run(at_selected=lambda r: seen.append(float(score(r))))
    kept[str(rounds)] = seen[-1] if seen else float("nan")
    _save_budget_scores(folder, kept)
    return kept[str(rounds)]


def _budget_scores(folder) -> dict:
    path = Path(folder) / BUDGET_SCORES
    return json.loads(path.read_text()) if path.exists() else {}


def _save_budget_scores(folder, scores: dict) -> None:
    from ..jsonio import write_json_atomic

    write_json_atomic(Path(folder) / BUDGET_SCORES, scores)
