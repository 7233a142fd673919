"""``run ... --fusion fedvlr`` (``--tune``, on by default with a fusion layer): train the layer's grid of recipes on
the first seed, keep the one with the best validation score, and hand the run the flags of that recipe (see
:mod:`fedvlr_plus.fedvlr.tuning`)."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from ...backbones import REFERENCE_BACKBONES
from ...errors import ConfigError
from ..common import say


def check_tune_flags(args) -> None:
    """``--tune`` chooses the fusion layer's recipe; without the layer there is nothing to choose."""
    if getattr(args, "tune", None) and getattr(args, "fusion", "none") == "none":
        raise ConfigError(
            "--tune",
            "chooses the fusion layer's training recipe on validation; this run has no fusion layer",
            "add --fusion fedvlr (or another --fusion mode), or drop --tune",
        )


def resolve_tune(args) -> bool:
    """Whether this ``run`` tunes: as the user said (``--tune`` / ``--no-tune``), else on for a run with a fusion
    layer whose grid has more than one recipe left after the flags the user fixed. A resumed run tunes only if its
    folder holds tuning candidates, so a folder made without tuning resumes as it was made."""
    if getattr(args, "tune", None) is not None:
        return bool(args.tune)
    if getattr(args, "fusion", "none") == "none" or args.backbone in REFERENCE_BACKBONES:
        return False
    if getattr(args, "resume", None):
        return (Path(args.resume) / "tuning").is_dir()
    return grid_has_choice(args)


def grid_has_choice(args) -> bool:
    """Whether the layer's grid keeps more than one recipe after the flags the user fixed."""
    return len(_candidates(args)) > 1


def _candidates(args, cold_items: bool = False):
    from ...fedvlr.tuning import candidate_recipes

    return candidate_recipes(
        cold_items=cold_items,
        lr=args.lr,
        server_lr=args.server_lr,
        residual=True if args.fusion_residual else None,
        residual_gate=True if getattr(args, "fusion_residual_gate", False) else None,
        content_preference=True if getattr(args, "content_preference", False) else None,
        view_scale=getattr(args, "fusion_view_scale", None),
        id_dropout=getattr(args, "id_dropout", 0.0) or None,
        weight_decay=getattr(args, "weight_decay", None),
        backbone=args.backbone,
    )


def tune_recipe(args, data, *, config_for, build_backbone, stack: ExitStack):
    """Train the candidate recipes on one seed (``args.seed``) to the end, or by successive halving with
    ``--halving`` (:mod:`~fedvlr_plus.fedvlr.halving`) and return ``(args with the chosen recipe's flags, the
    TuningReport, start_from)``. ``config_for(ns)`` makes the run's FedConfig from a namespace and
    ``build_backbone(ns, cfg)`` its model, exactly as the run itself does, so a candidate differs from the final run
    only in its flags, seed count and rounds. Candidates train in ``RUN_DIR/tuning/<recipe>/`` (a temporary folder
    without a run folder, which ``stack`` keeps until it closes), continuing from their checkpoint at each budget;
    a resumed run resumes them. ``start_from`` (seed -> folder, for :func:`~fedvlr_plus.federation.run_seeds.
    run_federated`): the kept recipe's seed goes on from where its candidate stopped instead of training those
    rounds again (the same figures)."""
    from ...fedvlr.halving import budgets as halving_budgets
    from ...fedvlr.halving import budgets_note, candidate_folder, candidate_root, successive_halving
    from ...fedvlr.tuning import tries_id_dropout

    recipes = _candidates(args, cold_items=tries_id_dropout(data))
    full = config_for(args)
    budgets = halving_budgets(full, getattr(args, "halving", False))
    run_dir = args.resume or args.out
    say(
        f"tuning: {len(recipes)} recipes on seed {args.seed}, selecting on valid {full.valid_metric}"
        + budgets_note(budgets)
        + "".join(f"\n  {r.name}: {_flags(r)}" for r in recipes)
    )
    root = stack.enter_context(candidate_root(Path(run_dir) / "tuning" if run_dir else None))
    train_to = _trainer(args, data, root, config_for, build_backbone, full.valid_metric)
    report = successive_halving(
        recipes, train_to, budgets=budgets, metric=full.valid_metric, seed=args.seed, on_rung=_say_cut
    )
    say(f"tuning: kept recipe {report.selected} (valid {full.valid_metric} {report.scores_line()})")
    start_from = {args.seed: candidate_folder(root, report.selected) / f"seed-{args.seed}"}
    return _with_recipe(args, report.chosen, seeds=args.seeds), report, start_from


def _flags(recipe) -> str:
    """The flags a recipe sets, as a user would type them."""
    settings = recipe.settings().items()
    return " ".join(f"{k} {v}" if not isinstance(v, bool) else k for k, v in settings if v is not False) or (
        "the layer's defaults"
    )


def _say_cut(budget: int, kept, stopped, scores: dict) -> None:
    from ...fedvlr.halving import cut_line

    say(f"tuning: {cut_line(budget, kept, stopped, scores)}")


def _trainer(args, data, root, config_for, build_backbone, metric: str):
    """``train_to(recipes, rounds)``: each recipe trained up to ``rounds`` on ``args.seed`` (continued from its
    folder's checkpoint), side by side in worker processes where ``--jobs`` allows; their best valid scores."""
    from ...federation.runs.folder import seed_folders
    from ...federation.runs.parallel import map_jobs, worker_count
    from ...fedvlr.halving import budget_settings, candidate_folder, candidate_job

    jobs = getattr(args, "jobs", None)
    temporary = not (args.resume or args.out)  # the candidates' folders are temporary (see tune_recipe)
    started = set()  # recipes this call trained before: they continue; others resume only under --resume

    def job(recipe, rounds: int) -> RecipeJob:
        ns = _with_recipe(args, recipe, seeds=1)
        cfg = replace(config_for(ns), **budget_settings(rounds, temporary=temporary))
        out = candidate_folder(root, recipe.name)
        resume = recipe.name in started or (bool(args.resume) and bool(seed_folders(out)))
        started.add(recipe.name)
        progress = not getattr(args, "no_progress", False)
        # the kept recipe's candidate is continued by the run's first seed: it keeps its selected model
        return RecipeJob(data, build_backbone(ns, cfg), cfg, out, resume, progress, keep_selected=True)

    def train_to(recipes, rounds: int) -> list[float]:
        built = [job(r, rounds) for r in recipes]
        workers = worker_count(jobs, len(built))
        if workers > 1:  # the recipes side by side in worker processes (the same figures)
            for b in built:
                b.progress = False
            names = [candidate_job(r.name, rounds) for r in recipes]
            return map_jobs(_valid_metric_of, [(b, metric) for b in built], workers, names=names, what="tuning")
        return [_valid_metric_of((b, metric)) for b in built]

    return train_to


@dataclass
class RecipeJob:
    """One recipe's training run, as a worker process receives it."""

    data: object
    backbone: object
    cfg: object
    out: Path | None
    resume: bool
    progress: bool
    keep_selected: bool = False


def _valid_metric_of(job_and_metric) -> float:
    """The best validation ``metric`` of one recipe's run (module level: a worker process calls it)."""
    from ...federation.run_seeds import run_federated

    job, metric = job_and_metric
    res = run_federated(
        job.data,
        job.backbone,
        job.cfg,
        out_dir=job.out,
        resume=job.resume,
        progress=job.progress,
        test=False,
        keep_selected=job.keep_selected,
    )
    return float(res["valid"][metric])


def _with_recipe(args, recipe, *, seeds: int) -> argparse.Namespace:
    ns = argparse.Namespace(**vars(args))
    ns.lr, ns.server_lr, ns.fusion_residual, ns.seeds = recipe.lr, recipe.server_lr, recipe.residual, seeds
    ns.content_preference = recipe.content_preference
    ns.fusion_residual_gate = recipe.residual_gate
    ns.fusion_view_scale = recipe.view_scale
    ns.id_dropout = recipe.id_dropout
    if recipe.weight_decay is not None:
        ns.weight_decay = recipe.weight_decay
    return ns
