"""``run SOURCE --backbone <federated or recbole:Model>``: the flags as a FedConfig and a backbone, the engine
run, and its result as the CLI reports it."""

from __future__ import annotations

from contextlib import ExitStack

from ...backbones import backbone_names
from ...errors import ConfigError, RunFolderError
from ...federation.config import FEDERATED_BACKBONES
from .args import config_from_args


def run_federated_command(args, data, *, split_used: str, metrics, ks, keys, protocol: str) -> dict:
    """Train ``args.backbone`` federatedly on ``data`` and return the CLI's result dict (valid/test/test_ci/
    test_warm/test_cold/baselines as for the reference rankers, plus selected_round, per_seed and history)."""
    from ...federation.run_seeds import run_federated
    from ...federation.runs.result import federated_result

    is_recbole = _check_backbone_flags(args)
    names = tuple(dict.fromkeys(list(metrics) + ["hr"]))

    def config_for(ns):
        return config_from_args(
            ns,
            ks=tuple(ks),
            metrics=names,
            valid_protocol=protocol,
            mask_history=getattr(ns, "mask_history", "train"),
            test_both_protocols=bool(getattr(ns, "test_both_protocols", False)),
        )

    run_dir = args.resume or args.out
    tuning, start_from = None, {}
    with ExitStack() as stack:  # holds the tuning candidates' temporary folder until the run is trained
        if getattr(args, "tune", False):
            from .tune import tune_recipe

            build = lambda ns, c: build_backbone(ns, data, c.dim, is_recbole)
            args, tuning, start_from = tune_recipe(args, data, config_for=config_for, build_backbone=build, stack=stack)
        cfg = config_for(args)
        backbone = build_backbone(args, data, cfg.dim, is_recbole)
        router, rb_eval = {}, {}
        on_round = _selected_round_hook(args, data, cfg, metrics, ks, router, rb_eval)
        res = run_federated(
            data,
            backbone,
            cfg,
            out_dir=run_dir,
            resume=bool(args.resume),
            progress=not getattr(args, "no_progress", False),
            on_round=on_round,
            start_from=start_from,
        )
    fusion = getattr(args, "fusion", "none")
    result = federated_result(
        res,
        data,
        backbone=args.backbone,
        fusion=fusion,
        protocol_name=args.protocol,
        protocol=protocol,
        split_used=split_used,
        cfg=cfg,
        keys=keys,
        metrics=metrics,
        ks=ks,
        recbole_test=rb_eval,
        router=router,
    )
    if tuning is not None:
        result["tuning"] = tuning.to_json()
    return result


def _check_backbone_flags(args) -> bool:
    """The flags that name the model and the run folder agree; whether the backbone is a RecBole model."""
    is_recbole = args.backbone.startswith("recbole:")
    if args.backbone not in FEDERATED_BACKBONES and not is_recbole:
        raise ConfigError(f"--backbone {args.backbone}", "unknown backbone", f"choose from {backbone_names()}")
    if getattr(args, "recbole_config", None) and not is_recbole:
        raise ConfigError("--recbole-config", f"configures a recbole:<Model> backbone only, not {args.backbone}")
    if args.resume and args.out and args.resume != args.out:
        raise RunFolderError(
            "--out",
            f"--resume {args.resume} continues the run in that folder; do not pass a different --out ({args.out})",
        )
    if getattr(args, "log", ()) and not (args.resume or args.out):
        raise ConfigError(
            "--log", "writes the per-round logs into the run folder, and this run has none", "add --out RUN_DIR"
        )
    return is_recbole


def build_backbone(args, data, dim: int, is_recbole: bool):
    """The backbone name, or the model the flags build (a RecBole model, the FedVLR layer around a backbone, a
    backbone given options of its own such as ``--fedrap-lambda``)."""
    if is_recbole:
        from ..recbole import cli_backbone

        return cli_backbone(args, data)
    if getattr(args, "fusion", "none") != "none":
        from ..fusion import fusion_backbone

        return fusion_backbone(args, data, args.backbone, dim)
    from ...adapters import backbone_options

    if not backbone_options(args.backbone, args):
        return args.backbone
    from ..fusion import base_backbone

    return base_backbone(args, data.n_items, args.backbone, dim)


def _selected_round_hook(args, data, cfg, metrics, ks, router: dict, rb_eval: dict):
    """A per-round callback that fills ``router`` / ``rb_eval`` (seed -> report) at each seed's selected
    (best-validation) round, or None when neither the router report nor RecBole's evaluator is asked for."""
    fusion = getattr(args, "fusion", "none") != "none"
    recbole_eval = getattr(args, "evaluator", "ours") == "recbole"
    if not (fusion or recbole_eval):
        return None
    return SelectedRoundReports(
        fusion, recbole_eval, data, tuple(ks), tuple(metrics), cfg.mask_history, router, rb_eval
    )


class SelectedRoundReports:
    """The reports of each seed's selected round: the router report (a fusion layer) and RecBole's own evaluator.
    An object rather than a closure so that it can go to a worker process with its seed and come back with what it
    collected (:meth:`merge`)."""

    def __init__(
        self,
        fusion: bool,
        recbole_eval: bool,
        data,
        ks: tuple,
        metrics: tuple,
        mask_history: str,
        router: dict,
        rb_eval: dict,
    ):
        self.fusion, self.recbole_eval, self.data = fusion, recbole_eval, data
        self.ks, self.metrics, self.mask_history = ks, metrics, mask_history
        self.router, self.rb_eval = router, rb_eval

    def __call__(self, run, record) -> None:
        if run.best is None or run.best["round"] != record["round"]:
            return
        if self.fusion:
            from ..fusion import router_report

            self.router[run.cfg.seed] = router_report(run)
        if self.recbole_eval:
            from ...adapters.recbole.backbone import recbole_evaluate

            self.rb_eval[run.cfg.seed] = recbole_evaluate(
                self.data, run.scorer(), split="test", ks=self.ks, metrics=self.metrics, mask_history=self.mask_history
            )

    def merge(self, other: SelectedRoundReports) -> None:
        """Take the reports a worker's copy collected."""
        self.router.update(other.router)
        self.rb_eval.update(other.rb_eval)
