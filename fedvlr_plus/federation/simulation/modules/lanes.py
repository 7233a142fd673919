"""The training rows of one local step for a chunk of module clients, laid out for ``torch.func.vmap``.

The one-at-a-time module client turns a schedule step into a RecBole ``Interaction`` (``RecBoleBackbone.batch``):
pairwise models get one row per (positive, negative) pair, positive-major; pointwise models one row per slot.
Here the same rows are built for every client of a chunk at once, as ``[clients, rows]`` arrays padded to the
chunk's longest client, with item ids *local* to the client: id ``1 + j`` is the ``j``-th item the client touches
this round (``Schedule.touched_of``), id 0 the padding row. The per-client item tables are then the client's
gathered rows, and a gradient with respect to them is exactly the upload of its touched rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..schedule import Schedule


@dataclass
class StepLanes:
    """Rows of one local step for the chunk's clients (``c`` indexes the chunk)."""

    ids: dict[str, torch.Tensor]  # field -> [C, R] local ids (or labels), 0 in padding lanes
    weight: torch.Tensor  # [C, R] 1 / rows of the client in real lanes, 0 in padding
    rows: np.ndarray  # [C] real rows per client (0: the client takes no step here)
    used: torch.Tensor  # [C, 1 + T] bool: local item rows this step looks up


def example_order(sched: Schedule) -> np.ndarray:
    """The schedule's examples sorted by (client, step, slot): each client's steps are contiguous."""
    return np.lexsort((sched.ex_slot, sched.ex_step, sched.ex_client))


def step_lanes(
    sched: Schedule,
    order: np.ndarray,
    c0: int,
    c1: int,
    step: int,
    *,
    pairwise: bool,
    negatives: int,
    fields: dict[str, str],
    t_max: int,
    clients: np.ndarray | None = None,
) -> StepLanes:
    """``fields`` names the model's columns: ``user``, ``item`` and ``neg`` (pairwise) or ``label``;
    ``clients``: ``sched.ex_client[order]``, where the caller keeps it for many calls."""
    clients = sched.ex_client[order] if clients is None else clients
    lo = np.searchsorted(clients, c0, side="left")
    hi = np.searchsorted(clients, c1, side="left")
    sel = order[lo:hi]
    sel = sel[sched.ex_step[sel] == step]
    cl = sched.ex_client[sel] - c0
    slot = sched.ex_slot[sel]
    local = sched.ex_local[sel] + 1
    n_c = c1 - c0
    if pairwise:
        k = int(negatives)
        is_pos = slot % (1 + k) == 0
        q_max = int(slot.max() // (1 + k)) + 1 if len(slot) else 1
        pos_of = np.zeros((n_c, q_max), dtype=np.int64)
        pos_of[cl[is_pos], slot[is_pos] // (1 + k)] = local[is_pos]
        neg = ~is_pos
        q, t = slot[neg] // (1 + k), slot[neg] % (1 + k) - 1
        cl, row = cl[neg], q * k + t
        cols = {fields["item"]: pos_of[cl, q], fields["neg"]: local[neg]}
    else:
        row = slot
        cols = {fields["item"]: local, fields["label"]: sched.ex_label[sel]}
    rows = np.bincount(cl, minlength=n_c)
    r_max = max(1, int(row.max()) + 1 if len(row) else 1)
    ids = {fields["user"]: torch.zeros(n_c, r_max, dtype=torch.long)}
    ids[fields["user"]][torch.from_numpy(cl), torch.from_numpy(row)] = 1
    for name, v in cols.items():
        dt = torch.float32 if name == fields.get("label") else torch.long
        ids[name] = torch.zeros(n_c, r_max, dtype=dt)
        ids[name][torch.from_numpy(cl), torch.from_numpy(row)] = torch.from_numpy(np.asarray(v)).to(dt)
    weight = torch.zeros(n_c, r_max, dtype=torch.float32)
    safe = np.maximum(rows, 1).astype(np.float32)
    weight[torch.from_numpy(cl), torch.from_numpy(row)] = torch.from_numpy(1.0 / safe[cl])
    used = torch.zeros(n_c, 1 + t_max, dtype=torch.bool)
    used[torch.from_numpy(sched.ex_client[sel] - c0), torch.from_numpy(local)] = True
    return StepLanes(ids=ids, weight=weight, rows=rows, used=used)
