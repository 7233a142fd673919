"""The federated engine's command-line flags (shared by ``run``, ``experiment``, ``coldstart`` and ``bench``) and
the :class:`~fedvlr_plus.federation.config.FedConfig` they build."""
from __future__ import annotations

import argparse

from ...errors import ConfigError
from ...federation.config import (
    FEDERATED_BACKBONES,
    PRIVATE_STORES,
    ROUND_LOGS,
    STRATEGIES,
    FedConfig,
    config_from_options,
)
from ..argtypes import (
    bounded,
    clients_per_round,
    every_or_auto,
    int_list,
    non_negative_float,
    non_negative_int,
    one_metric,
    positive_float,
    positive_int,
)


class _SkipExisting:
    """An argument group that leaves out flags the parser already has (e.g. the CLI's own --seed, --out) and
    flags that do not apply to the command (``skip``)."""

    def __init__(self, parser, group, skip=frozenset()):
        self.parser, self.group, self.skip = parser, group, skip

    def add_argument(self, *flags, **kw):
        if any(f in self.skip for f in flags if f.startswith("-")):
            return None
        try:
            return self.group.add_argument(*flags, **kw)
        except argparse.ArgumentError:  # a conflicting option string: the command defines this flag itself
            return None


#: the FedRAP backbone's own options: only the commands that build that backbone from the flags take them
_FEDRAP_FLAGS = frozenset({"--fedrap-lambda", "--fedrap-mu"})
#: flags of add_run_arguments that a command leaves out because they mean nothing there
_NOT_FOR = {
    "run": frozenset(),
    "experiment": frozenset({"--recbole-config", "--evaluator"}),
    "coldstart": frozenset({"--recbole-config", "--evaluator"}),
    "privacy": frozenset({"--recbole-config", "--evaluator"}),
    "leakage": frozenset({"--recbole-config", "--evaluator"}),
    "poisoning": frozenset({"--resume", "--recbole-config", "--evaluator"}),
    # experiment planted / view-routing: every row sets its own aggregation
    "routing": frozenset({"--recbole-config", "--evaluator", "--strategy", "--checkpoint-every"}),
    # bench round times one round of every client in memory: no evaluation, stopping, seeds or checkpoints
    "bench": frozenset({"--resume", "--recbole-config", "--evaluator", "--rounds", "--patience", "--valid-metric",
                        "--eval-every", "--ks", "--seeds", "--checkpoint-every", "--clients-per-round",
                        "--private-store", "--simulator", "--no-progress", "--jobs"}),
}
#: flags only ``run`` takes: the other commands train without a run folder of their own to log into
_RUN_ONLY = frozenset({"--log"})


def add_run_arguments(parser: argparse.ArgumentParser, *, include_io: bool = False,
                      command: str = "run") -> argparse.ArgumentParser:
    """Add the federated engine's flags (and --resume). ``include_io`` also adds --backbone, --out, --json.
    ``command`` (run, experiment, coldstart, bench) leaves out the flags that do not apply to it.
    Flags the parser already defines are left as they are."""
    skip = _NOT_FOR[command] | (_RUN_ONLY if command != "run" else frozenset())
    only = " (federated backbones only)" if command == "run" else ""

    def group(title):
        return _SkipExisting(parser, parser.add_argument_group(title + only), skip)

    g = group("federated training")
    g.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the (interrupted) federated run in RUN_DIR; finished seeds are read back")
    if include_io:
        g.add_argument("--backbone", required=True, choices=FEDERATED_BACKBONES, help="federated backbone")
        g.add_argument("--out", metavar="RUN_DIR", default=None,
                       help="checkpoint into RUN_DIR (as --checkpoint-every says)")
        g.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_length_arguments(g)
    _add_optimiser_arguments(group("optimisation and aggregation"))
    _add_schedule_arguments(group("simulation and checkpoints"), parser)
    _add_privacy_arguments(group("upload privacy"))
    return parser


def _add_length_arguments(g) -> None:
    d = FedConfig()
    g.add_argument("--rounds", type=positive_int, default=d.rounds, help="maximum number of rounds")
    g.add_argument("--local-epochs", type=positive_int, default=d.local_epochs,
                   help="local epochs per round (default: the backbone's, 5; RecBole models 1)")
    g.add_argument("--batch-size", type=positive_int, default=d.batch_size, help="positives per local mini-batch")
    g.add_argument("--negatives", type=non_negative_int, default=d.negatives, help="sampled negatives per positive")
    g.add_argument("--dim", type=positive_int, default=d.dim, help="latent size")
    g.add_argument("--clients-per-round", type=clients_per_round, default=None, metavar="C",
                   help="fraction (0.1) or count (50) of clients sampled per round (default: all)")
    g.add_argument("--patience", type=positive_int, default=d.patience,
                   help="early stopping: evaluations without a validation improvement")
    g.add_argument("--valid-metric", type=one_metric, default=d.valid_metric, help="model-selection metric on valid")
    g.add_argument("--eval-every", type=positive_int, default=d.eval_every, help="evaluate on valid every N rounds")
    g.add_argument("--seed", type=non_negative_int, default=d.seed, help="first seed")
    g.add_argument("--seeds", type=positive_int, default=d.seeds, help="number of seeds (seed, seed+1, ...)")


def _add_optimiser_arguments(g) -> None:
    d = FedConfig()
    g.add_argument("--lr", type=positive_float, default=None, help="client learning rate (default: the backbone's)")
    g.add_argument("--item-lr-scale", type=positive_float, default=None,
                   help="item-table rows learn at lr x this (default: the backbone's)")
    g.add_argument("--weight-decay", type=non_negative_float, default=None,
                   help=f"L2 decay (default {d.weight_decay:g}; with --tune a RecBole model's grid also tries "
                        "1e-4 behind the gated layer unless this fixes it)")
    g.add_argument("--lr-decay", type=bounded(float, 0, 1, low_open=True, name="lr_decay"), default=d.lr_decay,
                   help="client lr factor per round, in (0, 1]")
    g.add_argument("--strategy", choices=STRATEGIES, default=None, help="aggregation (default: the backbone's)")
    g.add_argument("--server-lr", type=positive_float, default=None,
                   help="fedgrad server learning rate (default: the backbone's; 1.0 on the averaged gradient, "
                        "FCF: client lr x clients, recbole:<Model>: 0.05)")
    g.add_argument("--server-optimizer", choices=("sgd", "adam"), default=None,
                   help="fedgrad server optimizer: sgd (FedVLR Algorithm 1) or adam (default: the backbone's; "
                        "sgd except recbole:<Model>, adam)")
    g.add_argument("--trim-fraction", type=bounded(float, 0, 0.5, high_open=True, name="trim_fraction"),
                   default=d.trim_fraction, help="trimmed-mean: share cut per side, in [0, 0.5)")
    g.add_argument("--local-shared", action="store_true", default=None,
                   help="fedgrad: clients also update their copy of the shared parts during local training, so "
                        "the uploaded gradient sum follows their own trajectory (FedOpt-style pseudo-gradient); "
                        "default off, as in the FedVLR paper's Algorithm 1")
    # the FedRAP backbone's own options (FedRAPOptions): None leaves the backbone's defaults
    g.add_argument("--fedrap-lambda", type=non_negative_float, default=None,
                   help="FedRAP: base weight of the -||A - C||^2 term (curriculum tanh(t/10) * lambda; "
                        "default: the backbone's, 1e-4)")
    g.add_argument("--fedrap-mu", type=non_negative_float, default=None,
                   help="FedRAP: base weight of the L1 sparsity term on C (curriculum tanh(t/10) * mu; "
                        "default: the backbone's, 1e-2)")
    g.add_argument("--recbole-config", metavar="FILE.yaml", default=None,
                   help="RecBole YAML (model hyper-parameters such as embedding_size) for a recbole:<Model> "
                        "backbone; data and device keys are set by fedvlr-plus")
    g.add_argument("--evaluator", choices=("ours", "recbole"), default="ours",
                   help="recbole: also score the selected round with RecBole's own evaluator (its Collector "
                        "and metric classes, same masked scores) and report it as test_recbole")


def _add_schedule_arguments(g, parser) -> None:
    d = FedConfig()
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    if parser.get_default("metrics") is None:  # the main CLI's --metrics already sets the cut-offs
        g.add_argument("--ks", type=int_list(1, "ks"), default=d.ks, help="cut-offs, comma-separated")
    g.add_argument("--simulator", choices=("batched", "sequential"), default=d.simulator,
                   help="batched (all clients of a round as stacked tensors, default) or sequential (the plain "
                        "one-client-at-a-time reference; same numbers, slower)")
    g.add_argument("--private-store", choices=PRIVATE_STORES, default=d.private_store,
                   help="where clients keep their private state between rounds: auto (default: file once the "
                        "population's states reach 1 GiB and $TMPDIR is on a disk with room, else memory); memory; "
                        "file (the same tables in files under $TMPDIR, read a chunk at a time, so memory grows with "
                        "a chunk, not with the population; the same numbers); disk (one file per client under "
                        "RUN_DIR/seed-<s>/private)")
    g.add_argument("--checkpoint-every", type=every_or_auto, default=d.checkpoint_every, metavar="N|auto",
                   help="write the run's checkpoint every N rounds and at the end; auto (default): after the first "
                        "round, then as often as keeps writing checkpoints near 5%% of the run's time (every round "
                        "where a checkpoint is small beside a round; a checkpoint holds every client's private "
                        "state). A resumed run repeats the rounds after the last checkpoint with the same numbers "
                        "(all randomness is keyed by round). --private-store disk checkpoints every round")
    g.add_argument("--device", choices=("cpu", "cuda", "auto"), default=d.device,
                   help="where the batched simulator trains and scores each chunk of clients: cpu (default), cuda, "
                        "or auto (cuda where there is one); results come back to the CPU")
    g.add_argument("--chunk-floats", type=bounded(int, 1024, name="chunk_floats"), default=d.chunk_floats,
                   help="memory bound of a batched chunk, in floats (>= 1024); another size sums in another "
                        "order, so figures can move in their last digits")
    g.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                   help="seeds (and --tune's recipes) trained side by side in N worker processes (default: one "
                        "per core, and up to twice as many where that keeps every core busy to the end: 3 seeds on "
                        "2 cores train in 3 workers; 1: one after another); the same figures")
    g.add_argument("--log", type=_round_logs, default=(), metavar="tensorboard,csv",
                   help="also log every round as it trains (loss, validation figures, round time; with the FedVLR "
                        "layer the router's mean weights and entropy) into the run folder: tensorboard "
                        "(RUN_DIR/tensorboard/seed-<s>/, for tensorboard --logdir), csv (RUN_DIR/rounds/seed-<s>.csv) "
                        "or both; needs --out (default: off)")


def _add_privacy_arguments(g) -> None:
    d = FedConfig()
    g.add_argument("--upload-noise", type=non_negative_float, default=d.upload_noise, metavar="SIGMA",
                   help="privacy experiment: clip each client's upload to L2 norm --upload-clip and add Gaussian "
                        "noise N(0, (SIGMA*clip)^2) on the client before it is sent (default 0: off)")
    g.add_argument("--upload-clip", type=non_negative_float, default=None, metavar="C",
                   help="L2 clip of each client's upload (gradients, or parameter change); default 1.0 when "
                        "--upload-noise is set, else off")
    g.add_argument("--target-epsilon", type=positive_float, default=None, metavar="EPS",
                   help="pick the noise multiplier so that the run's client-level epsilon (RDP accountant, "
                        "--rounds rounds, the clients per round, --dp-delta) is EPS; not with --upload-noise")
    g.add_argument("--dp-delta", type=bounded(float, 0, 1, low_open=True, high_open=True, name="dp_delta"),
                   default=None, metavar="DELTA", help="delta of the accounted (epsilon, delta) "
                   "(default 1 / clients^1.1)")
    g.add_argument("--pad-uploads", type=_pad_rows, default=0, metavar="K|all",
                   help="pad every item-table upload with decoy rows (items the client did not touch, zero "
                        "change) to exactly K rows, or to the whole catalogue with 'all' (a dense upload), so "
                        "its size and row ids no longer tell which items the client trained on (default 0: off)")


def _round_logs(text: str) -> tuple:
    """``tensorboard``, ``csv`` or both, comma-separated."""
    names = tuple(dict.fromkeys(x.strip().lower() for x in text.split(",") if x.strip()))
    if not names or not set(names) <= set(ROUND_LOGS):
        raise argparse.ArgumentTypeError(f"expected {' or '.join(ROUND_LOGS)} (or both, comma-separated), got {text!r}")
    return names


def _pad_rows(text: str) -> int:
    """``all`` (every item, stored as -1, which a run folder's config.toml gives back) or a row count >= 0."""
    if text.strip().lower() in ("all", "-1"):
        return -1
    return non_negative_int(text)


def config_from_args(args: argparse.Namespace, **overrides) -> FedConfig:
    """FedConfig from parsed flags (fields the namespace lacks keep their defaults), then ``overrides``."""
    if getattr(args, "target_epsilon", None) is not None and (getattr(args, "upload_noise", 0) or 0) > 0:
        raise ConfigError("--target-epsilon", "cannot be combined with --upload-noise (it picks the noise itself)",
                          "pass one of them")
    return config_from_options(args, **overrides)
