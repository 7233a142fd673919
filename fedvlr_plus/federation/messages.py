"""Messages between clients and the server: plain named arrays and scalars.

A :class:`ClientUpdate` is what a client uploads after local training: named arrays of **shared** parameters only
(their new values, or their gradients accumulated over all local steps, as ``kind`` says), the number of training
examples (the aggregation weight) and scalar metrics. Item tables travel row-wise: ``arrays[name]`` holds the rows
the client touched and ``rows[name]`` their item ids. ``to_message`` / ``from_message`` convert to and from a dict
of numpy arrays and Python scalars, which is what a Flower ``ArrayRecord`` / ``MetricRecord`` pair carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

KINDS = ("params", "grads")


@dataclass
class ClientUpdate:
    cid: int
    kind: str  # "params" (new values) or "grads" (accumulated gradients)
    arrays: dict[str, torch.Tensor]  # shared names only
    rows: dict[str, torch.Tensor] = field(default_factory=dict)  # item-table name -> int64 row ids
    num_examples: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"ClientUpdate.kind must be one of {KINDS}, got {self.kind!r}")

    def validate(self) -> ClientUpdate:
        """Row ids must belong to an uploaded array and match its number of rows."""
        for name, r in self.rows.items():
            if name not in self.arrays:
                raise ValueError(f"ClientUpdate: rows given for {name!r} but no array of that name")
            if r.shape[0] != self.arrays[name].shape[0]:
                raise ValueError(f"ClientUpdate: {name!r} has {self.arrays[name].shape[0]} rows but {len(r)} row ids")
        return self

    def to_message(self) -> dict:
        """Plain dict: numpy arrays and Python scalars only."""
        return {
            "cid": int(self.cid),
            "kind": self.kind,
            "arrays": {k: v.detach().cpu().numpy() for k, v in self.arrays.items()},
            "rows": {k: v.detach().cpu().numpy().astype(np.int64) for k, v in self.rows.items()},
            "num_examples": int(self.num_examples),
            "metrics": {k: float(v) for k, v in self.metrics.items()},
        }

    @classmethod
    def from_message(cls, msg: dict) -> ClientUpdate:
        return cls(
            cid=int(msg["cid"]),
            kind=str(msg["kind"]),
            arrays={k: torch.as_tensor(np.asarray(v)) for k, v in msg["arrays"].items()},
            rows={k: torch.as_tensor(np.asarray(v, dtype=np.int64)) for k, v in msg.get("rows", {}).items()},
            num_examples=int(msg["num_examples"]),
            metrics=dict(msg.get("metrics", {})),
        ).validate()


def shared_to_message(shared: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The server's broadcast: every shared array as numpy."""
    return {k: v.detach().cpu().numpy() for k, v in shared.items()}


def shared_from_message(arrays: dict) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.asarray(v)) for k, v in arrays.items()}
