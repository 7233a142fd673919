"""A sequential client and simulator for *module-based* backbones (a wrapped ``torch.nn.Module``, e.g. a RecBole
model through :class:`fedvlr_plus.adapters.recbole.backbone.RecBoleBackbone`), optionally under the FedVLR layer.

Same contract and same schedule as :class:`~fedvlr_plus.federation.client.RecClient` (the functional reference):
the client restores its private state from the store (a real load every round), runs its local steps, stores the
private state back and uploads only shared arrays (item tables row-wise: the rows it touched). The differences:

- the loss is the wrapped model's own ``calculate_loss`` on a batch built from the schedule, and scores come from
  its ``full_sort_predict``/``predict`` (the backbone's ``loss``/``scores``/``module_params``/``batch``);
- under :class:`~fedvlr_plus.fedvlr.FusionLayer` the model's item embedding tables are *replaced* for the
  forward pass by the client's router-weighted mixture of the server's fused views (split back into the model's
  tables by columns), so the model's own scoring code runs on fused item vectors and the uploaded gradient is the
  one with respect to the fused views (FedVLR Algorithm 1).

Local optimisation is plain SGD, as in the reference client (item rows at ``lr * item_lr_scale``). Dropout and
other randomness inside the model draw from a torch generator seeded by (seed, round, client).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from ....adapters.base import Backbone
from ...client import LocalTraining, _tensor, evaluate_client
from ...messages import ClientUpdate
from ...state.initial import init_private_block
from ...state.store import load_block
from ..schedule import build_schedule
from .fused_scoring import scores_together, together_refusal


def initial_private_block(bb: Backbone, cids, seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """The private state the clients ``cids`` start from, ``{name: [len(cids), ...]}``: the fusion layer's router
    from the keyed draws, the model's own private rows as the model initialises them under ``seed``."""
    model_rows = module_base(bb).initial_private(cids, seed)
    block = init_private_block(bb, cids, seed, dtype, skip=frozenset(model_rows))
    block.update(model_rows)
    return block


def module_base(bb: Backbone):
    """The module-based backbone inside ``bb`` (itself, or the base of a fusion layer), or None."""
    if getattr(bb, "module_based", False):
        return bb
    base = getattr(bb, "base", None)
    return base if getattr(base, "module_based", False) else None


@contextlib.contextmanager
def one_thread():
    """Run torch on one intra-op thread inside (restored afterwards). A client step works on tensors of a few
    thousand floats, where extra threads only wait for each other: on 2 shared cores torch's default (2 threads)
    cost 15x the CPU time of one thread for the same BPR round (docs/recbole.md, "Speed")."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _seed_of(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


class ModuleClient:
    """One user's device running a module-based backbone (see the module docstring)."""

    def __init__(
        self,
        cid: int,
        backbone: Backbone,
        positives,
        store,
        *,
        seed: int = 0,
        targets: dict[str, np.ndarray] | None = None,
        dtype=torch.float32,
    ):
        self.cid = int(cid)
        self.bb = backbone
        self.base = module_base(backbone)
        if self.base is None:
            raise TypeError(f"{backbone.name}: not a module-based backbone")
        self.fused = backbone if backbone is not self.base else None
        self.positives = np.unique(np.asarray(positives, dtype=np.int64))
        self.store = store
        self.seed = int(seed)
        self.targets = {k: np.asarray(v, dtype=np.int64) for k, v in (targets or {}).items()}
        self.dtype = dtype
        self._indptr = np.array([0, len(self.positives)], dtype=np.int64)

    # ------------------------------------------------------------------ private state
    def private_state(self) -> dict[str, torch.Tensor]:
        state = self.store.load(self.cid)
        if state is None:
            state = {
                name: v[0] for name, v in initial_private_block(self.bb, [self.cid], self.seed, self.dtype).items()
            }
        return state

    def _ctx(self, shared: dict) -> dict:
        ctx = {"items_global": torch.arange(self.bb.n_items), **self.bb.round_context(shared)}
        if self.bb.uses_history:
            h = torch.as_tensor(self.positives)
            ctx.update(hist_global=h, hist_mask=torch.ones(len(h), dtype=torch.bool))
        return ctx

    def _module_params(self, p: dict, ctx: dict) -> dict:
        q = dict(p)
        if self.fused is not None:
            q.update(self.base.split_item_repr(self.fused.item_repr(p, None, ctx)))
        return self.base.module_params(q, torch.tensor([self.cid]))

    # ------------------------------------------------------------------ fit
    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        bb, base, dtype = self.bb, self.base, self.dtype
        t = LocalTraining.start(bb, self.cid, shared, self.private_state(), config, dtype)
        p = t.p
        k = int(config["negatives"])
        sched = build_schedule(
            self._indptr,
            self.positives,
            np.array([0]),
            bb.n_items,
            ids=np.array([self.cid]),
            seed=int(config.get("seed", self.seed)),
            round=int(config["round"]),
            epochs=int(config["epochs"]),
            negatives=k,
            batch_size=int(config["batch_size"]),
        )
        ctx = self._ctx(t.shared)
        losses = []
        base.template.train()
        try:
            with torch.random.fork_rng(devices=[]):
                # the CPU generator only (torch.manual_seed also seeds CUDA, which costs ms per client)
                torch.default_generator.manual_seed(
                    _seed_of(config.get("seed", self.seed), config["round"], self.cid, 17)
                )
                for items_np, labels_np in sched.steps_of(0):
                    inter = base.batch(self.cid, items_np, labels_np, k)
                    loss = base.loss(self._module_params(p, ctx), inter, cid=self.cid, positives=self.positives)
                    items = torch.from_numpy(items_np)
                    loss = loss + bb.regulariser(p, items, torch.ones(len(items), dtype=dtype), config, ctx=ctx)
                    t.step(torch.autograd.grad(loss, [p[n] for n in t.names], allow_unused=True), items)
                    losses.append(float(loss.detach()))
        finally:
            base.template.eval()
        touched = torch.from_numpy(sched.touched_of(0))
        self.store.save(self.cid, {s.name: p[s.name].detach() for s in bb.private_specs()}, copy=False)
        return t.finish(bb, self.cid, touched, len(self.positives), losses, config)

    # ------------------------------------------------------------------ scoring and evaluation
    def scores(self, shared: dict) -> torch.Tensor:
        shared = {k: _tensor(v, self.dtype) for k, v in shared.items()}
        p = {**shared, **self.private_state()}
        with torch.no_grad():
            full = self._module_params(p, self._ctx(shared))
            return self.base.scores(full, torch.tensor([self.cid]), cid=self.cid, positives=self.positives)[0]

    def evaluate(self, shared: dict, config: dict) -> dict:
        return evaluate_client(self, shared, config)


class ModuleSimulator:
    """Sequential simulator over :class:`ModuleClient` (the engine picks it for module-based backbones).

    Scoring batches users through one model call when that is private-safe (no graph, no fusion, no whole
    private tensors), and otherwise scores one user at a time (each with its own graph or fused item table).
    """

    name = "module"
    #: False: the sampled protocol scores every item even where its candidates alone would be cheaper (the
    #: reference path ``fedvlr-plus bench eval --check`` times and compares against)
    score_candidates = True
    #: False: behind the FedVLR layer every user is scored alone, each with a full copy of the model's tables (the
    #: reference path of :mod:`.module_fused_scoring`)
    score_users_together = True

    def __init__(
        self, bb: Backbone, indptr: np.ndarray, indices: np.ndarray, store, *, seed: int = 0, dtype=torch.float32, **_
    ):
        self.bb = bb
        self.base = module_base(bb)
        self.indptr, self.indices = indptr, indices
        self.store = store
        self.seed = int(seed)
        self.dtype = dtype

    def client(self, cid: int) -> ModuleClient:
        pos = self.indices[self.indptr[cid] : self.indptr[cid + 1]]
        return ModuleClient(int(cid), self.bb, pos, self.store, seed=self.seed, dtype=self.dtype)

    def fit(self, cids, shared, config) -> list[ClientUpdate]:
        with one_thread():
            return [self.client(int(c)).fit(shared, config) for c in cids]

    def _batchable(self) -> bool:
        return self.bb is self.base and not self.base.graph and all(k != "private" for k in self.base.kinds.values())

    def scores(self, users, shared, batch: int = 256) -> torch.Tensor:
        with one_thread():
            return self._scores(users, shared, batch)

    @property
    def prefers_candidates(self) -> bool:
        """Whether the sampled protocol should score its candidates with :meth:`score_items`: where users are
        scored in batches and the model scores every item one (user, item) pair at a time (no
        ``full_sort_predict``); a model with its own full-sort scoring keeps it (one product, its own rounding)."""
        return self.score_candidates and self._batchable() and getattr(self.base, "predicts_pairs_only", False)

    def score_items(self, users, items, shared, batch: int = 256) -> torch.Tensor:
        """Scores ``[B, C]`` of the items ``items [B, C]`` (our ids) for ``users [B]``, through the model's
        ``predict`` on those pairs only."""
        users = np.asarray(users, dtype=np.int64)
        items = torch.as_tensor(np.asarray(items, dtype=np.int64))
        out = []
        with one_thread():
            for b0, ut, params in self._batched_params(users, shared, batch):
                with torch.no_grad():
                    out.append(self.base.score_items(params, ut, items[b0 : b0 + batch]))
        return torch.cat(out) if out else torch.zeros(0, items.shape[1], dtype=self.dtype)

    def _scores(self, users, shared, batch: int) -> torch.Tensor:
        users = np.asarray(users, dtype=np.int64)
        if not len(users):
            return torch.zeros(0, self.bb.n_items, dtype=self.dtype)
        if not self._batchable():
            if self.score_users_together and together_refusal(self) is None:
                return scores_together(self, users, shared)
            return torch.stack([self.client(int(u)).scores(shared) for u in users])
        out = []
        for _, ut, params in self._batched_params(users, shared, batch):
            with torch.no_grad():
                out.append(self.base.scores(params, ut))
        return torch.cat(out)

    def private_block(self, cids) -> dict[str, torch.Tensor]:
        """The private states of ``cids``, ``{name: [C, ...]}``, read as one block; clients without a stored state
        (before their first round) get their initial one, drawn for all of them at once."""
        names = [s.name for s in self.bb.private_specs()]
        if not names:
            return {}
        stored = load_block(self.store, cids, names)
        missing = np.flatnonzero(~np.logical_and.reduce([stored[n][1] for n in names]))
        fresh = initial_private_block(self.bb, np.asarray(cids)[missing], self.seed, self.dtype) if len(missing) else {}
        block = {}
        for name in names:
            vals = stored[name][0]
            if name in fresh:
                if vals is None:
                    vals = torch.zeros((len(cids),) + tuple(fresh[name].shape[1:]), dtype=fresh[name].dtype)
                vals[torch.as_tensor(missing)] = fresh[name].to(vals.dtype)
            block[name] = vals
        return block

    def _batched_params(self, users: np.ndarray, shared, batch: int):
        """``(start, users, module parameters)`` for each ``batch`` users from ``start`` on: the shared ones with
        these users' restored private rows placed in."""
        shared = {k: _tensor(v, self.dtype) for k, v in shared.items()}
        for b0 in range(0, len(users), batch):
            bu = users[b0 : b0 + batch]
            p = dict(shared)
            p.update({name: v.to(self.dtype) for name, v in self.private_block(bu).items()})
            ut = torch.as_tensor(bu)
            yield b0, ut, self.base.module_params(p, ut)
