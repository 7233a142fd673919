"""What several commands share: the flags that say how SOURCE is read and split, loading it as they say, and
the two output channels (the last stdout line as JSON, progress on stderr)."""

from __future__ import annotations

import argparse
import json
import sys

from ..jsonio import json_default
from ..metric_spec import DEFAULT_METRICS  # noqa: F401  (the --metrics default of every command)
from ..run_data import SPLITS
from .argtypes import non_negative_int


def emit_json(obj) -> None:
    print(json.dumps(obj, default=json_default))


def say(message: str) -> None:
    """What a long step is doing, on stderr: stdout stays the table, or with --json one JSON line."""
    print(message, file=sys.stderr, flush=True)


def continued_folder(args, what: str):
    """The folder a command keeps its report and runs in: ``--resume DIR``, which continues the runs there, or
    ``--out DIR``; both, naming different folders, is refused."""
    if args.resume and args.out and args.resume != args.out:
        from ..errors import RunFolderError

        raise RunFolderError(
            "--out",
            f"--resume {args.resume} continues the {what} in that folder; do not pass a different --out ({args.out})",
        )
    return args.resume or args.out


def say_written(args, folder, what: str, read: str | None = None) -> None:
    """The last lines of a command that keeps a folder, on stderr: what it wrote there (with the ``config.toml``
    that repeats it) and the next step; without a folder, how to keep one. ``read``: the file to open first."""
    from pathlib import Path

    from ..errors import shell_word
    from .config_file import RECORD, write_resolved_config

    if not folder:
        say(f"next: add --out DIR to keep {what}")
        return
    config = write_resolved_config(folder, args)
    say(f"wrote {folder}: {what}" + (", config.toml" if config else ""))
    steps = [f"read {Path(folder) / read}"] if read else []
    if config:
        steps.append(f"repeat it: fedvlr-plus {getattr(args, RECORD)[0]} --config {shell_word(config)} --out NEW_DIR")
    if steps:
        say("next: " + ", or ".join(steps))


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """Flags that say how SOURCE is read and split (shared by every command that trains or evaluates)."""
    g = p.add_argument_group("data")
    g.add_argument(
        "source",
        metavar="SOURCE",
        help="'ml-100k' (embedded, from the recbole wheel) or a path to a data folder/file; the format is detected",
    )
    g.add_argument(
        "--split",
        default="auto",
        choices=list(SPLITS),
        help="auto: the data's own split labels when it has them, else leave-one-out by time "
        "(last = test, second-to-last = valid)",
    )
    g.add_argument(
        "--implicit-threshold",
        type=float,
        default=None,
        metavar="R",
        help="keep only interactions with rating >= R as positives (default: all interactions)",
    )
    g.add_argument(
        "--k-core",
        type=non_negative_int,
        default=0,
        metavar="K",
        help="iterative K-core filter on users and items before splitting (default: none)",
    )


def load_for_run(args):
    """``(data, split used)``: SOURCE loaded with the requested preprocessing and split."""
    from ..run_data import load_and_split

    return load_and_split(
        args.source,
        split=args.split,
        k_core=args.k_core,
        threshold=args.implicit_threshold,
        seed=getattr(args, "seed", 0),
    )


def add_halving_argument(group, grid: str) -> None:
    """``--halving/--no-halving`` of a command with ``--tune``; ``grid``: what it cuts, as the help names it."""
    group.add_argument(
        "--halving",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=f"with --tune, cut {grid} in half on validation after an eighth, a quarter and half of --rounds "
        "(successive halving: faster, but it can stop a recipe that learns slowly and would win; runs under 16 "
        "rounds train every recipe to the end). Default: every recipe trains to the end",
    )
