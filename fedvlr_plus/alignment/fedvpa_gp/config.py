"""FedVPA-GP's settings: the three methods it compares and every knob of the local objective, the optimisers and
the server (what each does: :mod:`.fedvpa_gp`; why the defaults: docs/alignment-preference.md)."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("monolithic", "fedvpl", "fedvpa_gp")
DECODERS = ("bilinear", "concat")
POSTERIOR_MU, POSTERIOR_LOGVAR = "posterior.mu", "posterior.logvar"
SUMMARY_MEANS = ("all_pairs", "posterior", "samples")


@dataclass
class VPAConfig:
    method: str = "fedvpa_gp"
    rounds: int = 100
    local_steps: int = 2  # few local steps: with many, each client fits its own type through the z-free
    # path and FedAvg cancels the types out (measured; see docs/alignment-preference.md)
    batch_size: int = 32  # target pairs per local step
    context_size: int = 8  # context pairs per posterior sample during training
    latent: int = 8  # d
    hidden: int = 64
    decoder: str = "bilinear"  # bilinear: r = e_s^T (w_0 + U z) | concat: VPL's MLP([e_s ; z])
    lr: float = 3e-2  # Adam step size: the server's (server_optimizer adam) or the clients' (none)
    lr_schedule: str = "constant"  # constant | cosine (lr * (1 + cos(pi (r - 1) / rounds)) / 2 in round r)
    weight_decay: float = 0.0  # L2 on the network (the local optimiser's weight_decay)
    server_optimizer: str = "adam"  # adam: local SGD (local_lr), FedAvg of the updates taken as a pseudo-gradient
    # by a server Adam (lr) (Reddi et al. 2021) | none: local Adam (lr) + FedAvg;
    # see local_optimizer for why (measured on an HH-RLHF validation split)
    local_lr: float = 0.1  # local SGD step size with server_optimizer="adam"
    beta: float = 0.05  # KL weight (the paper: 0.5; with local Adam 0.5 pinned every z to the peers;
    # with the server Adam 0.5 and 0.05 are level on HH-RLHF validation pairs)
    ortho: float = 1.0  # lambda
    gamma: float = 0.1  # weight of ||P P^T - I||
    tau: float = 1.0  # Gumbel-Softmax temperature
    logvar_max: float = 0.0  # variance cap
    prototypes: int = 2  # M
    prototype_scale: float = 5.0
    prototype_mode: str = "fixed"  # fixed: scaled identity rows | learnable: QR init, shared (FedAvg), QR
    # re-orthonormalised after every step (the paper's option)
    prior_weights: str = "gumbel"  # gumbel (paper) | samples (released code)
    prior_min_logvar: float | None = 0.0  # floor on the prior components' log-variance (None: none) [inferred]
    summary_mean: str = "all_pairs"  # the uploaded mubar: posterior from all pairs | mean of the steps' posterior
    # means | of the sampled z (paper); see posterior_summary [inferred]
    ortho_warmup: int | None = 10  # rounds before prototype labels are broadcast (None: rounds // 3) [inferred]
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
