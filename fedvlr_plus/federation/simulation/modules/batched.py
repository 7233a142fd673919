"""Module clients (RecBole models) trained together: one ``torch.func.vmap`` over the clients of a chunk.

The numbers are those of :class:`~fedvlr_plus.federation.simulation.modules.client.ModuleClient`, the one-at-a-time
reference (to floating-point rounding):

- **Per-client parameters.** Each client gets the module parameters it would use alone, made small: its user row
  (a two-row user table, local user id 1), the item rows it touches this round (a ``1 + T`` row table, local ids
  from :mod:`.module_lanes`), its private tensors, and the shared dense parameters (one copy for all when they
  stay fixed during the round, as under ``fedgrad``; stacked per client when the client steps them). The model's
  own ``calculate_loss`` runs on them under ``vmap`` (outer: clients) inside ``torch.func.grad_and_value``.
- **The model's batch mean.** A client's rows have different counts, and a RecBole loss is a mean over its
  batch, so padding cannot go into the model's batch: an inner ``vmap`` runs ``calculate_loss`` on one row per
  lane and the client's loss is the weighted sum of its lanes (weight ``1 / rows``, 0 for padding). That is the
  model's loss wherever it is a mean (or sum) of per-row terms plus terms of the parameters only; a model whose
  loss couples the rows of a batch (batch statistics, in-batch negatives) gives other numbers, which the check
  below catches.
- **The same random draws.** Negatives and shuffles come from the counter-based schedule (keyed by seed, round,
  client). Dropout masks are drawn from one ``torch.Generator`` per client seeded as the reference client seeds
  torch, mask by mask in the model's call order with the shape the reference draws (``[rows, ...]``), so a
  client gets the masks it gets alone. Any other random call in the forward is an error under ``vmap``.
- **Local SGD** as :class:`~fedvlr_plus.federation.client.LocalTraining` steps it (lr, item lr, lazy weight
  decay of the rows used, gradient accumulation of a ``grads`` upload), clients without a step masked out.

- **The FedVLR layer** around the model: each client holds its touched rows of the broadcast fused views and its
  router, and every step mixes them into the model's item tables in front of the model's own batched step
  (:mod:`.module_fused`).

The first round checks itself before it trains: two of its clients (the smallest and the largest) are trained
batched, as a chunk of their own, and by the reference client, and the uploads, private states and losses are
compared. Models that cannot be batched fall back to the reference simulator, said once (a ``RuntimeWarning``)
and recorded as ``fallback``: graph models (each client has its own graph), layer parts the chunk does not
compute (personal item parts, a content preference), a forward that ``vmap`` cannot run (data-dependent control
flow, ``.item()``, unsupported in-place or random ops), and any model whose numbers differ from the reference's.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ....adapters.base import Backbone
from ...client import _tensor
from ...messages import ClientUpdate
from ...privacy.noise import privatise
from ...state.initial import round_start
from ...state.store import save_block
from ..schedule import build_schedule
from .client import ModuleClient, ModuleSimulator, _seed_of, one_thread
from .dropout import LaneDropout
from .lanes import example_order, step_lanes

#: padded rows (clients x rows) per vmap call: large enough that the per-call overhead is small, small enough
#: that the chunk's tensors stay in cache (ml-100k BPR: fastest between 4k and 32k)
LANES_PER_CHUNK = 65536
#: the self-check's tolerance (float32 sums in another order)
CHECK_RTOL, CHECK_ATOL = 1e-4, 1e-6
_WARNED: set[tuple[str, str]] = set()


def batch_refusal(bb: Backbone) -> str | None:
    """Why ``bb``'s clients cannot be batched by their structure, or None."""
    from .client import module_base

    base = module_base(bb)
    if base is not bb:  # a wrapper (the FusionLayer) says itself what it cannot batch
        why = bb.chunk_refusal()
        if why:
            return why
    if getattr(base, "graph", False):
        return "a graph model runs each client on its own graph"
    if base.personal_copies or base.uses_history or type(base).regulariser is not Backbone.regulariser:
        return "the backbone has personal copies, a history context or a regulariser"
    if any(s.per_round for s in bb.private_specs()):
        return "the backbone restarts private parameters every round"
    return None


class BatchedModuleSimulator(ModuleSimulator):
    """:class:`ModuleSimulator` with ``fit`` batched over clients (see the module docstring); scoring is the
    reference simulator's. ``fallback`` is None while batching, else why the clients run one at a time."""

    name = "module-batched"
    sums_chunks = True  # fit_chunks(..., summed=True) may hand chunks over as blocks (:mod:`.summed_chunk`)

    def __init__(
        self,
        bb: Backbone,
        indptr,
        indices,
        store,
        *,
        seed: int = 0,
        dtype=torch.float32,
        lanes_per_chunk: int = LANES_PER_CHUNK,
        **kw,
    ):
        super().__init__(bb, indptr, indices, store, seed=seed, dtype=dtype, **kw)
        self.lanes_per_chunk = int(lanes_per_chunk)
        self.fallback = batch_refusal(bb)
        self.checked = False
        if self.fallback:
            self._say_fallback()

    def _say_fallback(self) -> None:
        key = (self.bb.name, self.fallback)
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(
                f"{self.bb.name}: clients train one at a time ({self.fallback})", RuntimeWarning, stacklevel=3
            )

    def fit(self, cids, shared, config) -> list[ClientUpdate]:
        batched = np.asarray(cids, dtype=np.int64)
        if not self.fallback and not self.checked:
            self._self_check(batched, shared, config)
        if not self.fallback:
            with one_thread():
                try:
                    updates, states = self._fit_batched(batched, shared, config)
                except Exception as exc:  # a forward vmap cannot run: the reference runs the round instead
                    self.fallback = _cannot_vmap(exc)
            if not self.fallback:
                for chunk_cids, block in states:
                    save_block(self.store, chunk_cids, block)
                return updates
        self._say_fallback()
        return super().fit(cids, shared, config)

    # ------------------------------------------------------------------ the self-check
    def _self_check(self, cids: np.ndarray, shared, config) -> None:
        """Before the first batched round: train its smallest and its largest client batched, as a chunk of their
        own (nothing stored), and compare them with the reference client (:meth:`_check`). A client's draws and
        numbers do not depend on the chunk it trains in, so the round itself can then stream chunk by chunk."""
        sizes = np.diff(self.indptr)[cids]
        picks = cids[sorted({int(np.argmin(sizes)), int(np.argmax(sizes))})]
        with one_thread():
            try:
                updates, states = self._fit_batched(picks, shared, config)
            except Exception as exc:
                self.fallback = _cannot_vmap(exc)
                return
        self._check(picks, updates, states, shared, config)

    def _check(self, cids, updates, states, shared, config) -> None:
        """Train each client of ``cids`` with the reference client and compare with its batched ``updates`` and
        ``states`` (``(client ids, {name: [C, ...]})`` of every chunk)."""
        from ...state.store import MemoryStore

        where = {int(c): (block, j) for chunk_cids, block in states for j, c in enumerate(chunk_cids.tolist())}

        probe = MemoryStore()
        for i, cid in enumerate(np.asarray(cids).tolist()):
            held = self.store.load(cid)
            if held is not None:
                probe.save(cid, held)
            pos = self.indices[self.indptr[cid] : self.indptr[cid + 1]]
            ref = ModuleClient(cid, self.bb, pos, probe, seed=self.seed, dtype=self.dtype).fit(shared, config)
            block, j = where[cid]
            worst = _difference(ref, updates[i], probe.load(cid), {k: v[j] for k, v in block.items()})
            if worst is not None:
                self.fallback = f"its batched numbers differ from the one-at-a-time client's ({worst})"
                return
        self.checked = True

    # ------------------------------------------------------------------ the batched round
    def fit_chunks(self, cids, shared, config, summed: bool = False):
        """The round's uploads a chunk of clients at a time, each chunk's private states stored as it ends, so the
        engine can add a chunk to the strategy's sums and drop it (:mod:`.running_sum`). A model that falls back
        comes as one chunk (:meth:`fit`); a chunk that fails hands the clients not yet trained to the reference
        client. ``summed``: the batched chunks as :class:`SummedChunk` blocks."""
        cids = np.asarray(cids, dtype=np.int64)
        if not self.fallback and not self.checked:
            self._self_check(cids, shared, config)
        if self.fallback:
            yield self.fit(cids, shared, config)
            return
        chunks, left = self._chunks_batched(cids, shared, config, summed), set(cids.tolist())
        while True:
            try:
                with one_thread():
                    out, chunk_cids, states = next(chunks)
            except StopIteration:
                return
            except Exception as exc:  # as in ``fit``: the reference trains the clients this chunk had
                self.fallback = _cannot_vmap(exc)
                self._say_fallback()
                yield super().fit([c for c in cids.tolist() if c in left], shared, config)
                return
            save_block(self.store, chunk_cids, states)
            left.difference_update(chunk_cids.tolist())
            yield out if summed else list(out.values())

    def _fit_batched(self, cids: np.ndarray, shared: dict, config: dict):
        out: dict[int, ClientUpdate] = {}
        states = []
        for out_c, cids_c, st_c in self._chunks_batched(cids, shared, config):
            out.update(out_c)
            states.append((cids_c, st_c))
        return [out[int(c)] for c in cids], states

    def _chunks_batched(self, cids: np.ndarray, shared: dict, config: dict, summed: bool = False):
        """``(uploads {cid: ...} (a SummedChunk when ``summed``), client ids [C], private states {name: [C, ...]})``
        of each chunk in turn."""
        base, dtype = self.base, self.dtype
        order = np.argsort(np.diff(self.indptr)[cids], kind="stable")
        rows = cids[order]  # clients of similar size share a chunk
        seed = int(config.get("seed", self.seed))
        sched = build_schedule(
            self.indptr,
            self.indices,
            rows,
            base.n_items,
            seed=seed,
            round=int(config["round"]),
            epochs=int(config["epochs"]),
            negatives=int(config["negatives"]),
            batch_size=int(config["batch_size"]),
        )
        shared_t = {k: _tensor(v, dtype) for k, v in shared.items()}
        ex_order = example_order(sched)
        ex_order = (ex_order, sched.ex_client[ex_order])  # (the clients in that order: read every step)
        per_client = np.bincount(sched.ex_client, minlength=len(rows))
        c0 = 0
        while c0 < len(rows):
            c1 = _chunk_end(per_client, c0, self.lanes_per_chunk)
            base.template.train()
            try:
                out, states = self._fit_chunk(sched, ex_order, rows, c0, c1, shared_t, config, seed, summed)
            finally:
                base.template.eval()
            yield out, rows[c0:c1], states
            c0 = c1

    def _initial_states(self, cids) -> dict[str, torch.Tensor]:
        """The private states of ``cids`` as they start the round, ``{name: [C, ...]}``."""
        return round_start(self.bb, self.private_block(cids))

    def _fit_chunk(self, sched, ex_order, rows, c0, c1, shared, config, seed, summed: bool = False):
        from .chunk import ChunkTraining, summed_chunk

        cids = rows[c0:c1]
        fused = self.bb is not self.base
        if fused:
            positives = [np.unique(self.indices[self.indptr[c] : self.indptr[c + 1]]) for c in cids.tolist()]
            chunk = self.bb.start_chunk(
                sched, c0, c1, shared, self._initial_states(cids), config, self.dtype, positives
            )
        else:
            chunk = ChunkTraining.start(
                self.base, sched, c0, c1, shared, self._initial_states(cids), config, self.dtype
            )
        if summed and not fused and chunk.upload == "grads" and not chunk.local_shared and chunk.bpr is not None:
            chunk.direct = []  # the item gradients go to the sums as rows (the table is fixed in the round)
        dropout = LaneDropout(lambda: [_seed_of(seed, config["round"], int(c), 17) for c in cids], len(cids))
        steps = sched.n_steps[c0:c1]
        losses = [[] for _ in cids]
        for s in range(int(steps.max())):
            lanes = step_lanes(
                sched,
                ex_order[0],
                c0,
                c1,
                s,
                clients=ex_order[1],
                pairwise=chunk.pairwise,
                negatives=int(config["negatives"]),
                fields=chunk.fields,
                t_max=chunk.t_max,
            )
            grads, loss = chunk.gradients(lanes, dropout.step(lanes.rows))
            active = torch.from_numpy(steps > s)
            chunk.step(grads, lanes.used, active)
            for j in np.flatnonzero(steps > s):
                losses[j].append(float(loss[j]))
        if summed:
            return (
                chunk.summed(sched, cids, losses) if fused else summed_chunk(chunk, sched, cids, losses)
            ), chunk.states()
        return chunk.finish(sched, cids, losses, config, privatise)


def _cannot_vmap(exc: Exception) -> str:
    """The fallback reason recorded when ``vmap`` cannot run the model's forward."""
    return f"vmap cannot run its forward: {type(exc).__name__}: {exc}"[:300]


def _chunk_end(per_client: np.ndarray, c0: int, lanes: int) -> int:
    """End of the chunk from ``c0``: clients (sorted by size) while clients x the largest fits in ``lanes``."""
    c1 = c0 + 1
    while c1 < len(per_client) and (c1 + 1 - c0) * int(per_client[c1]) <= lanes:
        c1 += 1
    return c1


def _difference(ref: ClientUpdate, got: ClientUpdate, ref_state: dict, got_state: dict) -> str | None:
    """A description of the first array that differs beyond the tolerance, or None."""
    pairs = [(f"upload {k}", ref.arrays[k], got.arrays.get(k)) for k in ref.arrays]
    pairs += [(f"upload rows {k}", ref.rows[k], got.rows.get(k)) for k in ref.rows]
    pairs += [(f"private {k}", ref_state[k], got_state.get(k)) for k in ref_state]
    pairs.append(("loss", torch.tensor(ref.metrics["loss"]), torch.tensor(got.metrics["loss"])))
    for what, a, b in pairs:
        if b is None or a.shape != b.shape:
            return f"{what}: missing or of another shape"
        if not torch.allclose(a.double(), b.double(), rtol=CHECK_RTOL, atol=CHECK_ATOL):
            return f"{what}: max abs diff {float((a.double() - b.double()).abs().max()):.2e}"
    return None
