"""``paper-table --tune``: the FedVLR row's recipe chosen on validation before any fusion row is trained.

Every recipe of :data:`fedvlr_plus.fedvlr.tuning.RECIPES` is trained for the table's first seed, as the row
itself would be; the one with the best validation score (the engine's selection metric, at its best round) is
the recipe the row then trains with on every seed. Test figures of the candidates are never read. With a run
folder each candidate keeps its own checkpoints under ``runs/<row>/tuning/<recipe>/`` and resumes with the table.

The router-ablation rows of the same backbone (``sum``, ``mlp``, ``gate``, ``uniform``) train with the recipe the
FedVLR row chose, so that each differs from it in the fusion mode only; a table without a FedVLR row tunes each
fusion row on its own.
"""

from __future__ import annotations

from ...api import FedVLR
from ...errors import RunFolderError


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


def _valid_score(study, model: FedVLR, folder) -> float:
    """Train ``model`` for the table's first seed (or read it back from ``folder``) and return its best
    validation score."""
    seed = study.seed
    run = study.experiment.start(model, seed, folder=folder)
    if folder is not None and run.folder.has_checkpoint():
        if not study.opts.resume:
            raise RunFolderError(
                str(study.opts.folder),
                "already holds runs",
                f"continue them with --resume {study.opts.folder}, or choose another folder",
            )
        run.load_checkpoint()
    run.run()
    return float(run.best["metric"])


def tuned_recipe(study, recipe: FedVLR):
    """The grid point (:class:`~fedvlr_plus.fedvlr.tuning.Recipe`) chosen on validation for ``recipe``, and the
    tuning report (JSON)."""
    import sys

    from ...fedvlr.tuning import candidate_recipes, select_recipe

    points = candidate_recipes(**_fixed(study, recipe))
    root = study.opts.folder / "runs" / recipe.label / "tuning" if study.opts.folder else None
    metric = study.experiment.config(recipe, study.seed).valid_metric

    def score(point) -> float:
        folder = root / point.name.replace("+", "-") / f"seed-{study.seed}" if root is not None else None
        return _valid_score(study, _candidate(recipe, point), folder)

    def announce(i, point) -> None:
        print(
            f"paper-table: tuning {recipe.label} {i + 1}/{len(points)}: recipe {point.name}, seed {study.seed}",
            file=sys.stderr,
            flush=True,
        )

    report = select_recipe(points, score, metric=metric, seed=study.seed, on_candidate=announce)
    print(
        f"paper-table: {recipe.label} keeps recipe {report.selected} (valid {metric}: "
        + ", ".join(f"{n} {s:.4f}" for n, s in report.scores.items())
        + ")",
        file=sys.stderr,
        flush=True,
    )
    return report.chosen, report.to_json()


def tune_rows(study, rows: list, tuning: dict) -> list:
    """``rows`` (recipe, variant) with every fusion row's recipe chosen on validation; ``tuning`` gets each tuned
    row's report, and a row that took another row's choice says so."""
    from ..variants import FUSION_VARIANTS

    chosen = {}  # backbone -> (its FedVLR row's label, the recipe that row chose)
    for recipe, variant in rows:  # the FedVLR row of each backbone first: the ablation rows follow its choice
        if variant == "fedvlr":
            point, tuning[recipe.label] = tuned_recipe(study, recipe)
            chosen[recipe.backbone] = (recipe.label, point)
    out = []
    for recipe, variant in rows:
        if variant not in FUSION_VARIANTS:
            out.append((recipe, variant))
            continue
        if recipe.backbone not in chosen:
            point, tuning[recipe.label] = tuned_recipe(study, recipe)
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
