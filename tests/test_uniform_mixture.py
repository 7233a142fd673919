"""``mode="uniform"``: the three experts with fixed equal weights and no router, the router's ablation."""

import numpy as np
import torch

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import FUSED, FedVLROptions, build_fedvlr


def _data():
    data = synthetic_data(30, 50, 8.0, groups=4, seed=2)
    data.features = {"text": np.random.default_rng(0).standard_normal((data.n_items, 5)).astype(np.float32)}
    return data


def test_uniform_is_the_routed_layer_at_equal_weights_without_a_router():
    data = _data()
    uni = build_fedvlr(data, make_backbone("fedavg", data.n_items, 8), FedVLROptions(mode="uniform", progress=False))
    routed = build_fedvlr(data, make_backbone("fedavg", data.n_items, 8), FedVLROptions(progress=False))
    assert not any(s.name.startswith("router.") for s in uni.specs()) and not uni.uses_history
    sp = routed.init_server(0)
    assert sp.keys() == uni.init_server(0).keys()
    g = torch.Generator().manual_seed(1)
    p = {FUSED: routed.fused_views(sp)}
    p.update({s.name: torch.randn(s.shape, generator=g) for s in routed.private_specs()})
    hist = torch.tensor([1, 2])
    ctx = {
        "items_global": torch.arange(data.n_items),
        "hist_global": hist,
        "hist_mask": torch.ones(2, dtype=torch.bool),
        **routed.round_context(p),
    }
    # a routed user whose router outputs zero logits has weights 1/3: exactly the uniform mixture
    p_zero = {**p, "router.w2": torch.zeros_like(p["router.w2"]), "router.b2": torch.zeros_like(p["router.b2"])}
    expected = routed.logits(p_zero, None, dict(ctx))
    assert torch.allclose(uni.logits(p, None, {"items_global": torch.arange(data.n_items)}), expected, atol=1e-6)
    assert not torch.allclose(routed.logits(p, None, dict(ctx)), expected, atol=1e-4)
