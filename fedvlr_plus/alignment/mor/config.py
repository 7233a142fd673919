"""MoR's settings: reward models, router, candidates and the GRPO policy rounds."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..grpo import GRPOConfig


@dataclass
class MoRConfig:
    reward_epochs: int = 30
    reward_lr: float = 1e-2
    architectures: tuple = ("bilinear", "mlp")  # dealt round-robin over the clients
    public_fraction: float = 0.1  # share of each client's training pairs donated as public pairs
    router_epochs: int = 300
    router_balance: float = 0.05
    router_holdout: float = 0.0  # share of the public pairs that early-stops the router (0: none)
    candidates: int = 100  # C: the reference's top-C unseen items per user
    grpo_rounds: int = 30
    users_per_round: int = 256
    inner_steps: int = 2
    policy_lr: float = 0.05
    temperature: float = 1.0
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(group_size=8, beta=0.05, kl="k3"))
    seed: int = 0
