"""The ClientApp's side of a deployment: a node's users trained with the simulator's
:class:`~fedvlr_plus.federation.client.RecClient`, their private state kept in the node (``context.state`` and a
local file, never a message), and federated evaluation that returns metric sums only."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ..federation.client import RecClient
from ..federation.state.store import atomic_torch_save
from .settings import Settings, build_backbone, load_data, partition_users
from .wire import record_to_shared, shared_to_record, updates_to_content  # (first: it checks for flwr)

STATE_FORMAT = 1


class NodeStore:
    """Private state of a node's users: ``context.state`` (one ``ArrayRecord`` per user, kept by the SuperNode
    between messages of a run) backed by one local file (``private-run<id>-part<i>.pt``), written atomically
    after every local training so that a restarted SuperNode resumes from it. Same protocol as
    :class:`~fedvlr_plus.federation.state.store.MemoryStore` for what :class:`RecClient` calls (``load``/``save``)."""

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
                states[int(k[len("fedvlr.private.u") :])] = record_to_shared(self.context.state[k])
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
            self._log(
                {
                    "event": "restore",
                    "source": "file",
                    "sha256": hashlib.sha256(blob).hexdigest(),
                    "users": sorted(states),
                }
            )
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
        atomic_torch_save(
            {
                "format": STATE_FORMAT,
                "round": int(round_index),
                "users": {int(c): {k: v.contiguous() for k, v in st.items()} for c, st in self.states.items()},
            },
            self.path,
        )
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
        self.cold = data.cold_items()  # item-level catalogue fact ("new item"), the same on every node
        self.data = data.replace(inter=data.inter[keep].reset_index(drop=True))
        self.partition, self.num_partitions = part, nparts
        home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
        self.state_dir = Path(node_config.get("state-dir") or home / "fedvlr-state")

    def client(self, cid: int, store) -> RecClient:
        pos = self.indices[self.indptr[cid] : self.indptr[cid + 1]]
        return RecClient(int(cid), self.bb, pos, store, seed=self.s.cfg.seed)


_NODE_CACHE: dict[str, _NodeModel] = {}


def _node_model(context: Context) -> _NodeModel:
    key = json.dumps(
        [
            sorted((str(k), str(v)) for k, v in context.run_config.items()),
            sorted((str(k), str(v)) for k, v in context.node_config.items()),
        ]
    )
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
    from . import secagg as flower_secagg

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
        time.sleep(node.s.fault_delay_s)  # a fault drill: time to kill this node in the middle of the round
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
        def cold_items(self):  # warm/cold targets are judged against the whole federation's training data
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
        res = evaluate(
            data,
            scorer,
            split=split,
            protocol="full",
            ks=tuple(config["ks"]),
            metrics=tuple(config["metrics"]),
            mask_history=str(config["mask_history"]),
            seed=int(config["seed"]),
        )
        for group in ("all", "warm", "cold"):
            f = res.frame(group)
            out[f"{split}/{group}/n"] = int(len(f))
            for name in res.metric_names:
                out[f"{split}/{group}/{name}"] = float(f[name].sum()) if len(f) else 0.0
    out["num-examples"] = int(out.get("valid/all/n", 0))
    return Message(RecordDict({"metrics": MetricRecord(out)}), reply_to=msg)


def make_client_app() -> ClientApp:
    """The ``ClientApp``: ``train`` and ``evaluate`` handlers over :class:`RecClient` (see the module doc)."""
    from .secagg import secagg_mod

    app = ClientApp()
    app.train(mods=[secagg_mod])(node_train)  # SecAgg+ only for messages of a secure round
    app.evaluate()(node_evaluate)
    return app
