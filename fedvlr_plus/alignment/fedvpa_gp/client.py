"""A FedVPA-GP / FedVPL / monolithic client, one at a time: the plain reference of the local objective
(:class:`~.vpa_batched.BatchedVPAClients` trains all clients of a round at once with the same objective)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ...federation.messages import ClientUpdate
from ...federation.state.store import MemoryStore
from ..pairs import PreferencePairs, pairwise_accuracy
from .config import POSTERIOR_LOGVAR, POSTERIOR_MU, VPAConfig
from .model import (
    VPAModel,
    gumbel_weights,
    kl_standard_normal,
    load_arrays,
    mixture_kl_mc,
    named_arrays,
    ortho_loss,
    orthonormal_rows,
    posterior_summary,
    prototype_matrix,
)
from .optim import local_optimizer


def context_target_sizes(n: int, cfg: VPAConfig) -> tuple[int, int]:
    """(context pairs, target pairs) of one local step for a client with n pairs: disjoint, the context at most
    half of the client's pairs, at least one of each."""
    c = max(1, min(cfg.context_size, n // 2))
    return c, max(1, min(cfg.batch_size, n - c))


class _PeerPrior(NamedTuple):
    """The peers' rows of the server's prior table that this client's mixture prior is made of."""

    present: torch.Tensor  # [n_table] bool: which rows are peers with a summary
    mu: torch.Tensor
    logvar: torch.Tensor
    count: torch.Tensor


class _Step(NamedTuple):
    z: torch.Tensor
    posterior: tuple | None  # (mu, logvar) of the step's context, None for the monolithic method
    loss: float
    kl: float


class VPAClient:
    """A FedVPA-GP / FedVPL / monolithic client on the federation's ``fit`` / ``evaluate`` protocol.

    Private: its pairs and (FedVPA-GP) its mixture-weight logits pi, kept in ``store``. ``fit`` uploads the shared
    network parameters (``net.*``) and the posterior summary (``posterior.mu``, ``posterior.logvar``)."""

    def __init__(
        self,
        cid: int,
        train: PreferencePairs,
        test: PreferencePairs | None,
        cfg: VPAConfig,
        *,
        n_table: int,
        store=None,
    ):
        if len(train) < 2:
            raise ValueError(f"client {cid}: needs at least 2 training pairs, has {len(train)}")
        self.cid, self.train, self.test, self.cfg = int(cid), train, test, cfg
        self.n_table = n_table
        self.store = store if store is not None else MemoryStore()
        self.d_in = train.chosen.shape[1]

    def _t(self, a):
        return torch.as_tensor(np.asarray(a), dtype=torch.float32)

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        cfg = self.cfg
        r = int(config.get("round", 1))
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + r * 1009 + self.cid)
        torch.manual_seed(cfg.seed * 1_000_003 + r * 1009 + self.cid)
        model = VPAModel.from_config(self.d_in, cfg)
        load_arrays(model, shared)
        state = self.store.load(self.cid) or {"pi": torch.zeros(self.n_table)}
        pi = state["pi"].clone().requires_grad_(True)
        opt = local_optimizer(cfg, list(model.parameters()), pi if cfg.method == "fedvpa_gp" else None, r)
        prior = self._peer_prior(shared)
        labels = np.asarray(shared.get("labels", np.full(self.n_table, -1)))
        label = int(labels[self.cid]) if cfg.method == "fedvpa_gp" else -1
        proto = self._prototypes(model)
        c, rj = self._t(self.train.chosen), self._t(self.train.rejected)
        sizes = context_target_sizes(len(c), cfg)
        with torch.no_grad():  # z from all the client's pairs under the broadcast network
            mu_all = model.posterior(c, rj, cfg.logvar_max)[0]
        steps = [
            self._local_step(model, opt, pi, prior, proto, label, (c, rj), sizes, g) for _ in range(cfg.local_steps)
        ]
        self.store.save(self.cid, {"pi": pi.detach().clone()})
        arrays = named_arrays(model)
        if cfg.method != "monolithic":
            arrays[POSTERIOR_MU], arrays[POSTERIOR_LOGVAR] = posterior_summary(
                torch.stack([s.z for s in steps]),
                torch.stack([s.posterior[0] for s in steps]),
                torch.stack([s.posterior[1] for s in steps]),
                cfg.summary_mean,
                mu_all,
            )
        return ClientUpdate(
            cid=self.cid,
            kind="params",
            arrays=arrays,
            num_examples=len(c),
            metrics={"loss": float(np.mean([s.loss for s in steps])), "kl": float(np.mean([s.kl for s in steps]))},
        )

    def _peer_prior(self, shared: dict) -> _PeerPrior | None:
        """The peers' summaries of the mixture prior; None without a mixture (no peer yet, or not FedVPA-GP)."""
        cfg = self.cfg
        present = torch.as_tensor(np.asarray(shared.get("prior.present", np.zeros(self.n_table, bool)))).bool().clone()
        present[self.cid] = False  # the prior mixes the *peers'* summaries
        if not (cfg.method == "fedvpa_gp" and bool(present.any())):
            return None
        pmu = self._t(shared["prior.mu"])[present]
        plv = self._t(shared["prior.logvar"])[present]
        if cfg.prior_min_logvar is not None:
            plv = plv.clamp_min(cfg.prior_min_logvar)
        return _PeerPrior(present, pmu, plv, self._t(shared["prior.count"])[present])

    def _prototypes(self, model: VPAModel) -> torch.Tensor:
        cfg = self.cfg
        if hasattr(model, "proto"):
            with torch.no_grad():  # FedAvg of orthonormal rows is not orthonormal
                model.proto.copy_(orthonormal_rows(model.proto, cfg.prototype_scale))
            return model.proto
        return prototype_matrix(cfg.prototypes, cfg.latent, cfg.prototype_scale)

    def _local_step(self, model, opt, pi, prior, proto, label: int, pairs, sizes, g) -> _Step:
        """One step on L_BT + beta KL + lambda L_ortho; context and target pairs disjoint, as at evaluation (z
        never sees the pair it scores)."""
        cfg = self.cfg
        c, rj = pairs
        n = len(c)
        c_size, b_size = sizes
        perm = torch.randperm(n, generator=g)
        ctx, tgt = perm[:c_size], perm[c_size : c_size + b_size]
        post = None
        if cfg.method == "monolithic":
            tgt = perm[: min(cfg.batch_size, n)]
            z = torch.zeros(cfg.latent)
            kl = torch.zeros(())
        else:
            mu, logvar = model.posterior(c[ctx], rj[ctx], cfg.logvar_max)
            z = mu + torch.exp(0.5 * logvar) * torch.randn(cfg.latent, generator=g)
            post = (mu.detach(), logvar.detach())
            kl = kl_standard_normal(mu, logvar) if prior is None else self._mixture_kl(z, mu, logvar, pi, prior, g)
        loss = -F.logsigmoid(model.score(c[tgt], z) - model.score(rj[tgt], z)).mean() + cfg.beta * kl
        if label >= 0 and cfg.ortho > 0:
            loss = loss + cfg.ortho * ortho_loss(z, proto, label, cfg.gamma)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if hasattr(model, "proto"):
            with torch.no_grad():
                model.proto.copy_(orthonormal_rows(model.proto, cfg.prototype_scale))
        return _Step(z.detach(), post, float(loss.detach()), float(kl.detach()))

    def _mixture_kl(self, z, mu, logvar, pi, prior: _PeerPrior, g):
        if self.cfg.prior_weights == "gumbel":
            w = gumbel_weights(pi[prior.present], self.cfg.tau, g)
        else:
            w = prior.count / prior.count.sum()
        return mixture_kl_mc(z, mu, logvar, prior.mu, prior.logvar, torch.log(w + 1e-12))

    # -------------------------------------------------------------- evaluation
    def infer_z(self, model: VPAModel, pairs: PreferencePairs | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and log-variance of z from context pairs (default: all the client's training pairs)."""
        pairs = pairs if pairs is not None else self.train
        if self.cfg.method == "monolithic":
            return torch.zeros(self.cfg.latent), torch.zeros(self.cfg.latent)
        with torch.no_grad():
            return model.posterior(self._t(pairs.chosen), self._t(pairs.rejected), self.cfg.logvar_max)

    def evaluate(self, shared: dict, config: dict) -> dict:
        model = VPAModel.from_config(self.d_in, self.cfg)
        load_arrays(model, shared)
        mu, logvar = self.infer_z(model)
        out = {
            "cid": self.cid,
            "n_test": 0 if self.test is None else len(self.test),
            "kl_standard_normal": float(kl_standard_normal(mu, logvar)),
        }
        if self.test is not None and len(self.test):
            out["accuracy"] = accuracy(model, self.test, mu)
        return out


def accuracy(model: VPAModel, pairs: PreferencePairs, z: torch.Tensor) -> float:
    with torch.no_grad():
        c = model.score(torch.as_tensor(pairs.chosen, dtype=torch.float32), z)
        r = model.score(torch.as_tensor(pairs.rejected, dtype=torch.float32), z)
    return pairwise_accuracy(c.numpy(), r.numpy())
