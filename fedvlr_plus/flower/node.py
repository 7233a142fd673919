"""The ClientApp's side of a deployment: a node trains and scores its users with the engine's own simulator.

A node (a device with one user, or a silo with thousands) builds the :class:`~fedvlr_plus.federation.engine.
FederatedRun` of its partition, the same object ``fedvlr-plus run`` builds, and calls its ``_fit`` and ``scorer``:
the batched simulator (chunks, closed forms, the memory or file store) trains all the node's users at once, or the
sequential reference clients where the run config asks for ``simulator = "sequential"``. A RecBole module backbone
gets the engine's module simulator, as in ``run``. Private state stays in the node: in the run's store, written to
a local file after every local training (:mod:`.node_state`), never in a message.

A training reply is one aggregate per node where the strategy is linear (:mod:`.node_sums`), the users' uploads
where it is not (median, trimmed mean need each upload), and one masked vector per node under SecAgg+
(:mod:`.secagg`). Evaluation returns metric sums only.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from .settings import Settings, build_backbone, load_data, partition_users

# In a deployment every message starts a fresh ClientApp process that imports this module. A secure round's key
# exchange and unmasking stages never reach the handlers below, so the trainer's modules (and torch with them)
# are imported inside the handlers: those stages then cost Flower's own start-up only.


def _node_data(data, users: np.ndarray):
    """The node's own users' interactions only (evaluation never sees anyone else's); warm and cold targets are
    judged against the whole federation's training data, an item-level catalogue fact the same on every node."""
    cold = data.cold_items()

    class _NodeData(type(data)):
        def cold_items(self):
            return cold

    keep = np.isin(data.inter["user"].to_numpy(), users)
    own = data.replace(inter=data.inter[keep].reset_index(drop=True))
    return _NodeData(**{f.name: getattr(own, f.name) for f in fields(own)})


class NodeRun:
    """What a node builds once per process: its partition's :class:`FederatedRun` (progress off) and state file."""

    def __init__(self, s: Settings, node_config: dict, run_id: int):
        from ..federation.engine import FederatedRun
        from .node_state import NodeStateFile

        self.s = s
        self.partition = int(node_config.get("partition-id", 0))
        self.num_partitions = int(node_config.get("num-partitions", 1))
        data = load_data(str(node_config.get("data") or s.data), s.max_users)
        bb = build_backbone(data, s)
        self.users = partition_users(data.n_users, self.partition, self.num_partitions)
        self.run = FederatedRun(_node_data(data, self.users), bb, s.cfg, progress=False)
        self.train_users = self.run.eligible
        home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
        state_dir = Path(node_config.get("state-dir") or home / "fedvlr-state")
        state_dir.mkdir(parents=True, exist_ok=True)
        stem = f"run{run_id}-part{self.partition}of{self.num_partitions}"
        self.state = NodeStateFile(state_dir, stem)
        self.build_seconds = 0.0  # set by node_run for the message that built it
        self.seconds: dict = {}  # the last fit's stages

    def fit(self, shared: dict, config: dict, *, each: bool = False):
        """Round ``config["round"]`` for every user of the node with training data, the store committed and
        written to the state file. The engine's ``_fit`` (sums where the strategy is linear, else the uploads), or
        with ``each`` every user's upload from the run's simulator (SecAgg+ masks their node-weighted mean)."""
        run, r = self.run, int(config["round"])
        t0 = time.perf_counter()
        self.state.restore_into(run.store)
        run.store.begin_round(r)
        t1 = time.perf_counter()
        out = run.sim.fit(self.train_users, shared, config) if each else run._fit(self.train_users, shared, config)
        run.store.prepare(r)
        run.store.commit()
        t2 = time.perf_counter()
        self.state.save(run.store, r)
        self.seconds = {"restore_s": t1 - t0, "train_s": t2 - t1, "save_s": time.perf_counter() - t2}
        return out


_NODE_CACHE: dict[str, NodeRun] = {}


def node_run(context: Context) -> NodeRun:
    """The node's :class:`NodeRun`, built once per process and run (in a deployment a process serves one message;
    in-process tests reuse it)."""
    key = json.dumps(
        [
            int(context.run_id),
            sorted((str(k), str(v)) for k, v in context.run_config.items()),
            sorted((str(k), str(v)) for k, v in context.node_config.items()),
        ]
    )
    if key not in _NODE_CACHE:
        started = time.perf_counter()
        s = Settings.from_run_config(context.run_config)
        _NODE_CACHE[key] = NodeRun(s, dict(context.node_config), int(context.run_id))
        _NODE_CACHE[key].build_seconds = time.perf_counter() - started
    return _NODE_CACHE[key]


def _config_dict(rec: ConfigRecord) -> dict:
    return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in rec.items()}


def node_train(msg: Message, context: Context) -> Message:
    """Local training of every user of this node that has training data; private state stays in the node."""
    from ..federation.simulation.upload_stream import StreamedUploads
    from . import secagg_node as flower_secagg
    from .node_state import process_started_at
    from .node_sums import sums_to_content
    from .wire import record_to_shared, updates_to_content

    handler_started = time.time()
    node = node_run(context)
    secure = flower_secagg.is_secure_train(msg)
    if secure:
        shared, config = flower_secagg.secure_fit_inputs(msg)
    else:
        shared, config = record_to_shared(msg.content["arrays"]), _config_dict(msg.content["config"])
    r = int(config["round"])
    node.state.log("fit-start", round=r, users=len(node.train_users))
    s = node.s
    if s.fault_delay_s and s.fault_partition == node.partition and s.fault_round in (0, r):
        time.sleep(s.fault_delay_s)  # a fault drill: time to kill this node in the middle of the round
    if secure:
        updates = node.fit(shared, config, each=True)
        tables = {n for n in shared if node.run.specs[n].item_table}
        reply = flower_secagg.secure_fit_reply(updates, shared, tables, context)
    else:
        out = node.fit(shared, config)
        reply = sums_to_content(out, node.train_users) if isinstance(out, StreamedUploads) else updates_to_content(out)
    # where a round's time goes on the node: the process start and Flower's set-up before the handler, building
    # the node's run (data, backbone) once per process, then restore, training and the state file
    node.state.log(
        "fit-done",
        round=r,
        process_started=process_started_at(),
        handler_started=handler_started,
        build_s=node.build_seconds,
        **node.seconds,
    )
    node.build_seconds = 0.0  # paid once per process
    return Message(reply, reply_to=msg)


def node_evaluate(msg: Message, context: Context) -> Message:
    """Rank every item for each of this node's users and return, per split and target group (all / warm /
    cold), the *sum* of each metric over users and the number of users (the server divides)."""
    from ..evaluation import evaluate
    from .wire import record_to_shared

    node = node_run(context)
    node.state.restore_into(node.run.store)
    config = _config_dict(msg.content["config"])
    node.run.shared = record_to_shared(msg.content["arrays"])
    data = node.run.data
    out = {}
    for split in str(config["splits"]).split(","):
        if len(data.part(split)) == 0:
            for group in ("all", "warm", "cold"):
                out[f"{split}/{group}/n"] = 0
            continue
        res = evaluate(
            data,
            node.run.scorer(),
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
    """The ``ClientApp``: ``train`` and ``evaluate`` handlers over the node's :class:`NodeRun`."""
    from .secagg_node import secagg_mod

    app = ClientApp()
    app.train(mods=[secagg_mod])(node_train)  # SecAgg+ only for messages of a secure round
    app.evaluate()(node_evaluate)
    return app
