"""A node's training reply as one aggregate: the example-weighted sums of its users' uploads, not the uploads.

Where the strategy is linear (FedAvg, sparse row averaging, FedGrad and the FedVLR server step: the next state
depends on the uploads only through ``Σ_u w_u x_u`` and, per item row, ``Σ_{u ∋ r} w_u``), a node adds its users'
uploads as the batched simulator hands them over (:mod:`fedvlr_plus.federation.simulation.upload_stream`) and sends
the sums, weighted within the node (``n_u / N_node``), with ``N_node``. The server scales each node's sums by
``N_node / N`` and adds them: the round's sums, up to the order of float additions. A reply is then the size of
the shared state (the touched rows of each item table), whatever the number of users behind it.

Keys: ``sums/<name>`` (dense arrays, float64; item tables: the touched rows' sums), ``sums/<name>/rows`` and
``sums/<name>/weight`` (item tables: row ids and ``Σ w_u`` per row). Metrics: ``num-examples`` (``N_node``),
``loss-sum`` (``Σ_u n_u loss_u``), ``cids`` (the users behind the sums, so that overlapping partitions are caught).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from ..federation.simulation.running_sum import RunningSums
from ..federation.simulation.upload_stream import StreamedUploads

PREFIX = "sums/"


def sums_to_content(up: StreamedUploads, cids) -> RecordDict:
    arrays = {}
    for name in up.sums.rows:
        rows, num, den = up.sums.rows[name].touched()
        arrays[f"{PREFIX}{name}"] = num.contiguous()
        arrays[f"{PREFIX}{name}/rows"] = rows.to(torch.int64).contiguous()
        arrays[f"{PREFIX}{name}/weight"] = den.contiguous()
    for name in up.sums.dense:
        arrays[f"{PREFIX}{name}"] = up.sums.dense_sum(name).contiguous()
    n = np.asarray(up.num_examples, dtype=np.float64)
    metrics = MetricRecord(
        {
            "num-examples": int(n.sum()),
            "loss-sum": float(np.dot(n, up.losses)),
            "cids": [int(c) for c in np.asarray(cids).tolist()],
        }
    )
    return RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics})


def is_sums_reply(content: RecordDict) -> bool:
    return "loss-sum" in content["metrics"]


def _tensor(arr) -> torch.Tensor:
    return torch.from_numpy(np.array(arr.numpy(), copy=True))


def node_parts(content: RecordDict, shared: dict, tables) -> tuple[dict, dict]:
    """``(rows, dense)`` of one node's reply, checked against the shared state (names, widths, row range)."""
    rows, dense = {}, {}
    arrays = content["arrays"]
    keys = set(arrays.keys())
    for name, value in shared.items():
        key = f"{PREFIX}{name}"
        if name in tables:
            need = {key, f"{key}/rows", f"{key}/weight"}
            if not need <= keys:
                raise ValueError(f"node sums lack {sorted(need - keys)}")
            r, num, den = _tensor(arrays[f"{key}/rows"]).long(), _tensor(arrays[key]), _tensor(arrays[f"{key}/weight"])
            width = int(np.prod(value.shape[1:]))
            bad_rows = len(r) and (int(r.min()) < 0 or int(r.max()) >= value.shape[0])
            if num.reshape(len(r), -1).shape[1] != width or len(den) != len(r) or bad_rows:
                raise ValueError(f"node sums of {name!r} do not fit its shape {tuple(value.shape)}")
            rows[name] = (r, num, den)
            keys -= need
        else:
            if key not in keys or _tensor(arrays[key]).numel() != value.numel():
                raise ValueError(f"node sums lack {key!r} or it does not fit {tuple(value.shape)}")
            dense[name] = _tensor(arrays[key])
            keys.discard(key)
    if keys:
        raise ValueError(f"node sums hold arrays that are no shared parameter: {sorted(keys)[:3]}")
    return rows, dense


def merged_sums(contents: list[RecordDict], shared: dict, tables) -> tuple[RunningSums, float, int, list[int]]:
    """The round's sums from every node's reply: ``(sums, mean loss, examples, users)``."""
    totals = [float(c["metrics"]["num-examples"]) for c in contents]
    n_all = sum(totals)
    if n_all <= 0:
        raise ValueError("the replying nodes hold no training example")
    sums = RunningSums(shared, tables)
    cids: list[int] = []
    for content, n_node in zip(contents, totals):
        rows, dense = node_parts(content, shared, tables)
        node_cids = [int(c) for c in content["metrics"]["cids"]]
        sums.add_partial(rows, dense, n_node / n_all, len(node_cids))
        cids += node_cids
    loss = sum(float(c["metrics"]["loss-sum"]) for c in contents) / n_all
    return sums, loss, int(n_all), cids
