"""FedVPA-GP: federated variational preference alignment with a Gumbel-Softmax mixture prior.

Koo, Kim, Jang, Ok, "Federated Variational Preference Alignment with Gumbel-Softmax Prior for Personalized User
Preferences", ICML 2026, arXiv 2605.30873; built on VPL (Poddar et al., "Personalizing Reinforcement Learning from
Human Feedback with Variational Preference Learning", NeurIPS 2024, arXiv 2408.10075). Stage 1 (the reward model)
at CPU scale (what differs from the paper, and why: docs/alignment.md, "FedVPA-GP"):

- encoder: a pair encoder MLP over [e_chosen ; e_rejected], mean-pooled over a client's context pairs, linear heads
  to (mu, log sigma^2) of q(z | C), d-dimensional; log sigma^2 <- min(log sigma^2, logvar_max) (variance cap);
  z = mu + sigma * eps;
- decoder: a z-conditioned Bradley-Terry reward; p(chosen > rejected) = sigma(r(chosen, z) - r(rejected, z)).
  Default ``decoder="bilinear"``: r(s, z) = e_s^T (w_0 + U z), a reward *direction* that depends on z, so two
  client types with opposite preferences are both representable (w_0 + U z_A and w_0 + U z_B may point in opposite
  directions). ``decoder="concat"`` is VPL's r(s, z) = MLP([e_s ; z]): there z only shifts hidden pre-activations,
  its additive part cancels in r(chosen) - r(rejected), and on HH-RLHF it learned to ignore z (measured, see
  docs/alignment-preference.md). (The paper adds f(z) to an LLM's choice logits instead.)
- federated mixture prior p_mix^(i)(z) = sum_j w_j N(z; mubar_j, sigmabar_j^2) over the peers' posterior summaries
  (the server's prior table: this round's uploads overwrite their rows, absent clients keep theirs), with
  w = softmax((log pi + g) / tau), Gumbel noise g and per-client logits pi learned locally and never uploaded
  (``prior_weights="samples"``: the released code's sample-size weights). One-sample Monte-Carlo KL:
  log q(z | C) - logsumexp_j [log w_j + log N(z; mubar_j, sigmabar_j^2)]. Round 1 (empty table): N(0, I);
- orthogonal prototypes: L_ortho = ||z - p_{y*}||^2 + gamma ||Phat Phat^T - I||_F^2, P = scale x orthonormal rows
  (``prototype_mode="fixed"``: scaled identity rows; ``"learnable"``: QR init, shared through FedAvg, QR
  re-orthonormalised after every step), y* the
  prototype label the server assigns by balanced k-means (k = M) over the clients' mean z;
- local loss L = L_BT + beta KL + lambda L_ortho; upload = the shared network parameters (sample-weighted FedAvg,
  the federation's :class:`~fedvlr_plus.federation.fedavg.FedAvgStrategy`) + the posterior summary (mubar_i,
  log sigmabar^2_i) + n_i. mubar_i is by default the posterior mean from all the client's pairs under the broadcast
  encoder (see :func:`posterior_summary`); context and target pairs of a local step are disjoint;
- optimisation (``server_optimizer="adam"``, default): local SGD, then a server Adam on FedAvg's averaged update
  (FedAdam, Reddi et al., "Adaptive Federated Optimization", ICLR 2021); ``"none"``: local Adam + FedAvg. Why:
  :func:`local_optimizer`. The departures from the paper are measured in docs/alignment-preference.md.

Baselines in the same code: ``method="fedvpl"`` (N(0, I) prior, no prototypes: VPL federated) and
``method="monolithic"`` (z fixed at 0: one federated Bradley-Terry reward for everybody).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..federation.messages import ClientUpdate
from ..federation.rounds import RoundLoop, fit_each, over_the_wire
from ..federation.server_adam import ServerAdam
from ..federation.store import MemoryStore
from .pairs import PreferencePairs, kmeans, pairwise_accuracy, purity, silhouette

METHODS = ("monolithic", "fedvpl", "fedvpa_gp")
DECODERS = ("bilinear", "concat")
POSTERIOR_MU, POSTERIOR_LOGVAR = "posterior.mu", "posterior.logvar"


@dataclass
class VPAConfig:
    method: str = "fedvpa_gp"
    rounds: int = 100
    local_steps: int = 2          # few local steps: with many, each client fits its own type through the z-free
                                  # path and FedAvg cancels the types out (measured; see docs/alignment-preference.md)
    batch_size: int = 32          # target pairs per local step
    context_size: int = 8         # context pairs per posterior sample during training
    latent: int = 8               # d
    hidden: int = 64
    decoder: str = "bilinear"     # bilinear: r = e_s^T (w_0 + U z) | concat: VPL's MLP([e_s ; z])
    lr: float = 3e-2              # Adam step size: the server's (server_optimizer adam) or the clients' (none)
    lr_schedule: str = "constant"  # constant | cosine (lr * (1 + cos(pi (r - 1) / rounds)) / 2 in round r)
    weight_decay: float = 0.0     # L2 on the network (the local optimiser's weight_decay)
    server_optimizer: str = "adam"  # adam: local SGD (local_lr), FedAvg of the updates taken as a pseudo-gradient
                                    # by a server Adam (lr) (Reddi et al. 2021) | none: local Adam (lr) + FedAvg;
                                    # see local_optimizer for why (measured on an HH-RLHF validation split)
    local_lr: float = 0.1         # local SGD step size with server_optimizer="adam"
    beta: float = 0.05            # KL weight (the paper: 0.5; with local Adam 0.5 pinned every z to the peers;
                                  # with the server Adam 0.5 and 0.05 are level on HH-RLHF validation pairs)
    ortho: float = 1.0            # lambda
    gamma: float = 0.1            # weight of ||P P^T - I||
    tau: float = 1.0              # Gumbel-Softmax temperature
    logvar_max: float = 0.0       # variance cap
    prototypes: int = 2           # M
    prototype_scale: float = 5.0
    prototype_mode: str = "fixed"  # fixed: scaled identity rows | learnable: QR init, shared (FedAvg), QR
                                   # re-orthonormalised after every step (the paper's option)
    prior_weights: str = "gumbel"   # gumbel (paper) | samples (released code)
    prior_min_logvar: float | None = 0.0  # floor on the prior components' log-variance (None: none) [inferred]
    summary_mean: str = "all_pairs"  # the uploaded mubar: posterior from all pairs | mean of the steps' posterior
                                     # means | of the sampled z (paper); see posterior_summary [inferred]
    ortho_warmup: int | None = 10    # rounds before prototype labels are broadcast (None: rounds // 3) [inferred]
    seed: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {self.decoder!r}")
        if self.server_optimizer not in ("none", "adam"):
            raise ValueError(f"server_optimizer must be 'none' or 'adam', got {self.server_optimizer!r}")
        if self.prototype_mode not in ("fixed", "learnable"):
            raise ValueError(f"prototype_mode must be 'fixed' or 'learnable', got {self.prototype_mode!r}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {self.lr_schedule!r}")
        if self.summary_mean not in SUMMARY_MEANS:
            raise ValueError(f"summary_mean must be one of {SUMMARY_MEANS}, got {self.summary_mean!r}")
        if self.prior_weights not in ("gumbel", "samples"):
            raise ValueError(f"prior_weights must be 'gumbel' or 'samples', got {self.prior_weights!r}")
        if self.prototypes > self.latent:
            raise ValueError(f"{self.prototypes} orthogonal prototypes need latent >= {self.prototypes}")


# ------------------------------------------------------------------------------------------------ the model
class VPAModel(torch.nn.Module):
    """Pair encoder -> q(z | C); z-conditioned reward decoder. All of it is shared (FedAvg)."""

    def __init__(self, d_in: int, latent: int, hidden: int = 64, decoder: str = "bilinear", *,
                 prototypes: int = 0, prototype_scale: float = 5.0):
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        self.pair = torch.nn.Sequential(torch.nn.Linear(2 * d_in, hidden), torch.nn.ReLU(),
                                        torch.nn.Linear(hidden, hidden), torch.nn.ReLU())
        self.mu = torch.nn.Linear(hidden, latent)
        self.logvar = torch.nn.Linear(hidden, latent)
        if decoder == "bilinear":
            # w(z) = w_0 + U z; a bias would cancel in r(chosen) - r(rejected)
            self.w0 = torch.nn.Linear(d_in, 1, bias=False)
            self.U = torch.nn.Linear(latent, d_in, bias=False)
            # start at r = 0 for every z: PyTorch's default init of U (entries up to 1/sqrt(d)) made U z a large
            # random direction that swamped w_0 at the start (docs/alignment-preference.md)
            torch.nn.init.zeros_(self.w0.weight)
            torch.nn.init.zeros_(self.U.weight)
        else:
            self.reward = torch.nn.Sequential(torch.nn.Linear(d_in + latent, hidden), torch.nn.ReLU(),
                                              torch.nn.Linear(hidden, 1))
        self.latent, self.decoder = latent, decoder
        if prototypes:
            # learnable prototypes: QR-orthonormalised Gaussian rows, scaled (the paper's "QR init, learnable")
            self.proto = torch.nn.Parameter(orthonormal_rows(torch.randn(prototypes, latent), prototype_scale))

    @classmethod
    def from_config(cls, d_in: int, cfg: "VPAConfig") -> "VPAModel":
        learn = cfg.prototype_mode == "learnable" and cfg.method == "fedvpa_gp"
        return cls(d_in, cfg.latent, cfg.hidden, cfg.decoder, prototypes=cfg.prototypes if learn else 0,
                   prototype_scale=cfg.prototype_scale)

    def direction(self, z):
        """w(z) = w_0 + U z of the bilinear decoder: z [..., d] -> [..., d_in]."""
        if self.decoder != "bilinear":
            raise ValueError("only the bilinear decoder has a z-dependent reward direction")
        return self.w0.weight[0] + self.U(z)

    def posterior(self, chosen, rejected, logvar_max: float = 0.0):
        """(mu, logvar) of q(z | C) from a context set of pairs [N, d_in] each."""
        h = self.pair(torch.cat([chosen, rejected], -1)).mean(-2)
        return self.mu(h), torch.clamp(self.logvar(h), max=logvar_max)

    def score(self, s, z):
        """r(s, z): s [..., d_in], z [d] or broadcastable."""
        if self.decoder == "bilinear":
            return (s * self.direction(z)).sum(-1)
        z = z.expand(*s.shape[:-1], self.latent)
        return self.reward(torch.cat([s, z], -1)).squeeze(-1)


def named_arrays(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {f"net.{k}": v.detach().clone() for k, v in model.state_dict().items()}


def load_arrays(model: torch.nn.Module, shared: dict) -> None:
    state = {k[4:]: torch.as_tensor(np.asarray(v), dtype=torch.float32) for k, v in shared.items()
             if k.startswith("net.")}
    model.load_state_dict(state)


# ------------------------------------------------------------------------------------------------ KL terms
def log_normal(z, mu, logvar):
    """log N(z; mu, diag exp(logvar)), summed over the last dimension."""
    return -0.5 * (((z - mu) ** 2) / logvar.exp() + logvar + math.log(2 * math.pi)).sum(-1)


def kl_standard_normal(mu, logvar):
    """Closed-form KL(N(mu, sigma^2) || N(0, I))."""
    return 0.5 * (mu ** 2 + logvar.exp() - 1.0 - logvar).sum(-1)


def gumbel_weights(logits: torch.Tensor, tau: float = 1.0, generator: torch.Generator | None = None,
                   noise: bool = True) -> torch.Tensor:
    """softmax((logits + g) / tau) with Gumbel noise g = -log(-log U) (Jang et al. 2017; Maddison et al. 2017)."""
    if noise:
        u = torch.rand(logits.shape, generator=generator).clamp(1e-10, 1 - 1e-10)
        logits = logits - torch.log(-torch.log(u))
    return torch.softmax(logits / tau, -1)


def mixture_kl_mc(z, mu, logvar, prior_mu, prior_logvar, log_w):
    """One-sample Monte-Carlo KL(q || sum_j w_j N(mubar_j, sigmabar_j^2)) at z ~ q:
    log q(z) - logsumexp_j [log w_j + log N(z; mubar_j, sigmabar_j^2)]."""
    log_q = log_normal(z, mu, logvar)
    log_p = torch.logsumexp(log_w + log_normal(z.unsqueeze(-2), prior_mu, prior_logvar), -1)
    return log_q - log_p


def orthonormal_rows(p: torch.Tensor, scale: float) -> torch.Tensor:
    """scale x the QR-orthonormalised rows of p [..., M, d] (M <= d), signs kept so that each row stays on the side
    of its input row (re-orthonormalising an almost orthogonal P moves it little)."""
    q, r = torch.linalg.qr(p.transpose(-1, -2))
    sign = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    return scale * (q * sign.unsqueeze(-2)).transpose(-1, -2)


def prototype_matrix(m: int, d: int, scale: float) -> torch.Tensor:
    """M scaled orthonormal rows (the scaled-identity option)."""
    return scale * torch.eye(d)[:m]


def ortho_loss(z, proto, label: int, gamma: float):
    pn = proto / proto.norm(dim=1, keepdim=True)
    return ((z - proto[label]) ** 2).sum() + gamma * ((pn @ pn.T - torch.eye(len(proto))) ** 2).sum()


SUMMARY_MEANS = ("all_pairs", "posterior", "samples")


def posterior_summary(zs, mus, logvars, mean_of: str = "posterior", mu_all=None):
    """(mubar, log sigmabar^2) of a client's local posteriors over its steps.

    mubar: ``"samples"`` the mean of the sampled z (the paper's; over a long local epoch); ``"posterior"`` the
    mean of the steps' posterior means; ``"all_pairs"`` ``mu_all``, the posterior mean from all the client's pairs
    under the round's broadcast network (before the local steps). All three estimate the client's mean z. Early in
    training the clients' z differ by type by about 0.01, less than both the sampling noise of a few z (standard
    deviation up to 1) and the change two local Adam steps make to each client's own copy of the encoder; the
    first two summaries buried the type signal and the server's prototype labels came out random on HH-RLHF,
    while z from the broadcast encoder separates the types (docs/alignment-preference.md).
    sigmabar^2 = mean posterior variance + variance of the posterior means (the moment-matched aggregate posterior
    of the steps)."""
    if mean_of not in SUMMARY_MEANS:
        raise ValueError(f"mean_of must be one of {SUMMARY_MEANS}, got {mean_of!r}")
    var = logvars.exp().mean(0) + mus.var(0, unbiased=False)
    if mean_of == "all_pairs":
        if mu_all is None:
            raise ValueError("mean_of='all_pairs' needs mu_all")
        mean = mu_all
    else:
        mean = (mus if mean_of == "posterior" else zs).mean(0)
    return mean, torch.log(var.clamp_min(1e-4))


# ------------------------------------------------------------------------------------------------ prior table
class PriorTable:
    """The server's table of every client's posterior summary; a round's uploads overwrite their rows, the
    others keep theirs."""

    def __init__(self, n_clients: int, latent: int):
        self.mu = torch.zeros(n_clients, latent)
        self.logvar = torch.zeros(n_clients, latent)
        self.count = torch.zeros(n_clients)
        self.present = torch.zeros(n_clients, dtype=torch.bool)

    def update(self, updates: list[ClientUpdate]) -> None:
        for u in updates:
            self.mu[u.cid] = torch.as_tensor(u.arrays[POSTERIOR_MU]).float()
            self.logvar[u.cid] = torch.as_tensor(u.arrays[POSTERIOR_LOGVAR]).float()
            self.count[u.cid] = float(u.num_examples)
            self.present[u.cid] = True

    def arrays(self) -> dict[str, torch.Tensor]:
        return {"prior.mu": self.mu.clone(), "prior.logvar": self.logvar.clone(), "prior.count": self.count.clone(),
                "prior.present": self.present.clone()}


def prototype_labels(mu: np.ndarray, proto: np.ndarray, seed: int = 0) -> np.ndarray:
    """Balanced k-means (k = M, k-means++ seeding) over client mean-z; cluster j is then given the prototype that
    minimises the total centre-to-prototype distance over all matchings (so labels follow the data, and stay put
    from round to round once the clusters sit on their prototypes)."""
    from itertools import permutations

    labels, centres = kmeans(mu, len(proto), seed=seed, balanced=True)
    d = ((centres[:, None, :] - proto[None]) ** 2).sum(-1)
    best = min(permutations(range(len(proto))), key=lambda p: sum(d[j, p[j]] for j in range(len(p))))
    return np.asarray(best)[labels]


def round_lr(cfg: VPAConfig, r: int) -> float:
    """The Adam step size of round r (1-based): the server's (``server_optimizer="adam"``) or the clients'. Adam's
    steps are about lr whatever the gradient's size, so with a constant lr the federated model keeps moving by
    about lr per round; the cosine schedule lets it settle."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * (r - 1) / max(cfg.rounds, 1)))


class _Optimizers:
    def __init__(self, opts):
        self.opts = opts

    def zero_grad(self):
        for o in self.opts:
            o.zero_grad()

    def step(self):
        for o in self.opts:
            o.step()


def local_optimizer(cfg: VPAConfig, net: list, pi: torch.Tensor | None, r: int) -> _Optimizers:
    """The client's optimiser of round r: Adam on the network (``server_optimizer="none"``) or plain SGD
    (``"adam"``: the server adapts the step instead); the private mixture logits pi always with Adam.

    Why the server variant exists: a fresh Adam's first steps are close to lr * sign(gradient). Two client types
    whose gradients on a weight share a sign but differ in size (the encoder's ReLU features are >= 0, and the type
    information sits in their sizes) then move it by +lr and -lr, and FedAvg cancels exactly what would separate
    the types. SGD keeps the sizes; the server's Adam scales the averaged update."""
    lr = round_lr(cfg, r)
    if cfg.server_optimizer == "adam":
        opts = [torch.optim.SGD(net, lr=cfg.local_lr, weight_decay=cfg.weight_decay)]
    else:
        opts = [torch.optim.Adam(net, lr=lr, weight_decay=cfg.weight_decay)]
    if pi is not None:
        opts.append(torch.optim.Adam([pi], lr=lr))
    return _Optimizers(opts)


def fedadam_step(adam: ServerAdam, old: dict, averaged: dict, lr: float) -> dict:
    """One server Adam step on the network over FedAvg's result taken as a pseudo-gradient
    g = theta - mean_k theta_k (FedAdam, Reddi et al., "Adaptive Federated Optimization", ICLR 2021); the other
    arrays pass through as averaged."""
    adam.tick()
    out = dict(averaged)
    for k, a in averaged.items():
        if not k.startswith("net."):
            continue
        o = torch.as_tensor(np.asarray(old[k]), dtype=torch.float32)
        g = o - torch.as_tensor(np.asarray(a), dtype=torch.float32)
        out[k] = adam.update(k, o, g, lr)
    return out


def context_target_sizes(n: int, cfg: VPAConfig) -> tuple[int, int]:
    """(context pairs, target pairs) of one local step for a client with n pairs: disjoint, the context at most
    half of the client's pairs, at least one of each."""
    c = max(1, min(cfg.context_size, n // 2))
    return c, max(1, min(cfg.batch_size, n - c))


# ------------------------------------------------------------------------------------------------ the client
class VPAClient:
    """A FedVPA-GP / FedVPL / monolithic client on the federation's ``fit`` / ``evaluate`` protocol.

    Private: its pairs and (FedVPA-GP) its mixture-weight logits pi, kept in ``store``. ``fit`` uploads the shared
    network parameters (``net.*``) and the posterior summary (``posterior.mu``, ``posterior.logvar``)."""

    def __init__(self, cid: int, train: PreferencePairs, test: PreferencePairs | None, cfg: VPAConfig, *,
                 n_table: int, store=None):
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
        present = torch.as_tensor(np.asarray(shared.get("prior.present", np.zeros(self.n_table, bool)))).bool().clone()
        present[self.cid] = False                 # the prior mixes the *peers'* summaries
        use_mix = cfg.method == "fedvpa_gp" and bool(present.any())
        if use_mix:
            pmu = self._t(shared["prior.mu"])[present]
            plv = self._t(shared["prior.logvar"])[present]
            if cfg.prior_min_logvar is not None:
                plv = plv.clamp_min(cfg.prior_min_logvar)
            pcount = self._t(shared["prior.count"])[present]
        labels = np.asarray(shared.get("labels", np.full(self.n_table, -1)))
        label = int(labels[self.cid]) if cfg.method == "fedvpa_gp" else -1
        learn_proto = hasattr(model, "proto")
        if learn_proto:
            with torch.no_grad():             # FedAvg of orthonormal rows is not orthonormal
                model.proto.copy_(orthonormal_rows(model.proto, cfg.prototype_scale))
            proto = model.proto
        else:
            proto = prototype_matrix(cfg.prototypes, cfg.latent, cfg.prototype_scale)
        c, rj = self._t(self.train.chosen), self._t(self.train.rejected)
        n = len(c)
        zs, losses, kls, posts = [], [], [], []
        c_size, b_size = context_target_sizes(n, cfg)
        with torch.no_grad():             # z from all the client's pairs under the broadcast network
            mu_all = model.posterior(c, rj, cfg.logvar_max)[0]
        for _ in range(cfg.local_steps):
            # context and target pairs disjoint, as at evaluation (z never sees the pair it scores)
            perm = torch.randperm(n, generator=g)
            ctx, tgt = perm[:c_size], perm[c_size:c_size + b_size]
            if cfg.method == "monolithic":
                tgt = perm[:min(cfg.batch_size, n)]
                z = torch.zeros(cfg.latent)
                kl = torch.zeros(())
            else:
                mu, logvar = model.posterior(c[ctx], rj[ctx], cfg.logvar_max)
                z = mu + torch.exp(0.5 * logvar) * torch.randn(cfg.latent, generator=g)
                posts.append((mu.detach(), logvar.detach()))
                if use_mix:
                    if cfg.prior_weights == "gumbel":
                        w = gumbel_weights(pi[present], cfg.tau, g)
                    else:
                        w = pcount / pcount.sum()
                    kl = mixture_kl_mc(z, mu, logvar, pmu, plv, torch.log(w + 1e-12))
                else:
                    kl = kl_standard_normal(mu, logvar)
                zs.append(z.detach())
            loss = -F.logsigmoid(model.score(c[tgt], z) - model.score(rj[tgt], z)).mean() + cfg.beta * kl
            if label >= 0 and cfg.ortho > 0:
                loss = loss + cfg.ortho * ortho_loss(z, proto, label, cfg.gamma)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if learn_proto:
                with torch.no_grad():
                    model.proto.copy_(orthonormal_rows(model.proto, cfg.prototype_scale))
            losses.append(float(loss.detach()))
            kls.append(float(kl.detach()))
        self.store.save(self.cid, {"pi": pi.detach().clone()})
        arrays = named_arrays(model)
        if cfg.method != "monolithic":
            arrays[POSTERIOR_MU], arrays[POSTERIOR_LOGVAR] = posterior_summary(
                torch.stack(zs), torch.stack([m for m, _ in posts]), torch.stack([v for _, v in posts]),
                cfg.summary_mean, mu_all)
        return ClientUpdate(cid=self.cid, kind="params", arrays=arrays, num_examples=n,
                            metrics={"loss": float(np.mean(losses)), "kl": float(np.mean(kls))})

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
        out = {"cid": self.cid, "n_test": 0 if self.test is None else len(self.test),
               "kl_standard_normal": float(kl_standard_normal(mu, logvar))}
        if self.test is not None and len(self.test):
            out["accuracy"] = accuracy(model, self.test, mu)
        return out


def accuracy(model: VPAModel, pairs: PreferencePairs, z: torch.Tensor) -> float:
    with torch.no_grad():
        c = model.score(torch.as_tensor(pairs.chosen, dtype=torch.float32), z)
        r = model.score(torch.as_tensor(pairs.rejected, dtype=torch.float32), z)
    return pairwise_accuracy(c.numpy(), r.numpy())


# ------------------------------------------------------------------------------------------------ the server
class _Spec:
    item_table = False


def train_federated(train: PreferencePairs, test: PreferencePairs, cfg: VPAConfig, *, log: list | None = None,
                    simulator: str = "batched", on_round=None):
    """Train one method over the clients of ``train`` (all clients every round); return the shared state, the
    clients, the prior table, the prototype labels and the per-round history. ``simulator``: ``batched`` (all
    clients at once, :class:`BatchedVPAClients`) or ``sequential`` (one :class:`VPAClient` at a time).
    ``on_round(r, shared, table, labels)``: called after every round (diagnostics)."""
    from ..federation.fedavg import FedAvgStrategy

    torch.manual_seed(cfg.seed)
    K = train.n_clients
    model = VPAModel.from_config(train.chosen.shape[1], cfg)
    shared = named_arrays(model)
    specs = {k: _Spec() for k in shared}
    store = MemoryStore()
    clients = [VPAClient(k, train.of_client(k), test.of_client(k), cfg, n_table=K, store=store)
               for k in range(K) if (train.client == k).sum() >= 2]
    table = PriorTable(K, cfg.latent)
    labels = np.full(K, -1, np.int64)
    fixed_proto = prototype_matrix(cfg.prototypes, cfg.latent, cfg.prototype_scale).numpy()
    strategy = FedAvgStrategy()
    server_adam = ServerAdam() if cfg.server_optimizer == "adam" else None

    def configure(r, shared):
        # the clients see the network, the peers' posterior summaries and their prototype labels
        return {**shared, **table.arrays(), "labels": torch.as_tensor(labels)}, {"round": r}

    def aggregate(r, shared, updates, config):
        if log is not None:
            log.extend(updates)
        params = [ClientUpdate(cid=u.cid, kind="params", num_examples=u.num_examples,
                               arrays={k: v for k, v in u.arrays.items() if k.startswith("net.")}) for u in updates]
        averaged = strategy.aggregate(shared, params, specs)
        shared = averaged if server_adam is None else fedadam_step(server_adam, shared, averaged, round_lr(cfg, r))
        if cfg.method != "monolithic":
            table.update(updates)
            warmup = cfg.rounds // 3 if cfg.ortho_warmup is None else cfg.ortho_warmup
            if cfg.method == "fedvpa_gp" and r >= warmup:
                # labels from the clients' mean z only once z carries the preference signal: assigned on the
                # first rounds' near-random z, the prototype pull would lock random labels in
                have = table.present.numpy()
                proto = fixed_proto if "net.proto" not in shared else orthonormal_rows(
                    torch.as_tensor(np.asarray(shared["net.proto"]), dtype=torch.float32), cfg.prototype_scale).numpy()
                labels[have] = prototype_labels(table.mu[have].numpy(), proto, seed=cfg.seed + r)
        return shared, {"round": r, "loss": float(np.mean([u.metrics["loss"] for u in updates])),
                        "kl_term": float(np.mean([u.metrics["kl"] for u in updates]))}

    if simulator == "batched":
        batched = BatchedVPAClients(train, cfg, n_table=K, store=store)
        fit = over_the_wire(lambda cohort, message, config: batched.fit(message, config))  # all clients at once
    else:
        fit = over_the_wire(fit_each)
    report = None if on_round is None else lambda r, shared, record: on_round(r, shared, table, labels)
    loop = RoundLoop(clients, aggregate, fit=fit, configure=configure, on_round=report)
    shared, history = loop.run(shared, range(1, cfg.rounds + 1))
    return shared, clients, table, labels, history


def evaluate_method(train: PreferencePairs, test: PreferencePairs, unseen: PreferencePairs | None, cfg: VPAConfig,
                    *, context_pairs: int = 10, log: list | None = None, simulator: str = "batched") -> dict:
    """Train one method and measure: held-out accuracy per client type, KL to N(0, I) of the clients' posteriors,
    silhouette / purity of client mean-z by true type, unseen-client accuracy from ``context_pairs`` pairs."""
    shared, clients, table, labels, history = train_federated(train, test, cfg, log=log, simulator=simulator)
    model = VPAModel.from_config(train.chosen.shape[1], cfg)
    load_arrays(model, shared)
    types = train.client_groups()
    names = train.group_names
    hits = {n: [] for n in names}
    mus, kls, tys = [], [], []
    for c in clients:
        mu, logvar = c.infer_z(model)
        mus.append(mu.numpy())
        kls.append(float(kl_standard_normal(mu, logvar)))
        tys.append(types[c.cid])
        if c.test is not None and len(c.test):
            with torch.no_grad():
                sc = model.score(torch.as_tensor(c.test.chosen), mu) - model.score(torch.as_tensor(c.test.rejected), mu)
            hits[names[types[c.cid]]] += ((sc > 0).float() + 0.5 * (sc == 0).float()).tolist()
    mus, tys = np.array(mus), np.array(tys)
    out = {"accuracy": {n: float(np.mean(h)) if h else float("nan") for n, h in hits.items()},
           "history": history}
    if cfg.method != "monolithic":
        out["kl"] = float(np.mean(kls))
        out["kl_term"] = history[-1]["kl_term"]
        out["silhouette"] = silhouette(mus, tys)
        if cfg.method == "fedvpa_gp" and (labels >= 0).all():
            lab = labels[[c.cid for c in clients]]
        else:
            lab, _ = kmeans(mus, cfg.prototypes, seed=cfg.seed, balanced=True)
        out["purity"] = purity(lab, tys)
        # swap: score each client's held-out pairs with the mean z of the other type(s)
        flips, tot = 0, 0
        for c, mu in zip(clients, mus):
            other = mus[tys != types[c.cid]]
            if not len(other) or c.test is None or not len(c.test):
                continue
            with torch.no_grad():
                own = model.score(torch.as_tensor(c.test.chosen), torch.as_tensor(mu)) - \
                    model.score(torch.as_tensor(c.test.rejected), torch.as_tensor(mu))
                sw = model.score(torch.as_tensor(c.test.chosen), torch.as_tensor(other.mean(0))) - \
                    model.score(torch.as_tensor(c.test.rejected), torch.as_tensor(other.mean(0)))
            flips += int(((own > 0) != (sw > 0)).sum())
            tot += len(own)
        out["swap_flip_rate"] = flips / tot if tot else float("nan")
    if unseen is not None and len(unseen):
        accs = []
        rng = np.random.default_rng(cfg.seed)
        for k in np.unique(unseen.client):
            rows = rng.permutation(np.flatnonzero(unseen.client == k))
            ctx, rest = unseen.take(rows[:context_pairs]), unseen.take(rows[context_pairs:])
            if not len(rest):
                continue
            if cfg.method == "monolithic":
                z = torch.zeros(cfg.latent)
            else:
                with torch.no_grad():
                    z, _ = model.posterior(torch.as_tensor(ctx.chosen), torch.as_tensor(ctx.rejected),
                                           cfg.logvar_max)
            accs.append((accuracy(model, rest, z), len(rest)))
        out["unseen_accuracy"] = float(np.average([a for a, _ in accs], weights=[n for _, n in accs]))
    return out


def fit_linear_bt(chosen: np.ndarray, rejected: np.ndarray, *, weight_decay: float = 0.0, steps: int = 100,
                  lr: float = 1e-2, seed: int = 0) -> np.ndarray:
    """A linear Bradley-Terry reward r(s) = w^T s fitted centrally (full-batch Adam, L2 ``weight_decay``)."""
    torch.manual_seed(seed)
    w = torch.zeros(chosen.shape[1], requires_grad=True)
    d = torch.as_tensor(chosen - rejected, dtype=torch.float32)
    opt = torch.optim.Adam([w], lr=lr, weight_decay=weight_decay)
    for _ in range(steps):
        loss = -F.logsigmoid(d @ w).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return w.detach().numpy()


def central_ceiling(train: PreferencePairs, test: PreferencePairs, *, seed: int = 0,
                    weight_decays=(0.0, 1e-3, 1e-2, 1e-1), val_fraction: float = 0.2) -> dict:
    """How much a type-conditioned reward can gain on these features: linear Bradley-Terry rewards trained
    *centrally* (all pairs in one place, no federation) on the pooled pairs vs one per client type (the true type
    known: an oracle z). ``weight_decay`` is chosen per model on a validation split of ``train``; the test pairs are
    only scored. ``cross``: each type's pairs scored by the *other* type's model (below 50% = the types disagree)."""
    from .pairs import holdout_split

    tr, va = holdout_split(train, val_fraction, seed=seed + 100)
    names = train.group_names
    groups = np.unique(train.group)

    def pick(rows_tr, rows_va):
        accs = [pairwise_accuracy(va.chosen[rows_va] @ w, va.rejected[rows_va] @ w)
                for w in (fit_linear_bt(tr.chosen[rows_tr], tr.rejected[rows_tr], weight_decay=wd, seed=seed)
                          for wd in weight_decays)]
        return weight_decays[int(np.argmax(accs))]

    def acc(w, t):
        rows = test.group == t
        return pairwise_accuracy(test.chosen[rows] @ w, test.rejected[rows] @ w)

    wd = pick(np.ones(len(tr), bool), np.ones(len(va), bool))
    w_pool = fit_linear_bt(train.chosen, train.rejected, weight_decay=wd, seed=seed)
    out = {"pooled": {names[t]: acc(w_pool, t) for t in groups}, "per_type": {}, "cross": {},
           "weight_decay": {"pooled": wd}}
    ws = {}
    for t in groups:
        wd_t = pick(tr.group == t, va.group == t)
        ws[t] = fit_linear_bt(train.chosen[train.group == t], train.rejected[train.group == t], weight_decay=wd_t,
                              seed=seed)
        out["weight_decay"][names[t]] = wd_t
        out["per_type"][names[t]] = acc(ws[t], t)
    if len(groups) == 2:
        for t in groups:
            out["cross"][names[t]] = acc(ws[groups[groups != t][0]], t)
    return out


def run_fedvpa_gp(source, *, cfg: VPAConfig | None = None, hh: bool = False, limit: int | None = None,
                  clients_per_type: int = 10, pairs_per_client: int = 40, unseen_per_type: int = 2,
                  context_pairs: int = 10, test_fraction: float = 0.25, text: str = "none", encoder=None,
                  cache_dir=None, progress: bool = False, pairs: PreferencePairs | None = None,
                  simulator: str = "batched") -> dict:
    """The three methods on the same clients; the JSON-ready report of the issue's contract."""
    import time
    from dataclasses import replace

    from .pairs import annotator_pairs, assign_clients, hh_pairs, holdout_split, item_features, item_stats

    cfg = cfg or VPAConfig()
    t0 = time.perf_counter()
    per_type = clients_per_type + unseen_per_type
    if pairs is None:
        if hh:
            pairs = hh_pairs(source, limit_per_split=limit, encoder=encoder, cache_dir=cache_dir,
                             clients_per_split=per_type, seed=cfg.seed, progress=progress)
            name = str(source)
        else:
            from fedvlr_plus.datasets import load

            data = load(source)
            feats = item_features(data, text=text, encoder=encoder, cache_dir=cache_dir, progress=progress)
            # the "quality" annotator reads the mean rating: give the models that statistic as a feature
            feats = np.concatenate([feats, item_stats(data)], 1)
            pairs = annotator_pairs(data, feats, n_clients_per_type=per_type, pairs_per_client=pairs_per_client,
                                    seed=cfg.seed)
            name = getattr(data, "name", str(source))
    else:
        name = str(source)
        pairs = replace(pairs, client=assign_clients(pairs.group, per_type, seed=cfg.seed))
    # the last unseen_per_type clients of every type are unseen; the others are renumbered 0..K-1
    types = pairs.client_groups()
    unseen_ids = np.concatenate([np.flatnonzero(types == t)[clients_per_type:] for t in np.unique(types)])
    is_unseen = np.isin(pairs.client, unseen_ids)
    seen = pairs.take(np.flatnonzero(~is_unseen))
    remap = {c: j for j, c in enumerate(np.unique(seen.client))}
    seen = replace(seen, client=np.array([remap[c] for c in seen.client], np.int64))
    unseen = pairs.take(np.flatnonzero(is_unseen))
    train, test = holdout_split(seen, test_fraction, seed=cfg.seed)
    results = {}
    uploads: list[ClientUpdate] = []
    for method in METHODS:
        results[method] = evaluate_method(train, test, unseen, replace(cfg, method=method),
                                          context_pairs=context_pairs, log=uploads if method == "fedvpa_gp" else None,
                                          simulator=simulator)
    return {
        "source": name, "types": list(pairs.group_names),
        "accuracy": {m: results[m]["accuracy"] for m in METHODS},
        "kl": {m: results[m].get("kl") for m in METHODS},
        "kl_term": {m: results[m].get("kl_term") for m in METHODS},
        "prototype_purity": results["fedvpa_gp"]["purity"],
        "silhouette": results["fedvpa_gp"]["silhouette"],
        "separation": {m: {"purity": results[m].get("purity"), "silhouette": results[m].get("silhouette")}
                       for m in ("fedvpl", "fedvpa_gp")},
        "swap": {"flip_rate": results["fedvpa_gp"]["swap_flip_rate"],
                 "fedvpl_flip_rate": results["fedvpl"]["swap_flip_rate"]},
        "unseen_accuracy": {m: results[m].get("unseen_accuracy") for m in METHODS},
        "ceiling": central_ceiling(train, test, seed=cfg.seed),
        "clients": {"train": int(train.n_clients), "unseen": int(len(unseen_ids)),
                    "pairs_per_client": len(train) / max(train.n_clients, 1), "test_pairs": len(test),
                    "context_pairs_unseen": context_pairs},
        "uplink": {"arrays": sorted({k for u in uploads for k in u.arrays})},
        "history": {m: results[m]["history"] for m in METHODS},
        "config": {k: v for k, v in cfg.__dict__.items() if k != "method"},
        "seconds": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------------------------------------ batched clients
def _lin(x, params, name):
    """x [K, N, in] through every client's own copy of a linear layer: W [K, out, in], b [K, out]."""
    return torch.baddbmm(params[f"{name}.bias"].unsqueeze(1), x, params[f"{name}.weight"].transpose(1, 2))


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
            self.C[i, :len(rows)] = torch.as_tensor(train.chosen[rows])
            self.R[i, :len(rows)] = torch.as_tensor(train.rejected[rows])

    def fit(self, shared: dict, config: dict) -> list[ClientUpdate]:
        cfg = self.cfg
        r = int(config.get("round", 1))
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + r * 1009)
        K, L = len(self.cids), cfg.latent
        cids = torch.as_tensor(self.cids)
        params = {k[4:]: torch.as_tensor(np.asarray(v), dtype=torch.float32).unsqueeze(0).repeat(
            K, *([1] * np.asarray(v).ndim)).requires_grad_(True) for k, v in shared.items() if k.startswith("net.")}
        pi = torch.stack([(self.store.load(c) or {"pi": torch.zeros(self.n_table)})["pi"] for c in self.cids])
        pi.requires_grad_(True)
        # one optimiser over the stack is K independent ones: Adam and SGD are elementwise
        opt = local_optimizer(cfg, list(params.values()), pi if cfg.method == "fedvpa_gp" else None, r)
        present = torch.as_tensor(np.asarray(shared.get("prior.present", np.zeros(self.n_table, bool)))).bool()
        allowed = present.unsqueeze(0).repeat(K, 1)
        allowed[torch.arange(K), cids] = False                    # peers only
        use_mix = cfg.method == "fedvpa_gp" and bool(allowed.any(1).all())
        if use_mix:
            pmu = torch.as_tensor(np.asarray(shared["prior.mu"]), dtype=torch.float32)
            plv = torch.as_tensor(np.asarray(shared["prior.logvar"]), dtype=torch.float32)
            if cfg.prior_min_logvar is not None:
                # components narrower than N(0, I) pin every z to the peers' consensus (observed collapse)
                plv = plv.clamp_min(cfg.prior_min_logvar)
            pcount = torch.as_tensor(np.asarray(shared["prior.count"]), dtype=torch.float32)
        labels = torch.as_tensor(np.asarray(shared.get("labels", np.full(self.n_table, -1))))[cids]
        learn_proto = "proto" in params
        if learn_proto:
            with torch.no_grad():
                params["proto"].copy_(orthonormal_rows(params["proto"], cfg.prototype_scale))
        else:
            proto = prototype_matrix(cfg.prototypes, L, cfg.prototype_scale)
            pn = proto / proto.norm(dim=1, keepdim=True)
            ortho_const = cfg.gamma * ((pn @ pn.T - torch.eye(len(proto))) ** 2).sum()
        has_label = (labels >= 0) & (cfg.method == "fedvpa_gp") & (cfg.ortho > 0)
        c_size = context_target_sizes(int(self.n.min()), cfg)[0]
        B = cfg.batch_size                    # targets wrap around for clients with fewer pairs
        ar = torch.arange(K).unsqueeze(1)
        zs, losses, kls, posts = [], [], [], []

        def reward(s, z):
            if cfg.decoder == "bilinear":
                w = params["w0.weight"][:, 0] + torch.bmm(params["U.weight"], z.unsqueeze(-1)).squeeze(-1)
                return (s * w.unsqueeze(1)).sum(-1)
            h = torch.relu(_lin(torch.cat([s, z.unsqueeze(1).expand(-1, s.shape[1], -1)], -1), params, "reward.0"))
            return _lin(h, params, "reward.2").squeeze(-1)

        if cfg.method != "monolithic":
            # each client's z from all its pairs under the round's broadcast network (padding masked); see
            # posterior_summary
            with torch.no_grad():
                h = torch.relu(_lin(torch.cat([self.C, self.R], -1), params, "pair.0"))
                h = torch.relu(_lin(h, params, "pair.2"))
                valid = (torch.arange(self.C.shape[1]).unsqueeze(0) < self.n.unsqueeze(1)).float().unsqueeze(-1)
                h = (h * valid).sum(1, keepdim=True) / self.n.view(K, 1, 1)
                mu_all = _lin(h, params, "mu").squeeze(1)
        for _ in range(cfg.local_steps):
            # one permutation per client (padding last): the context is its head, the targets the next B pairs
            # (wrapping when fewer are left): disjoint, as in VPAClient
            keys = torch.rand(K, self.C.shape[1], generator=g)
            keys[torch.arange(self.C.shape[1]).unsqueeze(0) >= self.n.unsqueeze(1)] = 2.0
            perm = keys.argsort(1)
            start = 0 if cfg.method == "monolithic" else c_size
            pos = start + torch.arange(B).unsqueeze(0) % (self.n.unsqueeze(1) - start)
            tgt = perm.gather(1, pos)
            if cfg.method == "monolithic":
                z = torch.zeros(K, L)
                kl = torch.zeros(K)
            else:
                ctx = perm[:, :c_size]
                h = torch.relu(_lin(torch.cat([self.C[ar, ctx], self.R[ar, ctx]], -1), params, "pair.0"))
                h = torch.relu(_lin(h, params, "pair.2")).mean(1, keepdim=True)
                mu = _lin(h, params, "mu").squeeze(1)
                logvar = torch.clamp(_lin(h, params, "logvar").squeeze(1), max=cfg.logvar_max)
                z = mu + torch.exp(0.5 * logvar) * torch.randn(K, L, generator=g)
                posts.append((mu.detach(), logvar.detach()))
                if use_mix:
                    if cfg.prior_weights == "gumbel":
                        u = torch.rand(pi.shape, generator=g).clamp(1e-10, 1 - 1e-10)
                        logits = ((pi - torch.log(-torch.log(u))) / cfg.tau).masked_fill(~allowed, -torch.inf)
                        log_w = torch.log_softmax(logits, -1)
                    else:
                        log_w = torch.log((pcount.unsqueeze(0) * allowed).clamp_min(1e-30))
                        log_w = log_w - torch.logsumexp(log_w.masked_fill(~allowed, -torch.inf), -1, keepdim=True)
                    log_p = torch.logsumexp((log_w + log_normal(z.unsqueeze(1), pmu, plv)).masked_fill(
                        ~allowed, -torch.inf), -1)
                    kl = log_normal(z, mu, logvar) - log_p
                else:
                    kl = kl_standard_normal(mu, logvar)
                zs.append(z.detach())
            margin = reward(self.C[ar, tgt], z) - reward(self.R[ar, tgt], z)
            per_client = -F.logsigmoid(margin).mean(1) + cfg.beta * kl
            if bool(has_label.any()):
                if learn_proto:
                    P = params["proto"]                                       # [K, M, d], each client's copy
                    pn = P / P.norm(dim=-1, keepdim=True)
                    ortho_const = cfg.gamma * ((pn @ pn.transpose(1, 2) - torch.eye(P.shape[1])) ** 2).sum((1, 2))
                    target = P[torch.arange(K), labels.clamp_min(0)]
                else:
                    target = proto[labels.clamp_min(0)]
                dist = ((z - target) ** 2).sum(-1) + ortho_const
                per_client = per_client + cfg.ortho * torch.where(has_label, dist, torch.zeros_like(dist))
            opt.zero_grad()
            per_client.sum().backward()
            opt.step()
            if learn_proto:
                with torch.no_grad():
                    params["proto"].copy_(orthonormal_rows(params["proto"], cfg.prototype_scale))
            losses.append(per_client.detach())
            kls.append(kl.detach())
        loss_m = torch.stack(losses).mean(0)
        kl_m = torch.stack(kls).mean(0)
        out = []
        for i, c in enumerate(self.cids):
            self.store.save(c, {"pi": pi[i].detach().clone()})
            arrays = {f"net.{k}": v[i].detach().clone() for k, v in params.items()}
            if cfg.method != "monolithic":
                arrays[POSTERIOR_MU], arrays[POSTERIOR_LOGVAR] = posterior_summary(
                    torch.stack([z[i] for z in zs]), torch.stack([m[i] for m, _ in posts]),
                    torch.stack([v[i] for _, v in posts]), cfg.summary_mean, mu_all[i])
            out.append(ClientUpdate(cid=c, kind="params", arrays=arrays, num_examples=int(self.n[i]),
                                    metrics={"loss": float(loss_m[i]), "kl": float(kl_m[i])}))
        return out
