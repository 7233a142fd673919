"""Group Relative Policy Optimisation (GRPO) for single-step categorical policies.

Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
arXiv 2402.03300 (2024). For a context q, G actions o_1..o_G are sampled from the old policy and scored r_i:

- group-relative advantage  A_i = (r_i - mean(r)) / (std(r) + eps)   (std over the group, population form);
- ratio  rho_i = pi_theta(o_i | q) / pi_old(o_i | q);
- surrogate  min(rho_i A_i, clip(rho_i, 1 - epsilon, 1 + epsilon) A_i);
- KL penalty to a frozen reference, either the k3 estimator on the sampled actions
  (Schulman, "Approximating KL divergence", 2020): pi_ref/pi_theta - log(pi_ref/pi_theta) - 1, unbiased and >= 0,
  or, because a recommendation policy's action space (the candidate items) is enumerable, the exact
  categorical KL(pi_theta || pi_ref).

Loss = -(1/G) sum_i [surrogate_i - beta * KL_i], averaged over contexts. Actions here are single items, so the
per-token normalisation |o_i| of the original is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Standardise rewards within each group (last dimension). A group whose rewards are all equal gets zeros."""
    mean = rewards.mean(dim=-1, keepdim=True)
    std = rewards.std(dim=-1, unbiased=False, keepdim=True)
    return (rewards - mean) / (std + eps)


def clipped_surrogate(
    logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, clip_eps: float = 0.2
) -> torch.Tensor:
    """Per-sample PPO/GRPO surrogate min(rho A, clip(rho) A) (to be maximised); rho = exp(logp - logp_old)."""
    ratio = torch.exp(logp - logp_old)
    return torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-sample k3 estimate of KL(pi || pi_ref) on actions sampled from pi; always >= 0."""
    log_ratio = logp_ref - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def kl_categorical(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Exact KL(softmax(logits) || softmax(ref_logits)) over the last dimension (one value per context)."""
    logp = torch.log_softmax(logits, dim=-1)
    logq = torch.log_softmax(ref_logits, dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1)


@dataclass
class GRPOConfig:
    group_size: int = 8  #: G, actions sampled per context
    clip_eps: float = 0.2  #: epsilon of the clipped ratio
    beta: float = 0.04  #: weight of the KL penalty to the reference
    kl: str = "k3"  #: "k3" (sampled estimator) or "exact" (categorical KL over all actions)
    adv_eps: float = 1e-6


def sample_groups(logits: torch.Tensor, group_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample ``group_size`` actions per context (with replacement) from softmax(logits): [B, G] indices."""
    probs = torch.softmax(logits.detach(), dim=-1)
    return torch.multinomial(probs, group_size, replacement=True, generator=generator)


def grpo_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    logp_old: torch.Tensor,
    ref_logits: torch.Tensor,
    rewards: torch.Tensor,
    cfg: GRPOConfig | None = None,
) -> tuple[torch.Tensor, dict]:
    """GRPO loss for categorical policies over an enumerable action set.

    logits, ref_logits: [B, A] current and reference policy logits; actions: [B, G] sampled action indices;
    logp_old: [B, G] log-probabilities of those actions under the sampling policy; rewards: [B, G].
    Returns the scalar loss and diagnostics (mean reward, mean KL, clip fraction).
    """
    cfg = cfg or GRPOConfig()
    if actions.shape != rewards.shape or actions.shape != logp_old.shape:
        raise ValueError(
            f"actions {tuple(actions.shape)}, rewards {tuple(rewards.shape)} and logp_old "
            f"{tuple(logp_old.shape)} must have the same [B, G] shape"
        )
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, actions)
    adv = group_advantages(rewards, cfg.adv_eps)
    surrogate = clipped_surrogate(logp, logp_old, adv, cfg.clip_eps)
    if cfg.kl == "k3":
        ref_logp = torch.log_softmax(ref_logits, dim=-1).gather(-1, actions)
        kl = kl_k3(logp, ref_logp)  # [B, G]
        kl_mean = kl.mean()
        loss = -(surrogate - cfg.beta * kl).mean()
    elif cfg.kl == "exact":
        kl = kl_categorical(logits, ref_logits)  # [B]
        kl_mean = kl.mean()
        loss = -surrogate.mean() + cfg.beta * kl_mean
    else:
        raise ValueError(f"kl must be 'k3' or 'exact', got {cfg.kl!r}")
    ratio = torch.exp(logp - logp_old)
    clipped = ((ratio < 1 - cfg.clip_eps) | (ratio > 1 + cfg.clip_eps)).float().mean()
    return loss, {
        "reward": float(rewards.float().mean()),
        "kl": float(kl_mean.detach()),
        "clip_fraction": float(clipped),
    }
