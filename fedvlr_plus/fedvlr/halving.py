"""Successive halving of the ``--tune`` grid (Jamieson and Talwalkar, "Non-stochastic Best Arm Identification and
Hyperparameter Optimization", AISTATS 2016; the inner loop of Hyperband, Li et al., JMLR 2018).

Every recipe trains to the first budget of rounds; the better half on validation goes on to the next budget,
continuing from where it stopped; and so on until one recipe is left or the budget is the whole run. A recipe
that its early stopping ended before a budget keeps its score and stays in the comparison. The budgets are an
eighth, a quarter and a half of the run, so a recipe is stopped only after it trained at least an eighth of the
rounds, and never by a single evaluation early in training.

It is off unless asked for (``--halving``): on lfm2k the layer's best recipes learn slowly, and the cut after an
eighth of the run stopped them for a recipe that scored 0.033 lower on test (``docs/usage.md``).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .tuning import Recipe, TuningReport

#: the fractions of the run's rounds at which the grid is cut in half
RUNG_FRACTIONS = (1 / 8, 1 / 4, 1 / 2)
#: below this many rounds a run is too short to cut: every recipe trains the whole run
MIN_ROUNDS_TO_HALVE = 16


def rungs(rounds: int, eval_every: int = 1) -> list[int]:
    """The round budgets: the fractions of ``rounds``, each moved up to an evaluated round, then ``rounds``."""
    if rounds < MIN_ROUNDS_TO_HALVE:
        return [rounds]
    cuts = {min(rounds, eval_every * math.ceil(rounds * f / eval_every)) for f in RUNG_FRACTIONS}
    return sorted(cuts | {rounds})


def budgets(cfg, halving: bool = False) -> list[int]:
    """The round budgets of a tuner whose run has config ``cfg``: the rungs, or the whole run alone without halving
    or under ``target_epsilon`` (the upload noise is set for the run's rounds, so a candidate trained to a shorter
    budget and continued would not be the run it stands for)."""
    if not halving or getattr(cfg, "target_epsilon", None) is not None:
        return [cfg.rounds]
    return rungs(cfg.rounds, cfg.eval_every)


def budgets_note(budgets: list[int]) -> str:
    """How a tuner announces its budgets: ``; the better half goes on after 13, 25, 50 rounds`` (empty without
    halving)."""
    return f"; the better half goes on after {', '.join(map(str, budgets[:-1]))} rounds" if len(budgets) > 1 else ""


def candidate_job(recipe: str, budget: int) -> str:
    """How a tuner names one candidate's training when it ends in a worker process: ``recipe fast (25 rounds)``."""
    return f"recipe {recipe} ({budget} rounds)"


def cut_line(budget: int, kept: list[Recipe], stopped: list[Recipe], scores: dict) -> str:
    """How a tuner reports one cut (``on_rung``'s arguments): the recipes kept and stopped, with their scores."""

    def named(recipes) -> str:
        return ", ".join(f"{r.name} {scores[r.name]:.4f}" for r in recipes)

    return f"after {budget} rounds, kept {named(kept)}; stopped {named(stopped)}"


def successive_halving(
    recipes: list[Recipe],
    train_to: Callable[[list[Recipe], int], list[float]],
    *,
    budgets: list[int],
    metric: str,
    seed: int,
    on_rung: Callable[[int, list[Recipe], list[Recipe], dict], None] | None = None,
) -> TuningReport:
    """Keep the best recipe by validation ``metric``. ``train_to(recipes, rounds)`` trains each recipe up to
    ``rounds`` (continuing its earlier training) and returns each one's best validation score so far.
    ``on_rung(rounds, kept, stopped, scores)`` hears each cut. Ties keep the earlier recipe, as a full grid does."""
    if not recipes:
        raise ValueError("no recipe to choose from")
    report = TuningReport(metric=metric, seed=seed, recipes=list(recipes))

    def better_first(recipe: Recipe) -> tuple:  # a tie keeps the earlier recipe of the grid
        return -report.scores[recipe.name], recipes.index(recipe)

    alive = list(recipes)
    for i, budget in enumerate(budgets):
        for recipe, score in zip(alive, train_to(alive, budget)):
            report.scores[recipe.name] = float(score)
        if len(alive) == 1 or i == len(budgets) - 1:
            break
        ranked = sorted(alive, key=better_first)
        kept = set(r.name for r in ranked[: math.ceil(len(alive) / 2)])
        stopped = [r for r in alive if r.name not in kept]
        for r in stopped:
            report.stopped[r.name] = budget
        alive = [r for r in alive if r.name in kept]
        if on_rung is not None:
            on_rung(budget, alive, stopped, dict(report.scores))
        if len(alive) == 1:  # the choice is made: the run trains it on every seed next
            break
    report.selected = min(alive, key=better_first).name
    return report


def candidate_folder(root: Path, recipe: str) -> Path:
    """The folder of ``recipe``'s candidate under the tuner's ``root`` (a ``+`` in its name becomes ``-``)."""
    return root / recipe.replace("+", "-")


@contextmanager
def candidate_root(folder: Path | None) -> Iterator[Path]:
    """Where the candidates train: ``folder`` where the caller has one, else a temporary folder. A candidate goes on
    from its checkpoint at each budget, and the kept recipe's candidate becomes the run's first seed, so it needs a
    folder even when every recipe trains to the end in one go. Its checkpoints cost disk: about two copies of the
    model a candidate (the last round's and the selected round's), every user's private state included."""
    if folder is not None:
        yield folder
    else:
        with tempfile.TemporaryDirectory(prefix="fedvlr-tuning-") as tmp:
            yield Path(tmp)


def budget_settings(rounds: int, *, temporary: bool) -> dict:
    """The config changes of a candidate trained up to ``rounds``. In a temporary folder, which is read only where
    the next budget goes on, it checkpoints once, at the end of the budget (a FedVLR checkpoint holds every user's
    router); in the user's folder, as the run's settings say, so that a crash loses no more."""
    return {"rounds": int(rounds), "checkpoint_every": int(rounds)} if temporary else {"rounds": int(rounds)}
