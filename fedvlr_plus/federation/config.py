"""Every knob of a federated run, with the paper's defaults where it states them (docs/method.md, "The paper"); the
flags are in fedvlr_plus.cli."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from ..backbones import FEDERATED_BACKBONES  # noqa: F401  (named with the engine's other choices)

#: aggregation strategies (fedvlr_plus.federation.make_strategy), named here so that building the CLI does not
#: import torch
STRATEGIES = ("fedavg", "sparse-avg", "fedgrad", "median", "trimmed-mean")
PRIVATE_STORES = ("auto", "memory", "file", "disk")
COMPACT_STORES = ("memory", "file")  # one table per parameter over all clients, in memory or in files
#: where a run with a folder can also log its rounds as they happen (fedvlr_plus.federation.runs.round_log)
ROUND_LOGS = ("tensorboard", "csv")

#: config fields that may differ between a checkpoint and the run that resumes it (they do not change numbers
#: already computed: more rounds or patience extend a run; the simulator, chunking and device change speed, and the
#: order of float sums in the rounds still to train, which can move their figures in the last digits). The
#: metrics, cut-offs and test masking are not among them: the saved history and test figures were computed with
#: the old ones, and a resumed run would mix the two.
RESUMABLE_CHANGES = {
    "rounds",
    "patience",
    "simulator",
    "chunk_floats",
    "seeds",
    "checkpoint_every",
    "device",
    "test_both_protocols",
    "jobs",
    "log",
}


def _failed(config, checks) -> None:
    for ok, msg in checks:
        if not ok:
            raise ValueError(f"{type(config).__name__}: {msg}")


@dataclass
class TrainingConfig:
    """What each client does in a round. ``None``: the backbone's default (see the run's ``resolved``)."""

    rounds: int = 100
    local_epochs: int | None = None  # None: the backbone's (5; RecBole models 1)
    batch_size: int = 2048  # positives per mini-batch (each brings its negatives)
    negatives: int = 1  # negatives per positive, re-drawn every local epoch
    dim: int = 64  # latent size
    lr: float | None = None  # client SGD learning rate
    item_lr_scale: float | None = None  # item-table rows learn at lr * item_lr_scale
    weight_decay: float = 0.0  # decoupled L2 decay on every parameter a step trains (item rows: used rows)
    lr_decay: float = 1.0  # client lr multiplied by this every round (FedRAP's release used 0.9)

    def _checks(self):
        return [
            (self.rounds >= 1, "rounds must be >= 1"),
            (self.local_epochs is None or self.local_epochs >= 1, "local_epochs must be >= 1"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.negatives >= 0, "negatives must be >= 0"),
            (self.dim >= 1, "dim must be >= 1"),
            (self.lr is None or self.lr > 0, "lr must be positive"),
            (self.item_lr_scale is None or self.item_lr_scale > 0, "item_lr_scale must be positive"),
            (self.weight_decay >= 0, "weight_decay must be >= 0"),
            (0 < self.lr_decay <= 1, "lr_decay must be in (0, 1]"),
        ]


@dataclass
class AggregationConfig:
    """Who takes part in a round and how the server combines their uploads."""

    strategy: str | None = None  # fedavg | sparse-avg | fedgrad | median | trimmed-mean
    server_lr: float | None = None  # fedgrad only; None: the backbone's (1.0; FCF: client lr x clients)
    server_optimizer: str | None = None  # fedgrad only: sgd (Algorithm 1) | adam; None: the backbone's (sgd)
    trim_fraction: float = 0.1  # trimmed-mean only
    clients_per_round: float | None = None  # None: all; 0 < x < 1: fraction; integer >= 1: count
    local_shared: bool = False  # fedgrad: clients also step their copy of the shared parts (pseudo-grads)

    def _checks(self):
        return [
            (self.strategy is None or self.strategy in STRATEGIES, f"strategy must be one of {', '.join(STRATEGIES)}"),
            (self.server_lr is None or self.server_lr > 0, "server_lr must be positive"),
            (self.server_optimizer in (None, "sgd", "adam"), "server_optimizer must be sgd or adam"),
            (0 <= self.trim_fraction < 0.5, "trim_fraction must be in [0, 0.5)"),
            (self.clients_per_round is None or self.clients_per_round > 0, "clients_per_round must be positive"),
        ]


@dataclass
class EvaluationConfig:
    """How rounds are evaluated and the run selected (on validation only; test is read at the selected round)."""

    patience: int = 20  # evaluated rounds without a validation improvement before stopping
    valid_metric: str = "hr@50"
    valid_protocol: str = "full"  # protocol of the validation metric: full | sampled
    eval_every: int = 1
    ks: tuple = (10, 20, 50)
    metrics: tuple = ("hr", "ndcg")  # computed at every evaluation (hr, ndcg, recall, mrr)
    mask_history: str = "train"  # full protocol at test: mask train (FedVLR) or all earlier splits (RecBole)
    #: also report test under the protocol validation does not use (sampled beside full): a second test pass
    test_both_protocols: bool = False

    def _checks(self):
        return [
            (self.patience >= 1, "patience must be >= 1"),
            (self.eval_every >= 1, "eval_every must be >= 1"),
            (len(self.ks) > 0 and min(self.ks) >= 1, "ks must be positive integers"),
            (self.valid_protocol in ("full", "sampled"), "valid_protocol must be full or sampled"),
            (self.mask_history in ("train", "all", "none"), "mask_history must be train, all or none"),
            (
                len(self.metrics) > 0 and set(self.metrics) <= {"hr", "ndcg", "recall", "mrr"},
                "metrics must be among hr, ndcg, recall, mrr",
            ),
        ]

    def _add_valid_metric(self) -> None:
        """The validation metric is always computed: its K and name join ``ks`` and ``metrics``."""
        if "@" not in self.valid_metric:
            raise ValueError(f"{type(self).__name__}: valid_metric looks like 'hr@50', got {self.valid_metric!r}")
        name, k = self.valid_metric.split("@", 1)
        k = int(k)
        if k not in self.ks:
            self.ks = tuple(sorted(set(self.ks) | {k}))
        if name not in self.metrics:
            self.metrics = tuple(self.metrics) + (name,)


@dataclass
class RuntimeConfig:
    """Seeds and where and how the run computes; none of it changes a number but the seeds."""

    seed: int = 0
    seeds: int = 1  # run seeds seed, seed+1, ..., seed+seeds-1
    simulator: str = "batched"  # batched | sequential (the plain reference)
    private_store: str = "auto"  # auto (file for large populations) | memory | file (tables in $TMPDIR) | disk
    checkpoint_every: int | None = None  # rounds between checkpoints (also at the end); None: auto (5% of the time)
    chunk_floats: int = 1 << 24  # memory bound of one batched chunk, in floats
    device: str = "cpu"  # where the batched simulator trains and scores: cpu | cuda | auto
    jobs: int | None = None  # seeds side by side in worker processes (None: as the cores allow; 1: one by one)
    log: tuple = ()  # per-round logs written into the run folder as it trains: tensorboard, csv (none: off)

    def _checks(self):
        return [
            (self.seeds >= 1, "seeds must be >= 1"),
            (self.jobs is None or self.jobs >= 1, "jobs must be >= 1"),
            (self.simulator in ("batched", "sequential"), "simulator must be batched or sequential"),
            (self.private_store in PRIVATE_STORES, f"private_store must be one of {', '.join(PRIVATE_STORES)}"),
            (self.checkpoint_every is None or self.checkpoint_every >= 1, "checkpoint_every must be >= 1 or None"),
            (self.chunk_floats >= 1024, "chunk_floats must be >= 1024"),
            (self.device in ("cpu", "cuda", "auto"), "device must be cpu, cuda or auto"),
            (set(self.log) <= set(ROUND_LOGS), f"log must be among {', '.join(ROUND_LOGS)}"),
        ]


@dataclass
class PrivacyConfig:
    """What protects the uploads (docs/privacy.md): clipping and noise with an accounted budget, padding."""

    upload_noise: float = 0.0  # noise multiplier sigma of the clipped uploads (0: off)
    upload_clip: float = 0.0  # L2 clip C of each client's upload (0: off; 1.0 when noise is on)
    target_epsilon: float | None = None  # pick upload_noise so the run's accounted epsilon is this (docs/privacy.md)
    dp_delta: float | None = None  # delta of the accounted (epsilon, delta); None: 1 / clients^1.1
    pad_uploads: int = 0  # item-table uploads padded with decoy rows to this many rows (0: off; -1: all)

    def _checks(self):
        return [
            (self.upload_noise >= 0 and self.upload_clip >= 0, "upload_noise and upload_clip must be >= 0"),
            (self.target_epsilon is None or self.target_epsilon > 0, "target_epsilon must be positive"),
            (
                self.target_epsilon is None or self.upload_noise == 0,
                "give upload_noise or target_epsilon, not both (target_epsilon picks the noise)",
            ),
            (self.dp_delta is None or 0 < self.dp_delta < 1, "dp_delta must be in (0, 1)"),
            (self.pad_uploads >= -1, "pad_uploads must be >= 0, or -1 for every item"),
        ]


#: the concerns a run's settings are split into, in the order FedConfig lists their fields
CONCERNS = {
    "training": TrainingConfig,
    "aggregation": AggregationConfig,
    "evaluation": EvaluationConfig,
    "runtime": RuntimeConfig,
    "privacy": PrivacyConfig,
}


# dataclasses collect inherited fields from the last base to the first, so the bases are listed in reverse
@dataclass
class FedConfig(PrivacyConfig, RuntimeConfig, EvaluationConfig, AggregationConfig, TrainingConfig):
    """A federated run: every concern's settings in one flat record (``cfg.lr``, ``cfg.strategy``, ...).
    ``cfg.part("training")`` gives one concern as its own typed record, for code that needs only that one.
    A backbone's own options (FedRAP's penalties) are not here: the backbone declares them
    (:attr:`~fedvlr_plus.adapters.Backbone.options_type`)."""

    def __post_init__(self):
        self.ks = tuple(int(k) for k in self.ks)
        self.metrics = tuple(str(m) for m in self.metrics)
        self.log = tuple(str(s) for s in self.log)
        for concern in CONCERNS.values():
            _failed(self, concern._checks(self))
        self._add_valid_metric()

    def part(self, concern: str):
        """The settings of one concern (``training``, ``aggregation``, ``evaluation``, ``runtime``, ``privacy``)
        as that concern's own dataclass."""
        cls = CONCERNS[concern]
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ks"] = list(self.ks)
        d["metrics"] = list(self.metrics)
        d["log"] = list(self.log)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> FedConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"FedConfig: unknown fields {sorted(unknown)}")
        return cls(**d)


def config_from_options(options, **overrides) -> FedConfig:
    """FedConfig from ``options`` (a mapping, or an object whose attributes are the options: the fields it lacks or
    sets to None keep their defaults), then ``overrides``."""
    names = {f.name for f in fields(FedConfig)}
    given = options if isinstance(options, Mapping) else vars(options)
    values = {k: v for k, v in given.items() if k in names and v is not None}
    if isinstance(values.get("metrics"), str):  # the main CLI's "hr@10,ndcg@50" string, not metric names
        values.pop("metrics")
    values.update(overrides)
    return FedConfig(**values)
