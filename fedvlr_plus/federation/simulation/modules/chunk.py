"""One chunk of module clients training together: their stacked small parameter tables, the vmapped gradient of
the model's own loss, the local SGD step and the uploads (see :mod:`.module_batched` for the design).

Tables per client (``C`` = clients of the chunk, ``T`` = most item rows a client of the chunk touches):

- user-indexed parameters: ``[C, 2, ...]``, row 0 the model's padding row, row 1 the client's own row;
- item tables: ``[C, 1 + T, ...]``, row 0 the model's padding row, row ``1 + j`` the shared row of the client's
  ``j``-th touched item (rows past a client's own count stay zero and are never looked up);
- whole private parameters: ``[C, ...]``;
- dense shared parameters: one copy (``fixed``) when the round keeps them fixed, else ``[C, ...]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.func import grad_and_value, vmap

from ...messages import ClientUpdate
from ..summed_chunk import SummedChunk
from .bpr import bpr_gradients, closed_form_bpr


@dataclass
class ChunkTraining:
    base: object
    batched: dict  # name -> [C, ...] tables stepped per client
    fixed: dict  # name -> dense shared tensor, the same for every client of the round
    acc: dict  # shared name -> [C, ...] gradient sums (grads upload)
    shared: dict  # the round's broadcast (for the privacy mechanism)
    upload: str
    lr: float
    item_lr: float
    wd: float
    local_shared: bool
    pairwise: bool
    fields: dict
    t_max: int
    c0: int
    item_ids: torch.Tensor | None = None  # [C * (1 + T)] global id of each flat item-table row (-1: padding)
    # where set (a list), BPR's item gradients of a fixed item table go to the round's sums as rows
    # (:func:`summed_chunk`): (global ids, gradients, client index) of every step, no per-client tables
    direct: list | None = None

    @classmethod
    def start(
        cls, base, sched, c0: int, c1: int, shared: dict, states: dict, config: dict, dtype, fills_items: bool = False
    ):
        """``states``: the chunk's private states as they start the round, ``{name: [C, ...]}``; ``fills_items``:
        the caller puts the item tables into ``batched`` before every step (the FedVLR layer's mixture)."""
        from recbole.utils import InputType

        upload = config.get("upload", "params")
        local_shared = bool(config.get("local_shared", False))
        ptr = sched.touched_ptr
        t_max = int((ptr[c0 + 1 : c1 + 1] - ptr[c0:c1]).max())
        cids = [int(c) for c in sched.clients[c0:c1]]
        batched, fixed, item_ids = {}, {}, None
        for name, prm in base.template.named_parameters():
            kind, pad = base.kinds[name], prm.detach().to(dtype)
            if kind == "user":
                own = states[name].to(dtype).reshape(len(cids), 1, *pad.shape[1:])
                batched[name] = torch.cat([pad[:1].expand(len(cids), *pad[:1].shape), own], 1)
            elif kind == "private":
                batched[name] = states[name].to(dtype)
            elif kind == "item" and fills_items:
                continue
            elif kind == "item":
                batched[name], item_ids = _gathered_rows(shared[name], pad[0], sched, c0, c1, t_max)
            elif upload == "grads" and not local_shared:
                fixed[name] = shared[name].detach()
            else:
                batched[name] = shared[name].detach().expand(len(cids), *shared[name].shape).clone()
        # grads upload: the gradient sums, filled at the first step (see ``step``)
        acc = {n: None for n in base.shared_names} if upload == "grads" else {}
        m = base.template
        pairwise = base.input_type == InputType.PAIRWISE
        fields = {"user": m.USER_ID, "item": m.ITEM_ID}
        fields.update({"neg": m.NEG_ITEM_ID} if pairwise else {"label": m.LABEL})
        lr = float(config["lr"])
        return cls(
            base=base,
            batched=batched,
            fixed=fixed,
            acc=acc,
            shared=shared,
            upload=upload,
            lr=lr,
            item_lr=lr * float(config.get("item_lr_scale", 1.0)),
            wd=float(config.get("weight_decay", 0.0)),
            local_shared=local_shared,
            pairwise=pairwise,
            fields=fields,
            t_max=t_max,
            c0=c0,
            item_ids=item_ids,
        )

    # ------------------------------------------------------------------ gradients
    def gradients(self, lanes, dropout) -> tuple[dict, torch.Tensor]:
        """Per-client gradients (every parameter, ``[C, ...]``) and losses ``[C]`` of one local step.

        Each row lane gets its own small tables of the rows it looks up (user: ``[pad, own row]``; items:
        ``[pad, positive, negative]`` or ``[pad, item]``) and the model looks them up with constant ids 1 and 2;
        a row's gradient is its few rows, added into its client's tables afterwards. (Looking a client's whole
        table up from inside a ``grad`` under a ``vmap`` over rows makes functorch's embedding backward fill one
        dense table gradient per row.) A model with only user rows and item tables needs no per-client copy of
        anything: one ``vmap`` of the forward over the real rows of the chunk on the chunk's flat tables, and one
        plain backward (``_flat_gradients``); one with other parameters (dense towers, private tensors) runs a
        ``vmap`` over clients, each with its own copy, around a ``vmap`` over the client's rows."""
        look = self._lookups(lanes)
        if self.fixed or any(self.base.kinds[n] not in ("user", "item") for n in self.batched):
            return self._nested_gradients(lanes, look, dropout)
        return self._flat_gradients(lanes, look, dropout)

    @property
    def bpr(self):
        """RecBole's BPR, whose flat gradients have a closed form (:mod:`.module_bpr`), or None."""
        if not hasattr(self, "_bpr"):
            self._bpr = closed_form_bpr(self.base) if self.pairwise else None
        return self._bpr

    @property
    def padded(self) -> bool:
        """Whether a lane's tables keep the padding row first: only where an embedding has a padding index
        (its gradient skips row 0); otherwise a lane's tables hold just the rows it looks up."""
        return any(getattr(m, "padding_idx", None) is not None for m in self.base.template.modules())

    def _lookups(self, lanes) -> torch.Tensor:
        """``[C, R, 1 to 3]``: local item rows of each row lane (with the padding row first if ``padded``)."""
        f = self.fields
        cols = [torch.zeros_like(lanes.ids[f["item"]])] if self.padded else []
        cols.append(lanes.ids[f["item"]])
        if self.pairwise:
            cols.append(lanes.ids[f["neg"]])
        return torch.stack(cols, -1)

    def _row_loss(self, dropout, user_id: int):
        """The model's loss on one row lane: ``(params, label, client index, row index) -> scalar``; the lane's
        user row is row ``user_id`` of its user tables."""
        from recbole.data.interaction import Interaction

        base, f, pairwise = self.base, self.fields, self.pairwise
        first = int(self.padded)
        one, two = torch.full((1,), first, dtype=torch.long), torch.full((1,), first + 1, dtype=torch.long)
        user = torch.full((1,), int(user_id), dtype=torch.long)

        def row_loss(params, label, c, r):
            dropout.lane = (c, r)
            cols = {f["user"]: user, f["item"]: one}
            cols.update({f["neg"]: two} if pairwise else {f["label"]: label.unsqueeze(0)})
            return base.loss(params, Interaction(cols), cid=-1)

        return row_loss

    def _labels(self, lanes) -> torch.Tensor:
        return lanes.ids[self.fields["label"]] if not self.pairwise else torch.zeros_like(lanes.weight)

    def _nested_gradients(self, lanes, look, dropout):
        n_c, r_max = lanes.weight.shape
        clients = torch.arange(n_c)
        items = [n for n in self.batched if self.base.kinds[n] == "item"]
        lane_tables = {n: self.batched[n][clients[:, None, None], look] for n in items}
        own = {n: v for n, v in self.batched.items() if n not in lane_tables}
        row_loss = self._row_loss(dropout, 1)  # a client's own two-row user tables

        def client_loss(own, fixed, tables, labels, weight, c):
            params = {**fixed, **own}
            per_row = vmap(lambda t, y, r: row_loss({**params, **t}, y, c, r))
            return (per_row(tables, labels, torch.arange(r_max)) * weight).sum()

        per_client = vmap(grad_and_value(client_loss, argnums=(0, 1, 2)), in_dims=(0, None, 0, 0, 0, 0))
        with dropout:
            (g_own, g_fixed, g_tables), loss = per_client(
                own, self.fixed, lane_tables, self._labels(lanes), lanes.weight, clients
            )
        dropout.lane = None
        grads = {**g_fixed, **g_own}
        flat = (clients[:, None, None] * (self.t_max + 1) + look).reshape(-1)
        grads.update({n: self._added_rows(n, flat, g) for n, g in g_tables.items()})
        return grads, loss.detach()

    def _flat_gradients(self, lanes, look, dropout):
        """One ``vmap`` over the real rows of the chunk, the chunk's tables unbatched: every client's tables laid
        end to end (``[C * rows, ...]``) and each row looking its own client's rows up by their flat index. Only
        the forward is vmapped; the backward of the whole chunk is one plain autograd pass, whose embedding
        gradient is the client tables' gradient directly (no per-row copies of the rows, no scatter)."""
        n_c = lanes.weight.shape[0]
        cl, r = (lanes.weight > 0).nonzero(as_tuple=True)
        weight = lanes.weight[cl, r]
        f = self.fields
        width = {n: int(v.shape[1]) for n, v in self.batched.items()}
        item_width = next((w for n, w in width.items() if self.base.kinds[n] == "item"), 1)
        user_width = next((w for n, w in width.items() if self.base.kinds[n] == "user"), 2)
        local = look[cl, r, int(self.padded) :]  # the row's local item ids (positive[, negative])
        ids = {f["user"]: cl * user_width + 1, f["item"]: cl * item_width + local[:, 0]}
        if self.pairwise:
            ids[f["neg"]] = cl * item_width + local[:, 1]
        else:
            ids[f["label"]] = self._labels(lanes)[cl, r]
        tables = {n: v.detach().reshape((-1,) + tuple(v.shape[2:])) for n, v in self.batched.items()}
        names = list(tables)
        if self.bpr is not None:
            direct = self.direct is not None
            g_named, weighted = bpr_gradients(
                tables, self.bpr, ids[f["user"]], ids[f["item"]], ids[f["neg"]], weight, item_rows=direct
            )
            if direct:
                flat, g_rows = g_named.pop(self.bpr[1])
                self.direct.append(
                    (self.item_ids.index_select(0, flat), g_rows, torch.div(flat, item_width, rounding_mode="floor"))
                )
            g_flat = [g_named.get(n) for n in names]
        else:
            tables = {n: v.requires_grad_(True) for n, v in tables.items()}
            row_loss = self._flat_row_loss(dropout)
            with dropout, torch.enable_grad():
                per_row = vmap(row_loss, in_dims=(None, 0, 0, 0))(tables, ids, cl, r)
                weighted = per_row * weight
                g_flat = torch.autograd.grad(weighted.sum(), [tables[n] for n in names], allow_unused=True)
            dropout.lane = None
        loss = torch.zeros(n_c, dtype=weighted.dtype).index_add_(0, cl, weighted.detach())
        grads = {
            n: torch.zeros_like(self.batched[n]) if g is None else g.reshape(self.batched[n].shape)
            for n, g in zip(names, g_flat)
            if not (self.direct is not None and n == self.bpr[1])
        }
        return grads, loss

    def _flat_row_loss(self, dropout):
        """The model's loss on one row lane whose ids index the chunk's flat tables: ``(tables, ids, client
        index, row index) -> scalar``."""
        from recbole.data.interaction import Interaction

        base = self.base

        def row_loss(tables, ids, c, r):
            dropout.lane = (c, r)
            return base.loss(tables, Interaction({k: v.unsqueeze(0) for k, v in ids.items()}), cid=-1)

        return row_loss

    def _added_rows(self, name: str, flat_index: torch.Tensor, row_grads: torch.Tensor) -> torch.Tensor:
        """Row gradients of the lanes summed into ``[C, rows, ...]`` client tables (``flat_index``: client *
        rows + local row of every lane row)."""
        shape = self.batched[name].shape
        rest = tuple(shape[2:])
        out = torch.zeros((shape[0] * shape[1],) + rest, dtype=row_grads.dtype)
        return out.index_add_(0, flat_index, row_grads.reshape((-1,) + rest)).reshape(shape)

    # ------------------------------------------------------------------ the local step
    @torch.no_grad()
    def step(self, grads: dict, used: torch.Tensor, active: torch.Tensor) -> None:
        """:meth:`LocalTraining.step` for every client of the chunk; clients not ``active`` keep their values."""
        every = bool(active.all())
        for name, g in grads.items():
            if name in self.acc:
                accumulate(self.acc, name, g, active, every)
                if not self.local_shared:
                    continue
            kind, p = self.base.kinds[name], self.batched[name]
            if kind == "user":
                g, p = g[:, 1], p[:, 1]
            if self.wd:
                decay = p * _expand(used, p) if kind == "item" else p
                g = g + self.wd * decay
            lr = self.item_lr if kind == "item" and self._scaled(name) else self.lr
            p -= lr * g if every else _where(active, lr * g, 0.0)

    def _scaled(self, name: str) -> bool:
        return next(s for s in self.base.all_specs() if s.name == name).scaled

    # ------------------------------------------------------------------ uploads and private states
    def states(self) -> dict:
        """The chunk's new private states ``{name: [C, ...]}``."""
        return {
            s.name: (self.batched[s.name][:, 1] if self.base.kinds[s.name] == "user" else self.batched[s.name]).clone()
            for s in self.base.private_specs()
        }

    def finish(self, sched, cids, losses: list, config: dict, privatise) -> tuple[dict, dict]:
        """The chunk's uploads ``{cid: ClientUpdate}`` and its new private states ``{name: [C, ...]}``."""
        updates = {}
        for j, cid in enumerate(int(c) for c in cids):
            idx = self.c0 + j
            touched = torch.from_numpy(sched.touched_of(idx))
            arrays, rows = {}, {}
            for name in self.base.shared_names:
                src = (self.acc if self.upload == "grads" else self.batched)[name][j]
                # views of the chunk's tensors, which nothing writes to once the chunk is done
                if self.base.kinds[name] == "item":
                    arrays[name] = src[1 : 1 + len(touched)]
                    rows[name] = touched
                else:
                    arrays[name] = src
            steps = losses[j]
            up = ClientUpdate(
                cid=cid,
                kind=self.upload,
                arrays=arrays,
                rows=rows,
                num_examples=int(sched.n_pos[idx]),
                metrics={
                    "loss": float(np.mean(steps)) if len(steps) > 1 else (steps[0] if steps else 0.0),
                    "steps": len(steps),
                },
            )
            updates[cid] = privatise(up, self.shared, config)
        return updates, self.states()


def summed_chunk(chunk: ChunkTraining, sched, cids, losses: list) -> SummedChunk:
    """The chunk's uploads as blocks for the round's sums (:mod:`.summed_chunk`): each item table's ``[C, 1 + T]``
    rows as they are, the padding rows with weight 0 (no copy), dense arrays stacked."""
    tables, dense, direct = {}, {}, None
    for name in chunk.base.shared_names:
        if chunk.direct is not None and name == chunk.bpr[1]:  # every step's rows; each client's rows counted once
            direct = (name, chunk.direct)
            continue
        src = (chunk.acc if chunk.upload == "grads" else chunk.batched)[name]
        (tables if chunk.base.kinds[name] == "item" else dense)[name] = src
    return summed_blocks(chunk.upload, sched, cids, chunk.c0, chunk.t_max, losses, tables, dense, direct)


def summed_blocks(
    kind: str, sched, cids, c0: int, t_max: int, losses: list, tables: dict, dense: dict, direct: tuple | None = None
) -> SummedChunk:
    """A :class:`SummedChunk` of a chunk's uploads: ``tables`` ``{name: [C, 1 + T, ...]}`` item rows in the
    chunk's local layout, ``dense`` ``{name: [C, ...]}``; ``direct``: ``(name, [(global ids, gradients, client
    index) of every step])`` an item table's gradients handed over as rows."""
    c_n = len(cids)
    ptr = sched.touched_ptr
    counts = ptr[c0 + 1 : c0 + c_n + 1] - ptr[c0 : c0 + c_n]
    cl = np.repeat(np.arange(c_n), counts)
    j = np.arange(int(counts.sum())) - np.repeat(ptr[c0 : c0 + c_n] - ptr[c0], counts)
    slot = torch.from_numpy(cl * (1 + t_max) + 1 + j)
    rows = torch.zeros(c_n * (1 + t_max), dtype=torch.long)
    rows[slot] = torch.from_numpy(sched.touched[ptr[c0] : ptr[c0 + c_n]])
    real = torch.zeros(c_n * (1 + t_max), dtype=torch.bool)
    real[slot] = True
    client = torch.arange(c_n).repeat_interleave(1 + t_max)
    mean = [float(np.mean(x)) if len(x) > 1 else (x[0] if x else 0.0) for x in losses]
    out = SummedChunk(
        kind=kind,
        cids=np.asarray(cids, dtype=np.int64),
        num_examples=sched.n_pos[c0 : c0 + c_n],
        losses=np.asarray(mean, dtype=np.float64),
    )
    if direct is not None:
        name, steps = direct
        ids, vals, owner = (x[0] if len(x) == 1 else torch.cat(x) for x in zip(*steps))
        out.row_blocks[name] = (ids, vals, owner, None, (rows[real], client[real]))
    for name, src in tables.items():
        out.row_blocks[name] = (rows, src.reshape(c_n * (1 + t_max), -1), client, real, None)
    out.dense.update(dense)
    return out


def _gathered_rows(table: torch.Tensor, pad: torch.Tensor, sched, c0: int, c1: int, t_max: int) -> torch.Tensor:
    """``[C, 1 + T, ...]``: the padding row, then each client's touched rows of the shared ``table`` (and the
    padding row again past a client's own rows, which it never looks up); and the global id of each of those
    rows, flat (-1: a padding row)."""
    ptr = sched.touched_ptr
    counts = ptr[c0 + 1 : c1 + 1] - ptr[c0:c1]
    cl = np.repeat(np.arange(c1 - c0), counts)
    j = np.arange(ptr[c1] - ptr[c0]) - (ptr[c0:c1] - ptr[c0])[cl]
    index = np.zeros((c1 - c0, 1 + t_max), dtype=np.int64)  # 0: the padding row
    index[cl, j + 1] = sched.touched[ptr[c0] : ptr[c1]] + 1
    padded = torch.cat([pad.unsqueeze(0), table.detach()])
    flat = torch.from_numpy(index).view(-1)
    # (index_select on the flat ids is several times faster than advanced indexing with [C, 1 + T] ids)
    return padded.index_select(0, flat).view(c1 - c0, 1 + t_max, *padded.shape[1:]), flat - 1


def accumulate(acc: dict, name: str, g: torch.Tensor, active: torch.Tensor, every: bool) -> None:
    """Add one local step's gradient ``g`` of ``name`` to the upload sum ``acc[name]`` (None before the first),
    nothing for clients not ``active``. A step's gradients are fresh tensors: the first is kept, later ones are
    added to it in place."""
    g_in = g if every else _where(active, g, 0.0)
    acc[name] = g_in if acc[name] is None else acc[name].add_(g_in)


def _expand(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.reshape(mask.shape + (1,) * (like.dim() - mask.dim())).to(like.dtype)


def _where(active: torch.Tensor, value: torch.Tensor, other: float) -> torch.Tensor:
    return torch.where(_expand(active, value).bool(), value, other)
