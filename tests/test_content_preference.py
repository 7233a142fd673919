"""The VBPR-style content preference (``content_preference``): a private θ_u against a server projection of the
content, added to the head's logit; θ_u starts at zero, so the layer starts where the paper's form does."""

import numpy as np
import pytest
import torch

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import FUSED, FedVLROptions, build_fedvlr
from fedvlr_plus.fedvlr.preference import THETA


def content_data():
    data = synthetic_data(40, 60, 8.0, groups=4, seed=5)
    g = np.random.default_rng(0)
    data.features = {
        "text": g.standard_normal((data.n_items, 6)).astype(np.float32),
        "audio": 10 * g.standard_normal((data.n_items, 3)).astype(np.float32),
    }
    return data


def layer(data, **options):
    return build_fedvlr(data, make_backbone("fedavg", data.n_items, 8), FedVLROptions(progress=False, **options))


def scoring(bb, theta=None):
    sp = bb.init_server(0)
    g = torch.Generator().manual_seed(1)
    p = {FUSED: bb.fused_views(sp)}
    p.update({s.name: torch.randn(s.shape, generator=g) for s in bb.private_specs() if s.name != THETA})
    if theta is not None:
        p[THETA] = theta
    hist = torch.tensor([0, 3, 7])
    ctx = {
        "items_global": torch.arange(bb.n_items),
        "hist_global": hist,
        "hist_mask": torch.ones(3, dtype=torch.bool),
        **bb.round_context(p),
    }
    return p, ctx


def test_at_zero_theta_the_scores_are_the_paper_forms():
    data = content_data()
    plain, pref = layer(data), layer(data, content_preference=True)
    p0, c0 = scoring(plain)
    p1, c1 = scoring(pref, theta=torch.zeros(8))
    assert p1[FUSED].shape[1] == p0[FUSED].shape[1] + 8
    assert torch.allclose(plain.logits(p0, None, c0), pref.logits(p1, None, c1), atol=1e-6)


def test_theta_adds_exactly_theta_dot_projected_content():
    data = content_data()
    bb = layer(data, content_preference=True)
    theta = torch.randn(8, generator=torch.Generator().manual_seed(2))
    p, ctx = scoring(bb, theta=torch.zeros(8))
    base = bb.logits(p, None, ctx)
    p[THETA] = theta
    content = p[FUSED][:, -8:]
    assert content.abs().sum() > 0
    assert torch.allclose(bb.logits(p, None, ctx) - base, content @ theta, atol=1e-5)


def test_the_projection_reads_unit_norm_views():
    """A view's scale does not change P (VGGish-like vectors are not normalised)."""
    data = content_data()
    bb = layer(data, content_preference=True)
    sp = bb.init_server(0)
    data.features["audio"] = data.features["audio"] * 100
    assert torch.allclose(
        bb.fused_views(sp)[:, -8:], layer(data, content_preference=True).fused_views(sp)[:, -8:], atol=1e-5
    )


def test_a_round_trains_theta_and_the_servers_projection():
    data = content_data()
    bb = layer(data, content_preference=True)
    run = FederatedRun(data, bb, FedConfig(local_epochs=1, seed=0), progress=False)
    before = {k: v.clone() for k, v in run.strategy.server.items() if k.startswith("preference.")}
    run.run_round()
    run.run_round()  # θ is zero in round 1, so the projection first moves in round 2
    thetas = [run.store.load(int(u))[THETA] for u in run.eligible[:5]]
    assert any(t.abs().sum() > 0 for t in thetas)
    assert any(not torch.equal(before[k], run.strategy.server[k]) for k in before)


def test_refused_without_content():
    data = content_data()
    with pytest.raises(ValueError, match="content view"):
        layer(data, content_preference=True, drop_modality=("text", "audio"))


def test_the_command_line_flag_reaches_the_layer():
    import argparse

    from fedvlr_plus.cli.fusion import options_from_args
    from fedvlr_plus.cli.fusion_args import add_fusion_arguments

    p = argparse.ArgumentParser()
    add_fusion_arguments(p)
    assert options_from_args(p.parse_args(["--fusion", "fedvlr", "--content-preference"])).content_preference
    assert not options_from_args(p.parse_args(["--fusion", "fedvlr"])).content_preference
