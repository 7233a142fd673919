"""``fedvlr-plus bench round SOURCE --backbone B [--fusion F]``: time federated rounds, batched against sequential
(``B`` a federated backbone or ``recbole:<Model>``); ``fedvlr-plus bench eval``: time the evaluation passes of a
trained model, with ``--check`` against the reference paths; ``fedvlr-plus bench suite``: every speed figure of
the project, each case in its own process."""

from __future__ import annotations

import argparse
import json
import sys

from .argtypes import non_negative_int, positive_float, positive_int
from .common import add_data_arguments, load_for_run


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``bench round``, ``bench eval`` and ``bench suite``."""
    from ..federation.config import FEDERATED_BACKBONES

    p = subparsers.add_parser("bench", help="speed benchmarks of the federated engine")
    sub = p.add_subparsers(dest="bench_command", metavar="{round,eval,suite}", required=True)
    r = sub.add_parser(
        "round",
        help="time one full round (all clients, local epochs, no evaluation), batched and sequential",
        usage="%(prog)s SOURCE --backbone NAME [options]",
        description="Time one full federated round for the batched simulator and the sequential "
        "reference in one process and print both and their ratio. SOURCE may also "
        "be synthetic:USERSxITEMS (e.g. synthetic:35000x18000).",
    )
    add_data_arguments(r)
    r.add_argument(
        "--backbone",
        required=True,
        metavar="NAME",
        help=f"federated backbone to time: {', '.join(FEDERATED_BACKBONES)} or recbole:<Model>",
    )
    r.add_argument("--repeats", type=positive_int, default=3, help="time each simulator this many times, keep the best")
    r.add_argument(
        "--timed-rounds",
        type=positive_int,
        default=1,
        metavar="N",
        help="train N rounds in a row and report the median of rounds 2..N (default 1: the first "
        "round, best of --repeats)",
    )
    r.add_argument("--no-sequential", action="store_true", help="time the batched simulator only")
    _add_model_arguments(r, cmd_bench_round)
    _register_eval(sub)
    _register_suite(sub)
    _register_runs(sub)
    return p


def _register_eval(sub) -> None:
    from ..federation.config import FEDERATED_BACKBONES

    e = sub.add_parser(
        "eval",
        help="time the evaluation passes (full sort, sampled) of a model trained for a few "
        "rounds; --check also times the reference paths and compares the figures",
        usage="%(prog)s SOURCE --backbone NAME [--train-rounds N] [--check] [options]",
        description="Train a federated model for --train-rounds rounds (the quality does not matter "
        "here), then time one pass of each protocol over the chosen split (on the torch "
        "threads the process has: OMP_NUM_THREADS=1 for one). "
        "With --check, each pass runs again by the reference path (the sampled "
        "protocol scoring every item instead of its 100 candidates; the FedVLR layer "
        "forming each user's mixtures before FedNCF's head) and the line says whether "
        "the figures are the same.",
    )
    add_data_arguments(e)
    e.add_argument(
        "--backbone",
        required=True,
        metavar="NAME",
        help=f"federated backbone: {', '.join(FEDERATED_BACKBONES)} or recbole:<Model>",
    )
    e.add_argument(
        "--train-rounds",
        type=non_negative_int,
        default=1,
        metavar="N",
        help="rounds trained before the passes are timed (default 1; 0 times the initial model, whose "
        "passes cost the same)",
    )
    e.add_argument("--eval-split", choices=("valid", "test"), default="test", help="the split scored (default test)")
    e.add_argument(
        "--protocols",
        default=None,
        metavar="LIST",
        help="comma-separated protocols to time: full, sampled (default both, the sampled one where "
        "the catalogue has 99 negatives for every test user)",
    )
    e.add_argument("--check", action="store_true", help="also time each pass by the reference path and compare")
    _add_model_arguments(e, cmd_bench_eval)


def _add_model_arguments(p, func) -> None:
    """``--json`` and the flags of the model a bench command trains (a run's and the fusion layer's)."""
    from .fusion_args import add_fusion_arguments
    from .run.args import add_run_arguments

    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_run_arguments(p, command="bench")
    add_fusion_arguments(p)
    p.set_defaults(func=func)


def _register_suite(sub) -> None:
    s = sub.add_parser(
        "suite",
        help="every speed figure (KU, ml-100k, recbole:BPR, 35,598 synthetic clients, "
        "19,412 Amazon Toys clients, full-sort evaluation), each case in its own "
        "process, as JSON and Markdown",
        description="Measure every case of the speed table in one run: CPU and wall time per round "
        "(one thread), round 1 and the median of later rounds, the sequential reference "
        "and the ratio where there is one, full-sort evaluation time, and each case's "
        "peak RSS (one process per case). Real-data cases whose folder is missing are "
        "skipped with the reason. Writes DIR/suite.json and DIR/suite.md.",
    )
    s.add_argument("--out", metavar="DIR", default="bench-suite", help="folder for suite.json and suite.md")
    s.add_argument(
        "--quick", action="store_true", help="leave out the big cases (35,598 and 19,412 clients, ml-100k FedVLR)"
    )
    s.add_argument("--cases", metavar="IDS", default=None, help="comma-separated case ids to run (default: all)")
    s.add_argument(
        "--scale-source",
        metavar="SOURCE",
        default=None,
        help="data of the large-population cases (default synthetic:35598x18357)",
    )
    s.add_argument("--device", choices=("cpu", "cuda", "auto"), default=None, help="device of every case")
    s.add_argument(
        "--case-timeout",
        type=positive_float,
        metavar="SECONDS",
        default=None,
        help="stop a case that runs longer and record it as failed (default: no limit)",
    )
    s.add_argument(
        "--no-sequential",
        action="store_true",
        help="time the batched simulator only (no sequential reference, no ratio)",
    )
    s.set_defaults(func=cmd_bench_suite)


def _register_runs(sub) -> None:
    s = sub.add_parser(
        "runs",
        help="whole commands as a user runs them (the README's main job, 3-seed runs, a cold-start study): "
        "wall, CPU and where it goes",
        description="Run each case as a fresh fedvlr-plus process and report its wall time, its CPU time (worker "
        "processes included) and its phases: start-up (interpreter and imports), loading, training, evaluation "
        "and the rest. Cases on real data sets whose folder is missing are skipped with the reason. Writes "
        "DIR/runs.json and DIR/runs.md.",
    )
    s.add_argument("--out", metavar="DIR", default="bench-runs", help="folder for runs.json and runs.md")
    s.add_argument("--quick", action="store_true", help="only the README's main job")
    s.add_argument("--cases", metavar="IDS", default=None, help="comma-separated case ids to run (default: all)")
    s.add_argument(
        "--case-timeout",
        type=positive_float,
        metavar="SECONDS",
        default=None,
        help="stop a case that runs longer and record it as failed (default: no limit)",
    )
    s.set_defaults(func=cmd_bench_runs)


def _shared_data():
    """The folder of the real data sets the benchmarks read: ``$FEDVLR_SHARED_DATA``, else ``../shared/data``."""
    import os
    from pathlib import Path

    return Path(os.environ.get("FEDVLR_SHARED_DATA") or Path.cwd().parent / "shared" / "data")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_bench_runs(args) -> int:
    from pathlib import Path

    from ..bench.runs import run_all

    only = set(args.cases.split(",")) if args.cases else None
    doc = run_all(
        Path(args.out),
        shared_data=_shared_data(),
        quick=args.quick,
        only=only,
        timeout=args.case_timeout,
        progress=_say,
    )
    print((Path(args.out) / "runs.md").read_text(), end="")
    print(f"wrote {Path(args.out) / 'runs.json'} and runs.md", file=sys.stderr)
    return 1 if any(c["status"] == "failed" for c in doc["cases"]) else 0


def cmd_bench_suite(args) -> int:
    from pathlib import Path

    from ..bench.suite import SCALE_SOURCE, run_suite

    only = set(args.cases.split(",")) if args.cases else None
    doc = run_suite(
        Path(args.out),
        shared_data=_shared_data(),
        quick=args.quick,
        only=only,
        scale_source=args.scale_source or SCALE_SOURCE,
        device=args.device,
        case_timeout=args.case_timeout,
        sequential=not args.no_sequential,
        progress=_say,
    )
    print((Path(args.out) / "suite.md").read_text(), end="")
    failed = [c["id"] for c in doc["cases"] if c["status"] == "failed"]
    return 1 if failed else 0


def cmd_bench_eval(args) -> int:
    import torch

    from ..bench.evaluation import eval_passes
    from ..errors import ConfigError
    from ..evaluation import sampled_unavailable
    from ..federation.engine import FederatedRun
    from .common import say
    from .run.args import config_from_args
    from .run.federated import build_backbone

    is_recbole = _is_recbole(args.backbone)
    protocols = _bench_protocols(args.protocols)
    data = load_for_run(args)[0]
    why_not = sampled_unavailable(data, split=args.eval_split) if "sampled" in protocols else None
    if why_not is not None and args.protocols is not None:
        raise ConfigError("--protocols sampled", why_not, "time the full protocol alone: --protocols full")
    if why_not is not None:
        say(f"bench eval: the sampled protocol is left out: {why_not}")
        protocols.remove("sampled")
    cfg = config_from_args(args)
    run = FederatedRun(data, build_backbone(args, data, cfg.dim, is_recbole), cfg, progress=False)
    say(
        f"bench eval: training {args.train_rounds} round(s) of {run.bb.name} on {data.name} "
        f"({data.n_users:,} users, {data.n_items:,} items), then timing {', '.join(protocols)} on {args.eval_split} "
        f"({torch.get_num_threads()} torch threads)"
    )
    for _ in range(args.train_rounds):
        run.run_round()
    rows = eval_passes(
        run,
        args.eval_split,
        protocols,
        args.check,
        say=lambda line: print(line, file=sys.stderr if args.json else sys.stdout, flush=True),
    )
    if args.json:
        print(
            json.dumps(
                {
                    "data": data.name,
                    "model": run.bb.name,
                    "users": int(data.n_users),
                    "items": int(data.n_items),
                    "train_rounds": args.train_rounds,
                    "threads": torch.get_num_threads(),
                    "passes": rows,
                }
            )
        )
    return 0 if all(row.get("same_figures", True) for row in rows) else 1


def _is_recbole(backbone: str) -> bool:
    """Whether ``--backbone`` names a RecBole model; anything but one of those or a federated backbone is an
    error."""
    from ..errors import ConfigError
    from ..federation.config import FEDERATED_BACKBONES

    is_recbole = backbone.startswith("recbole:")
    if backbone not in FEDERATED_BACKBONES and not is_recbole:
        raise ConfigError(
            f"--backbone {backbone}",
            "unknown backbone",
            f"choose from {', '.join(FEDERATED_BACKBONES)} or recbole:<Model>",
        )
    return is_recbole


def _bench_protocols(flag: str | None) -> list[str]:
    from ..bench.evaluation import PROTOCOLS
    from ..errors import ConfigError

    if flag is None:
        return list(PROTOCOLS)
    protocols = [x.strip() for x in flag.split(",") if x.strip()]
    unknown = sorted(set(protocols) - set(PROTOCOLS))
    if unknown or not protocols:
        raise ConfigError(
            f"--protocols {flag}",
            f"unknown protocol {', '.join(unknown) or '(none)'}",
            f"choose from {', '.join(PROTOCOLS)}",
        )
    return protocols


def cmd_bench_round(args) -> int:
    from ..federation.simulation.round_timing import bench_round, format_bench
    from .run.args import config_from_args
    from .run.federated import build_backbone

    is_recbole = _is_recbole(args.backbone)
    data = load_for_run(args)[0]
    cfg = config_from_args(args)
    backbone = build_backbone(args, data, cfg.dim, is_recbole)
    res = bench_round(
        data, backbone, cfg, sequential=not args.no_sequential, repeats=args.repeats, rounds=args.timed_rounds
    )
    print(format_bench(res), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res))
    return 0
