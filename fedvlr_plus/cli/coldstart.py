"""``fedvlr-plus coldstart SOURCE --backbone B [--fusion none|fedvlr] [--cold-items F] [--cold-users F
--support N,...] [--seeds 3] [--out DIR] [--json]``: the flags turned into
:class:`~fedvlr_plus.coldstart.study.ColdStartOptions` for
:func:`fedvlr_plus.coldstart.study.run_coldstart`.

Without ``--cold-items`` / ``--cold-users`` the data's own split is used (leave-one-out when it has none); its
natural cold targets (KU: items that occur only in valid/test) are then the item cold-start test. Torch is not
imported while the parser is built.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..metric_spec import DEFAULT_METRICS, parse_metrics
from .common import add_halving_argument


def _supports(text: str) -> tuple:
    try:
        out = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated support sizes like 1,3,5, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("support sizes must be integers >= 1")
    return out


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.2, got {text!r}") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"the fraction must be in (0, 1), got {v}")
    return v


#: the cold-item rules of :mod:`fedvlr_plus.coldstart.rules` (named here: that module imports torch)
COLD_RULES = ("none", "neighbours", "mapping", "both", "fused-neighbours", "fused-mapping", "fused-both")
#: where a joining user's private state starts (:mod:`fedvlr_plus.coldstart.population`, likewise)
NEW_USER_STARTS = ("population", "mean-params", "items", "auto", "fresh")
#: what a joining user's scores add (:mod:`fedvlr_plus.coldstart.popularity_prior`, likewise)
NEW_USER_PRIORS = ("none", "popularity")


def register(subparsers) -> argparse.ArgumentParser:
    from ..federation.config import FEDERATED_BACKBONES
    from .argtypes import auto_or_non_negative_int, metric_list, non_negative_int, one_metric
    from .fusion_args import add_fusion_arguments
    from .run.args import add_run_arguments

    p = subparsers.add_parser(
        "coldstart", help="cold-start experiments: new items, new users, sparse users",
        usage="%(prog)s SOURCE --backbone NAME [--cold-items F] [--cold-users F] [options]",
        description="Train a federated backbone (optionally with the FedVLR layer) and measure it where interactions "
                    "are scarce: cold items ranked among all items and among cold items only (with server-side "
                    "content rules for their ID rows), held-out users joining with N support interactions, and "
                    "results by the user's number of training interactions. Same protocol and evaluator as "
                    "'fedvlr-plus run'; pop, random, antipop and a content-only ranker are reported beside.")
    d = p.add_argument_group("data")
    d.add_argument("source", metavar="SOURCE", help="'ml-100k' (embedded) or a path to a data folder/file")
    d.add_argument("--implicit-threshold", type=float, default=None, metavar="R",
                   help="keep only interactions with rating >= R (default: all)")
    d.add_argument("--k-core", type=non_negative_int, default=0, metavar="K",
                   help="iterative K-core filter before splitting (0: none)")
    c = p.add_argument_group("cold-start study")
    c.add_argument("--backbone", required=True, choices=FEDERATED_BACKBONES, help="federated backbone")
    c.add_argument("--cold-items", type=_fraction, default=None, metavar="FRACTION",
                   help="hold this fraction of items out of training (half of them are validation targets, half "
                        "test); the warm interactions are split leave-one-out")
    c.add_argument("--cold-users", type=_fraction, default=None, metavar="FRACTION",
                   help="hold this fraction of users out of training; they join afterwards with --support items")
    c.add_argument("--support", type=_supports, default=(1, 3, 5), metavar="N[,N...]",
                   help="support sizes of the joining users")
    c.add_argument("--support-epochs", type=auto_or_non_negative_int, default="auto", metavar="N|auto",
                   help="local epochs a joining user trains its private parts for (0: none); auto (the default): "
                        "chosen per support size among 0, 1, 5, 20 (then 50, 100 while the longest is best) on a "
                        "third of the joining users by --cold-select, the figures then from the other two thirds")
    _add_new_user_arguments(c)
    c.add_argument("--cold-rule", choices=("auto",) + COLD_RULES, default="auto",
                   help="ID rows of cold items for the headline figure: auto = the rule with the best validation "
                        "--cold-select among cold items (FedVLR), 'none' for the backbone alone; fused-*: the rule "
                        "applied to the layer's fused views instead of its ID input (the backbone alone takes the "
                        "plain rule); every rule is reported either way")
    c.add_argument("--cold-select", type=one_metric, default="ndcg@10",
                   help="validation metric of every choice the study makes: the cold rule (among cold items) "
                        "and, in a new-user study, the layer's recipe and each model's local epochs and prior "
                        "weight (on the validation joining users); choose at the depth you report")
    c.add_argument("--with-backbone", action="store_true",
                   help="with --fusion: also train the backbone alone on the same split and report it beside")
    _add_tune_arguments(c)
    c.add_argument("--split-seed", type=non_negative_int, default=0, help="seed of the cold-item / cold-user draw")
    o = p.add_argument_group("evaluation and output")
    o.add_argument("--metrics", type=metric_list, default=DEFAULT_METRICS, help="metric@K list")
    o.add_argument("--out", metavar="DIR", default=None,
                   help="report folder: result.json, CSV tables, report.md and PNG plots")
    o.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_run_arguments(p, command="coldstart")
    add_fusion_arguments(p)
    p.set_defaults(func=cmd_coldstart, seeds=3)
    return p


def _add_tune_arguments(c) -> None:
    c.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                   help="with --fusion: choose the layer's recipe on validation first (the grid of 'run --tune', "
                        "first seed; a new-user study rates each recipe by its validation joining users, an item "
                        "study by its valid --cold-select among cold items under the best cold rule); reported "
                        "under 'tuning'. On by default in a new-user study with --fusion, off otherwise")
    add_halving_argument(c, "the grid")


def _add_new_user_arguments(c) -> None:
    """How a joining user is served: where its private state starts, and what its scores add."""
    c.add_argument("--new-user-start", choices=NEW_USER_STARTS, default="population",
                   help="where a joining user's private state starts: the mean private state of the trained "
                        "clients with the router as their mean mixture (one aggregate sent to newcomers; "
                        "docs/coldstart.md), every parameter averaged, the router's too (mean-params, its "
                        "ablation), the mean over its support items of each item's users' mean state (items), "
                        "whichever of population and items its validation joining users rank better (auto, "
                        "needs --support-epochs auto or --tune), or its own initial draw (fresh, the earlier "
                        "protocol)")
    c.add_argument("--new-user-prior", choices=NEW_USER_PRIORS, default=None,
                   help="popularity: add the trained users' log item counts, weighted, to a joining user's scores, "
                        "the weight (0, 0.5, 1, 2 or 4, then doubling up to 1,024 while the largest tried is best) "
                        "chosen with the local epochs on the validation joining users (needs --support-epochs auto "
                        "or --tune); none: the model's scores alone. Default: popularity where the study sets "
                        "validation joining users aside, else none")


def coldstart_options(args):
    """The study's typed options from the parsed flags."""
    from ..adapters import backbone_options
    from ..coldstart.study import ColdStartOptions, StudySplit
    from .fusion import options_from_args
    from .run.args import config_from_args
    from .run.tune import check_tune_flags

    resolve_new_user_defaults(args)
    check_tune_flags(args)
    _check_validation_choices(args)
    split = StudySplit(args.source, cold_items=args.cold_items, cold_users=args.cold_users,
                       min_history=max(args.support) + 1, implicit_threshold=args.implicit_threshold,
                       k_core=args.k_core, split_seed=args.split_seed)
    keys = parse_metrics(args.metrics)[2]
    ks = parse_metrics(",".join(keys + [args.cold_select.lower()]))[1]   # the cut-offs the runs evaluate at
    command = "fedvlr-plus coldstart " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["coldstart"] else None
    return ColdStartOptions(
        split, args.backbone, training=config_from_args(args, ks=ks),
        fedvlr=options_from_args(args, mode=args.fusion if args.fusion != "none" else "fedvlr"),
        metrics=keys, fusion=args.fusion, with_backbone=args.with_backbone,
        support=args.support, support_epochs=args.support_epochs, new_user_start=args.new_user_start,
        new_user_prior=args.new_user_prior,
        backbone_options=backbone_options(args.backbone, args),
        cold_rule=args.cold_rule,
        cold_select=args.cold_select, tune=args.tune, halving=args.halving, progress=not args.no_progress,
        command=command, jobs=args.jobs, folder=Path(args.out) if args.out else None,
        resume=bool(getattr(args, "resume", None)))


def cmd_coldstart(args) -> int:
    from ..coldstart.paired import COLD_ITEM_FRAMES, JOINING_FRAMES
    from ..coldstart.report import format_summary, write_cold_item_per_user, write_joining_per_user, write_report
    from ..coldstart.study import run_coldstart
    from ..jsonio import json_default, write_json_atomic
    from .common import continued_folder, say_written

    def log(msg):
        print(msg, file=sys.stderr)

    args.out = continued_folder(args, "study")  # (the report goes beside the steps it continues)
    seeds = list(range(args.seed, args.seed + args.seeds))
    studies = [f"cold items {args.cold_items}" if args.cold_items else "",
               f"cold users {args.cold_users} (support {','.join(map(str, args.support))})" if args.cold_users else ""]
    studies = "; ".join(s for s in studies if s) or "natural cold targets of the data's own split"
    model = args.backbone + (f"+{args.fusion}" if args.fusion != "none" else "")
    seed_list = ", ".join(map(str, seeds))
    log(f"cold-start study of {model} on {args.source}: {studies}; {len(seeds)} seed{'s' * (len(seeds) > 1)} "
        f"({seed_list}; "
        f"change with --seeds), up to {args.rounds} rounds" + (f"; writing to {args.out}" if args.out else ""))
    opts = coldstart_options(args)
    if args.cold_users is not None:
        log(f"joining users: local epochs {args.support_epochs}, start {args.new_user_start}, prior "
            f"{args.new_user_prior}" + ("; the layer's recipe chosen on validation joining users (--no-tune: its "
                                        "defaults)" if args.tune else "")
            + (f"; choices by their {args.cold_select.lower()} (--cold-select)" if _sets_joining_users_aside(args)
               else ""))
    result = run_coldstart(opts, log=log)
    joining_frames, item_frames = result.pop(JOINING_FRAMES, {}), result.pop(COLD_ITEM_FRAMES, {})
    if args.out:
        write_report(result, Path(args.out))
        write_joining_per_user(joining_frames, Path(args.out))
        write_cold_item_per_user(item_frames, Path(args.out))
        write_json_atomic(Path(args.out) / "result.json", result)
    print(format_summary(result), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result, default=json_default))
    say_written(args, args.out, "report.md (tables and plots), CSV tables, per-user figures, result.json",
                read="report.md")
    return 0


def resolve_new_user_defaults(args) -> None:
    """Fill the flags left at their defaults with the validated recipe of a new-user study: the layer's recipe, the
    local epochs and the popularity prior's weight all chosen on the validation joining users (0, the model alone,
    among the weights). Another study keeps the layer's defaults and no prior."""
    from .run.tune import grid_has_choice

    if args.tune is None:
        args.tune = args.cold_users is not None and args.fusion != "none" and grid_has_choice(args)
    if args.new_user_prior is None:
        args.new_user_prior = "popularity" if _sets_joining_users_aside(args) else "none"


def _sets_joining_users_aside(args) -> bool:
    """Whether the study keeps a third of its joining users for validation choices: a new-user study with
    ``--support-epochs auto`` or ``--tune``."""
    return args.cold_users is not None and (args.support_epochs == "auto" or bool(args.tune))


def _check_validation_choices(args) -> None:
    """The prior's weight and an automatic start are chosen on validation joining users: they are set aside only
    by ``--support-epochs auto`` or ``--tune`` in a new-user study."""
    from ..errors import ConfigError

    chosen = [(flag, what) for flag, what, on in (
        ("--new-user-prior", "the prior's weight", args.new_user_prior != "none"),
        ("--new-user-start auto", "the start", args.new_user_start == "auto")) if on]
    if chosen and not _sets_joining_users_aside(args):
        flag, what = chosen[0]
        raise ConfigError(flag, f"chooses {what} on validation joining users, which this study does not set aside",
                          "add --cold-users F and --support-epochs auto (or --tune)")
