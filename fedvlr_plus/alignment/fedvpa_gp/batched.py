"""Every FedVPA-GP client of a round trained at once, the clients stacked on a leading axis: the same local
objective, uploads and private state as :class:`~.vpa_client.VPAClient`, vectorised because a few thousand tiny
sequential steps are too slow on CPU."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ...federation.messages import ClientUpdate
from ...federation.state.store import MemoryStore
from ..pairs import PreferencePairs
from .client import context_target_sizes
from .config import POSTERIOR_LOGVAR, POSTERIOR_MU, VPAConfig
from .model import kl_standard_normal, log_normal, orthonormal_rows, posterior_summary, prototype_matrix
from .optim import local_optimizer


def _lin(x, params, name):
    """x [K, N, in] through every client's own copy of a linear layer: W [K, out, in], b [K, out]."""
    return torch.baddbmm(params[f"{name}.bias"].unsqueeze(1), x, params[f"{name}.weight"].transpose(1, 2))


class _PeerPrior(NamedTuple):
    allowed: torch.Tensor  # [K, n_table] bool: the rows of client k's mixture (peers with a summary)
    mu: torch.Tensor
    logvar: torch.Tensor
    count: torch.Tensor


class _PrototypePull(NamedTuple):
    labels: torch.Tensor  # [K] the server's prototype label per client (-1: none yet)
    has_label: torch.Tensor  # [K] bool: the pull applies
    proto: torch.Tensor | None  # fixed prototypes (None: each client's learnable copy in params)
    ortho_const: torch.Tensor | None


class _Step(NamedTuple):
    z: torch.Tensor
    posterior: tuple | None
    loss: torch.Tensor  # [K]
    kl: torch.Tensor  # [K]


class BatchedVPAClients:
    """Every client of a round trained at once: each holds its own copy of the shared parameters (stacked on a
    leading client axis) and its own Adam state (Adam is elementwise, so one Adam over the stack is K independent
    Adams). Same local objective, uploads and private state as :class:`VPAClient`, which stays the plain
    one-client reference; this one exists because a few thousand tiny sequential steps are too slow on CPU."""

    def __init__(self, train: PreferencePairs, cfg: VPAConfig, *, n_table: int, store=None):
        self.cfg, self.n_table = cfg, n_table
        self.store = store if store is not None else MemoryStore()
        self.cids = [k for k in range(train.n_clients) if (train.client == k).sum() >= 2]
        K = len(self.cids)
        self.n = torch.tensor([(train.client == k).sum() for k in self.cids])
        d = train.chosen.shape[1]
        nmax = int(self.n.max())
        self.C = torch.zeros(K, nmax, d)
        self.R = torch.zeros(K, nmax, d)
        for i, k in enumerate(self.cids):
            rows = np.flatnonzero(train.client == k)
            self.C[i, : len(rows)] = torch.as_tensor(train.chosen[rows])
            self.R[i, : len(rows)] = torch.as_tensor(train.rejected[rows])

    def fit(self, shared: dict, config: dict) -> list[ClientUpdate]:
        cfg = self.cfg
        r = int(config.get("round", 1))
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + r * 1009)
        params = self._stacked_params(shared)
        pi = torch.stack([(self.store.load(c) or {"pi": torch.zeros(self.n_table)})["pi"] for c in self.cids])
        pi.requires_grad_(True)
        # one optimiser over the stack is K independent ones: Adam and SGD are elementwise
        opt = local_optimizer(cfg, list(params.values()), pi if cfg.method == "fedvpa_gp" else None, r)
        prior = self._peer_prior(shared)
        pull = self._prototype_pull(shared, params)
        mu_all = None if cfg.method == "monolithic" else self._posterior_mean_all(params)
        steps = [self._local_step(params, opt, pi, prior, pull, g) for _ in range(cfg.local_steps)]
        return self._uploads(params, pi, steps, mu_all)

    def _stacked_params(self, shared: dict) -> dict[str, torch.Tensor]:
        """Every client's own copy of the broadcast network, stacked: [K, *shape] per array."""
        K = len(self.cids)
        return {
            k[4:]: torch.as_tensor(np.asarray(v), dtype=torch.float32)
            .unsqueeze(0)
            .repeat(K, *([1] * np.asarray(v).ndim))
            .requires_grad_(True)
            for k, v in shared.items()
            if k.startswith("net.")
        }

    def _peer_prior(self, shared: dict) -> _PeerPrior | None:
        """Each client's peers in the prior table; None without a mixture (some client has no peer yet, or the
        method is not FedVPA-GP)."""
        cfg = self.cfg
        K, cids = len(self.cids), torch.as_tensor(self.cids)
        present = torch.as_tensor(np.asarray(shared.get("prior.present", np.zeros(self.n_table, bool)))).bool()
        allowed = present.unsqueeze(0).repeat(K, 1)
        allowed[torch.arange(K), cids] = False  # peers only
        if not (cfg.method == "fedvpa_gp" and bool(allowed.any(1).all())):
            return None
        pmu = torch.as_tensor(np.asarray(shared["prior.mu"]), dtype=torch.float32)
        plv = torch.as_tensor(np.asarray(shared["prior.logvar"]), dtype=torch.float32)
        if cfg.prior_min_logvar is not None:
            # components narrower than N(0, I) pin every z to the peers' consensus (observed collapse)
            plv = plv.clamp_min(cfg.prior_min_logvar)
        pcount = torch.as_tensor(np.asarray(shared["prior.count"]), dtype=torch.float32)
        return _PeerPrior(allowed, pmu, plv, pcount)

    def _prototype_pull(self, shared: dict, params: dict) -> _PrototypePull:
        cfg = self.cfg
        labels = torch.as_tensor(np.asarray(shared.get("labels", np.full(self.n_table, -1))))[
            torch.as_tensor(self.cids)
        ]
        proto = ortho_const = None
        if "proto" in params:
            with torch.no_grad():
                params["proto"].copy_(orthonormal_rows(params["proto"], cfg.prototype_scale))
        else:
            proto = prototype_matrix(cfg.prototypes, cfg.latent, cfg.prototype_scale)
            pn = proto / proto.norm(dim=1, keepdim=True)
            ortho_const = cfg.gamma * ((pn @ pn.T - torch.eye(len(proto))) ** 2).sum()
        has_label = (labels >= 0) & (cfg.method == "fedvpa_gp") & (cfg.ortho > 0)
        return _PrototypePull(labels, has_label, proto, ortho_const)

    def _reward(self, params: dict, s, z):
        if self.cfg.decoder == "bilinear":
            w = params["w0.weight"][:, 0] + torch.bmm(params["U.weight"], z.unsqueeze(-1)).squeeze(-1)
            return (s * w.unsqueeze(1)).sum(-1)
        h = torch.relu(_lin(torch.cat([s, z.unsqueeze(1).expand(-1, s.shape[1], -1)], -1), params, "reward.0"))
        return _lin(h, params, "reward.2").squeeze(-1)

    def _posterior_mean_all(self, params: dict) -> torch.Tensor:
        """Each client's z from all its pairs under the round's broadcast network (padding masked); see
        posterior_summary."""
        K = len(self.cids)
        with torch.no_grad():
            h = torch.relu(_lin(torch.cat([self.C, self.R], -1), params, "pair.0"))
            h = torch.relu(_lin(h, params, "pair.2"))
            valid = (torch.arange(self.C.shape[1]).unsqueeze(0) < self.n.unsqueeze(1)).float().unsqueeze(-1)
            h = (h * valid).sum(1, keepdim=True) / self.n.view(K, 1, 1)
            return _lin(h, params, "mu").squeeze(1)

    def _draw_pairs(self, g) -> tuple[torch.Tensor, torch.Tensor]:
        """(context, targets) rows per client: one permutation per client (padding last); the context is its head,
        the targets the next B pairs (wrapping when fewer are left): disjoint, as in VPAClient."""
        cfg = self.cfg
        K = len(self.cids)
        c_size = context_target_sizes(int(self.n.min()), cfg)[0]
        keys = torch.rand(K, self.C.shape[1], generator=g)
        keys[torch.arange(self.C.shape[1]).unsqueeze(0) >= self.n.unsqueeze(1)] = 2.0
        perm = keys.argsort(1)
        start = 0 if cfg.method == "monolithic" else c_size
        # targets wrap around for clients with fewer pairs
        pos = start + torch.arange(cfg.batch_size).unsqueeze(0) % (self.n.unsqueeze(1) - start)
        return perm[:, :c_size], perm.gather(1, pos)

    def _local_step(self, params: dict, opt, pi, prior: _PeerPrior | None, pull: _PrototypePull, g) -> _Step:
        cfg = self.cfg
        K = len(self.cids)
        ar = torch.arange(K).unsqueeze(1)
        ctx, tgt = self._draw_pairs(g)
        post = None
        if cfg.method == "monolithic":
            z = torch.zeros(K, cfg.latent)
            kl = torch.zeros(K)
        else:
            z, kl, post = self._sample_z(params, ctx, pi, prior, g)
        margin = self._reward(params, self.C[ar, tgt], z) - self._reward(params, self.R[ar, tgt], z)
        per_client = -F.logsigmoid(margin).mean(1) + cfg.beta * kl
        if bool(pull.has_label.any()):
            per_client = per_client + cfg.ortho * self._prototype_distance(params, pull, z)
        opt.zero_grad()
        per_client.sum().backward()
        opt.step()
        if "proto" in params:
            with torch.no_grad():
                params["proto"].copy_(orthonormal_rows(params["proto"], cfg.prototype_scale))
        return _Step(z.detach(), post, per_client.detach(), kl.detach())

    def _sample_z(self, params: dict, ctx, pi, prior: _PeerPrior | None, g):
        """z ~ q(z | context) per client, its KL term and the (detached) posterior."""
        cfg = self.cfg
        K = len(self.cids)
        ar = torch.arange(K).unsqueeze(1)
        h = torch.relu(_lin(torch.cat([self.C[ar, ctx], self.R[ar, ctx]], -1), params, "pair.0"))
        h = torch.relu(_lin(h, params, "pair.2")).mean(1, keepdim=True)
        mu = _lin(h, params, "mu").squeeze(1)
        logvar = torch.clamp(_lin(h, params, "logvar").squeeze(1), max=cfg.logvar_max)
        z = mu + torch.exp(0.5 * logvar) * torch.randn(K, cfg.latent, generator=g)
        kl = kl_standard_normal(mu, logvar) if prior is None else self._mixture_kl(z, mu, logvar, pi, prior, g)
        return z, kl, (mu.detach(), logvar.detach())

    def _mixture_kl(self, z, mu, logvar, pi, prior: _PeerPrior, g):
        cfg = self.cfg
        allowed = prior.allowed
        if cfg.prior_weights == "gumbel":
            u = torch.rand(pi.shape, generator=g).clamp(1e-10, 1 - 1e-10)
            logits = ((pi - torch.log(-torch.log(u))) / cfg.tau).masked_fill(~allowed, -torch.inf)
            log_w = torch.log_softmax(logits, -1)
        else:
            log_w = torch.log((prior.count.unsqueeze(0) * allowed).clamp_min(1e-30))
            log_w = log_w - torch.logsumexp(log_w.masked_fill(~allowed, -torch.inf), -1, keepdim=True)
        log_p = torch.logsumexp(
            (log_w + log_normal(z.unsqueeze(1), prior.mu, prior.logvar)).masked_fill(~allowed, -torch.inf), -1
        )
        return log_normal(z, mu, logvar) - log_p

    def _prototype_distance(self, params: dict, pull: _PrototypePull, z):
        """||z - p_label||^2 + gamma ||Phat Phat^T - I||^2 per client (0 where the client has no label)."""
        cfg = self.cfg
        K = len(self.cids)
        if "proto" in params:
            P = params["proto"]  # [K, M, d], each client's copy
            pn = P / P.norm(dim=-1, keepdim=True)
            ortho_const = cfg.gamma * ((pn @ pn.transpose(1, 2) - torch.eye(P.shape[1])) ** 2).sum((1, 2))
            target = P[torch.arange(K), pull.labels.clamp_min(0)]
        else:
            ortho_const = pull.ortho_const
            target = pull.proto[pull.labels.clamp_min(0)]
        dist = ((z - target) ** 2).sum(-1) + ortho_const
        return torch.where(pull.has_label, dist, torch.zeros_like(dist))

    def _uploads(self, params: dict, pi, steps: list[_Step], mu_all) -> list[ClientUpdate]:
        cfg = self.cfg
        loss_m = torch.stack([s.loss for s in steps]).mean(0)
        kl_m = torch.stack([s.kl for s in steps]).mean(0)
        out = []
        for i, c in enumerate(self.cids):
            self.store.save(c, {"pi": pi[i].detach().clone()})
            arrays = {f"net.{k}": v[i].detach().clone() for k, v in params.items()}
            if cfg.method != "monolithic":
                arrays[POSTERIOR_MU], arrays[POSTERIOR_LOGVAR] = posterior_summary(
                    torch.stack([s.z[i] for s in steps]),
                    torch.stack([s.posterior[0][i] for s in steps]),
                    torch.stack([s.posterior[1][i] for s in steps]),
                    cfg.summary_mean,
                    mu_all[i],
                )
            out.append(
                ClientUpdate(
                    cid=c,
                    kind="params",
                    arrays=arrays,
                    num_examples=int(self.n[i]),
                    metrics={"loss": float(loss_m[i]), "kl": float(kl_m[i])},
                )
            )
        return out
