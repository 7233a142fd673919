"""FedVPA-GP's model and its terms: the pair encoder q(z | C) with the z-conditioned reward decoder, the KL terms
to N(0, I) and to the peers' mixture prior, the orthogonal prototypes and the posterior summary a client uploads."""

from __future__ import annotations

import math

import numpy as np
import torch

from .config import DECODERS, SUMMARY_MEANS, VPAConfig


class VPAModel(torch.nn.Module):
    """Pair encoder -> q(z | C); z-conditioned reward decoder. All of it is shared (FedAvg)."""

    def __init__(
        self,
        d_in: int,
        latent: int,
        hidden: int = 64,
        decoder: str = "bilinear",
        *,
        prototypes: int = 0,
        prototype_scale: float = 5.0,
    ):
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        self.pair = torch.nn.Sequential(
            torch.nn.Linear(2 * d_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU()
        )
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
            self.reward = torch.nn.Sequential(
                torch.nn.Linear(d_in + latent, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
            )
        self.latent, self.decoder = latent, decoder
        if prototypes:
            # learnable prototypes: QR-orthonormalised Gaussian rows, scaled (the paper's "QR init, learnable")
            self.proto = torch.nn.Parameter(orthonormal_rows(torch.randn(prototypes, latent), prototype_scale))

    @classmethod
    def from_config(cls, d_in: int, cfg: VPAConfig) -> VPAModel:
        learn = cfg.prototype_mode == "learnable" and cfg.method == "fedvpa_gp"
        return cls(
            d_in,
            cfg.latent,
            cfg.hidden,
            cfg.decoder,
            prototypes=cfg.prototypes if learn else 0,
            prototype_scale=cfg.prototype_scale,
        )

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
    state = {
        k[4:]: torch.as_tensor(np.asarray(v), dtype=torch.float32) for k, v in shared.items() if k.startswith("net.")
    }
    model.load_state_dict(state)


# ------------------------------------------------------------------------------------------------ KL terms
def log_normal(z, mu, logvar):
    """log N(z; mu, diag exp(logvar)), summed over the last dimension."""
    return -0.5 * (((z - mu) ** 2) / logvar.exp() + logvar + math.log(2 * math.pi)).sum(-1)


def kl_standard_normal(mu, logvar):
    """Closed-form KL(N(mu, sigma^2) || N(0, I))."""
    return 0.5 * (mu**2 + logvar.exp() - 1.0 - logvar).sum(-1)


def gumbel_weights(
    logits: torch.Tensor, tau: float = 1.0, generator: torch.Generator | None = None, noise: bool = True
) -> torch.Tensor:
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
