"""``fedvlr-plus run SOURCE --backbone NAME``: train (federated backbones) or rank (reference rankers), select on
validation, report test figures with intervals, split into warm and cold targets."""
from __future__ import annotations

import argparse

from ...backbones import REFERENCE_BACKBONES, backbone_names
from ...metric_spec import DEFAULT_METRICS, parse_metrics
from ..argtypes import backbone_arg, metric_list, non_negative_int
from ..common import add_data_arguments, add_halving_argument, load_for_run, say
from ..report import report_run


def register(sub) -> None:
    from ..fusion_args import add_fusion_arguments
    from .args import add_run_arguments

    p_run = sub.add_parser("run", help="train (if needed) and evaluate one backbone",
                           usage="%(prog)s SOURCE [--backbone NAME] [options]",
                           description="Train a backbone on SOURCE (federated backbones) or use a reference "
                                       "ranker, select on validation, and report test metrics with bootstrap "
                                       "confidence intervals, split into warm and cold targets.")
    add_data_arguments(p_run)
    g = p_run.add_argument_group("model and evaluation")
    g.add_argument("--backbone", type=backbone_arg, default="pop", metavar="NAME",
                   help=f"what to train or rank with; {backbone_names()}. pop: training popularity, "
                        f"antipop: fewest training interactions first")
    g.add_argument("--protocol", default="full", choices=["full", "sampled99"],
                   help="full: rank all items with the user's training items masked; sampled99: the target "
                        "among 99 sampled negatives (seeded)")
    g.add_argument("--mask-history", default="train", choices=["train", "all"],
                   help="at test time mask only training items (FedVLR protocol; the validation item stays a "
                        "candidate) or training and validation items (RecBole's behaviour)")
    g.add_argument("--test-both-protocols", action="store_true",
                   help="federated backbones: also report test under the other protocol (sampled beside full); "
                        "one more test pass")
    g.add_argument("--metrics", type=metric_list, default=DEFAULT_METRICS,
                   help="comma-separated metric@K list (hr, ndcg, recall, mrr)")
    g.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed for sampling, splits, the random ranker and the first training seed")
    o = p_run.add_argument_group("output")
    o.add_argument("--out", metavar="RUN_DIR", default=None,
                   help="write result.json and per-user test metrics (CSV) into RUN_DIR (federated backbones "
                        "checkpoint there too and write them per seed, in RUN_DIR/seed-<s>/)")
    o.add_argument("--json", action="store_true",
                   help="print one JSON object as the last line: the figures, intervals, selected round, settings "
                        "and files written (the per-round history is in RUN_DIR/result.json)")
    o.add_argument("--json-history", action="store_true",
                   help="with --json: keep the per-round history (every seed's) in the JSON line")
    add_run_arguments(p_run)
    add_fusion_arguments(p_run)
    recipe = p_run.add_argument_group("recipe")
    recipe.add_argument(
        "--tune", action=argparse.BooleanOptionalAction, default=None,
        help="choose the fusion layer's recipe on validation: train each of a small grid (the layer's defaults, "
             "--fusion-residual, three times the model's server step, both, --content-preference; RecBole models: "
             "no content preference, unit-size views with and without the residual path, and the residual path "
             "with --fusion-residual-gate; where at least 1%% of the validation targets are cold items, each also "
             "with --id-dropout 0.5) on the first seed, keep the best by --valid-metric, then run every seed with "
             "it; flags you pass stay fixed. Reported under "
             "'tuning' in the JSON. On by default with --fusion (a resumed run tunes only if its folder did); "
             "--no-tune trains the layer's defaults alone")
    add_halving_argument(recipe, "the grid")
    p_run.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    from ...evaluation.reference_table import reference_run

    names, ks, keys = parse_metrics(args.metrics)
    protocol = "sampled" if args.protocol == "sampled99" else "full"
    from .tune import check_tune_flags, resolve_tune

    check_tune_flags(args)
    args.tune = resolve_tune(args)
    data, split_used = load_for_run(args)
    if protocol == "sampled":
        _check_sampled(data)
    say(_run_plan(args, data.name))
    if args.backbone not in REFERENCE_BACKBONES:
        from ...federation.runs.parallel import shared_workers
        from .federated import run_federated_command

        with shared_workers():  # the tuning's rungs and the seeds start their worker processes once
            result = run_federated_command(args, data, split_used=split_used, metrics=names, ks=ks, keys=keys,
                                           protocol=protocol)
        report_run(args, result, keys)
        say(_next_step(args))
        return 0
    result, test = reference_run(data, args.backbone, protocol_name=args.protocol, split_used=split_used,
                                 names=names, ks=ks, keys=keys, mask_history=args.mask_history, seed=args.seed)
    report_run(args, result, keys, test, data)
    say(_next_step(args))
    return 0


def _check_sampled(data) -> None:
    """``--protocol sampled99`` on a catalogue too small for it stops before training, not at the first
    evaluation (where the line was also cut into by the progress bar)."""
    from ...errors import ConfigError
    from ...evaluation import sampled_unavailable

    for split in ("valid", "test"):
        why = sampled_unavailable(data, split=split)
        if why:
            raise ConfigError("--protocol sampled99", why, "use the full protocol, --protocol full")


def _run_plan(args, dataset: str) -> str:
    """One line that says what ``run`` is about to do and where it writes."""
    where = (f"writing to {args.resume or args.out}" if (args.resume or args.out)
             else "nothing written (add --out RUN_DIR to keep the result)")
    if args.backbone in REFERENCE_BACKBONES:
        return f"ranking {dataset} with the reference ranker {args.backbone} (no training); {where}"
    seeds = list(range(args.seed, args.seed + args.seeds))
    model = args.backbone + ("" if args.fusion == "none" else f" + {args.fusion} fusion")
    tune = ("after choosing its recipe on valid (one seed per recipe of the --tune grid; --no-tune skips it), "
            if getattr(args, "tune", False) else "")
    verb = "resuming" if args.resume else "training"
    return (f"{verb} {model} on {dataset}{_on_gpu(args)}{' ' + tune.rstrip(', ') if tune else ''}: {len(seeds)} "
            f"seed{'s' * (len(seeds) > 1)} ({', '.join(map(str, seeds))}), up to {args.rounds} rounds, patience "
            f"{args.patience}; {where}")


def _on_gpu(args) -> str:
    """`` on the GPU (its name)`` where ``--device`` sends the chunks to CUDA, else nothing (the CPU is the rule)."""
    from ...federation.device import resolve_device

    device = resolve_device(getattr(args, "device", None))
    if device.type != "cuda":
        return ""
    import torch

    return f" on the GPU ({torch.cuda.get_device_name(device)})"


def _next_step(args) -> str:
    """Where to go from a finished ``run``."""
    from ...errors import shell_word

    src = shell_word(args.source)
    if args.backbone in REFERENCE_BACKBONES:
        return f"next: train a federated backbone, e.g. fedvlr-plus run {src} --backbone fedavg"
    base = args.backbone if not args.backbone.startswith("recbole:") else "fedavg"
    if args.fusion == "none":
        return (f"next: add the FedVLR layer with --fusion fedvlr, or a cold-start study with "
                f"fedvlr-plus coldstart {src} --backbone {base}")
    if not getattr(args, "tune", False):
        return (f"next: let validation choose the layer's recipe (the best differs between data sets) "
                f"with --tune, or compare every backbone with paired tests: fedvlr-plus experiment "
                f"paper-table {src} --tune")
    return (f"next: every backbone alone and with the fusion layer, with paired tests: "
            f"fedvlr-plus experiment paper-table {src} --tune")
