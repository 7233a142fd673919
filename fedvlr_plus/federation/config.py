"""Every knob of a federated run, with defaults from fedvlr-method.md §4, and its command-line flags."""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields

from ..argtypes import (bounded, int_list, non_negative_float, non_negative_int, one_metric, positive_float,
                        positive_int)

#: aggregation strategies (fedvlr_plus.federation.make_strategy) and federated backbones
#: (fedvlr_plus.adapters.BACKBONES), named here so that building the CLI does not import torch
STRATEGIES = ("fedavg", "sparse-avg", "fedgrad", "median", "trimmed-mean")
FEDERATED_BACKBONES = ("fcf", "fedavg", "fedncf", "fedrap", "pfedrec")

#: config fields that may differ between a checkpoint and the run that resumes it (they do not change numbers
#: already computed: more rounds or patience extend a run; the simulator and chunking only change speed). The
#: metrics, cut-offs and test masking are not among them: the saved history and test figures were computed with
#: the old ones, and a resumed run would mix the two.
RESUMABLE_CHANGES = {"rounds", "patience", "simulator", "chunk_floats", "seeds", "checkpoint_every"}


@dataclass
class FedConfig:
    """A federated run. ``None`` means "the backbone's default" (see ``resolved``)."""

    rounds: int = 100
    local_epochs: int | None = None   # None: the backbone's (5; RecBole models 1)
    batch_size: int = 2048            # positives per mini-batch (each brings its negatives)
    negatives: int = 1                # negatives per positive, re-drawn every local epoch
    dim: int = 64                     # latent size
    lr: float | None = None           # client SGD learning rate
    item_lr_scale: float | None = None  # item-table rows learn at lr * item_lr_scale
    weight_decay: float = 0.0         # decoupled L2 decay on every parameter a step trains (item rows: used rows)
    lr_decay: float = 1.0             # client lr multiplied by this every round (FedRAP's release used 0.9)
    strategy: str | None = None       # fedavg | sparse-avg | fedgrad | median | trimmed-mean
    server_lr: float | None = None    # fedgrad only; None: client lr x clients in the round (FCF's sum rule)
    server_optimizer: str | None = None  # fedgrad only: sgd (Algorithm 1) | adam; None: the backbone's (sgd)
    trim_fraction: float = 0.1        # trimmed-mean only
    clients_per_round: float | None = None  # None: all; 0 < x < 1: fraction; integer >= 1: count
    patience: int = 20                # evaluated rounds without a validation improvement before stopping
    valid_metric: str = "hr@50"
    valid_protocol: str = "full"      # protocol of the validation metric: full | sampled
    eval_every: int = 1
    ks: tuple = (10, 20, 50)
    metrics: tuple = ("hr", "ndcg")   # computed at every evaluation (hr, ndcg, recall, mrr)
    mask_history: str = "train"       # full protocol at test: mask train (FedVLR) or all earlier splits (RecBole)
    seed: int = 0
    seeds: int = 1                    # run seeds seed, seed+1, ..., seed+seeds-1
    simulator: str = "batched"        # batched | sequential (the plain reference)
    private_store: str = "memory"     # memory | disk (under RUN_DIR/seed-<s>/private)
    checkpoint_every: int = 1         # rounds between checkpoints (also at every evaluation and at the end)
    chunk_floats: int = 1 << 24       # memory bound of one batched chunk, in floats
    fedrap_lambda: float = 1e-4
    local_shared: bool = False        # fedgrad: clients also step their copy of the shared parts (pseudo-grads)
    upload_noise: float = 0.0         # noise multiplier sigma of the clipped uploads (0: off)
    upload_clip: float = 0.0          # L2 clip C of each client's upload (0: off; 1.0 when noise is on)
    fedrap_mu: float = 1e-2

    def __post_init__(self):
        self.ks = tuple(int(k) for k in self.ks)
        self.metrics = tuple(str(m) for m in self.metrics)
        checks = [
            (self.rounds >= 1, "rounds must be >= 1"),
            (self.local_epochs is None or self.local_epochs >= 1, "local_epochs must be >= 1"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.negatives >= 0, "negatives must be >= 0"),
            (self.dim >= 1, "dim must be >= 1"),
            (self.lr is None or self.lr > 0, "lr must be positive"),
            (self.item_lr_scale is None or self.item_lr_scale > 0, "item_lr_scale must be positive"),
            (self.weight_decay >= 0, "weight_decay must be >= 0"),
            (0 < self.lr_decay <= 1, "lr_decay must be in (0, 1]"),
            (self.strategy is None or self.strategy in STRATEGIES,
             f"strategy must be one of {', '.join(STRATEGIES)}"),
            (self.server_lr is None or self.server_lr > 0, "server_lr must be positive"),
            (self.server_optimizer in (None, "sgd", "adam"), "server_optimizer must be sgd or adam"),
            (0 <= self.trim_fraction < 0.5, "trim_fraction must be in [0, 0.5)"),
            (self.clients_per_round is None or self.clients_per_round > 0, "clients_per_round must be positive"),
            (self.patience >= 1, "patience must be >= 1"),
            (self.eval_every >= 1, "eval_every must be >= 1"),
            (self.seeds >= 1, "seeds must be >= 1"),
            (self.simulator in ("batched", "sequential"), "simulator must be batched or sequential"),
            (self.private_store in ("memory", "disk"), "private_store must be memory or disk"),
            (self.checkpoint_every >= 1, "checkpoint_every must be >= 1"),
            (self.chunk_floats >= 1024, "chunk_floats must be >= 1024"),
            (self.upload_noise >= 0 and self.upload_clip >= 0, "upload_noise and upload_clip must be >= 0"),
            (len(self.ks) > 0 and min(self.ks) >= 1, "ks must be positive integers"),
            (self.valid_protocol in ("full", "sampled"), "valid_protocol must be full or sampled"),
            (self.mask_history in ("train", "all", "none"), "mask_history must be train, all or none"),
            (len(self.metrics) > 0 and set(self.metrics) <= {"hr", "ndcg", "recall", "mrr"},
             "metrics must be among hr, ndcg, recall, mrr"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"FedConfig: {msg}")
        if "@" not in self.valid_metric:
            raise ValueError(f"FedConfig: valid_metric looks like 'hr@50', got {self.valid_metric!r}")
        name, k = self.valid_metric.split("@", 1)
        k = int(k)
        if k not in self.ks:
            self.ks = tuple(sorted(set(self.ks) | {k}))
        if name not in self.metrics:
            self.metrics = tuple(self.metrics) + (name,)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ks"] = list(self.ks)
        d["metrics"] = list(self.metrics)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "FedConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"FedConfig: unknown fields {sorted(unknown)}")
        return cls(**d)


def _clients_arg(text: str) -> float:
    """``0.1`` = a fraction of the clients; ``50`` = a count (``1`` is one client, ``1.0`` all of them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.1 or a count like 50, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    if "." in text or "e" in text.lower():
        if value > 1:
            raise argparse.ArgumentTypeError("a fractional value must be in (0, 1]; give a count as an integer")
        return value
    return int(value)


class _SkipExisting:
    """An argument group that leaves out flags the parser already has (e.g. the CLI's own --seed, --out) and
    flags that do not apply to the command (``skip``)."""

    def __init__(self, parser, group, skip=frozenset()):
        self.parser, self.group, self.skip = parser, group, skip

    def add_argument(self, *flags, **kw):
        if any(f in self.parser._option_string_actions or f in self.skip for f in flags if f.startswith("-")):
            return None
        return self.group.add_argument(*flags, **kw)


#: flags of add_run_arguments that a command leaves out because they mean nothing there
_NOT_FOR = {
    "run": frozenset(),
    "experiment": frozenset({"--recbole-config", "--evaluator"}),
    "coldstart": frozenset({"--resume", "--recbole-config", "--evaluator"}),
    # bench round times one round of every client in memory: no evaluation, stopping, seeds or checkpoints
    "bench": frozenset({"--resume", "--recbole-config", "--evaluator", "--rounds", "--patience", "--valid-metric",
                        "--eval-every", "--ks", "--seeds", "--checkpoint-every", "--clients-per-round",
                        "--private-store", "--simulator", "--no-progress"}),
}


def add_run_arguments(parser: argparse.ArgumentParser, *, include_io: bool = False,
                      command: str = "run") -> argparse.ArgumentParser:
    """Add the federated engine's flags (and --resume). ``include_io`` also adds --backbone, --out, --json.
    ``command`` (run, experiment, coldstart, bench) leaves out the flags that do not apply to it.
    Flags the parser already defines are left as they are."""
    skip = _NOT_FOR[command]
    only = " (federated backbones only)" if command == "run" else ""

    def group(title):
        return _SkipExisting(parser, parser.add_argument_group(title + only), skip)

    g = group("federated training")
    g.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the (interrupted) federated run in RUN_DIR; finished seeds are read back")
    if include_io:
        g.add_argument("--backbone", required=True, choices=FEDERATED_BACKBONES, help="federated backbone")
        g.add_argument("--out", metavar="RUN_DIR", default=None,
                       help="checkpoint into RUN_DIR (every round, or as --checkpoint-every says)")
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
    g.add_argument("--clients-per-round", type=_clients_arg, default=None, metavar="C",
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
    g.add_argument("--weight-decay", type=non_negative_float, default=d.weight_decay, help="L2 decay")
    g.add_argument("--lr-decay", type=bounded(float, 0, 1, low_open=True, name="lr_decay"), default=d.lr_decay,
                   help="client lr factor per round, in (0, 1]")
    g.add_argument("--strategy", choices=STRATEGIES, default=None, help="aggregation (default: the backbone's)")
    g.add_argument("--server-lr", type=positive_float, default=None,
                   help="fedgrad server learning rate (default: client lr x clients per round)")
    g.add_argument("--server-optimizer", choices=("sgd", "adam"), default=None,
                   help="fedgrad server optimizer: sgd (FedVLR Algorithm 1) or adam (default: the backbone's; "
                        "sgd except recbole:<Model>, adam)")
    g.add_argument("--trim-fraction", type=bounded(float, 0, 0.5, high_open=True, name="trim_fraction"),
                   default=d.trim_fraction, help="trimmed-mean: share cut per side, in [0, 0.5)")
    g.add_argument("--local-shared", action="store_true", default=None,
                   help="fedgrad: clients also update their copy of the shared parts during local training, so "
                        "the uploaded gradient sum follows their own trajectory (FedOpt-style pseudo-gradient); "
                        "default off, as in the FedVLR paper's Algorithm 1")
    g.add_argument("--fedrap-lambda", type=non_negative_float, default=d.fedrap_lambda,
                   help="FedRAP: base weight of the -||A - C||^2 term (curriculum tanh(t/10) * lambda)")
    g.add_argument("--fedrap-mu", type=non_negative_float, default=d.fedrap_mu,
                   help="FedRAP: base weight of the L1 sparsity term on C (curriculum tanh(t/10) * mu)")
    g.add_argument("--recbole-config", metavar="FILE.yaml", default=None,
                   help="RecBole YAML (model hyper-parameters such as embedding_size) for a recbole:<Model> "
                        "backbone; data and device keys are set by fedvlr-plus")
    g.add_argument("--evaluator", choices=("ours", "recbole"), default="ours",
                   help="recbole: also score the selected round with RecBole's own evaluator (its Collector "
                        "and metric classes, same masked scores) and report it as test_recbole")


def _add_schedule_arguments(g, parser) -> None:
    d = FedConfig()
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    if "--metrics" not in parser._option_string_actions:  # the main CLI's --metrics already sets the cut-offs
        g.add_argument("--ks", type=int_list(1, "ks"), default=d.ks, help="cut-offs, comma-separated")
    g.add_argument("--simulator", choices=("batched", "sequential"), default=d.simulator,
                   help="batched (all clients of a round as stacked tensors, default) or sequential (the plain "
                        "one-client-at-a-time reference; same numbers, slower)")
    g.add_argument("--private-store", choices=("memory", "disk"), default=d.private_store,
                   help="where clients keep their private state between rounds: memory (default) or disk "
                        "(one file per client under RUN_DIR/seed-<s>/private)")
    g.add_argument("--checkpoint-every", type=positive_int, default=d.checkpoint_every, metavar="N",
                   help="write the run's checkpoint every N rounds, at every evaluation and at the end (default 1); "
                        "with a memory store each checkpoint holds every client's private state, so a larger N "
                        "saves time when that is big, and a resumed run repeats at most N-1 rounds (the same "
                        "numbers: all randomness is keyed by round). --private-store disk checkpoints every round")
    g.add_argument("--chunk-floats", type=bounded(int, 1024, name="chunk_floats"), default=d.chunk_floats,
                   help="memory bound of a batched chunk, in floats (>= 1024)")


def _add_privacy_arguments(g) -> None:
    d = FedConfig()
    g.add_argument("--upload-noise", type=non_negative_float, default=d.upload_noise, metavar="SIGMA",
                   help="privacy experiment: clip each client's upload to L2 norm --upload-clip and add Gaussian "
                        "noise N(0, (SIGMA*clip)^2) on the client before it is sent (default 0: off)")
    g.add_argument("--upload-clip", type=non_negative_float, default=None, metavar="C",
                   help="L2 clip of each client's upload (gradients, or parameter change); default 1.0 when "
                        "--upload-noise is set, else off")


def config_from_args(args: argparse.Namespace, **overrides) -> FedConfig:
    """FedConfig from parsed flags (fields the namespace lacks keep their defaults), then ``overrides``."""
    names = {f.name for f in fields(FedConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    if isinstance(values.get("metrics"), str):  # the main CLI's "hr@10,ndcg@50" string, not metric names
        values.pop("metrics")
    values.update(overrides)
    return FedConfig(**values)
