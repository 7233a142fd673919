"""``paper-table --tune``: the FedVLR row's recipe chosen on validation before any fusion row is trained.

Every recipe of :data:`fedvlr_plus.fedvlr.tuning.RECIPES` is trained for the table's first seed, as the row
itself would be, to the end as ``run --tune`` does (or cut by successive halving with ``--halving``,
:mod:`fedvlr_plus.fedvlr.halving`); the one with the best validation score (the engine's selection metric, at its best
round) is the recipe the row then trains with on every seed. Test figures of the candidates are never read. With a
run folder each candidate keeps its own checkpoints under ``runs/<row>/tuning/<recipe>/`` and resumes with the
table.

The router-ablation rows of the same backbone (``sum``, ``mlp``, ``gate``, ``uniform``) train with the recipe the
FedVLR row chose, so that each differs from it in the fusion mode only; a table without a FedVLR row tunes each
fusion row on its own.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack

from ...api import FedVLR
from ...federation.runs.folder import refuse_started_runs


def _fixed(study, recipe: FedVLR) -> dict:
    """The recipe values the table's flags or ``--override`` already fix (the grid leaves those alone)."""
    from ...fedvlr.tuning import fixed_by, tries_id_dropout

    settings = {**study.experiment.training, **recipe.train}
    # a weight decay of 0 is the default here, so only a non-zero one counts as fixed
    return {
        "lr": settings.get("lr"),
        "server_lr": settings.get("server_lr"),
        **fixed_by(recipe.options),
        "weight_decay": settings.get("weight_decay") or None,
        "cold_items": tries_id_dropout(study.data),
        "backbone": recipe.backbone,
    }


def _candidate(recipe: FedVLR, point) -> FedVLR:
    train = {
        k: v
        for k, v in (("lr", point.lr), ("server_lr", point.server_lr), ("weight_decay", point.weight_decay))
        if v is not None
    }
    return FedVLR(recipe.inner, recipe.views, label=recipe.label, options=point.layer_options(recipe.options), **train)


def _trainer(study, recipe: FedVLR, root):
    """``train_to(points, rounds)``: each grid point trained for the table's first seed up to ``rounds``, continuing
    its own earlier training (its folder's checkpoint), or read back under ``--resume``; side by side in worker
    processes where ``--jobs`` allows (the same scores); their best valid scores."""
    from ...federation.runs.parallel import map_jobs, worker_count
    from ...fedvlr.halving import candidate_folder, candidate_job
    from .table import for_workers

    started = set()  # points this call trained before: they continue; others resume only under --resume

    def train_to(points, rounds: int) -> list[float]:
        jobs = []
        for point in points:
            folder = candidate_folder(root, point.name) / f"seed-{study.seed}"
            jobs.append((study, recipe, point, rounds, folder, point.name in started or study.opts.resume))
            started.add(point.name)
        workers = worker_count(study.opts.jobs, len(jobs))  # (one for --jobs 1 or a single point)
        if workers > 1:
            lean = for_workers(study)
            names = [candidate_job(point.name, rounds) for point in points]
            return map_jobs(_candidate_score, [(lean, *job[1:]) for job in jobs], workers, names=names, what="tuning")
        return [_candidate_score(job) for job in jobs]

    return train_to


def _candidate_score(job: tuple) -> float:
    """One grid point ``(study, recipe, point, rounds, folder, may_continue)`` trained up to ``rounds`` (its folder's
    checkpoint continued where ``may_continue``): its best valid score. Module level: a worker process calls it."""
    from ...fedvlr.halving import budget_settings

    study, recipe, point, rounds, folder, may_continue = job
    settings = budget_settings(rounds, temporary=study.opts.folder is None)
    # the kept recipe's candidate is continued by its row's first seed: it keeps its selected model
    run = study.experiment.start(
        _candidate(recipe, point), study.seed, folder=folder, settings=settings, test=False, keep_selected=True
    )
    if run.folder.has_checkpoint():
        refuse_started_runs(study.opts.folder, [folder], may_continue)
        run.load_checkpoint()
    run.run()
    return float(run.best["metric"])


def tuned_recipe(study, recipe: FedVLR, stack: ExitStack):
    """The grid point (:class:`~fedvlr_plus.fedvlr.tuning.Recipe`) chosen on validation for ``recipe``, every point
    trained to the end (or cut by successive halving with ``halving`` on), and the tuning report (JSON). Without a
    table folder the candidates train in a temporary folder that ``stack`` keeps. The row's first seed goes on
    from the kept recipe's candidate (``study.continued``)."""
    from ...fedvlr.halving import budgets as halving_budgets
    from ...fedvlr.halving import budgets_note, candidate_folder, candidate_root, cut_line, successive_halving
    from ...fedvlr.tuning import candidate_recipes

    points = candidate_recipes(**_fixed(study, recipe))
    cfg = study.experiment.config(recipe, study.seed)
    budgets = halving_budgets(cfg, study.opts.halving)
    _say(
        f"tuning {recipe.label}: {len(points)} recipes on seed {study.seed}, selecting on valid {cfg.valid_metric}"
        + budgets_note(budgets)
    )

    def cut(budget, kept, stopped, scores) -> None:
        _say(f"tuning {recipe.label}: {cut_line(budget, kept, stopped, scores)}")

    folder = study.opts.folder / "runs" / recipe.label / "tuning" if study.opts.folder else None
    root = stack.enter_context(candidate_root(folder))
    report = successive_halving(
        points, _trainer(study, recipe, root), budgets=budgets, metric=cfg.valid_metric, seed=study.seed, on_rung=cut
    )
    study.continued[recipe.label] = candidate_folder(root, report.selected) / f"seed-{study.seed}"
    _say(f"{recipe.label} keeps recipe {report.selected} (valid {cfg.valid_metric}: {report.scores_line()})")
    return report.chosen, report.to_json()


def _say(line: str) -> None:
    print(f"paper-table: {line}", file=sys.stderr, flush=True)


def tune_rows(study, rows: list, tuning: dict, stack: ExitStack) -> list:
    """``rows`` (recipe, variant) with every fusion row's recipe chosen on validation; ``tuning`` gets each tuned
    row's report, and a row that took another row's choice says so."""
    from ..variants import FUSION_VARIANTS

    chosen = {}  # backbone -> (its FedVLR row's label, the recipe that row chose)
    for recipe, variant in rows:  # the FedVLR row of each backbone first: the ablation rows follow its choice
        if variant == "fedvlr":
            point, tuning[recipe.label] = tuned_recipe(study, recipe, stack)
            chosen[recipe.backbone] = (recipe.label, point)
    out = []
    for recipe, variant in rows:
        if variant not in FUSION_VARIANTS:
            out.append((recipe, variant))
            continue
        if recipe.backbone not in chosen:
            point, tuning[recipe.label] = tuned_recipe(study, recipe, stack)
        else:
            source, point = chosen[recipe.backbone]
            if recipe.label != source:
                report = tuning[source]
                tuning[recipe.label] = {
                    "metric": report["metric"],
                    "split": "valid",
                    "seed": report["seed"],
                    "selected": report["selected"],
                    "selected_settings": report["selected_settings"],
                    "from": source,
                    "candidates": [],
                }
        out.append((_candidate(recipe, point), variant))
    return out
