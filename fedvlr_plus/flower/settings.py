"""A Flower deployment's settings: the run config (``[tool.flwr.app.config]``) read into the simulator's
:class:`~fedvlr_plus.federation.config.FedConfig`, the backbone's own options, the FedVLR layer and the deployment
knobs; and what every node and the server build from them (the data, the backbone, a node's users)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from ..federation.config import FedConfig

#: run-config keys that are not FedConfig fields
DEPLOY_KEYS = {
    "data": "",
    "max-users": 0,
    "fusion": "none",
    "router-temperature": 1.0,
    "router-balance": 0.0,
    "router-over": "auto",
    "cold-neighbours": 10,
    "min-train-nodes": 1,
    "min-evaluate-nodes": 1,
    "min-available-nodes": 1,
    "fraction-train": 1.0,
    "round-timeout": 3600.0,
    "reply-poll-interval": 0.2,
    "evaluation": "federated",
    "result": "",
    "audit-dir": "",
    "fault-partition": -1,
    "fault-round": 0,
    "fault-delay-s": 0.0,
    # secure aggregation (Flower's SecAgg+), see flower_secagg.py and docs/flower.md
    "secagg": 0,
    "secagg-num-shares": 1.0,
    "secagg-reconstruction-threshold": 0.67,
    "secagg-max-weight": 0.0,
    "secagg-clipping-range": 0.0,
    "secagg-quantization-range": 0,
}


@dataclass
class Settings:
    """A run's settings: the simulator's :class:`FedConfig` plus data, the FedVLR layer and deployment knobs."""

    cfg: FedConfig
    data: str
    max_users: int = 0
    fusion: str = "none"
    router_temperature: float = 1.0
    router_balance: float = 0.0
    router_over: str = "auto"  # what the private router weighs: auto | views | operators (as run --router-over)
    cold_neighbours: int = 10
    min_train_nodes: int = 1
    min_evaluate_nodes: int = 1
    min_available_nodes: int = 1
    fraction_train: float = 1.0
    round_timeout: float = 3600.0
    reply_poll_interval: float = 0.2  # how often the ServerApp asks the SuperLink for replies (0: Flower's 3 s)
    evaluation: str = "federated"
    result: str = ""
    audit_dir: str = ""
    fault_partition: int = -1
    fault_round: int = 0
    fault_delay_s: float = 0.0
    secagg: int = 0
    secagg_num_shares: float = 1.0
    secagg_reconstruction_threshold: float = 0.67
    secagg_max_weight: float = 0.0  # 0: the training examples of the whole dataset (no node has more)
    secagg_clipping_range: float = 0.0  # 0: from the broadcast (secure_sum.clipping_range)
    secagg_quantization_range: int = 0  # 0: the finest the round's number of nodes allows
    backbone: str = "fedavg"
    #: the backbone's own options (``fedrap-lambda``, ``fedrap-mu``); keys another backbone declares are ignored
    backbone_options: dict = field(default_factory=dict)

    @classmethod
    def from_run_config(cls, rc) -> Settings:
        """From Flower's run config (kebab-case keys; ``ks``/``metrics`` as comma-separated strings)."""
        from ..adapters import option_names

        rc = {str(k): v for k, v in dict(rc).items()}
        names = {f.name for f in fields(FedConfig)}
        fed, extra, own = {}, {}, {}
        for key, value in rc.items():
            name = key.replace("-", "_")
            if key == "backbone":
                continue
            if name in option_names():
                own[name] = float(value)
            elif name in names:
                if name in ("ks", "metrics") and isinstance(value, str):
                    value = tuple(int(x) if name == "ks" else x for x in value.split(",") if x.strip())
                if name in (
                    "lr",
                    "item_lr_scale",
                    "server_lr",
                    "strategy",
                    "clients_per_round",
                    "local_epochs",
                ) and value in ("", 0):
                    continue  # "" / 0 in a TOML file means "the backbone's default" (TOML has no null)
                fed[name] = value
            elif key in DEPLOY_KEYS:
                extra[name] = type(DEPLOY_KEYS[key])(value) if not isinstance(DEPLOY_KEYS[key], str) else str(value)
            else:
                raise ValueError(
                    f"run config: unknown key {key!r} (FedConfig fields or a backbone's own options in "
                    f"kebab case, or one of {', '.join(sorted(DEPLOY_KEYS))}, backbone)"
                )
        if fed.get("clients_per_round") not in (None, 1.0):
            raise ValueError(
                "run config: clients-per-round is a simulator setting; under Flower every user of a "
                "sampled node trains (sample nodes with fraction-train)"
            )
        if not extra.get("data"):
            raise ValueError("run config: 'data' (the dataset path, or ml-100k) is required")
        if extra.get("evaluation", "federated") not in ("federated", "server"):
            raise ValueError("run config: evaluation must be 'federated' or 'server'")
        if extra.get("secagg") and int(extra.get("min_train_nodes", 1)) < 2:
            raise ValueError(
                "run config: secagg needs at least 2 nodes per round (min-train-nodes >= 2): a secure "
                "sum of one node is that node's upload"
            )
        return cls(cfg=FedConfig(**fed), backbone=str(rc.get("backbone", "fedavg")), backbone_options=own, **extra)


def load_data(source: str, max_users: int = 0):
    """The dataset as the simulator sees it: ``source`` loaded, its first ``max_users`` users (all items kept,
    so content views stay aligned), split by its own labels or leave-one-out by time."""
    from ..datasets import load
    from ..datasets.splits import dedup, leave_one_out
    from ..federation.synthetic import SYNTHETIC_PREFIX, synthetic_source

    # a generated population (synthetic:USERSxITEMS) is the same on every node: the scale drill splits it
    data = synthetic_source(source) if source.startswith(SYNTHETIC_PREFIX) else load(source)
    if max_users and max_users < data.n_users:
        inter = data.inter[data.inter["user"].to_numpy() < max_users].reset_index(drop=True)
        users = data.users.iloc[:max_users] if len(data.users) else data.users
        data = data.replace(
            inter=inter, user_ids=data.user_ids[:max_users], users=users, name=f"{data.name}-{max_users}u"
        )
    if not data.is_split:
        data = leave_one_out(dedup(data))
    return data


def build_backbone(data, s: Settings):
    """The backbone (wrapped by the FedVLR layer when ``s.fusion`` is not ``none``), built exactly as the
    ``fedvlr-plus run ... --fusion`` command builds it."""
    from ..adapters import backbone_options, make_backbone

    base = make_backbone(s.backbone, data.n_items, s.cfg.dim, **backbone_options(s.backbone, s.backbone_options))
    if s.fusion == "none":
        return base
    from ..fedvlr import build_fedvlr

    return build_fedvlr(data, base, fedvlr_options(s))


def fedvlr_options(s: Settings):
    """The FedVLR layer's options of a deployment (the run config's ``fusion``, ``router-*``, ``cold-neighbours``);
    a bad value is the layer's own one-line error."""
    from ..fedvlr import FedVLROptions

    return FedVLROptions(
        mode=s.fusion,
        temperature=s.router_temperature,
        balance=s.router_balance,
        router_over=s.router_over,
        cold_neighbours=s.cold_neighbours,
        progress=False,
    )


def partition_users(n_users: int, partition_id: int, num_partitions: int) -> np.ndarray:
    """User ids of one partition: ``num_partitions`` contiguous blocks of (nearly) equal size."""
    if num_partitions < 1 or not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id must be in [0, num-partitions), got {partition_id}/{num_partitions}")
    return np.array_split(np.arange(n_users, dtype=np.int64), num_partitions)[partition_id]
