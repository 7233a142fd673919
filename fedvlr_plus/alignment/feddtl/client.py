"""A FedDTL client: a group of users whose histories stay private; SFT of the user tower (or both towers for the
FedAvg baseline), then GRPO against a hybrid reference, and the item prototypes it uploads for the server."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ...federation.messages import ClientUpdate
from ...federation.state.store import MemoryStore
from ..grpo import GRPOConfig, grpo_loss
from .model import ITEM_PARAMS, USER_PARAMS, DTLConfig, evaluate_users, noisy_candidates, user_vectors
from .task import RecTask
from .towers import ItemContent, ItemTower


class DTLClient:
    """A group of users (their histories are private and never leave :meth:`fit`)."""

    def __init__(
        self,
        cid: int,
        task: RecTask,
        users,
        cfg: DTLConfig,
        *,
        seed: int = 0,
        store=None,
        targets: list[np.ndarray] | None = None,
        warm_content: ItemContent | None = None,
    ):
        """``targets``: per user of ``users``, the train items this client holds as that user's examples (the
        label skew over examples, :mod:`.dtl_examples`); None: every labelled train item of the user.
        ``warm_content``: the warm items' content, shared by the clients of one task (built here when None)."""
        self.cid = int(cid)
        self.task = task
        self.users = np.asarray(users, dtype=np.int64)
        self.targets = targets
        self.cfg = cfg
        self.seed = int(seed)
        self.store = store if store is not None else MemoryStore()
        self._content = torch.from_numpy(task.content)
        self._warm = torch.from_numpy(task.warm_items)
        self._warm_content = warm_content if warm_content is not None else ItemContent(self._content[self._warm])
        col = np.full(task.n_items, -1)
        col[task.warm_items] = np.arange(len(task.warm_items))
        self._col = col
        self._hist_sum = {int(u): task.content[task.histories[u]].sum(0) for u in self.users}

    def examples(self, rnd: int) -> tuple[np.ndarray, np.ndarray]:
        """(context [n, d], target column [n]): up to ``per_user`` train items per user (its labelled ones in the
        few-shot regime; the ones this client holds with ``targets``), each predicted from the mean of the user's
        other train items."""
        rng = np.random.default_rng([self.seed, self.cid, rnd])
        ctx, tgt = [], []
        for j, u in enumerate(self.users):
            h = self.task.histories[u]
            targets = (
                self.targets[j]
                if self.targets is not None
                else h
                if self.task.labelled is None
                else self.task.labelled[u]
            )
            if len(h) < 2 or not len(targets):
                continue
            pick = rng.choice(targets, size=min(self.cfg.per_user, len(targets)), replace=False)
            s = self._hist_sum[int(u)]
            ctx.append((s[None] - self.task.content[pick]) / (len(h) - 1))
            tgt.append(self._col[pick])
        if not ctx:
            return np.zeros((0, self.task.dim), np.float32), np.zeros(0, np.int64)
        return np.concatenate(ctx).astype(np.float32), np.concatenate(tgt).astype(np.int64)

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        cfg = self.cfg
        stage = config.get("stage", "sft")
        train_items = bool(config.get("train_item_tower", False))
        names = list(USER_PARAMS) + (list(ITEM_PARAMS) if train_items else [])
        glob = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in shared.items()}
        state = self.store.load(self.cid) or {}
        personal = cfg.user_tower == "private" and not train_items
        # a private user tower continues from where this client left it, not from the average
        start = (
            {**glob, **{k: state[f"own.{k}"] for k in USER_PARAMS}} if personal and "own.user_down" in state else glob
        )
        p = {k: v.clone().requires_grad_(k in names) for k, v in start.items()}
        opt = torch.optim.Adam([p[k] for k in names], lr=cfg.lr)
        ctx_np, tgt_np = self.examples(int(config.get("round", 0)))
        ctx, tgt = torch.from_numpy(ctx_np), torch.from_numpy(tgt_np)
        gen = torch.Generator().manual_seed(int(self.seed * 1000003 + self.cid * 7919 + config.get("round", 0)))
        # a frozen item tower gives the same item vectors in every batch: compute them once (a third of a
        # decoupled client's time at 10,000 warm items); a trained one is recomputed per batch through autograd
        frozen_items = None
        if not train_items:
            with torch.no_grad():
                frozen_items = self._warm_content.tower(p)
        rl = self._rl_reference(glob, state, ctx, tgt, gen, frozen_items) if stage == "rl" else None
        losses, rewards, nonzero = [], [], []
        batches = [
            perm[s : s + cfg.batch_size]
            for _ in range(cfg.epochs)
            for perm in [torch.randperm(len(tgt), generator=gen)]
            for s in range(0, len(tgt), cfg.batch_size)
        ]
        for b in batches:
            loss, signal = self._batch_loss(p, ctx[b], tgt[b], b, rl, gen, frozen_items)
            if signal is not None:
                rewards.append(signal[0])
                nonzero.append(signal[1])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        self._keep_private(p, state, stage, personal)
        arrays, rows = self._uploads(p, names, train_items, ctx, tgt)
        metrics = {"loss": float(np.mean(losses)) if losses else 0.0, "steps": len(losses)}
        if rewards:
            metrics.update(reward=float(np.mean(rewards)), groups_with_signal=float(np.mean(nonzero)))
        return ClientUpdate(
            cid=self.cid, kind="params", arrays=arrays, rows=rows, num_examples=max(int(len(tgt)), 1), metrics=metrics
        )

    def _rl_reference(
        self, glob: dict, state: dict, ctx, tgt, gen, frozen_items: ItemTower | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(action sets [n, k], reference log-probabilities over them) of the GRPO stage.

        ``frozen_items``: the global item tower over the warm items when the caller has it already."""
        cfg = self.cfg
        # the action set of an example: its target (column 0) and rl_candidates - 1 other warm items; a hit
        # among ~100 is frequent enough for groups to disagree, a hit among all warm items is not
        n_warm = len(self.task.warm_items)
        k = min(cfg.rl_candidates, n_warm)
        neg = torch.randint(0, n_warm - 1, (len(tgt), k - 1), generator=gen)
        neg = neg + (neg >= tgt.unsqueeze(1)).long()  # skip the target itself
        cand = torch.cat([tgt.unsqueeze(1), neg], 1)  # [n, k]
        sft = {**glob, **{k_: state[k_] for k_ in USER_PARAMS}} if "user_down" in state else glob
        with torch.no_grad():
            v_ref = frozen_items if frozen_items is not None else self._warm_content.tower(glob)
            # scores against every warm item, then the action-set columns (no [n, k, d] gather)
            ref_sft = v_ref.scores(user_vectors(sft, ctx)).gather(1, cand) / cfg.tau
            ref_glob = v_ref.scores(user_vectors(glob, ctx)).gather(1, cand) / cfg.tau
            # hybrid reference: the mixture ref_mix * pi_SFT + (1 - ref_mix) * pi_global, as log-probabilities
            ref_logits = torch.logsumexp(
                torch.stack(
                    [
                        math.log(cfg.ref_mix) + torch.log_softmax(ref_sft, -1),
                        math.log(1 - cfg.ref_mix) + torch.log_softmax(ref_glob, -1),
                    ]
                ),
                0,
            )
        return cand, ref_logits

    def _batch_loss(self, p: dict, ctx_b, tgt_b, b, rl, gen, frozen_items: ItemTower | None = None):
        """(loss, None) of an SFT batch, or (loss, (mean reward, share of groups with signal)) of a GRPO batch."""
        cfg = self.cfg
        v = frozen_items if frozen_items is not None else self._warm_content.tower(p)
        u = user_vectors(p, ctx_b)
        logits = v.scores(u) / cfg.tau
        if rl is None:
            return F.cross_entropy(logits, tgt_b), None
        cand, ref_logits = rl
        gcfg = GRPOConfig(group_size=cfg.group, clip_eps=cfg.clip_eps, beta=cfg.beta, kl="k3")
        logits = logits.gather(1, cand[b])  # [B, k] over the action set
        actions = noisy_candidates(u, v, cfg.group, cfg.sigma, gen, columns=cand[b])
        r = (actions == 0).float()  # column 0 is the held-out target
        with torch.no_grad():
            logp_old = torch.log_softmax(logits, -1).gather(-1, actions)
        loss, diag = grpo_loss(logits, actions, logp_old, ref_logits[b], r, gcfg)
        return loss, (diag["reward"], float((r.std(-1) > 0).float().mean()))

    def _keep_private(self, p: dict, state: dict, stage: str, personal: bool) -> None:
        new_state = dict(state)
        if stage == "sft":  # the client's latest SFT model: half of its hybrid reference later
            new_state.update({k: p[k].detach().clone() for k in USER_PARAMS})
        if personal:
            new_state.update({f"own.{k}": p[k].detach().clone() for k in USER_PARAMS})
        if new_state:
            self.store.save(self.cid, new_state, copy=False)

    def _uploads(self, p: dict, names: list, train_items: bool, ctx, tgt) -> tuple[dict, dict]:
        arrays = {k: p[k].detach().clone() for k in (names if train_items else USER_PARAMS)}
        rows = {}
        if not train_items and len(tgt) and self.cfg.prototypes == "example":
            # the paper's per-sample uploads: each example's user embedding, its item, a count of 1. The per-item
            # means below make the server's item tower worse than not training it at all on the skewed lfm2k
            # split (docs/alignment-vlm.md): one mean per (client, item) is all but the client's centroid, and a
            # cross-entropy over ~1,000 items fitted to those points separates the items by noise
            with torch.no_grad():
                arrays["proto"] = user_vectors(p, ctx)
            rows["proto"] = rows["proto_n"] = self._warm[tgt]
            arrays["proto_n"] = torch.ones(len(tgt))
        elif not train_items and len(tgt):
            # class prototypes: per trained item, the normalised mean of this client's context embeddings
            with torch.no_grad():
                emb = user_vectors(p, ctx)
            cols, inv = torch.unique(tgt, return_inverse=True)
            proto = torch.zeros(len(cols), emb.shape[1]).index_add_(0, inv, emb)
            arrays["proto"] = F.normalize(proto, dim=-1)
            rows["proto"] = self._warm[cols]
            # how many of this round's examples each prototype averages: the server samples prototypes in that
            # proportion, so its CE sees the items as often as the clients' examples do (the paper uploads
            # per-sample embeddings; a count keeps that sample weighting without any per-user vector)
            arrays["proto_n"] = torch.bincount(inv, minlength=len(cols)).float()
            rows["proto_n"] = rows["proto"]
        return arrays, rows

    def evaluate(self, shared: dict, config: dict) -> dict:
        p = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in shared.items()}
        return evaluate_users(p, self.task, self.users, self.cfg, ks=config.get("ks", (10,)))
