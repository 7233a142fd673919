"""The client abstraction and the plain, one-client-at-a-time reference implementation.

A client owns its local data (its training positives, and the held-out items it evaluates on) and its private
state (named tensors in a store; they never leave the client). It answers two calls, both with plain inputs:

- ``fit(shared, config) -> ClientUpdate``: restore the private state, train locally, store the private state back,
  return the shared parts (new values or accumulated gradients, as ``config["upload"]`` says), the number of
  training examples and metrics;
- ``evaluate(shared, config) -> dict``: restore the private state, score every item, mask the training items and
  report the rank of each held-out item and HR/NDCG at ``config["ks"]``.

``shared`` is a dict of arrays (torch or numpy) and ``config`` a dict of scalars, so the same object runs in the
in-process simulator, under a Flower ``ClientApp`` (shared = the ``ArrayRecord``, private state in
``context.state`` or on disk) and inside alignment modules.

:class:`RecClient` is also the *sequential reference* of the batched simulator: it trains with ordinary autograd
on full tables, one step at a time, and the batched trainer must reproduce its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ..adapters.base import Backbone
from .messages import ClientUpdate
from .privacy.noise import privatise
from .simulation.schedule import build_schedule
from .state.initial import init_private_states, round_start


class Client(Protocol):
    cid: int

    def fit(self, shared: dict, config: dict) -> ClientUpdate: ...

    def evaluate(self, shared: dict, config: dict) -> dict: ...


def _tensor(x, dtype) -> torch.Tensor:
    t = torch.as_tensor(x)
    return t.to(dtype) if t.is_floating_point() else t


@dataclass
class LocalTraining:
    """A client's local SGD for one round: learning rates, the parameters it trains (shared parts copied from the
    broadcast, private parts from its restored state) and the gradient accumulators of a ``grads`` upload.
    Shared by the reference client and the module client (``module_client.ModuleClient``)."""

    upload: str
    lr: float
    item_lr: float
    wd: float
    # grads upload: Algorithm 1 keeps the shared parts fixed during the round; with local_shared the client also
    # steps its copy, so the upload is the gradient sum along its own trajectory (a pseudo-gradient)
    local_shared: bool
    specs: dict
    shared: dict
    p: dict
    names: list
    acc: dict

    @classmethod
    def start(cls, bb: Backbone, cid: int, shared: dict, state: dict, config: dict, dtype) -> LocalTraining:
        upload = config.get("upload", "params")
        if upload not in ("params", "grads"):
            raise ValueError(f"config['upload'] must be 'params' or 'grads', got {upload!r}")
        lr = float(config["lr"])
        shared = {k: _tensor(v, dtype) for k, v in shared.items()}
        missing = [s for s in bb.shared_names if s not in shared]
        if missing:
            raise ValueError(f"client {cid}: the server did not send {missing}")
        p = {name: shared[name].detach().clone().requires_grad_(True) for name in bb.shared_names}
        state = round_start(bb, state)
        for s in bb.private_specs():
            p[s.name] = state[s.name].detach().clone().to(dtype).requires_grad_(True)
        acc = {name: torch.zeros_like(p[name]) for name in bb.shared_names} if upload == "grads" else {}
        return cls(
            upload=upload,
            lr=lr,
            item_lr=lr * float(config.get("item_lr_scale", 1.0)),
            wd=float(config.get("weight_decay", 0.0)),
            local_shared=bool(config.get("local_shared", False)),
            specs={s.name: s for s in bb.all_specs()},
            shared=shared,
            p=p,
            names=list(p),
            acc=acc,
        )

    @torch.no_grad()
    def step(self, grads, items: torch.Tensor) -> None:
        """One SGD step (or gradient accumulation) from ``grads`` aligned with ``names``; None grads are skipped."""
        used = torch.unique(items)
        p = self.p
        for name, g in zip(self.names, grads):
            if g is None:
                continue
            if name in self.acc:
                self.acc[name] += g
                if not self.local_shared:
                    continue
            spec = self.specs[name]
            if self.wd:
                if spec.item_table:  # decay only the rows this step uses (lazy, sparse decay)
                    g = g.clone()
                    g[used] += self.wd * p[name][used]
                else:
                    g = g + self.wd * p[name]
            p[name] -= (self.item_lr if spec.scaled else self.lr) * g

    def finish(
        self, bb: Backbone, cid: int, touched: torch.Tensor, num_examples: int, losses: list, config: dict
    ) -> ClientUpdate:
        """The upload: shared arrays only (item tables by the rows touched), clipped and noised on the client
        when the run asks for it (``privacy.privatise``), before it leaves."""
        arrays, rows = {}, {}
        for name in bb.shared_names:
            src = self.acc[name] if self.upload == "grads" else self.p[name].detach()
            if self.specs[name].item_table:
                arrays[name] = src[touched].clone()
                rows[name] = touched.clone()
            else:
                arrays[name] = src.clone()
        update = ClientUpdate(
            cid=cid,
            kind=self.upload,
            arrays=arrays,
            rows=rows,
            num_examples=int(num_examples),
            metrics={"loss": float(np.mean(losses)) if losses else 0.0, "steps": len(losses)},
        )
        return privatise(update, self.shared, config)


def scoring_params(bb: Backbone, shared: dict[str, torch.Tensor], private: dict[str, torch.Tensor]) -> dict:
    """Parameters a client scores with: shared + private, its personal copies replacing the global tables."""
    p = {**shared, **{k: v for k, v in private.items()}}
    for shared_name, personal in bb.personal_copies.items():
        if personal in private:
            p[shared_name] = private[personal]
    return p


def rank_metrics(scores: torch.Tensor, targets: np.ndarray, exclude: np.ndarray, ks) -> dict:
    """HR/NDCG@k of each target among all items, ``exclude`` masked (a target is never masked)."""
    s = scores.detach().to(torch.float64).clone()
    ex = np.setdiff1d(exclude, targets)
    s[torch.as_tensor(ex, dtype=torch.long)] = -torch.inf
    out = {"n_targets": int(len(targets))}
    ranks = [int((s > s[int(t)]).sum()) for t in targets]
    out["ranks"] = ranks
    for k in ks:
        out[f"hr@{k}"] = float(np.mean([r < k for r in ranks])) if ranks else 0.0
        out[f"ndcg@{k}"] = float(np.mean([1.0 / np.log2(r + 2) if r < k else 0.0 for r in ranks])) if ranks else 0.0
    return out


def evaluate_client(client, shared: dict, config: dict) -> dict:
    """``Client.evaluate`` of a client with ``cid``, ``positives``, ``targets`` and ``scores(shared)``: rank
    metrics of its ``config["split"]`` targets, its training items masked (and, at test with ``mask_history
    train+valid``, its validation items)."""
    split = config.get("split", "valid")
    if split not in client.targets:
        raise ValueError(f"client {client.cid} holds no {split!r} items")
    ks = [int(k) for k in config.get("ks", (10, 50))]
    exclude = client.positives
    if config.get("mask_history", "train") == "train+valid" and split == "test":
        exclude = np.union1d(exclude, client.targets.get("valid", np.zeros(0, np.int64)))
    out = rank_metrics(client.scores(shared), client.targets[split], exclude, ks)
    out.update(cid=client.cid, split=split)
    return out


class RecClient:
    """One user's device: its positives, its private state (in ``store``) and the backbone's functions."""

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
        self.positives = np.unique(np.asarray(positives, dtype=np.int64))
        self.store = store
        self.seed = int(seed)
        self.targets = {k: np.asarray(v, dtype=np.int64) for k, v in (targets or {}).items()}
        self.dtype = dtype
        n = self.bb.n_items
        if len(self.positives) and (self.positives.min() < 0 or self.positives.max() >= n):
            raise ValueError(f"client {cid}: item ids must lie in [0, {n})")
        # a one-row CSR of the client's own data; draws are keyed by the real client id
        self._indptr = np.array([0, len(self.positives)], dtype=np.int64)

    # ------------------------------------------------------------------ private state
    def private_state(self) -> dict[str, torch.Tensor]:
        """The stored private state (a real load), or the deterministic initial one for a new client."""
        state = self.store.load(self.cid)
        if state is None:
            state = init_private_states(self.bb, [self.cid], self.seed, self.dtype)[0]
        return state

    def _ctx(self, items: torch.Tensor | None, shared: dict) -> dict:
        ctx = {
            "items_global": items if items is not None else torch.arange(self.bb.n_items),
            **self.bb.round_context(shared),
        }
        if self.bb.uses_history:
            h = torch.as_tensor(self.positives)
            ctx.update(hist_global=h, hist_mask=torch.ones(len(h), dtype=torch.bool))
        return ctx

    # ------------------------------------------------------------------ fit
    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        bb, dtype = self.bb, self.dtype
        t = LocalTraining.start(bb, self.cid, shared, self.private_state(), config, dtype)
        p = t.p
        sched = build_schedule(
            self._indptr,
            self.positives,
            np.array([0]),
            bb.n_items,
            ids=np.array([self.cid]),
            seed=int(config.get("seed", self.seed)),
            round=int(config["round"]),
            epochs=int(config["epochs"]),
            negatives=int(config["negatives"]),
            batch_size=int(config["batch_size"]),
        )
        losses = []
        for items_np, labels_np in sched.steps_of(0):
            items = torch.from_numpy(items_np)
            labels = torch.from_numpy(labels_np).to(dtype)
            ctx = self._ctx(items, t.shared)
            logits = bb.logits(p, items, ctx)
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            loss = loss + bb.regulariser(p, items, torch.ones(len(items), dtype=dtype), config, ctx=ctx)
            t.step(torch.autograd.grad(loss, [p[n] for n in t.names]), items)
            losses.append(float(loss.detach()))

        touched = torch.from_numpy(sched.touched_of(0))
        new_state = {s.name: p[s.name].detach() for s in bb.private_specs()}
        for shared_name, personal in bb.personal_copies.items():
            copy = t.shared[shared_name].detach().clone()
            copy[touched] = p[shared_name].detach()[touched]
            new_state[personal] = copy
        self.store.save(self.cid, new_state, copy=False)
        return t.finish(bb, self.cid, touched, len(self.positives), losses, config)

    # ------------------------------------------------------------------ scoring and evaluation
    def scores(self, shared: dict) -> torch.Tensor:
        """Logits for every item (nothing masked), from the restored private state."""
        shared = {k: _tensor(v, self.dtype) for k, v in shared.items()}
        p = scoring_params(self.bb, shared, self.private_state())
        with torch.no_grad():
            return self.bb.logits(p, None, self._ctx(None, shared))

    def evaluate(self, shared: dict, config: dict) -> dict:
        return evaluate_client(self, shared, config)
