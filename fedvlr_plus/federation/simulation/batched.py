"""The batched simulator: the clients of a round trained together as stacked tensors.

Every parameter gets a leading client dimension ``C``. Item tables are not copied whole: each client works on the
rows it touches this round (its positives and all its negatives over all local epochs), gathered into
``[C, T, d]`` with ``T`` the largest row count in the chunk. The local steps of all clients run in lock-step:
at step ``s`` each client sees its own mini-batch (padded and masked), the loss is the sum of the clients' own
mean losses, so one ``autograd.grad`` call returns every client's own gradient, and each client takes its own SGD
step. Clients with fewer steps are masked out of the steps they do not have.

This computes exactly what :class:`~fedvlr_plus.federation.client.RecClient` computes for each client one at a
time (same schedule, same initial state, same update rule); only floating-point summation order differs. Clients
are sorted by size and cut into chunks bounded by ``chunk_floats`` so that padding and memory stay small.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...adapters.base import Backbone
from ...adapters.chunk_steps import keeps_shared_fixed
from ..messages import ClientUpdate
from ..privacy.noise import privatise
from ..state.initial import round_start, stored_or_initial
from ..state.store import save_block
from .batched_scoring import BatchedScoring, history_ctx
from .dot_steps import DotSteps
from .indexed_rows import IndexedRows
from .schedule import Schedule, build_schedule
from .scratch import Scratch
from .summed_chunk import SummedChunk


def _chunks(order: np.ndarray, cost: np.ndarray, budget: float, overhead: float) -> list[np.ndarray]:
    """Greedy cut of clients sorted by cost: a chunk ends when it would exceed ``budget`` or when padding it to
    the newcomer's size would more than double its real work (plus a fixed per-chunk overhead)."""
    out, cur, cur_sum = [], [], 0.0
    for c in order:
        w = float(cost[c])
        if cur and ((len(cur) + 1) * w > budget or (len(cur) + 1) * w > 2.0 * (cur_sum + w) + overhead):
            out.append(np.array(cur, dtype=np.int64))
            cur, cur_sum = [], 0.0
        cur.append(c)
        cur_sum += w
    if cur:
        out.append(np.array(cur, dtype=np.int64))
    return out


def _always(config: dict) -> bool:
    """A closed form that holds under every round's rule (one without ``covers``)."""
    return True


def _hidden_on_cpu(hidden: dict) -> dict:
    """A chunk's hidden sums (:class:`SummedChunk`) with every tensor on the CPU, where the round's sums are."""
    return {group: (keys.cpu(), vals.cpu(), client.cpu(), n, {k: (kind, m.cpu()) for k, (kind, m) in out.items()})
            for group, (keys, vals, client, n, out) in hidden.items()}


def _trained_into(own: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """A chunk's trained private state back in ``own``, the CPU tensor it started from (on a GPU: the store's own
    rows where it handed them out, so the state lands in place and the store writes nothing more; on the CPU the
    chunk trained ``own`` itself)."""
    if trained is not own:
        own.copy_(trained)
    return own


class BatchedSimulator(BatchedScoring):
    """Trains and scores many clients at once from the training CSR (``indptr``, ``indices``)."""

    name = "batched"
    sums_chunks = True   # fit_chunks(..., summed=True) hands chunks over as blocks (:mod:`.summed_chunk`)

    def __init__(self, bb: Backbone, indptr: np.ndarray, indices: np.ndarray, store, *,
                 seed: int = 0, dtype=torch.float32, chunk_floats: int = 1 << 24, chunk_overhead: int = 1 << 18,
                 device: torch.device | str = "cpu"):
        self.bb = bb
        self.device = torch.device(device)   # where chunks are trained and scored (results come back to the CPU)
        self.indptr, self.indices = indptr, indices
        self.store = store
        self.seed = int(seed)
        self.dtype = dtype
        self.chunk_floats = int(chunk_floats)
        self.chunk_overhead = int(chunk_overhead)
        self.specs = {s.name: s for s in bb.all_specs()}
        self.table_width = sum(s.shape[1] if len(s.shape) > 1 else 1 for s in bb.all_specs() if s.item_table)
        self.dense_numel = sum(int(np.prod(s.shape)) if s.shape else 1 for s in bb.all_specs() if not s.item_table)
        self.scratch = Scratch()

    # ------------------------------------------------------------------ private state
    def _private_block(self, cids: np.ndarray, *, in_place: bool = False) -> dict[str, torch.Tensor]:
        """The stored private state of ``cids`` as one ``[C, ...]`` tensor per private parameter: fresh copies, or
        with ``in_place`` (a chunk about to train) the store's own rows where it can hand them out
        (:meth:`CompactStore.view_block`: a chunk it holds together, on the CPU in the simulator's dtype); clients
        without one get their initial state, drawn for all of them in one call."""
        names = [s.name for s in self.bb.private_specs()]
        if in_place and hasattr(self.store, "view_block"):
            own = self.store.view_block(cids, names, self.dtype)
            if own is not None:
                return own
        return stored_or_initial(self.bb, self.store, cids, names, self.seed, self.dtype)

    # ------------------------------------------------------------------ training
    def fit(self, cids, shared: dict[str, torch.Tensor], config: dict) -> list[ClientUpdate]:
        updates = {u.cid: u for chunk in self.fit_chunks(cids, shared, config) for u in chunk}
        return [updates[int(c)] for c in np.asarray(cids, dtype=np.int64)]

    def fit_chunks(self, cids, shared: dict[str, torch.Tensor], config: dict, summed: bool = False):
        """The round's uploads one chunk of clients at a time (the engine adds each chunk to the strategy's
        running sums and drops it, :mod:`.upload_stream`); ``summed``: as a :class:`SummedChunk` each."""
        cids = np.asarray(cids, dtype=np.int64)
        n = self.indptr[cids + 1] - self.indptr[cids]
        k, epochs, bsz = int(config["negatives"]), int(config["epochs"]), int(config["batch_size"])
        rows_est = np.minimum(self.bb.n_items, n * (1 + k * epochs))
        slots_est = np.minimum(n, bsz) * (1 + k)
        cost = (rows_est + slots_est) * max(self.table_width, 1) + self.dense_numel
        order = np.argsort(n, kind="stable")
        # the round's shared tables are the same for every chunk: on a GPU they cross the bus once a round, not
        # once a chunk (at 35k FedVLR clients, 13 MB a chunk times 101 chunks); on the CPU ``to`` is the tensor itself
        on_device = {k: v.to(self.device) for k, v in shared.items()}
        for idx in _chunks(order, cost, self.chunk_floats, self.chunk_overhead):
            yield self._fit_chunk(cids[idx], shared, on_device, config, summed)

    def _fit_chunk(self, cids: np.ndarray, cpu_shared: dict[str, torch.Tensor], shared: dict[str, torch.Tensor],
                   config: dict, summed: bool = False):
        """Every client of the chunk trains its local epochs in lock-step and yields its upload (the round's shared
        tensors as the strategy holds them, ``cpu_shared``, and on the simulator's device, ``shared``)."""
        batch = self._chunk_batch(cids, config)
        own = round_start(self.bb, self._private_block(cids, in_place=True))
        private = {k: v.to(self.device, non_blocking=True) for k, v in own.items()}
        kernel, fixed = self._closed_form_plan(batch, config)
        # rank-one steps of a dot-product head read the broadcast table: the rows are gathered only if needed
        lazy = (self.bb.dot_head[0],) if kernel is None and self._dot_steps_apply(batch, config, fixed) else ()
        sgd = self._local_sgd(batch, shared, private, config, fixed, lazy)
        loss_sum, steps_done = self._local_steps(cids, batch, shared, sgd, config, kernel, fixed)
        private = {k: _trained_into(own[k], v) for k, v in private.items()}
        if summed:
            return self._summed_chunk(cids, batch, cpu_shared, private, sgd, loss_sum, steps_done, config)
        return self._chunk_updates(cids, batch, cpu_shared, private, sgd, loss_sum, steps_done, config)

    def _chunk_batch(self, cids: np.ndarray, config: dict) -> _ChunkBatch:
        """The chunk's schedule for this round, the rows each client touches and its examples, on the device."""
        dtype, dev = self.dtype, self.device
        sched = build_schedule(self.indptr, self.indices, cids, self.bb.n_items,
                               seed=int(config.get("seed", self.seed)), round=int(config["round"]),
                               epochs=int(config["epochs"]), negatives=int(config["negatives"]),
                               batch_size=int(config["batch_size"]))
        c_n, rows = len(cids), sched.rows
        t_max, s_max, l_max = int(rows.max()), sched.steps_max, sched.slots
        # touched rows, padded with row 0 of the client's own list (never indexed by a real example)
        owner = np.repeat(np.arange(c_n), rows)
        pos = np.arange(len(sched.touched)) - sched.touched_ptr[owner]
        touched_np = np.zeros((c_n, t_max), dtype=np.int64)
        touched_np[owner, pos] = sched.touched
        touched = torch.from_numpy(touched_np).to(dev)

        # scattered in numpy, then wrapped: a third of the time of torch's indexed assignment on the CPU
        flat = (sched.ex_client * s_max + sched.ex_step) * l_max + sched.ex_slot
        items = np.zeros(c_n * s_max * l_max, dtype=np.int64)
        labels = np.zeros(c_n * s_max * l_max, dtype=np.float32)
        mask = np.zeros(c_n * s_max * l_max, dtype=np.float32)
        items[flat] = sched.ex_local
        labels[flat] = sched.ex_label
        mask[flat] = 1.0
        items = torch.from_numpy(items).view(c_n, s_max, l_max).to(dev)
        labels, mask = (torch.from_numpy(x).view(c_n, s_max, l_max).to(dev, dtype) for x in (labels, mask))
        return _ChunkBatch(sched, owner, pos, touched, items, labels, mask, c_n, t_max, s_max, l_max)

    def _local_sgd(self, batch: _ChunkBatch, shared: dict, private: dict, config: dict,
                   fixed: tuple[str, ...] = (), lazy: tuple[str, ...] = ()) -> _LocalSGD:
        """The chunk's trainable tensors (shared parts copied per client, item tables as the touched rows) and
        the step rule, from the round's learning rates. ``fixed``: shared item tables the closed-form steps read
        from the broadcast copy and whose uploaded gradient they make themselves (no copy, no accumulator); ``lazy``:
        shared item tables whose rows and gradient are formed at the end, if at all (None until then)."""
        bb, dtype, specs, c_n, t_max = self.bb, self.dtype, self.specs, batch.c_n, batch.t_max
        touched = batch.touched
        leaves: dict[str, torch.Tensor] = {}
        for name in bb.shared_names:
            if name in fixed:
                continue
            g = shared[name].to(dtype)
            if name in lazy:
                leaves[name] = None
            elif specs[name].item_table:  # index_select on the flat ids is much faster than g[touched]
                leaves[name] = g.index_select(0, touched.view(-1)).view(c_n, t_max, *g.shape[1:])
            else:
                leaves[name] = g.unsqueeze(0).expand(c_n, *g.shape).clone()
        for s in bb.private_specs():
            if s.item_table:
                leaves[s.name] = private[s.name][torch.arange(c_n).unsqueeze(1), touched]
            else:
                leaves[s.name] = private[s.name]   # a fresh copy or the store's own rows: trained in place
        tables = [nm for nm in leaves if specs[nm].item_table]
        for nm in leaves:
            if nm not in tables and leaves[nm] is not None:
                leaves[nm].requires_grad_(True)
        # item tables are updated in place through a flat [C * T, d] view: a step gathers the rows of its
        # examples as a fresh leaf, and the SGD step scatters the gradient back with index_add (duplicates sum,
        # exactly as the gradient of the table would); no dense [C, T, d] gradient is ever materialised
        flat_tables = {nm: None if nm in lazy else leaves[nm].view(c_n * t_max, -1) for nm in tables}
        grads_mode = config.get("upload", "params") == "grads"
        acc = {name: None if name in lazy else torch.zeros_like(leaves[name])
               for name in bb.shared_names if name in leaves} if grads_mode else {}
        acc_flat = {nm: None if nm in lazy else acc[nm].view(c_n * t_max, -1) for nm in tables if nm in acc}
        lr = float(config["lr"])
        return _LocalSGD(leaves, flat_tables, acc, acc_flat, specs, lr=lr,
                         item_lr=lr * float(config.get("item_lr_scale", 1.0)),
                         wd=float(config.get("weight_decay", 0.0)),
                         local_shared=bool(config.get("local_shared", False)),   # see RecClient.fit
                         c_n=c_n, l_max=batch.l_max)

    def _local_steps(self, cids, batch: _ChunkBatch, shared: dict, sgd: _LocalSGD, config: dict,
                     kernel=None, fixed: tuple[str, ...] = ()):
        """Every local step of every client; each client's summed loss and its number of steps. ``kernel``/``fixed``:
        the closed form of the chunk's steps and the tables it keeps fixed (:meth:`_closed_form_plan`)."""
        bb, dev, dtype = self.bb, self.device, self.dtype
        c_n, t_max, s_max, l_max = batch.c_n, batch.t_max, batch.s_max, batch.l_max
        row_base = (torch.arange(c_n, device=dev) * t_max).unsqueeze(1)
        ctx = bb.round_context(shared)
        ctx["scratch"] = self.scratch   # (buffers for the closed-form steps' intermediates, kept across chunks)
        ctx["round"] = int(config.get("round", 1))   # (a closed form's round-dependent weights, as FedRAP's)
        if bb.uses_history:
            ctx.update({k: v.to(dev) for k, v in history_ctx(self.indptr, self.indices, cids).items()})
        # per-step quantities for all steps at once (fewer small tensor ops inside the loop)
        counts = batch.mask.sum(2)                                     # [C, S]
        active_all = (counts > 0).to(dtype)
        weight_all = batch.mask / counts.clamp(min=1.0).unsqueeze(2)  # each client's mean over its real examples
        fidx_all = (batch.items + row_base.unsqueeze(2)).transpose(0, 1).reshape(s_max, -1)   # [S, C * L]
        global_all = batch.touched.gather(1, batch.items.view(c_n, -1)).view(c_n, s_max, l_max)
        # closed-form gradients for dot-product heads (same maths as autograd; the sequential reference and
        # the tests keep autograd): d(w BCE)/d logit = w (sigmoid(logit) - y)
        dot = bb.dot_head
        fast = self._dot_head_fast(set(sgd.names)) and dot[0] in sgd.flat_tables
        mixture = None if kernel is None else kernel.local_steps(
            ctx, sgd.leaves, sgd.lr, sgd.wd, (c_n, t_max, s_max) if fixed else None)
        dots = self._dot_steps(shared, sgd, s_max) if fast and sgd.leaves[dot[0]] is None else None
        per_steps = []
        for s in range(s_max):
            y, wt, fidx = batch.labels[:, s], weight_all[:, s], fidx_all[s]
            if dots is not None:
                _, wname, bname = dot
                g_w, g_b, per = dots.step(sgd.leaves[wname], sgd.leaves[bname] if bname else None, global_all[:, s],
                                          y, wt)
                grads = {wname: g_w, bname: g_b}
                sgd.step([grads.get(n) for n in sgd.names], fidx, batch.mask[:, s], active_all[:, s])
            elif fast:
                per = self._closed_form_step(sgd, fidx, y, wt, batch.mask[:, s], active_all[:, s])
            elif mixture is not None:
                rows = mixture.rows(shared[kernel.table].to(dtype), sgd.flat_tables.get(kernel.table), fidx,
                                    global_all[:, s])
                grads, per = mixture.step(rows, sgd.leaves, y, wt, active_all[:, s], fidx)
                sgd.step([grads[n] for n in sgd.names], fidx, batch.mask[:, s], active_all[:, s])
            else:
                ctx["items_global"] = global_all[:, s]
                per = self._autograd_step(sgd, ctx, fidx, y, wt, batch.mask[:, s], active_all[:, s], config)
            per_steps.append(per)
        if dots is not None:   # the rows are formed when the uploads are made (as rows, or as factors of sums)
            sgd.deferred = (self.bb.dot_head[0], dots)
        if mixture is not None:
            mixture.finish(sgd.leaves, sgd.acc)
            if fixed:   # (the same for the gradient of the fixed fused rows)
                sgd.deferred = (kernel.table, mixture)
        steps_done = active_all.sum(1)
        loss_sum = (torch.stack(per_steps, 1) * active_all).sum(1) if per_steps else torch.zeros(c_n, dtype=dtype)
        return loss_sum.cpu(), steps_done.cpu()

    def _dot_head_fast(self, names: set) -> bool:
        """Whether the trained tensors ``names`` are a dot-product head's and nothing else (closed-form steps)."""
        bb, dot = self.bb, self.bb.dot_head
        return (dot is not None and type(bb).regulariser is Backbone.regulariser and not bb.uses_history
                and names == {n for n in dot if n is not None})

    def _dot_steps_apply(self, batch: _ChunkBatch, config: dict, fixed: tuple[str, ...]) -> bool:
        """Whether the chunk's steps are rank-one sums over the broadcast table (:mod:`.dot_steps`): a shared
        item table of a dot-product head, no weight decay, and cheaper than stepping gathered rows."""
        names = {n for n in self.bb.shared_names if n not in fixed} | {s.name for s in self.bb.private_specs()}
        if not self._dot_head_fast(names) or float(config.get("weight_decay", 0.0)):
            return False
        table = self.bb.dot_head[0]
        return (table in self.bb.shared_names and self.specs[table].item_table
                and DotSteps.fits(self.bb.n_items, batch.c_n, batch.s_max, batch.l_max, self.chunk_floats))

    def _dot_steps(self, shared: dict, sgd: _LocalSGD, s_max: int) -> DotSteps:
        """The chunk's steps of a dot-product head as rank-one sums over the broadcast table."""
        table = self.bb.dot_head[0]
        item_lr = sgd.item_lr if self.specs[table].scaled else sgd.lr
        stepped = table not in sgd.acc or sgd.local_shared    # as _LocalSGD.step: a gradient upload steps only
        return DotSteps(shared[table].to(self.dtype), sgd.c_n, s_max, item_lr, stepped)

    def _form_deferred(self, sgd: _LocalSGD, touched: torch.Tensor) -> None:
        """Write what the chunk's closed-form steps left to the end into its tables: the clients' rows after
        their :class:`DotSteps` (and their gradient, for a gradient upload), or the FedVLR layer's gradient of
        the fixed fused rows."""
        if sgd.deferred is None:
            return
        (table, steps), sgd.deferred = sgd.deferred, None
        if not isinstance(steps, DotSteps):   # the backbone's own closed form (and what else it defers)
            sgd.acc[table] = steps.table_grads(touched)
            if hasattr(steps, "dense_grads"):
                steps.dense_grads(sgd.acc)
            return
        grads = steps.row_grads(touched)
        if table in sgd.acc:
            sgd.acc[table] = grads
            sgd.acc_flat[table] = grads.view(-1, grads.shape[-1])
        rows = steps.table.index_select(0, touched.reshape(-1)).view(*touched.shape, -1)   # the broadcast rows
        if steps.stepped:
            steps.write_rows(rows, grads)
        sgd.leaves[table], sgd.flat_tables[table] = rows, rows.view(-1, rows.shape[-1])

    def _deferred_factors(self, sgd: _LocalSGD, batch: _ChunkBatch, upload: str):
        """``(table, (coef, factor, columns, base))``: the deferred table upload of the chunk as factors of the
        round's sums (:class:`SummedChunk`), where it is a shared table no stored state needs as rows; else
        None."""
        if sgd.deferred is None:
            return None
        table, steps = sgd.deferred
        if table not in self.bb.shared_names or self.bb.personal_copies:
            return None
        if not isinstance(steps, DotSteps):   # the backbone's own closed form
            if not hasattr(steps, "table_factors"):   # (its rows' gradient comes as rows only)
                return None
            real = torch.from_numpy(batch.owner * batch.t_max + batch.pos).to(self.device)
            coef, factor, columns = steps.table_factors(batch.touched.view(-1)[real], real, self.bb.n_items)
            return table, (coef, factor, columns, None)
        return table, steps.factors(upload)

    def _closed_form_plan(self, batch: _ChunkBatch, config: dict):
        """The backbone's closed-form step (the FedVLR layer's router and dot-product head), where it covers every
        trained tensor, and the shared tables it keeps fixed: the fused views, when they are not stepped locally
        and the per-step record of their gradient (``[S, C * T]``) is smaller than the gradient itself. (None,
        ()) where autograd trains the chunk."""
        step_kernel = getattr(self.bb, "step_kernel", None)
        kernel = step_kernel() if step_kernel is not None else self._closed_form()
        if kernel is None or {s.name for s in self.bb.all_specs()} != kernel.names \
                or not self.specs[kernel.table].item_table or not getattr(kernel, "covers", _always)(config):
            return None, ()
        # (steps that always form the rows' gradient at the end keep the rows fixed whatever the count of steps)
        fixed = (keeps_shared_fixed(config)
                 and (batch.s_max < self.specs[kernel.table].shape[1] or getattr(kernel, "defers_rows", False)))
        return kernel, (kernel.table,) if fixed else ()

    def _closed_form_step(self, sgd: _LocalSGD, fidx, y, wt, m, active) -> torch.Tensor:
        """One step of a dot-product head with its gradients in closed form; each client's weighted loss."""
        tname, wname, bname = self.bb.dot_head
        c_n, l_max, leaves = sgd.c_n, sgd.l_max, sgd.leaves
        with torch.no_grad():
            w = leaves[wname]
            rows = IndexedRows(sgd.flat_tables[tname], fidx.view(c_n, l_max), 1, w.shape[-1])   # (not gathered)
            logits = rows.dot(w).squeeze(-1)
            if bname is not None:
                logits = logits + leaves[bname].unsqueeze(-1)
            dlog = (torch.sigmoid(logits) - y) * wt
            fast_grads = {tname: dlog.unsqueeze(-1) * w.unsqueeze(1), wname: rows.weighted_sum(dlog)}
            if bname is not None:
                fast_grads[bname] = dlog.sum(1)
            per = F.binary_cross_entropy_with_logits(logits, y, weight=wt, reduction="none").sum(1)
        sgd.step([fast_grads[n] for n in sgd.names], fidx, m, active)
        return per

    def _autograd_step(self, sgd: _LocalSGD, ctx: dict, fidx, y, wt, m, active, config: dict) -> torch.Tensor:
        """One step through the backbone's own logits and regulariser; each client's loss (with its penalty)."""
        bb, c_n, l_max = self.bb, sgd.c_n, sgd.l_max
        p = dict(sgd.leaves)
        for nm in sgd.flat_tables:
            p[nm] = sgd.flat_tables[nm].index_select(0, fidx).view(c_n, l_max, -1).requires_grad_(True)
        logits = bb.logits(p, None, ctx)
        # the sum over clients of each client's mean loss, as one weighted BCE (fewer autograd nodes)
        total = F.binary_cross_entropy_with_logits(logits, y, weight=wt, reduction="sum")
        reg = bb.regulariser(p, None, m, config, ctx=ctx)
        if not isinstance(reg, float):
            reg = reg * active
            total = total + reg.sum()
        grads = torch.autograd.grad(total, [p[nm] for nm in sgd.names])
        with torch.no_grad():
            per = F.binary_cross_entropy_with_logits(logits.detach(), y, weight=wt, reduction="none").sum(1)
            if not isinstance(reg, float):
                per = per + reg.detach()
        sgd.step(grads, fidx, m, active)
        return per.detach()

    def _chunk_updates(self, cids, batch: _ChunkBatch, shared, private, sgd: _LocalSGD, loss_sum, steps_done,
                       config: dict) -> list[ClientUpdate]:
        """Store the chunk's private states and cut its stacked results into one upload per client, with a few
        whole-tensor calls (no per-client indexing)."""
        bb, specs, sched = self.bb, self.specs, batch.sched
        c_n, t_max, owner, pos = batch.c_n, batch.t_max, batch.owner, batch.pos
        upload = config.get("upload", "params")
        self._form_deferred(sgd, batch.touched)
        acc = {k: v.cpu() for k, v in sgd.acc.items()}
        detached = {k: v.detach().cpu() for k, v in sgd.leaves.items()}
        sizes = sched.rows.tolist()
        trows = torch.split(torch.from_numpy(sched.touched), sizes)

        def per_client(src: torch.Tensor, table: bool) -> list:
            if table:   # a client's real rows are the first of its T slots: views, not a copy of every upload
                rows = src.reshape(c_n, t_max, -1)
                return [rows[c, :n] for c, n in enumerate(sizes)]
            return list(src.unbind(0))

        up = {name: per_client(acc[name] if upload == "grads" else detached[name], specs[name].item_table)
              for name in bb.shared_names}
        self._store_chunk(cids, shared, private, detached, owner, pos, sched.touched, t_max)
        table_names = {name for name in bb.shared_names if specs[name].item_table}
        losses = (loss_sum / steps_done.clamp(min=1.0)).tolist()
        steps_l = steps_done.to(torch.int64).tolist()
        n_pos = sched.n_pos.tolist()
        out = []
        for c, cid in enumerate(cids.tolist()):
            arrays = {name: up[name][c] for name in up}
            rws = {name: trows[c] for name in table_names}
            out.append(privatise(ClientUpdate(cid=cid, kind=upload, arrays=arrays, rows=rws, num_examples=n_pos[c],
                                              metrics={"loss": losses[c], "steps": steps_l[c]}), shared, config))
        return out

    def _summed_chunk(self, cids, batch: _ChunkBatch, shared, private, sgd: _LocalSGD, loss_sum, steps_done,
                      config: dict) -> SummedChunk:
        """Store the chunk's private states and hand its uploads over as blocks: each item table's real rows,
        client after client (what :meth:`_chunk_updates` cuts into per-client views), dense arrays stacked."""
        bb, specs, sched = self.bb, self.specs, batch.sched
        upload = config.get("upload", "params")
        out = SummedChunk(kind=upload, cids=cids, num_examples=sched.n_pos,
                          losses=(loss_sum / steps_done.clamp(min=1.0)).numpy())
        rows, client = torch.from_numpy(sched.touched), torch.from_numpy(batch.owner)
        factors = self._deferred_factors(sgd, batch, upload)
        if factors is not None:
            name, parts = factors
            out.row_factors[name] = (*(None if x is None else x.cpu() for x in parts), rows, client)
            if hasattr(sgd.deferred[1], "hidden_sums"):   # (what else the steps defer, for the sums to map back)
                out.hidden = _hidden_on_cpu(sgd.deferred[1].hidden_sums(self.bb.n_items))
            sgd.deferred = None
        self._form_deferred(sgd, batch.touched)
        detached = {k: v.detach().cpu() for k, v in sgd.leaves.items() if v is not None}   # (None: as factors)
        self._store_chunk(cids, shared, private, detached, batch.owner, batch.pos, sched.touched, batch.t_max)
        real = torch.from_numpy(batch.owner * batch.t_max + batch.pos)
        # the padded rows of each client's T slots go with weight 0 (adding 0 changes no sum): no copy of the rows
        real_mask = torch.zeros(batch.c_n * batch.t_max, dtype=torch.bool)
        real_mask[real] = True
        slot_client = torch.arange(batch.c_n).repeat_interleave(batch.t_max)
        read_out = {n for part in out.hidden.values() for n, (kind, _) in part[4].items() if kind == "outer"}
        for name in bb.shared_names:
            if name in out.row_factors or name in read_out:
                continue
            src = sgd.acc[name].cpu() if upload == "grads" else detached[name]
            if specs[name].item_table:
                out.row_blocks[name] = (batch.touched.cpu().view(-1), src.reshape(batch.c_n * batch.t_max, -1),
                                        slot_client, real_mask, None)
            else:
                out.dense[name] = src
        return out

    def _personal_rows(self, cids: np.ndarray, name: str, shape: tuple) -> torch.Tensor:
        """Where the chunk's new personal copies ``name`` are written: the store's own rows where it hands them out
        (saving then writes nothing more), else a fresh tensor. A fresh ``[C, N, d]`` block every chunk is new
        memory each time, and its first writes cost a page fault every 4 KB."""
        own = self.store.view_block(cids, [name], self.dtype) if hasattr(self.store, "view_block") else None
        if own is not None and tuple(own[name].shape) == shape and own[name].is_contiguous():
            return own[name]
        return torch.empty(shape, dtype=self.dtype)

    def _store_chunk(self, cids, shared, private, detached, owner, pos, touched_rows, t_max) -> None:
        """Write the chunk's new private states back in one block: private parameters as trained, private item
        tables and personal copies with the touched rows replaced (``owner``/``pos``: the client and slot of
        each of the chunk's touched rows, ``touched_rows`` their item ids)."""
        bb, c_n, n_items = self.bb, len(cids), self.bb.n_items
        dst = torch.from_numpy(owner * n_items + touched_rows)        # flat rows in a [C * n_items, d] table
        src = torch.from_numpy(owner * t_max + pos)                  # flat rows in a [C * T, d] gathered table
        block = {}
        for sp in bb.private_specs():
            if sp.item_table:
                # the touched rows written into the chunk's own table (the store's rows where it handed them out,
                # so saving writes nothing more; else a fresh copy): the steps trained gathered copies of them
                full = private[sp.name] if private[sp.name].is_contiguous() else private[sp.name].contiguous()
                full.view(c_n * n_items, -1)[dst] = detached[sp.name].reshape(c_n * t_max, -1)[src]
                block[sp.name] = full
            else:
                block[sp.name] = detached[sp.name]
        for shared_name, personal in bb.personal_copies.items():
            g = shared[shared_name].to(self.dtype)
            full = self._personal_rows(cids, personal, (c_n, *g.shape))
            full.copy_(g.unsqueeze(0).expand_as(full))
            full.view(c_n * n_items, -1)[dst] = detached[shared_name].reshape(c_n * t_max, -1)[src]
            block[personal] = full
        save_block(self.store, cids, block)

@dataclass
class _ChunkBatch:
    """One chunk's local data on the device: its schedule, the rows each client touches (``touched``: ``[C, T]``
    global ids; ``owner``/``pos``: the client and place of each real row) and its examples as ``[C, S, L]`` local
    row ids, labels and a mask of the real ones."""

    sched: Schedule
    owner: np.ndarray
    pos: np.ndarray
    touched: torch.Tensor
    items: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor
    c_n: int      # clients
    t_max: int    # touched rows of the largest client
    s_max: int    # local steps of the longest client
    l_max: int    # example slots per step


@dataclass
class _LocalSGD:
    """The chunk's trained tensors and one local SGD step of every client at once (or, for uploads of
    gradients, their accumulation)."""

    leaves: dict          # name -> [C, ...]; item tables as the [C, T, d] touched rows
    flat_tables: dict     # item table -> its [C * T, d] view, stepped in place
    acc: dict             # shared name -> the gradient sum uploaded instead of parameters (else empty)
    acc_flat: dict        # item tables of ``acc`` as [C * T, d] views
    specs: dict
    lr: float
    item_lr: float
    wd: float
    local_shared: bool
    c_n: int
    l_max: int
    # (table, DotSteps | MixtureSteps): a table's rows or gradient upload the closed-form steps form at the end
    deferred: tuple | None = None

    @property
    def names(self) -> list[str]:
        return list(self.leaves)

    @torch.no_grad()
    def step(self, grads, fidx, m, active) -> None:
        """Apply ``grads`` (in ``names`` order) of the step whose examples are rows ``fidx`` of the flat tables
        (``m``: mask of the real ones, ``active``: clients that have this step)."""
        flat_tables, acc, acc_flat, c_n, l_max = self.flat_tables, self.acc, self.acc_flat, self.c_n, self.l_max
        used = None
        for name, g in zip(self.names, grads):
            if g is None:   # applied by the caller (the closed-form steps of the FedVLR layer)
                continue
            table = name in flat_tables
            if name in acc:
                if table:
                    acc_flat[name].index_add_(0, fidx, g.reshape(c_n * l_max, -1))
                else:
                    acc[name] += g
                if not self.local_shared:
                    continue
            step_lr = self.item_lr if self.specs[name].scaled else self.lr
            if table:
                if self.wd:  # decay the rows this step uses, before the gradient step (θ(1 - ηλ) - ηg)
                    if used is None:
                        used = torch.unique(fidx[m.reshape(-1) > 0])
                    flat_tables[name][used] *= (1.0 - step_lr * self.wd)
                # (scaling the gradient first is ~3x faster than index_add_'s alpha on CPU)
                flat_tables[name].index_add_(0, fidx, g.reshape(c_n * l_max, -1).mul_(-step_lr))
            else:
                if self.wd:
                    g = g + self.wd * self.leaves[name] * active.view(-1, *([1] * (g.dim() - 1)))
                self.leaves[name].add_(g, alpha=-step_lr)
