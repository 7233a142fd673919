"""ID dropout of the FedVLR layer: the server's backward reads a share of the warm items through a content estimate
of their ID row (DropoutNet-style), while clients train on and evaluations score the real fused views."""

import numpy as np
import pytest
import torch
from test_fusion import cfg, layer, toy

from fedvlr_plus.cli import build_parser
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.fedvlr import FUSED, ColdItemRule, FedVLROptions
from fedvlr_plus.fedvlr.cold import warm_neighbours


def _cold(n, every=5):
    cold = np.zeros(n, dtype=bool)
    cold[::every] = True
    return cold


def test_warm_neighbours_are_the_other_warm_items_closest_in_content():
    data, views = toy()
    cold = _cold(data.n_items)
    ids, nbrs = warm_neighbours(views, cold, k=4)
    assert (ids == np.flatnonzero(~cold)).all() and nbrs.shape == (len(ids), 4)
    assert not (nbrs == ids[:, None]).any(), "an item is never its own neighbour"
    assert not cold[nbrs].any(), "neighbours are warm items"
    # brute force on the same normalised, view-weighted rows
    x = np.hstack([v / np.linalg.norm(v, axis=1, keepdims=True) / np.sqrt(len(views)) for v in views.values()])
    sims = x[ids] @ x[ids].T
    np.fill_diagonal(sims, -np.inf)
    best = ids[np.argsort(-sims, axis=1)[:, :4]]
    assert (np.sort(best, 1) == np.sort(nbrs, 1)).mean() > 0.99


def _trained(p, rounds=2, seed=0):
    data, views = toy()
    cold = _cold(data.n_items)
    bb = layer(data, views, cold_items=ColdItemRule(cold, 3), id_dropout=p)
    run = FederatedRun(data, bb, cfg(rounds=rounds, seed=seed), progress=False)
    for _ in range(rounds):
        run.run_round()
    return bb, run


def test_dropout_changes_only_the_server_step_not_what_clients_see_first():
    bb0, off = _trained(0.0, rounds=1)
    bb1, on = _trained(0.5, rounds=1)
    # round 1's broadcast is the same, so every client trained on the same views and uploaded the same gradients;
    # the server's step differs because it took them back through the dropped items' content estimate
    first = bb0.fused_views(bb0.init_server(0))
    assert torch.equal(first, bb1.fused_views(bb1.init_server(0)))
    assert any(not torch.allclose(off.strategy.server[k], on.strategy.server[k]) for k in off.strategy.server)
    # what is broadcast and evaluated is always the real fusion of the current server state
    assert torch.allclose(on.shared[FUSED], bb1.fused_views(on.strategy.server))


def test_dropped_rows_are_drawn_by_seed_and_round_and_only_among_warm_items():
    data, views = toy()
    cold = _cold(data.n_items)
    bb = layer(data, views, cold_items=ColdItemRule(cold, 3), id_dropout=0.3)
    a, b, c = bb.dropout_rows(0, 1), bb.dropout_rows(0, 1), bb.dropout_rows(0, 2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 0.15 < len(a) / len(bb.dropout_pool) < 0.45
    assert not cold[bb.dropout_pool[a].numpy()].any()
    assert layer(data, views, cold_items=ColdItemRule(cold, 3)).dropout_rows(0, 1) is None


def test_a_dropped_item_reads_its_neighbours_mean_id_row():
    data, views = toy()
    bb = layer(data, views, mode="sum", id_dropout=0.5)
    sp = bb.init_server(0)
    rows = torch.tensor([0, 3])
    item = bb.dropout_pool[rows]
    d = bb.base.shared_item_repr(sp, None, {"items_global": torch.arange(bb.n_items)})
    swapped = dict(sp)
    swapped_d = d.clone()
    swapped_d[item] = d[bb.dropout_fill[rows]].mean(1)
    key = next(s.name for s in bb.id_specs)
    swapped[key] = swapped_d
    assert torch.allclose(bb.server_forward(sp, dropped=rows), bb.server_forward(swapped), atol=1e-6)


def test_server_steps_are_kept_across_a_resume():
    bb, run = _trained(0.3, rounds=2)
    state = run.strategy.state_dict()
    assert state["steps"] == 2
    fresh = bb.wrap_strategy(run.strategy.inner, 0)
    fresh.load_state_dict(state)
    assert fresh.steps == 2


def test_bad_id_dropout_is_refused_with_its_name():
    with pytest.raises(ValueError, match="ID dropout"):
        FedVLROptions(id_dropout=1.0)
    data, views = toy()
    with pytest.raises(ValueError, match="ID dropout"):
        layer(data, {}, id_dropout=0.2)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "ml-100k", "--fusion", "fedvlr", "--id-dropout", "1"])
