"""One builder for the FedVLR layer: the Python API and the command line build the same model from the same
options, and the layer's forward and penalty do not depend on the order they are called in."""

import numpy as np
import pytest
import torch

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.cli import build_parser
from fedvlr_plus.cli.fusion import fusion_backbone, options_from_args
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import FUSED, FedVLROptions, build_fedvlr


def data_with_cold_items():
    data = synthetic_data(30, 120, 8.0, groups=4, seed=2)
    g = np.random.default_rng(0)
    data.features = {
        "text": g.standard_normal((data.n_items, 6)).astype(np.float32),
        "image": g.standard_normal((data.n_items, 5)).astype(np.float32),
    }
    return data


def cli_args(*extra):
    return build_parser().parse_args(
        ["run", "x", "--backbone", "fedavg", "--fusion", "fedvlr", "--dim", "8", "--no-progress", *extra]
    )


def test_the_command_lines_defaults_are_the_options_defaults():
    assert options_from_args(cli_args()) == FedVLROptions(progress=False)
    opts = options_from_args(
        cli_args(
            "--fusion-residual",
            "--router-balance",
            "0.2",
            "--cold-neighbours",
            "3",
            "--drop-modality",
            "image",
            "--fusion-views",
            "text,image",
        )
    )
    assert (opts.residual, opts.balance, opts.cold_neighbours) == (True, 0.2, 3)
    assert opts.drop_modality == ("image",) and opts.fusion_views == ("text", "image")


@pytest.mark.parametrize("extra", [(), ("--fusion-residual", "--cold-neighbours", "3", "--drop-modality", "image")])
def test_api_with_default_options_builds_what_run_fusion_builds(extra):
    data = data_with_cold_items()
    assert data.cold_items().any()  # the cold-item rule is part of what must agree
    cli = fusion_backbone(cli_args(*extra), data, "fedavg", 8)
    opts = FedVLROptions(
        residual="--fusion-residual" in extra,
        cold_neighbours=3 if extra else 10,
        drop_modality=("image",) if extra else (),
    )
    api = build_fedvlr(data, make_backbone("fedavg", data.n_items, 8), opts)
    assert api.describe() == cli.describe()
    assert api.describe()["cold_items_with_neighbours"] == int(data.cold_items().sum())
    sa, sc = api.init_server(0), cli.init_server(0)
    assert sa.keys() == sc.keys() and all(torch.equal(sa[k], sc[k]) for k in sa)
    assert torch.equal(api.fused_views(sa), cli.fused_views(sc))


def test_penalty_and_forward_do_not_depend_on_call_order():
    data = data_with_cold_items()
    bb = build_fedvlr(data, make_backbone("fedavg", data.n_items, 8), FedVLROptions(balance=0.5, router_hidden=4))
    g = torch.Generator().manual_seed(3)
    p = {FUSED: bb.fused_views(bb.init_server(0))}
    p.update({s.name: torch.randn(s.shape, generator=g) for s in bb.private_specs()})
    items = torch.tensor([1, 4, 9])

    def ctx(hist):
        return {
            "items_global": items,
            "hist_global": torch.tensor(hist),
            "hist_mask": torch.ones(len(hist), dtype=torch.bool),
            **bb.round_context(p),
        }

    cfg = {"round": 1}
    alone = bb.regulariser(p, items, torch.ones(3), cfg, ctx=ctx([0, 2, 5]))  # no forward first
    assert float(alone) > 0  # the balance term is on
    c = ctx([0, 2, 5])
    bb.item_repr(p, items, ctx([7]))  # another user's forward
    bb.item_repr(p, items, c)
    assert float(bb.regulariser(p, items, torch.ones(3), cfg, ctx=c)) == pytest.approx(float(alone), rel=1e-6)
    # another user's forward in between changes nothing for the first user's penalty
    other = bb.regulariser(p, items, torch.ones(3), cfg, ctx=ctx([7]))
    assert float(other) != pytest.approx(float(alone))
