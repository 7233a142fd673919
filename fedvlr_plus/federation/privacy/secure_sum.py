"""Uploads that a secure sum can aggregate: one fixed-shape vector per node, and the aggregate turned back into
what our strategies expect.

Secure aggregation (Flower's SecAgg+) reveals to the server only the example-weighted mean of the nodes' vectors,
``Σ_i N_i v_i / Σ_i N_i`` (``N_i`` = the node's training examples), never one node's vector. Our uploads are
row-sparse (each user sends the item rows it touched and their ids), and a sum needs every node to send the same
shape, so under secure aggregation a node sends **dense** tables: for every shared array the node's
example-weighted mean ``v_i = Σ_{u∈i} n_u x_u / N_i`` with zeros on rows a user did not touch, and, for every item
table, the weight vector ``c_i[r] = Σ_{u∈i, u∋r} n_u / N_i`` (the share of the node's examples whose user touched
row ``r``). The weighted mean over nodes is then exactly what the strategies compute from the individual uploads:

- ``M = Σ_u n_u x_u / N`` (the weighted row sums of :func:`~.strategy.weighted_row_sums`, divided by ``N``), and
- ``W[r] = Σ_{u∋r} n_u / N`` (their per-row weights).

Row ids never leave the node: the server learns which rows the *federation* touched (``W > 0``), not which rows a
node or a user touched. The node's example count ``N_i`` is the SecAgg+ weight and is visible to the server.

:func:`aggregate_as_update` turns ``M`` and ``W`` into one :class:`~.messages.ClientUpdate` whose aggregation by
the run's own strategy gives the same result as the individual uploads would have: FedAvg, sparse row averaging
and gradient aggregation (also under the FedVLR server fusion) are linear in the uploads, so one aggregate with
weight 1 stands for all of them. Median and trimmed mean need every upload and cannot run on a sum.
"""

from __future__ import annotations

import numpy as np
import torch

from ..messages import ClientUpdate

#: strategies whose aggregate is a function of the weighted sums (and so can run on a secure sum)
SUMMABLE = ("fedavg", "sparse-avg", "fedgrad")
LOSS = "loss"
#: the mean loss travels divided by this public constant, so that it fits a clipping range of 1 like the weights
LOSS_SCALE = 64.0


def layout(shapes: dict[str, tuple], item_tables: set[str]) -> list[tuple[str, str, tuple]]:
    """The vector's parts, in an order every node and the server derive alike: ``("mean", name, shape)`` for
    every shared array, ``("weight", name, (rows,))`` for every item table, ``("loss", "", (1,))``."""
    names = sorted(shapes)
    parts = [("mean", n, tuple(shapes[n])) for n in names]
    parts += [("weight", n, (int(shapes[n][0]),)) for n in names if n in item_tables]
    return parts + [(LOSS, "", (1,))]


def node_vector(updates: list[ClientUpdate], parts, clipping_range: float) -> tuple[list[np.ndarray], int]:
    """A node's dense vector (flat float64 arrays in ``parts`` order) and its number of training examples ``N_i``.

    Refuses values outside ``[-clipping_range, clipping_range]``: SecAgg+ would clip them silently and the
    aggregate would be wrong."""
    n_node = sum(int(u.num_examples) for u in updates)
    if n_node <= 0:
        raise ValueError("secure aggregation: this node has no training examples to upload")
    out = []
    for kind, name, shape in parts:
        acc = np.zeros(shape, dtype=np.float64)
        for u in updates:
            w = u.num_examples / n_node
            if kind == LOSS:
                acc[0] += w * float(u.metrics.get("loss", 0.0)) / LOSS_SCALE
                continue
            rows = u.rows.get(name)
            if kind == "weight":
                if rows is None:
                    acc += w  # a table sent whole counts as touching every row
                else:
                    np.add.at(acc, rows.numpy().astype(np.int64), w)
                continue
            vals = u.arrays[name].detach().to(torch.float64).numpy()
            if rows is None:
                acc += w * vals
            else:
                np.add.at(acc, rows.numpy().astype(np.int64), w * vals)
        out.append(acc.reshape(-1))  # 1-d: Flower 1.42's unmasking skips its offset on 0-d arrays
    worst = max(float(np.abs(a).max()) if a.size else 0.0 for a in out)
    if worst > clipping_range:
        raise ValueError(
            f"secure aggregation: an upload value of magnitude {worst:.4g} exceeds the clipping range "
            f"{clipping_range:g}; raise secagg-clipping-range (SecAgg+ would clip it silently)"
        )
    return out, n_node


def split_aggregate(arrays: list[np.ndarray], parts) -> tuple[dict, dict, float]:
    """The aggregated vector back into ``M`` (per shared array), ``W`` (per item table) and the mean loss."""
    if len(arrays) != len(parts):
        raise ValueError(f"secure aggregate has {len(arrays)} arrays, expected {len(parts)}")
    means, weights, loss = {}, {}, float("nan")
    for (kind, name, shape), a in zip(parts, arrays):
        a = np.asarray(a, dtype=np.float64).reshape(shape)
        if kind == "mean":
            means[name] = a
        elif kind == "weight":
            weights[name] = a
        else:
            loss = float(a[0]) * LOSS_SCALE
    return means, weights, loss


def aggregate_as_update(
    rule: str, shared: dict[str, torch.Tensor], means: dict, weights: dict, n_total: int, kind: str
) -> ClientUpdate:
    """One upload (weight 1) whose aggregation under ``rule`` equals that of the individual uploads.

    - ``fedgrad`` (and the FedVLR server fusion): the strategy forms ``Σ_u w_u g_u = M``: send ``M``.
    - ``fedavg``: an item row becomes ``θ(1 − W) + M``; sent whole with weight 1, that is the new row.
    - ``sparse-avg``: a touched row becomes ``M / W``; sent for the touched rows only (``W`` above half the
      smallest possible positive weight ``1 / N``, so quantisation noise on untouched rows cannot count).
    """
    if rule not in SUMMABLE:
        raise ValueError(
            f"strategy {rule!r} cannot run on a secure sum (it needs every upload); choose one of {', '.join(SUMMABLE)}"
        )
    arrays, rows = {}, {}
    for name, base in shared.items():
        m = torch.from_numpy(means[name])
        if name in weights and rule != "fedgrad":
            w = torch.from_numpy(weights[name])
            w_col = w.reshape(-1, *([1] * (m.dim() - 1)))
            if rule == "fedavg":
                m = base.to(torch.float64) * (1.0 - w_col) + m
            else:
                hit = torch.nonzero(w > 0.5 / n_total).flatten()
                m = m[hit] / w_col[hit]
                rows[name] = hit
        arrays[name] = m.to(base.dtype)
    return ClientUpdate(cid=-1, kind=kind, arrays=arrays, rows=rows, num_examples=1).validate()


def clipping_range(shared: dict[str, torch.Tensor], kind: str) -> float:
    """A clipping range honest node vectors fit, from the public broadcast only: 1 for gradient uploads (a node's
    mean gradient is small; the weights are at most 1), and for parameter uploads (new values near the broadcast
    ones) the power of two at or above four times the largest broadcast value, at least 8 (Flower's default).
    A node refuses to upload a value outside it (:func:`node_vector`)."""
    if kind == "grads":
        return 1.0
    top = max((float(v.abs().max()) for v in shared.values() if v.numel()), default=0.0)
    return float(2.0 ** max(3, int(np.ceil(np.log2(max(4.0 * top, 1.0))))))


def quantization_range(n_nodes: int, modulus: int = 1 << 32) -> int:
    """The finest SecAgg+ quantisation for ``n_nodes``: the largest power of two ``T`` with ``n_nodes · T`` below
    the modulus, so that the sum of the nodes' quantised values (each in ``[0, T]``) cannot wrap around."""
    # at most 2**30: Flower's stochastic rounding holds the quantised values in int32
    return 1 << min(30, int(np.floor(np.log2((modulus - 1) / max(int(n_nodes), 1)))))


def vector_bytes(parts, bytes_per_value: int = 8) -> int:
    """Bytes of one node's masked vector (SecAgg+ sends int64 values, plus one for the node's weight)."""
    return bytes_per_value * (1 + sum(int(np.prod(shape)) for _, _, shape in parts))
