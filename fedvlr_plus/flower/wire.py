"""What travels in a Flower message: the shared state as an ``ArrayRecord``, and a node's uploads as one
``ArrayRecord`` (keys ``u<cid>/<name>`` and ``u<cid>/<name>/rows``) with a ``MetricRecord`` of their counts."""

from __future__ import annotations

import numpy as np
import torch

try:
    from flwr.app import ArrayRecord, MetricRecord, RecordDict
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "fedvlr_plus.flower.app needs Flower's Message API: pip install 'fedvlr-plus[flower]' "
        "(flwr>=1.40,<2; do not add flwr[simulation], it pins a Ray that RecBole 1.2.1 refuses)"
    ) from exc

from ..federation.messages import ClientUpdate


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
    metrics = MetricRecord(
        {
            "num-examples": int(sum(u.num_examples for u in updates)),
            "cids": [int(u.cid) for u in updates],
            "n-examples": [int(u.num_examples) for u in updates],
            "loss": [float(u.metrics.get("loss", 0.0)) for u in updates],
            "steps": [int(u.metrics.get("steps", 0)) for u in updates],
        }
    )
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
    return [
        ClientUpdate(
            cid=c, kind=kind, arrays=per[c][0], rows=per[c][1], num_examples=n, metrics={"loss": lo, "steps": st}
        ).validate()
        for c, n, lo, st in zip(cids, n_ex, losses, steps)
    ]
