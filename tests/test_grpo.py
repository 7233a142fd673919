import math

import pytest
import torch

from fedvlr_plus.alignment.grpo import (
    GRPOConfig,
    clipped_surrogate,
    group_advantages,
    grpo_loss,
    kl_categorical,
    kl_k3,
    sample_groups,
)


def test_group_advantages_hand_computed():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    a = group_advantages(r, eps=0.0 + 1e-12)
    # mean 0.5, population std 0.5 -> +-1; a constant group gives zeros
    assert torch.allclose(a[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-6)
    assert torch.all(a[1] == 0)


def test_clipped_surrogate_clips_only_in_the_favourable_direction():
    logp_old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    s = clipped_surrogate(logp, logp_old, adv, clip_eps=0.2)
    # ratio 1.5, A>0 -> clipped to 1.2; ratio 1.5, A<0 -> min(-1.5, -1.2) = -1.5
    # ratio 0.5, A>0 -> min(0.5, 0.8) = 0.5; ratio 0.5, A<0 -> min(-0.5, -0.8) = -0.8
    assert torch.allclose(s, torch.tensor([1.2, -1.5, 0.5, -0.8]), atol=1e-6)


def test_k3_is_nonnegative_and_unbiased_for_kl():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 6, generator=g)
    ref = torch.randn(1, 6, generator=g)
    exact = kl_categorical(logits, ref).item()
    actions = sample_groups(logits, 200_000, generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, actions)
    logq = torch.log_softmax(ref, -1).gather(-1, actions)
    est = kl_k3(logp, logq)
    assert torch.all(est >= 0)
    assert est.mean().item() == pytest.approx(exact, rel=0.03)


def test_kl_categorical_matches_definition():
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.2, 0.3, 0.5])
    expected = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist()))
    assert kl_categorical(p.log()[None], q.log()[None]).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("kl", ["k3", "exact"])
def test_grpo_steps_move_probability_to_rewarded_actions(kl):
    torch.manual_seed(0)
    n_actions, good = 5, 3
    ref = torch.zeros(2, n_actions)
    logits = torch.zeros(2, n_actions, requires_grad=True)
    opt = torch.optim.SGD([logits], lr=0.5)
    cfg = GRPOConfig(group_size=16, beta=0.01, kl=kl)
    g = torch.Generator().manual_seed(1)
    for _ in range(30):
        actions = sample_groups(logits, cfg.group_size, generator=g)
        with torch.no_grad():
            logp_old = torch.log_softmax(logits, -1).gather(-1, actions)
        rewards = (actions == good).float()
        loss, info = grpo_loss(logits, actions, logp_old, ref, rewards, cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
    probs = torch.softmax(logits.detach(), -1)
    assert torch.all(probs[:, good] > 0.6)
    assert info["kl"] > 0


def test_beta_pulls_towards_reference():
    ref = torch.zeros(1, 4)
    logits = torch.tensor([[3.0, 0.0, 0.0, 0.0]], requires_grad=True)
    actions = torch.tensor([[1, 2, 3, 1]])
    rewards = torch.ones(1, 4)  # no advantage signal: only the KL term acts
    logp_old = torch.log_softmax(logits.detach(), -1).gather(-1, actions)
    loss, _ = grpo_loss(logits, actions, logp_old, ref, rewards, GRPOConfig(beta=1.0, kl="exact"))
    loss.backward()
    assert logits.grad[0, 0] > 0  # gradient descent lowers the over-weighted action


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="same"):
        grpo_loss(
            torch.zeros(1, 3),
            torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, 3),
            torch.zeros(1, 3),
            torch.zeros(1, 2),
        )
