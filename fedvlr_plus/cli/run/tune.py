"""``run ... --fusion fedvlr`` (``--tune``, on by default with a fusion layer): train the layer's grid of recipes on
the first seed, keep the one with the best validation score, and hand the run the flags of that recipe (see
:mod:`fedvlr_plus.fedvlr.tuning`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
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


def tune_recipe(args, data, *, config_for, build_backbone):
    """Run every candidate recipe for one seed (``args.seed``) and return ``(args with the chosen recipe's flags,
    the TuningReport)``. ``config_for(ns)`` makes the run's FedConfig from a namespace and ``build_backbone(ns,
    cfg)`` its model, exactly as the run itself does, so a candidate differs from the final run only in its flags
    and seed count. With a run folder each candidate checkpoints under ``RUN_DIR/tuning/<recipe>/`` and a resumed
    run resumes them (a finished candidate is read back, not retrained)."""
    from ...federation.runs.parallel import default_jobs, map_jobs
    from ...fedvlr.tuning import select_recipe, tries_id_dropout

    recipes = _candidates(args, cold_items=tries_id_dropout(data))
    run_dir = args.resume or args.out
    metric = config_for(args).valid_metric

    def job(recipe) -> RecipeJob:
        ns = _with_recipe(args, recipe, seeds=1)
        cfg = config_for(ns)
        out = Path(run_dir) / "tuning" / _folder_name(recipe.name) if run_dir else None
        resume = bool(args.resume) and out is not None and out.is_dir()
        return RecipeJob(data, build_backbone(ns, cfg), cfg, out, resume, not getattr(args, "no_progress", False))

    jobs = getattr(args, "jobs", None) or default_jobs()
    scores = {}
    if jobs != 1 and len(recipes) > 1:  # every recipe at once, one worker process each (the same figures)
        say(f"tuning: {len(recipes)} recipes side by side on seed {args.seed} (--jobs {jobs})")
        built = [job(r) for r in recipes]
        for b in built:
            b.progress = False
        scores = dict(zip([r.name for r in recipes], map_jobs(_valid_metric_of, [(b, metric) for b in built], jobs)))

    def valid_score(recipe) -> float:
        if recipe.name in scores:
            return scores[recipe.name]
        return _valid_metric_of((job(recipe), metric))

    def announce(i, recipe) -> None:
        flags = (
            " ".join(
                f"{k} {v}" if not isinstance(v, bool) else k for k, v in recipe.settings().items() if v is not False
            )
            or "the layer's defaults"
        )
        say(
            f"tuning {i + 1}/{len(recipes)}: recipe {recipe.name} ({flags}), seed {args.seed}, "
            f"selecting on valid {metric}"
        )

    report = select_recipe(recipes, valid_score, metric=metric, seed=args.seed, on_candidate=announce)
    say(
        f"tuning: kept recipe {report.selected} (valid {metric} "
        + ", ".join(f"{n} {s:.4f}" for n, s in report.scores.items())
        + ")"
    )
    return _with_recipe(args, report.chosen, seeds=args.seeds), report


@dataclass
class RecipeJob:
    """One recipe's training run, as a worker process receives it."""

    data: object
    backbone: object
    cfg: object
    out: Path | None
    resume: bool
    progress: bool


def _valid_metric_of(job_and_metric) -> float:
    """The best validation ``metric`` of one recipe's run (module level: a worker process calls it)."""
    from ...federation.run_seeds import run_federated

    job, metric = job_and_metric
    res = run_federated(job.data, job.backbone, job.cfg, out_dir=job.out, resume=job.resume, progress=job.progress)
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


def _folder_name(name: str) -> str:
    return name.replace("+", "-")
