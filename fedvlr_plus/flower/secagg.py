"""Secure aggregation of a training round with Flower's own SecAgg+ (``secaggplus_mod`` on the nodes,
``SecAggPlusWorkflow`` on the server), for the uploads of :mod:`fedvlr_plus.flower.app`.

Flower 1.42 ships SecAgg+ for its *legacy* round format only: the workflow asks a legacy ``Strategy`` for the
round's ``FitIns`` and hands the unmasked aggregate to its ``aggregate_fit``; the mod reads the node's reply as a
``FitRes`` (``fitres.*`` records), masks its arrays and empties them. This module is the adapter: the server runs
the workflow for one round with a one-round legacy strategy (:class:`_OneRound`) that sends our shared state and
round configuration as ``FitIns`` and keeps what ``aggregate_fit`` receives; the node answers a secure training
message with its dense vector (:func:`~fedvlr_plus.federation.privacy.secure_sum.node_vector`) as a ``FitRes`` whose
``num_examples`` is the node's example count (SecAgg+ weights the mean by it). The arithmetic (what a node sends,
how the aggregate becomes our strategies' input) is in :mod:`fedvlr_plus.federation.privacy.secure_sum`.

The node's side (the mod every ClientApp carries, and a secure training message read and answered) is in
:mod:`.secagg_node`; this module is the server's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns, bytes_to_ndarray, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server import LegacyContext
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey

from ..federation.privacy.secure_sum import clipping_range, layout, quantization_range, split_aggregate
from ..jsonio import write_json_atomic
from .secagg_node import FIT_CONFIG, FIT_NAMES


# ---------------------------------------------------------------------------------------------- server side
@dataclass
class SecureRound:
    """What the server learns from a secure round: the weighted means ``M`` and weights ``W``, the mean loss, the
    total example count and, per node, only its example count and number of users."""

    means: dict
    weights: dict
    loss: float
    n_total: int
    nodes: int
    users: int
    failures: list = field(default_factory=list)


class _OneRound(LegacyStrategy):
    """The legacy strategy SecAgg+'s workflow drives: it hands out prepared ``FitIns`` and keeps the results."""

    def __init__(self, instructions):
        self.instructions, self.results, self.failures = instructions, None, []

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        return self.instructions

    def aggregate_fit(self, server_round, results, failures):
        self.results, self.failures = list(results), list(failures)
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class _ReplyTap:
    """The grid seen by the workflow: every reply of every stage is passed to ``on_reply(stage, msg)``."""

    def __init__(self, grid, on_reply):
        self._grid, self._on_reply, self._stage = grid, on_reply, 0

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        stage = Stage.all()[min(self._stage, len(Stage.all()) - 1)]
        for m in replies:
            self._on_reply(stage, m)
        self._stage += 1
        return replies

    def __getattr__(self, name):
        return getattr(self._grid, name)


def workflow_from_settings(s, n_nodes: int, max_weight: float, clip: float) -> SecAggPlusWorkflow:
    """SecAgg+ with the run's share count, threshold (an int above 1 is a count, a float up to 1 a fraction),
    clipping range ``clip``, the weight bound ``max_weight`` and the finest quantisation ``n_nodes`` allow (unless
    the run config fixes one)."""

    def count_or_fraction(v: float, key: str):
        if v > 1:
            if v != int(v):
                raise ValueError(f"run config: {key} above 1 is a count of nodes and must be whole, got {v}")
            return int(v)
        return float(v)

    return SecAggPlusWorkflow(
        count_or_fraction(s.secagg_num_shares, "secagg-num-shares"),
        count_or_fraction(s.secagg_reconstruction_threshold, "secagg-reconstruction-threshold"),
        max_weight=float(max_weight),
        clipping_range=float(clip),
        quantization_range=int(s.secagg_quantization_range or quantization_range(n_nodes)),
        timeout=float(s.round_timeout),
    )


def run_secure_round(
    grid,
    nodes: list[int],
    shared: dict,
    round_config: dict,
    item_tables: set[str],
    s,
    server_round: int,
    max_weight: float,
    audit_dir: Path | None = None,
) -> SecureRound:
    clip = float(s.secagg_clipping_range or clipping_range(shared, round_config["upload"]))
    """One training round under SecAgg+: only the aggregate of the nodes' vectors reaches this function."""
    names = sorted(shared)
    params = ndarrays_to_parameters([shared[n].detach().cpu().numpy() for n in names])
    config = {FIT_NAMES: json.dumps(names), FIT_CONFIG: json.dumps(round_config)}
    one = _OneRound([(GridClientProxy(n, grid, 0), FitIns(params, config)) for n in nodes])
    state = RecordDict(
        {
            MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: int(server_round)}),
            MAIN_PARAMS_RECORD: ArrayRecord(),
        }
    )
    ctx = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}), strategy=one)
    tap = _ReplyTap(grid, lambda stage, m: audit_reply(audit_dir, server_round, stage, m) if audit_dir else None)
    workflow_from_settings(s, len(nodes), max_weight, clip)(tap, ctx)
    if not one.results:
        reasons = "; ".join(str(f) for f in one.failures) or "see the ServerApp log (too few nodes replied)"
        raise RuntimeError(f"round {server_round}: secure aggregation did not complete ({reasons})")
    aggregate = parameters_to_ndarrays(one.results[0][1].parameters)
    parts = layout({k: tuple(v.shape) for k, v in shared.items()}, item_tables)
    means, weights, loss = split_aggregate(aggregate, parts)
    return SecureRound(
        means,
        weights,
        loss,
        n_total=sum(int(r.num_examples) for _, r in one.results),
        nodes=len(one.results),
        users=sum(int(r.metrics.get("users", 0)) for _, r in one.results),
        failures=[str(f) for f in one.failures],
    )


def audit_reply(folder: Path, server_round: int, stage: str, msg: Message) -> None:
    """Store what one node's reply in one SecAgg+ stage gave the server: record names, every array (there
    should be none) and the masked vector (collect stage) as int64 arrays; bytes are listed by length."""
    out = Path(folder) / f"round{server_round:03d}-train-secagg"
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{stage}-node{msg.metadata.src_node_id}"
    if msg.has_error():
        write_json_atomic(f"{stem}.json", {"error": str(msg.error.reason)})
        return
    arrays, configs = {}, {}
    for rname, rec in msg.content.items():
        if isinstance(rec, ArrayRecord):
            arrays.update({f"{rname}::{k}": v.numpy() for k, v in rec.items()})
        else:
            configs[rname] = {k: _describe(v) for k, v in rec.items()}
    masked = msg.content.config_records.get(RECORD_KEY_CONFIGS, {}).get(Key.MASKED_PARAMETERS) or []
    arrays.update({f"masked::{i}": bytes_to_ndarray(b) for i, b in enumerate(masked)})
    np.savez(f"{stem}.npz", **arrays)
    write_json_atomic(
        f"{stem}.json",
        {
            "records": sorted(msg.content.keys()),
            "configs": configs,
            "arrays": sorted(arrays),
            "masked_bytes": int(sum(len(b) for b in masked)),
        },
    )


def _describe(v):
    if isinstance(v, bytes):
        return {"bytes": len(v)}
    if isinstance(v, (list, tuple)):
        return [_describe(x) for x in v]
    return v
