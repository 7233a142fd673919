"""The same clients under Flower's deployment engine (``flwr`` >= 1.40, the Message API; no Ray).

A federated run here is one SuperLink, one or more SuperNodes (a device, or a silo holding many users) and a
Flower App whose two halves are built by this module:

- :func:`make_client_app` -> ``ClientApp``. Its ``train`` and ``evaluate`` handlers run the *same*
  :class:`~fedvlr_plus.federation.client.RecClient` objects as the in-process simulator, over the same
  :class:`~fedvlr_plus.adapters.base.Backbone` (optionally wrapped by the FedVLR
  :class:`~fedvlr_plus.fedvlr.FusionLayer`). The shared state arrives as an ``ArrayRecord``; each user's upload goes
  back in one ``ArrayRecord`` (keys ``u<cid>/<name>`` and ``u<cid>/<name>/rows``). Private state (router, head,
  user embedding) lives in the node: in ``context.state`` and in a local file written atomically after every
  local training, so a SuperNode that restarts continues from it. It never enters a message.
- :func:`make_server_app` -> ``ServerApp``. Its :class:`FedVLRStrategy` (a Flower ``Strategy``) sends the shared
  state, turns the replies back into :class:`~fedvlr_plus.federation.messages.ClientUpdate` objects and hands them
  to *our* strategies (:func:`~fedvlr_plus.federation.strategy.make_strategy`: FedAvg, gradient aggregation with a
  server optimizer, sparse row averaging, ...), wrapped by the FedVLR server fusion when the layer is on. Stock
  Flower FedAvg cannot do this: uploads carry different item rows per client. Evaluation is federated (each node
  ranks its own users' held-out items and returns metric *sums*, never per-user values) or on the server
  (``evaluation = "server"``: the global model scored for users with a fresh, untrained private state).

Model selection follows the simulator (:mod:`fedvlr_plus.federation.engine`): the round with the best validation
metric is selected, and its test figures are reported; test is never read to make a decision. With the same
settings and seed a deployment reproduces the simulator's numbers (``tests/test_flower.py`` checks it on real
processes).

Node configuration (``flower-supernode --node-config``): ``partition-id``, ``num-partitions`` (users are split
into contiguous blocks of user ids; one partition = one silo or device), ``state-dir`` (where the private state
file lives; default ``$FLWR_HOME/fedvlr-state``), optionally ``data`` (this node's copy of the data; default: the
run's ``data``).

Run configuration (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``): ``data``,
``max-users`` and every :class:`~fedvlr_plus.federation.config.FedConfig` field in kebab case (``rounds``,
``local-epochs``, ``strategy``, ``server-lr``, ...), the FedVLR layer (``fusion``, ``router-temperature``,
``router-balance``, ``cold-neighbours``), and the deployment knobs ``min-train-nodes``, ``min-evaluate-nodes``,
``min-available-nodes``, ``fraction-train``, ``round-timeout``, ``evaluation`` (``federated`` | ``server``),
``result`` (path of the result JSON the ServerApp writes) and ``audit-dir`` (if set, every reply the ServerApp
receives is written there, so anyone can check what left the nodes). Fault drills: ``fault-partition``,
``fault-round``, ``fault-delay-s`` make that partition's node wait before training in that round, which leaves
time to kill it mid-round (the tests use it; leave them unset otherwise).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

try:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import Strategy as FlowerStrategyBase
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("fedvlr_plus.federation.flower needs Flower's Message API: pip install 'fedvlr-plus[flower]' "
                      "(flwr>=1.40,<2; do not add flwr[simulation], it pins a Ray that RecBole 1.2.1 refuses)"
                      ) from exc

from ..jsonio import write_json_atomic
from .client import RecClient
from .config import FedConfig
from .messages import ClientUpdate
from .store import atomic_torch_save

STATE_FORMAT = 1
#: run-config keys that are not FedConfig fields
DEPLOY_KEYS = {"data": "", "max-users": 0, "fusion": "none", "router-temperature": 1.0, "router-balance": 0.0,
               "cold-neighbours": 10, "min-train-nodes": 1, "min-evaluate-nodes": 1, "min-available-nodes": 1,
               "fraction-train": 1.0, "round-timeout": 3600.0, "evaluation": "federated", "result": "",
               "audit-dir": "", "fault-partition": -1, "fault-round": 0, "fault-delay-s": 0.0,
               # secure aggregation (Flower's SecAgg+), see flower_secagg.py and docs/flower.md
               "secagg": 0, "secagg-num-shares": 1.0, "secagg-reconstruction-threshold": 0.67,
               "secagg-max-weight": 0.0, "secagg-clipping-range": 0.0, "secagg-quantization-range": 0}


# ---------------------------------------------------------------------------------------------- settings
@dataclass
class Settings:
    """A run's settings: the simulator's :class:`FedConfig` plus data, the FedVLR layer and deployment knobs."""

    cfg: FedConfig
    data: str
    max_users: int = 0
    fusion: str = "none"
    router_temperature: float = 1.0
    router_balance: float = 0.0
    cold_neighbours: int = 10
    min_train_nodes: int = 1
    min_evaluate_nodes: int = 1
    min_available_nodes: int = 1
    fraction_train: float = 1.0
    round_timeout: float = 3600.0
    evaluation: str = "federated"
    result: str = ""
    audit_dir: str = ""
    fault_partition: int = -1
    fault_round: int = 0
    fault_delay_s: float = 0.0
    secagg: int = 0
    secagg_num_shares: float = 1.0
    secagg_reconstruction_threshold: float = 0.67
    secagg_max_weight: float = 0.0          # 0: the training examples of the whole dataset (no node has more)
    secagg_clipping_range: float = 0.0      # 0: from the broadcast (secure_sum.clipping_range)
    secagg_quantization_range: int = 0      # 0: the finest the round's number of nodes allows
    backbone: str = "fedavg"
    #: the backbone's own options (``fedrap-lambda``, ``fedrap-mu``); keys another backbone declares are ignored
    backbone_options: dict = field(default_factory=dict)

    @classmethod
    def from_run_config(cls, rc) -> "Settings":
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
                if name in ("lr", "item_lr_scale", "server_lr", "strategy", "clients_per_round",
                            "local_epochs") and value in ("", 0):
                    continue  # "" / 0 in a TOML file means "the backbone's default" (TOML has no null)
                fed[name] = value
            elif key in DEPLOY_KEYS:
                extra[name] = type(DEPLOY_KEYS[key])(value) if not isinstance(DEPLOY_KEYS[key], str) else str(value)
            else:
                raise ValueError(f"run config: unknown key {key!r} (FedConfig fields or a backbone's own options in "
                                 f"kebab case, or one of {', '.join(sorted(DEPLOY_KEYS))}, backbone)")
        if fed.get("clients_per_round") not in (None, 1.0):
            raise ValueError("run config: clients-per-round is a simulator setting; under Flower every user of a "
                             "sampled node trains (sample nodes with fraction-train)")
        if not extra.get("data"):
            raise ValueError("run config: 'data' (the dataset path, or ml-100k) is required")
        if extra.get("evaluation", "federated") not in ("federated", "server"):
            raise ValueError("run config: evaluation must be 'federated' or 'server'")
        if extra.get("secagg") and int(extra.get("min_train_nodes", 1)) < 2:
            raise ValueError("run config: secagg needs at least 2 nodes per round (min-train-nodes >= 2): a secure "
                             "sum of one node is that node's upload")
        return cls(cfg=FedConfig(**fed), backbone=str(rc.get("backbone", "fedavg")), backbone_options=own, **extra)


def load_data(source: str, max_users: int = 0):
    """The dataset as the simulator sees it: ``source`` loaded, its first ``max_users`` users (all items kept,
    so content views stay aligned), split by its own labels or leave-one-out by time."""
    from ..datasets import load
    from ..datasets.splits import dedup, leave_one_out

    data = load(source)
    if max_users and max_users < data.n_users:
        inter = data.inter[data.inter["user"].to_numpy() < max_users].reset_index(drop=True)
        users = data.users.iloc[:max_users] if len(data.users) else data.users
        data = data.replace(inter=inter, user_ids=data.user_ids[:max_users], users=users,
                            name=f"{data.name}-{max_users}u")
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
    """The FedVLR layer's options of a deployment (the run config's ``fusion``, ``router-*``, ``cold-neighbours``)."""
    from ..fedvlr import FedVLROptions

    return FedVLROptions(mode=s.fusion, temperature=s.router_temperature, balance=s.router_balance,
                         cold_neighbours=s.cold_neighbours, progress=False)


def partition_users(n_users: int, partition_id: int, num_partitions: int) -> np.ndarray:
    """User ids of one partition: ``num_partitions`` contiguous blocks of (nearly) equal size."""
    if num_partitions < 1 or not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id must be in [0, num-partitions), got {partition_id}/{num_partitions}")
    return np.array_split(np.arange(n_users, dtype=np.int64), num_partitions)[partition_id]


# ---------------------------------------------------------------------------------------------- wire format
def shared_to_record(shared: dict[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in shared.items()})


def record_to_shared(rec: ArrayRecord) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v.numpy(), copy=True)) for k, v in rec.items()}


def updates_to_content(updates: list[ClientUpdate]) -> RecordDict:
    """One ``ArrayRecord`` with every user's shared upload (and row ids) + a ``MetricRecord``."""
    arrays = {}
    for u in updates:
        for name, a in u.arrays.items():
            arrays[f"u{u.cid}/{name}"] = a.detach().cpu().contiguous()
        for name, r in u.rows.items():
            arrays[f"u{u.cid}/{name}/rows"] = r.detach().cpu().to(torch.int64).contiguous()
    metrics = MetricRecord({
        "num-examples": int(sum(u.num_examples for u in updates)),
        "cids": [int(u.cid) for u in updates],
        "n-examples": [int(u.num_examples) for u in updates],
        "loss": [float(u.metrics.get("loss", 0.0)) for u in updates],
        "steps": [int(u.metrics.get("steps", 0)) for u in updates],
    })
    return RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics})


def content_to_updates(content: RecordDict, kind: str) -> list[ClientUpdate]:
    """Inverse of :func:`updates_to_content`; refuses arrays that belong to no listed user."""
    m = content["metrics"]
    cids = [int(c) for c in m["cids"]]
    n_ex = [int(n) for n in m["n-examples"]]
    losses = [float(x) for x in m["loss"]]
    steps = [int(x) for x in m["steps"]]
    per = {c: ({}, {}) for c in cids}
    for key, arr in content["arrays"].items():
        head, _, rest = key.partition("/")
        if not head.startswith("u") or not rest:
            raise ValueError(f"reply array {key!r} is not of the form u<cid>/<name>")
        cid = int(head[1:])
        if cid not in per:
            raise ValueError(f"reply array {key!r} belongs to user {cid}, who is not in the reply's user list")
        t = torch.from_numpy(np.array(arr.numpy(), copy=True))
        if rest.endswith("/rows"):
            per[cid][1][rest[:-5]] = t.to(torch.int64)
        else:
            per[cid][0][rest] = t
    return [ClientUpdate(cid=c, kind=kind, arrays=per[c][0], rows=per[c][1], num_examples=n,
                         metrics={"loss": lo, "steps": st}).validate()
            for c, n, lo, st in zip(cids, n_ex, losses, steps)]


# ---------------------------------------------------------------------------------------------- node side
class NodeStore:
    """Private state of a node's users: ``context.state`` (one ``ArrayRecord`` per user, kept by the SuperNode
    between messages of a run) backed by one local file (``private-run<id>-part<i>.pt``), written atomically
    after every local training so that a restarted SuperNode resumes from it. Same protocol as
    :class:`~fedvlr_plus.federation.store.MemoryStore` for what :class:`RecClient` calls (``load``/``save``)."""

    def __init__(self, context: Context, path: Path, journal: Path | None = None):
        self.context, self.path, self.journal = context, Path(path), journal
        self._states: dict[int, dict[str, torch.Tensor]] | None = None
        self.dirty = False

    @staticmethod
    def _key(cid: int) -> str:
        return f"fedvlr.private.u{int(cid)}"

    def _restore(self) -> dict[int, dict[str, torch.Tensor]]:
        states: dict[int, dict] = {}
        keys = [k for k in self.context.state.keys() if k.startswith("fedvlr.private.u")]
        if keys:
            for k in keys:
                states[int(k[len("fedvlr.private.u"):])] = record_to_shared(self.context.state[k])
            source = "context.state"
        elif self.path.exists():
            blob = self.path.read_bytes()
            try:
                obj = torch.load(self.path, map_location="cpu", weights_only=True)
            except Exception as exc:
                raise RuntimeError(f"private state file {self.path} is unreadable: {exc}") from exc
            if obj.get("format") != STATE_FORMAT:
                raise RuntimeError(f"{self.path}: private state format {obj.get('format')} is not {STATE_FORMAT}")
            states = {int(c): dict(st) for c, st in obj["users"].items()}
            source = "file"
            self._log({"event": "restore", "source": "file", "sha256": hashlib.sha256(blob).hexdigest(),
                       "users": sorted(states)})
            for cid, st in states.items():  # back into the SuperNode's context for the rest of the run
                self.context.state[self._key(cid)] = shared_to_record(st)
        else:
            source = "fresh"
        self.source = source
        return states

    def _log(self, entry: dict) -> None:
        if self.journal is None:
            return
        entry = {"time": time.time(), "pid": os.getpid(), **entry}
        with open(self.journal, "a") as fh:
            fh.write(json.dumps(entry) + "\n")

    @property
    def states(self) -> dict[int, dict[str, torch.Tensor]]:
        if self._states is None:
            self._states = self._restore()
        return self._states

    def load(self, cid: int):
        return self.states.get(int(cid))

    def save(self, cid: int, state, *, copy: bool = True) -> None:
        self.states[int(cid)] = {k: v.detach().clone() if copy else v.detach() for k, v in state.items()}
        self.dirty = True

    def flush(self, round_index: int) -> None:
        """Publish the round's private states: the SuperNode's ``context.state`` and the local file."""
        if not self.dirty:
            return
        for cid, st in self.states.items():
            self.context.state[self._key(cid)] = shared_to_record(st)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_torch_save({"format": STATE_FORMAT, "round": int(round_index),
                           "users": {int(c): {k: v.contiguous() for k, v in st.items()}
                                     for c, st in self.states.items()}}, self.path)
        self._log({"event": "saved", "round": int(round_index), "sha256": file_digest(self.path)})
        self.dirty = False


def file_digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class _NodeModel:
    """What a node builds once per process: data, backbone, its users (cached per run config)."""

    def __init__(self, s: Settings, node_config: dict):
        self.s = s
        part = int(node_config.get("partition-id", 0))
        nparts = int(node_config.get("num-partitions", 1))
        data = load_data(str(node_config.get("data") or s.data), s.max_users)
        self.bb = build_backbone(data, s)
        self.n_items = data.n_items
        users = partition_users(data.n_users, part, nparts)
        self.users = users
        m = data.matrix(["train"]).tocsr()
        m.sort_indices()
        self.indptr, self.indices = m.indptr.astype(np.int64), m.indices.astype(np.int64)
        counts = np.diff(self.indptr)
        self.train_users = users[counts[users] > 0]
        # the node's own users only: evaluation never sees anyone else's interactions
        keep = np.isin(data.inter["user"].to_numpy(), users)
        self.cold = data.cold_items()   # item-level catalogue fact ("new item"), the same on every node
        self.data = data.replace(inter=data.inter[keep].reset_index(drop=True))
        self.partition, self.num_partitions = part, nparts
        home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
        self.state_dir = Path(node_config.get("state-dir") or home / "fedvlr-state")

    def client(self, cid: int, store) -> RecClient:
        pos = self.indices[self.indptr[cid]:self.indptr[cid + 1]]
        return RecClient(int(cid), self.bb, pos, store, seed=self.s.cfg.seed)


_NODE_CACHE: dict[str, _NodeModel] = {}


def _node_model(context: Context) -> _NodeModel:
    key = json.dumps([sorted((str(k), str(v)) for k, v in context.run_config.items()),
                      sorted((str(k), str(v)) for k, v in context.node_config.items())])
    if key not in _NODE_CACHE:
        _NODE_CACHE[key] = _NodeModel(Settings.from_run_config(context.run_config), dict(context.node_config))
    return _NODE_CACHE[key]


def _node_store(node: _NodeModel, context: Context) -> NodeStore:
    node.state_dir.mkdir(parents=True, exist_ok=True)
    stem = f"run{context.run_id}-part{node.partition}of{node.num_partitions}"
    return NodeStore(context, node.state_dir / f"private-{stem}.pt", node.state_dir / f"journal-{stem}.jsonl")


def _config_dict(rec: ConfigRecord) -> dict:
    return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in rec.items()}


def node_train(msg: Message, context: Context) -> Message:
    """Local training of every user of this node that has training data; private state stays in the node.

    In a secure round (SecAgg+) the node replies with one dense vector for all its users, which Flower's
    ``secaggplus_mod`` masks before it leaves the node (see :mod:`.flower_secagg`)."""
    from . import flower_secagg

    node = _node_model(context)
    store = _node_store(node, context)
    secure = flower_secagg.is_secure_train(msg)
    if secure:
        shared, config = flower_secagg.secure_fit_inputs(msg)
    else:
        shared, config = record_to_shared(msg.content["arrays"]), _config_dict(msg.content["config"])
    r = int(config["round"])
    store._log({"event": "fit-start", "round": r, "users": [int(u) for u in node.train_users]})
    if node.s.fault_delay_s and node.s.fault_partition == node.partition and node.s.fault_round in (0, r):
        time.sleep(node.s.fault_delay_s)   # a fault drill: time to kill this node in the middle of the round
    updates = [node.client(int(cid), store).fit(shared, config) for cid in node.train_users]
    store.flush(r)
    store._log({"event": "fit-done", "round": r})
    if secure:
        tables = {s.name for s in node.bb.all_specs() if s.item_table and s.name in shared}
        return Message(flower_secagg.secure_fit_reply(updates, shared, tables, context), reply_to=msg)
    return Message(updates_to_content(updates), reply_to=msg)


def node_evaluate(msg: Message, context: Context) -> Message:
    """Rank every item for each of this node's users and return, per split and target group (all / warm /
    cold), the *sum* of each metric over users and the number of users (the server divides)."""
    from ..evaluation import evaluate

    node = _node_model(context)
    store = _node_store(node, context)
    config = _config_dict(msg.content["config"])
    shared = record_to_shared(msg.content["arrays"])
    cold = node.cold

    class _NodeData(type(node.data)):
        def cold_items(self):   # warm/cold targets are judged against the whole federation's training data
            return cold

    data = _NodeData(**{f.name: getattr(node.data, f.name) for f in fields(node.data)})

    def scorer(users):
        return torch.stack([node.client(int(u), store).scores(shared) for u in np.asarray(users)])

    out = {}
    for split in str(config["splits"]).split(","):
        if len(data.part(split)) == 0:
            for group in ("all", "warm", "cold"):
                out[f"{split}/{group}/n"] = 0
            continue
        res = evaluate(data, scorer, split=split, protocol="full", ks=tuple(config["ks"]),
                       metrics=tuple(config["metrics"]), mask_history=str(config["mask_history"]),
                       seed=int(config["seed"]))
        for group in ("all", "warm", "cold"):
            f = res.frame(group)
            out[f"{split}/{group}/n"] = int(len(f))
            for name in res.metric_names:
                out[f"{split}/{group}/{name}"] = float(f[name].sum()) if len(f) else 0.0
    out["num-examples"] = int(out.get("valid/all/n", 0))
    return Message(RecordDict({"metrics": MetricRecord(out)}), reply_to=msg)


def make_client_app() -> ClientApp:
    """The ``ClientApp``: ``train`` and ``evaluate`` handlers over :class:`RecClient` (see the module doc)."""
    from .flower_secagg import secagg_mod

    app = ClientApp()
    app.train(mods=[secagg_mod])(node_train)   # SecAgg+ only for messages of a secure round
    app.evaluate()(node_evaluate)
    return app


# ---------------------------------------------------------------------------------------------- server side
class FedVLRStrategy(FlowerStrategyBase):
    """A Flower strategy whose aggregation is one of ours (``run.strategy``); selection on validation.

    ``run`` is a :class:`~fedvlr_plus.federation.engine.FederatedRun` used for what the simulator would use: the
    backbone, resolved learning rates, the (wrapped) strategy, the shared state and the round configuration. Its
    in-process simulator is never called.
    """

    def __init__(self, run, s: Settings):
        self.run, self.s = run, s
        self.history: list[dict] = []
        self.best: dict | None = None
        self.audit = Path(s.audit_dir) if s.audit_dir else None
        self._rng = random.Random(int(s.cfg.seed))
        self._pending: dict | None = None

    # ---- node selection
    def _nodes(self, grid: Grid, minimum: int, fraction: float) -> list[int]:
        need = max(int(minimum), int(self.s.min_available_nodes))
        deadline = time.time() + float(self.s.round_timeout)
        while len(ids := sorted(grid.get_node_ids())) < need:
            if time.time() > deadline:
                raise RuntimeError(f"only {len(ids)} SuperNodes connected after {self.s.round_timeout:.0f} s; "
                                   f"the run needs {need} (min-available-nodes / min-train-nodes)")
            time.sleep(0.5)
        k = max(int(minimum), int(np.ceil(fraction * len(ids))))
        return sorted(self._rng.sample(ids, min(k, len(ids))))

    def configure_train(self, server_round, arrays, config, grid):
        nodes = self._nodes(grid, self.s.min_train_nodes, self.s.fraction_train)
        conf = ConfigRecord(self.run.round_config(server_round))
        rec = shared_to_record(self.run.shared)
        return [Message(RecordDict({"arrays": rec, "config": conf}), dst_node_id=n, message_type="train")
                for n in nodes]

    def _ok(self, replies, server_round: int, what: str, minimum: int) -> list[Message]:
        replies = list(replies)
        ok = [m for m in replies if not m.has_error()]
        if len(ok) < minimum:
            errors = "; ".join(f"node {m.metadata.src_node_id}: {m.error.reason}" for m in replies if m.has_error())
            raise RuntimeError(f"round {server_round}: {len(ok)} {what} replies, fewer than the minimum {minimum}"
                               + (f" ({errors})" if errors else ""))
        return ok

    def _audit(self, server_round: int, what: str, msg: Message) -> None:
        if self.audit is None:
            return
        folder = self.audit / f"round{server_round:03d}-{what}"
        folder.mkdir(parents=True, exist_ok=True)
        stem = folder / f"node{msg.metadata.src_node_id}"
        arrays, scalars = {}, {}
        for rname, rec in msg.content.items():
            if isinstance(rec, ArrayRecord):
                for k, v in rec.items():
                    arrays[f"{rname}::{k}"] = v.numpy()
            else:
                scalars[rname] = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in rec.items()}
        np.savez(f"{stem}.npz", **arrays)
        write_json_atomic(f"{stem}.json", {"records": sorted(msg.content.keys()), "scalars": scalars,
                                           "arrays": sorted(arrays)})

    def aggregate_train(self, server_round, replies):
        ok = self._ok(replies, server_round, "training", self.s.min_train_nodes)
        updates = []
        for m in ok:
            self._audit(server_round, "train", m)
            updates += content_to_updates(m.content, self.run.strategy.upload)
        updates.sort(key=lambda u: u.cid)   # the simulator's order: aggregation is then bit-for-bit the same
        if len({u.cid for u in updates}) != len(updates):
            raise RuntimeError(f"round {server_round}: a user was uploaded by two nodes (overlapping partitions)")
        if not updates:
            raise RuntimeError(f"round {server_round}: the replying nodes hold no user with training data")
        n = np.array([u.num_examples for u in updates], dtype=np.float64)
        loss = float(np.dot(n, [u.metrics.get("loss", 0.0) for u in updates]) / n.sum())
        return self._apply(server_round, updates, loss=loss, nodes=len(ok), clients=len(updates))

    def _apply(self, server_round: int, updates: list[ClientUpdate], *, loss: float, nodes: int, clients: int):
        """Aggregate ``updates`` with our strategy into the new shared state and record the round."""
        run = self.run
        run.shared = run.strategy.aggregate(run.shared, updates, run.specs)
        run.round = server_round
        if not np.isfinite(loss) or not all(bool(torch.isfinite(v).all()) for v in run.shared.values()):
            raise FloatingPointError(f"training diverged in round {server_round} (loss {loss})")
        self._pending = {"round": server_round, "nodes": nodes, "clients": clients, "loss": loss}
        self.history.append(self._pending)
        return shared_to_record(run.shared), MetricRecord({"loss": loss, "nodes": nodes, "clients": clients})

    def _evaluating(self, server_round: int) -> bool:
        cfg = self.run.cfg
        return server_round % cfg.eval_every == 0 or server_round == cfg.rounds

    def eval_config(self) -> dict:
        cfg = self.run.cfg
        return {"splits": "valid,test", "ks": [int(k) for k in cfg.ks], "metrics": list(cfg.metrics),
                "mask_history": cfg.mask_history, "seed": int(cfg.seed)}

    def configure_evaluate(self, server_round, arrays, config, grid):
        if self.s.evaluation != "federated" or not self._evaluating(server_round):
            return []
        nodes = self._nodes(grid, self.s.min_evaluate_nodes, 1.0)
        conf = ConfigRecord(self.eval_config())
        rec = shared_to_record(self.run.shared)
        return [Message(RecordDict({"arrays": rec, "config": conf}), dst_node_id=n, message_type="evaluate")
                for n in nodes]

    def aggregate_evaluate(self, server_round, replies):
        if self.s.evaluation != "federated" or not self._evaluating(server_round):
            return None
        ok = self._ok(replies, server_round, "evaluation", self.s.min_evaluate_nodes)
        for m in ok:
            self._audit(server_round, "evaluate", m)
        sums: dict[str, float] = {}
        for m in ok:
            for k, v in m.content["metrics"].items():
                sums[k] = sums.get(k, 0.0) + float(v)
        res = {}
        for split in ("valid", "test"):
            for group in ("all", "warm", "cold"):
                n = sums.get(f"{split}/{group}/n", 0.0)
                names = sorted({k.split("/")[2] for k in sums if k.startswith(f"{split}/{group}/")} - {"n"})
                res[(split, group)] = ({name: (sums[f"{split}/{group}/{name}"] / n if n else None) for name in names},
                                       int(n))
        self._select(server_round, res, nodes=len(ok))
        return MetricRecord({f"valid/{k}": float(v) for k, v in res[("valid", "all")][0].items() if v is not None})

    def _select(self, server_round: int, res: dict, nodes: int) -> None:
        """The engine's rule: the best validation metric selects the round; its test figures are kept."""
        valid = res[("valid", "all")][0]
        rec = self.history[-1] if self.history and self.history[-1]["round"] == server_round else {"round": server_round}
        rec["valid"] = valid
        rec["eval_nodes"] = nodes
        metric = valid.get(self.run.cfg.valid_metric)
        if metric is not None and (self.best is None or metric > self.best["metric"]):
            self.best = {"round": server_round, "metric": float(metric), "valid": valid,
                         "test": res[("test", "all")][0], "test_warm": res[("test", "warm")][0],
                         "test_cold": res[("test", "cold")][0], "n_users": res[("test", "all")][1],
                         "test_warm_n_users": res[("test", "warm")][1],
                         "test_cold_n_users": res[("test", "cold")][1]}

    def server_evaluate(self, server_round: int, arrays) -> MetricRecord | None:
        """Server-side evaluation: the global model for users with an untrained (initial) private state."""
        if server_round == 0 or not self._evaluating(server_round):
            return None
        run = self.run
        groups = {}
        for split in ("valid", "test"):
            r = run.evaluate(split, "full")
            for group in ("all", "warm", "cold"):
                groups[(split, group)] = ({k: (None if v != v else float(v)) for k, v in r.summary(group).items()},
                                          r.n_users(group))
        self._select(server_round, groups, nodes=0)
        return MetricRecord({f"valid/{k}": float(v) for k, v in groups[("valid", "all")][0].items()
                             if v is not None})

    def summary(self) -> None:
        from flwr.common.logger import log
        from logging import INFO

        log(INFO, "\t├── fedvlr-plus strategy %s (upload %s), backbone %s, evaluation %s",
            self.run.strategy_name, self.run.strategy.upload, self.run.backbone_name, self.s.evaluation)
        log(INFO, "\t└── min train nodes %d, min evaluate nodes %d, min available nodes %d, fraction-train %.2f",
            self.s.min_train_nodes, self.s.min_evaluate_nodes, self.s.min_available_nodes, self.s.fraction_train)

    def result(self) -> dict:
        if self.best is None:
            raise RuntimeError("no validation evaluation was run")
        run = self.run
        out = {"backbone": run.backbone_name, "dataset": run.data.name, "seed": int(run.cfg.seed),
               "selected_round": int(self.best["round"]), "rounds_run": int(run.round),
               "strategy": run.strategy_name, "engine": "flower", "evaluation": self.s.evaluation,
               "valid": self.best["valid"], "test": self.best["test"], "test_warm": self.best["test_warm"],
               "test_cold": self.best["test_cold"], "n_users": self.best["n_users"],
               "test_warm_n_users": self.best["test_warm_n_users"],
               "test_cold_n_users": self.best["test_cold_n_users"], "history": self.history,
               "config": run.recorded_config(), "model": run.bb.describe()}
        return out


class SecureFedVLRStrategy(FedVLRStrategy):
    """:class:`FedVLRStrategy` whose training rounds run under Flower's SecAgg+: the server receives masked
    vectors only, and our strategy aggregates one upload that stands for the round's secure sum
    (:func:`~fedvlr_plus.federation.secure_sum.aggregate_as_update`). Evaluation is unchanged (metric sums)."""

    def __init__(self, run, s: Settings):
        from .secure_sum import SUMMABLE

        super().__init__(run, s)
        self.rule = "fedgrad" if run.strategy.upload == "grads" else run.strategy_name
        if self.rule not in SUMMABLE:
            raise ValueError(f"secagg: strategy {run.strategy_name!r} needs every upload and cannot run on a "
                             f"secure sum; choose one of {', '.join(SUMMABLE)}")
        self._secure = None
        # SecAgg+ weights a node by N_i / max_weight: no node holds more training examples than the dataset
        self.max_weight = float(s.secagg_max_weight or int(np.diff(run.indptr).sum()))

    def configure_train(self, server_round, arrays, config, grid):
        from .flower_secagg import run_secure_round

        nodes = self._nodes(grid, self.s.min_train_nodes, self.s.fraction_train)
        tables = {n for n in self.run.shared if self.run.specs[n].item_table}
        if self.audit is not None:
            self.audit.mkdir(parents=True, exist_ok=True)
        self._secure = run_secure_round(grid, nodes, self.run.shared, self.run.round_config(server_round), tables,
                                        self.s, server_round, self.max_weight, self.audit)
        return []   # the round's messages were exchanged by the SecAgg+ workflow

    def aggregate_train(self, server_round, replies):
        from .secure_sum import aggregate_as_update

        sec, self._secure = self._secure, None
        if sec.nodes < self.s.min_train_nodes:
            raise RuntimeError(f"round {server_round}: {sec.nodes} nodes in the secure sum, fewer than the minimum "
                               f"{self.s.min_train_nodes} ({'; '.join(sec.failures)})")
        update = aggregate_as_update(self.rule, self.run.shared, sec.means, sec.weights, sec.n_total,
                                     self.run.strategy.upload)
        out = self._apply(server_round, [update], loss=sec.loss, nodes=sec.nodes, clients=sec.users)
        if self.audit is not None:   # what the server holds after the round (the aggregate, nothing per node)
            np.savez(self.audit / f"round{server_round:03d}-shared.npz",
                     **{k: v.numpy() for k, v in self.run.shared.items()})
        return out

    def result(self) -> dict:
        s = self.s
        return {**super().result(), "secure_aggregation": {
            "protocol": "SecAgg+ (flwr secaggplus_mod / SecAggPlusWorkflow)", "rule": self.rule,
            "num_shares": float(s.secagg_num_shares),
            "reconstruction_threshold": float(s.secagg_reconstruction_threshold),
            "max_weight": self.max_weight, "clipping_range": float(s.secagg_clipping_range) or "auto",
            "quantization_range": int(s.secagg_quantization_range) or "auto"}}


def server_main(grid: Grid, context: Context) -> dict:
    """The ServerApp's body: build the run as the simulator would, drive Flower's round loop, write the result."""
    from .engine import FederatedRun

    s = Settings.from_run_config(context.run_config)
    try:
        data = load_data(s.data, s.max_users)
        bb = build_backbone(data, s)
        run = FederatedRun(data, bb, s.cfg, progress=False)
        strategy = (SecureFedVLRStrategy if s.secagg else FedVLRStrategy)(run, s)
        strategy.start(grid=grid, initial_arrays=shared_to_record(run.shared), num_rounds=s.cfg.rounds,
                       timeout=s.round_timeout,
                       evaluate_fn=strategy.server_evaluate if s.evaluation == "server" else None)
        result = strategy.result()
    except BaseException as exc:
        if s.result:
            write_json_atomic(Path(s.result).with_suffix(".error.json"),
                              {"error": f"{type(exc).__name__}: {exc}"})
        raise
    if s.result:
        write_json_atomic(s.result, result)
    return result


def make_server_app() -> ServerApp:
    """The ``ServerApp`` (see :func:`server_main`)."""
    app = ServerApp()
    app.main()(server_main)
    return app
