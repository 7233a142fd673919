"""The node's side of a secure round (Flower's SecAgg+; the server's side is :mod:`.secagg`).

The ClientApp always carries :func:`secagg_mod`, which hands a message to ``secaggplus_mod`` only when it carries
SecAgg+ configuration, so one ClientApp serves runs with and without secure aggregation; the run config's
``secagg`` decides. A secure round's key exchange and unmasking stages never reach the node's training handler,
and in a deployment every message is answered by a fresh ClientApp process: this module therefore imports
neither torch nor the trainer, so that those stages cost Flower's start-up only. The training stage reads its
shared state (:func:`secure_fit_inputs`) and answers with the node's dense vector (:func:`secure_fit_reply`),
which the mod masks before it leaves the node.
"""

from __future__ import annotations

import json

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE
from flwr.compat.common import recorddict_compat as compat

#: the config keys of a secure training message: the shared arrays' names and the round's configuration
FIT_NAMES, FIT_CONFIG = "fedvlr-names", "fedvlr-config"


def secagg_mod(msg: Message, ctxt: Context, call_next):
    """Flower's ``secaggplus_mod`` for messages of a secure round; every other message passes through."""
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)


def is_secure_train(msg: Message) -> bool:
    """A training message of a secure round (legacy ``FitIns`` records) rather than a plain one."""
    return "fitins.parameters" in msg.content.array_records


def secure_fit_inputs(msg: Message) -> tuple[dict, dict]:
    """The shared state (name -> tensor) and round configuration of a secure training message."""
    import torch

    ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    names = json.loads(str(ins.config[FIT_NAMES]))
    arrays = parameters_to_ndarrays(ins.parameters)
    if len(arrays) != len(names):
        raise ValueError(f"secure training message: {len(arrays)} arrays for {len(names)} names")
    shared = {n: torch.from_numpy(np.array(a, copy=True)) for n, a in zip(names, arrays)}
    return shared, json.loads(str(ins.config[FIT_CONFIG]))


def secure_fit_reply(updates, shared: dict, item_tables: set[str], context: Context) -> RecordDict:
    """The node's dense vector as a ``FitRes``; ``secaggplus_mod`` masks it before it leaves the node. The
    clipping range and the weight bound are those the server sent in the round's SecAgg+ setup."""
    from ..federation.privacy.secure_sum import layout, node_vector

    setup = context.state.config_records[RECORD_KEY_STATE]
    clipping_range, max_weight = float(setup["clipping_range"]), float(setup["max_weight"])
    parts = layout({k: tuple(v.shape) for k, v in shared.items()}, item_tables)
    vector, n_node = node_vector(updates, parts, clipping_range)
    if n_node > max_weight:
        raise ValueError(
            f"secure aggregation: this node has {n_node} training examples, more than the weight "
            f"bound {max_weight:g}; set secagg-max-weight to at least the largest node's count"
        )
    res = FitRes(
        status=Status(code=Code.OK, message="ok"),
        parameters=ndarrays_to_parameters(vector),
        num_examples=int(n_node),
        metrics={"users": len(updates)},
    )
    return compat.fitres_to_recorddict(res, keep_input=False)
