"""The FedVLR layer: server-side fusion, private router, exact Algorithm-1 aggregation, privacy of uploads."""

import numpy as np
import pytest
import torch

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.cli import build_parser
from fedvlr_plus.federation.config import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.simulation.batched import history_ctx
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import FUSED, ColdItemRule, FusionLayer, content_neighbours, mix


def toy(seed=0, n_users=40, n_items=150):
    data = synthetic_data(n_users, n_items, 12.0, groups=4, seed=seed)
    g = np.random.default_rng(seed)
    # content views that carry the item groups (as real content carries genres), plus noise
    grp = np.arange(data.n_items) % 4
    onehot = np.eye(4)[grp]
    views = {
        "text": np.hstack([onehot, 0.3 * g.standard_normal((data.n_items, 12))]),
        "image": np.hstack([0.3 * g.standard_normal((data.n_items, 8)), onehot]),
    }
    return data, views


def layer(data, views, backbone="fedavg", mode="fedvlr", **kw):
    return FusionLayer(make_backbone(backbone, data.n_items, 8), views, mode=mode, router_hidden=8, **kw)


def cfg(**kw):
    base = dict(rounds=2, local_epochs=2, batch_size=16, dim=8, lr=0.1, server_lr=0.5, patience=5, seed=0)
    base.update(kw)
    return FedConfig(**base)


def test_specs_split_server_client_and_private():
    data, views = toy()
    bb = layer(data, views)
    shared = set(bb.shared_names)
    assert FUSED in shared and "item_emb" not in shared  # the ID table lives on the server, behind F
    assert {"router.w1", "router.b1", "router.w2", "router.b2", "head_w", "head_b"} <= set(bb.private_names)
    server = {s.name for s in bb.server_specs()}
    assert "item_emb" in server and "gate.out.w" in server and "mlp.l1.w" in server
    assert not any(n.startswith("router") for n in server | shared)


def test_mix_matches_explicit_sum_in_every_shape_setting():
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(5, 3, generator=g), -1)
    e = torch.randn(7, 3, 4, generator=g)
    out = mix(w, e)  # scoring: [B, J] with shared [N, J, d]
    ref = torch.einsum("bj,njd->bnd", w, e)
    assert torch.allclose(out, ref, atol=1e-6)
    e2 = torch.randn(5, 7, 3, 4, generator=g)  # batched training: aligned client dim
    assert torch.allclose(mix(w, e2), torch.einsum("cj,cljd->cld", w, e2), atol=1e-6)
    assert torch.allclose(mix(w[0], e), torch.einsum("j,ljd->ld", w[0], e), atol=1e-6)


def test_gate_expert_multiplies_its_inputs():
    data, views = toy()
    bb = layer(data, views, mode="gate")
    sp = bb.init_server(0)
    base = bb.server_forward(sp)
    for k in bb.keys:  # gates shut: σ(-1e4) = 0, every gated input is zero
        sp[f"gate.{k}.b"] = torch.full_like(sp[f"gate.{k}.b"], -1e4)
    shut = bb.server_forward(sp)
    assert not torch.allclose(base, shut)
    assert torch.allclose(shut, shut[0].expand_as(shut), atol=1e-5)  # output = LN(bias): the same for every item


def test_residual_adds_the_raw_id_row_to_every_expert_and_keeps_it_through_the_mix():
    data, views = toy()
    plain, res = layer(data, views), layer(data, views, residual=True)
    sp = plain.init_server(0)
    with torch.no_grad():
        f0, f1 = plain.server_forward(sp), res.server_forward(sp)
        d = plain.d
        for j in range(len(plain.experts)):
            assert torch.allclose(f1[:, j * d : (j + 1) * d] - f0[:, j * d : (j + 1) * d], sp["item_emb"], atol=1e-6)
        # any router weights (summing to one) leave exactly D_i + sum_j w_j F_ij
        w = torch.tensor([[0.7, 0.2, 0.1]])
        mixed = mix(w, f1.view(data.n_items, 3, d))[0]
        assert torch.allclose(mixed - mix(w, f0.view(data.n_items, 3, d))[0], sp["item_emb"], atol=1e-6)
    with pytest.raises(ValueError, match="residual"):
        layer(data, views, residual=True, use_id=False)


def test_cold_items_take_the_mean_id_row_of_their_content_neighbours():
    data, views = toy()
    cold = np.zeros(data.n_items, bool)
    cold[[3, 10]] = True
    nb = content_neighbours(views, cold, k=3)
    assert nb.shape == (2, 3) and not np.isin(nb, [3, 10]).any()
    bb = layer(data, views, mode="sum", cold_items=ColdItemRule(cold, neighbours=3))
    assert torch.equal(bb.cold_items.neighbours, torch.as_tensor(nb))
    sp = bb.init_server(0)
    with torch.no_grad():
        f = bb.server_forward(sp)
        moved = dict(sp, item_emb=sp["item_emb"].clone())
        moved["item_emb"][3] += 100.0  # a cold item's own (untrained) ID row has no influence
        assert torch.allclose(f, bb.server_forward(moved))
        moved["item_emb"][nb[0, 0]] += 1.0  # its neighbours' rows do
        assert not torch.allclose(f[3], bb.server_forward(moved)[3])


def test_without_content_views_cold_items_take_the_mean_warm_id_row():
    data, views = toy()
    cold = np.zeros(data.n_items, bool)
    cold[[3, 10]] = True
    with pytest.raises(ValueError, match="content view"):
        content_neighbours({}, cold)
    bb = FusionLayer(make_backbone("fedavg", data.n_items, 8), {}, mode="sum", cold_items=ColdItemRule(cold))
    assert bb.describe()["cold_items_with_warm_mean"] == 2
    sp = bb.init_server(0)
    with torch.no_grad():
        f = bb.server_forward(sp)
        moved = dict(sp, item_emb=sp["item_emb"].clone())
        moved["item_emb"][3] += 100.0  # the cold item's own row has no influence
        assert torch.allclose(f, bb.server_forward(moved))
        ref = dict(sp, item_emb=sp["item_emb"].clone())
        ref["item_emb"][3] = sp["item_emb"][~torch.as_tensor(cold)].mean(0)
        assert torch.allclose(f[3], bb.server_forward(ref)[3], atol=1e-6)


def test_cold_rule_picks_neighbours_or_the_warm_mean_or_nothing():
    _, views = toy()
    cold = np.zeros(150, bool)
    cold[[4, 9]] = True
    fill = ColdItemRule(cold, 5).fit(views, 150)
    nbrs = fill.neighbours.numpy()
    assert fill.cold_idx.tolist() == [4, 9] and nbrs.shape == (2, 5) and not np.isin(nbrs, [4, 9]).any()
    fill = ColdItemRule(cold, 5).fit({}, 150)
    assert fill.cold_idx.tolist() == [4, 9] and fill.neighbours is None and 4 not in fill.warm_idx.tolist()
    assert ColdItemRule(cold, 0).fit(views, 150) is None
    assert ColdItemRule(np.zeros(150, bool), 5).fit(views, 150) is None


def test_server_step_is_the_weighted_sum_of_client_gradients():
    """Algorithm 1: the server's update equals -lr * sum_u (n_u / sum n) * grad_theta J_u (VJP exactness)."""
    data, views = toy()
    bb = layer(data, views)
    run = FederatedRun(data, bb, cfg(rounds=1), progress=False)
    before = {k: v.clone() for k, v in run.strategy.server.items()}
    ups = []
    run.on_upload = lambda r, u: ups.append(u)
    run.run_round()
    n = torch.tensor([float(u.num_examples) for u in ups], dtype=torch.float64)
    alpha = (n / n.sum()).tolist()
    params = {k: v.clone().requires_grad_(True) for k, v in before.items()}
    f = bb.server_forward(params)
    total = {k: torch.zeros_like(v) for k, v in before.items()}
    for a, u in zip(alpha, ups):
        g_f = torch.zeros_like(f)
        g_f[u.rows[FUSED].long()] = u.arrays[FUSED].to(f.dtype)
        grads = torch.autograd.grad(f, list(params.values()), g_f, retain_graph=True, allow_unused=True)
        for (k, _), g in zip(params.items(), grads):
            if g is not None:
                total[k] += a * g
    lr = run.strategy.opt.server_lr
    for k, v in run.strategy.server.items():
        scale = (
            run.strategy.opt.item_lr_scale
            if bb.server_specs()[[s.name for s in bb.server_specs()].index(k)].item_table
            else 1.0
        )
        assert torch.allclose(v, before[k] - lr * scale * total[k], atol=1e-5), k
    # the optimizer that owns the server state stepped
    assert any(not torch.allclose(run.strategy.server[k], before[k]) for k in before)


def test_uploads_carry_only_shared_arrays_never_router_or_head():
    data, views = toy()
    bb = layer(data, views)
    seen = []
    run = FederatedRun(data, bb, cfg(rounds=2), progress=False, on_upload=lambda r, u: seen.append(u))
    for _ in range(2):
        run.run_round()
    assert len(seen) == 2 * run.per_round
    allowed = set(bb.shared_names)
    for u in seen:
        assert set(u.arrays) <= allowed and FUSED in u.arrays
        assert not any(k.startswith("router") or k.startswith("head") for k in u.arrays)
        assert set(u.arrays[FUSED].shape[1:]) == {3 * bb.d}


@pytest.mark.parametrize("backbone", ["fedavg", "fedncf", "pfedrec", "fedrap"])
def test_batched_equals_sequential_with_fusion(backbone):
    data, views = toy()
    out = {}
    for sim in ("batched", "sequential"):
        bb = layer(data, views, backbone=backbone)
        run = FederatedRun(data, bb, cfg(rounds=2, simulator=sim), progress=False)
        run.run_round()
        run.run_round()
        out[sim] = (run.shared[FUSED].clone(), run.evaluate("valid").summary())
    assert torch.allclose(out["batched"][0], out["sequential"][0], atol=1e-4)
    for k, v in out["batched"][1].items():
        assert abs(v - out["sequential"][1][k]) < 1e-4, k


def test_router_is_personal_and_restored():
    data, views = toy()
    bb = layer(data, views)
    run = FederatedRun(data, bb, cfg(rounds=3), progress=False)
    for _ in range(3):
        run.run_round()
    users = np.arange(6)
    states = [run.store.load(int(u)) for u in users]
    p = {k: torch.stack([s[k] for s in states]) for k in ("router.w1", "router.b1", "router.w2", "router.b2")}
    ctx = {**history_ctx(run.indptr, run.indices, users), **bb.round_context(run.shared)}
    w = bb.weights(p, ctx)
    assert w.shape == (6, 3) and torch.allclose(w.sum(-1), torch.ones(6))
    assert (w.max(0).values - w.min(0).values).max() > 1e-3  # different users, different weights
    again = run.store.load(0)
    assert all(torch.equal(again[k], states[0][k]) for k in states[0])
    s1 = run.sim.scores(users, run.shared)
    assert not torch.allclose(s1[0], s1[1])


def test_single_expert_modes_have_no_router():
    data, views = toy()
    for mode in ("sum", "mlp", "gate"):
        bb = layer(data, views, mode=mode)
        assert not any(n.startswith("router") for n in bb.private_names)
        run = FederatedRun(data, bb, cfg(rounds=1), progress=False)
        run.run_round()
        assert np.isfinite(run.evaluate("valid").summary()["hr@10"])


def test_fusion_refuses_param_averaging():
    data, views = toy()
    with pytest.raises(ValueError, match="fedgrad"):
        FederatedRun(data, layer(data, views), cfg(strategy="fedavg"), progress=False)


@pytest.mark.parametrize("backbone", ["pfedrec", "fedrap"])
def test_personal_item_parts_stay_on_the_client(backbone):
    """PFedRec's personal item embedding (a private offset) and FedRAP's A_u are added to the fused vector, are
    trained and restored, and never appear in an upload or on the server."""
    data, views = toy()
    bb = layer(data, views, backbone=backbone, personal_offset=True)
    part = {"pfedrec": "personal.offset", "fedrap": "item_personal"}[backbone]
    assert part in bb.private_names and part not in bb.shared_names
    assert part not in {s.name for s in bb.server_specs()}
    assert bb.describe()["client_item_parts"] == [part]
    seen = []
    run = FederatedRun(data, bb, cfg(rounds=2), progress=False, on_upload=lambda r, u: seen.append(u))
    run.run_round()
    run.run_round()
    assert seen and all(set(u.arrays) <= set(bb.shared_names) for u in seen)
    state = run.store.load(0)
    assert state[part].abs().sum() > 0  # trained locally, kept
    # the client scores D-free fused vector + its own part: changing the part changes only this user's scores
    users = np.arange(2)
    s0 = run.sim.scores(users, run.shared)
    bumped = dict(state)
    bumped[part] = state[part] + 1.0
    run.store.save(0, bumped)
    s1 = run.sim.scores(users, run.shared)
    assert not torch.allclose(s0[0], s1[0]) and torch.allclose(s0[1], s1[1])
    assert np.isfinite(run.evaluate("valid").summary()["hr@10"])


@pytest.mark.parametrize("sim", ["batched", "sequential"])
def test_pfedrec_offset_is_a_fresh_fine_tune_every_round(sim):
    """PFedRec's rule: the personal part restarts at zero each round (what an earlier round trained is gone) and
    what this round trained is kept for scoring."""
    data, views = toy()
    bb = layer(data, views, backbone="pfedrec", personal_offset=True)
    run = FederatedRun(data, bb, cfg(rounds=2, simulator=sim), progress=False)
    run.run_round()
    state = run.store.load(0)
    run.store.save(0, {**state, "personal.offset": torch.full_like(state["personal.offset"], 50.0)})
    run.run_round()
    off = run.store.load(0)["personal.offset"]
    assert off.abs().max() < 5.0 and off.abs().sum() > 0  # restarted from zero, then trained
    assert (off.abs().sum(1) == 0).any()  # rows this round never touched stay zero


def test_pfedrec_without_personal_offset_keeps_only_score_function_and_router_private():
    data, views = toy()
    bb = layer(data, views, backbone="pfedrec")  # the default
    assert "personal.offset" not in bb.private_names + bb.shared_names
    assert bb.describe()["client_item_parts"] == [] and bb.describe()["personal_offset"] is False
    assert {"head_w", "head_b"} <= set(bb.private_names) and any(n.startswith("router") for n in bb.private_names)
    run = FederatedRun(data, bb, cfg(rounds=2), progress=False)
    run.run()
    assert "personal.offset" not in run.store.load(0)
    parse = build_parser().parse_args
    assert parse(["run", "x", "--backbone", "pfedrec", "--fusion", "fedvlr"]).personal_offset is False
    assert parse(["run", "x", "--backbone", "pfedrec", "--fusion", "fedvlr", "--personal-offset"]).personal_offset


def test_pfedrec_layer_without_offset_is_the_fedavg_layer():
    """PFedRec differs from FedAvg only by its personal item copy (both have a private affine head), so without the
    offset the wrapped PFedRec trains exactly as the wrapped FedAvg (the README says so beside its rows)."""
    data, views = toy()
    runs = [
        FederatedRun(data, layer(data, views, backbone=b), cfg(rounds=2), progress=False) for b in ("fedavg", "pfedrec")
    ]
    res = [r.run() for r in runs]
    assert [h["loss"] for h in res[0]["history"]] == pytest.approx([h["loss"] for h in res[1]["history"]], abs=1e-6)
    assert torch.allclose(
        runs[0].sim.scores(np.arange(4), runs[0].shared), runs[1].sim.scores(np.arange(4), runs[1].shared), atol=1e-5
    )
    with_offset = FederatedRun(
        data, layer(data, views, backbone="pfedrec", personal_offset=True), cfg(rounds=2), progress=False
    ).run()
    assert with_offset["history"][-1]["loss"] != pytest.approx(res[0]["history"][-1]["loss"], abs=1e-6)


def test_fedrap_penalty_reads_the_fused_vector_as_its_shared_part():
    data, views = toy()
    bb = layer(data, views, backbone="fedrap")
    rap = bb.base
    g = torch.Generator().manual_seed(1)
    p = {
        FUSED: torch.randn(data.n_items, 3 * bb.d, generator=g),
        "item_personal": torch.randn(data.n_items, 8, generator=g),
    }
    p.update({k: torch.zeros(s.shape) for k, s in ((s.name, s) for s in bb.private_specs()) if k.startswith("router")})
    p["head_w"], p["head_b"] = torch.ones(8), torch.zeros(())
    items = torch.tensor([3, 5, 7])

    def ctx():
        return {
            "items_global": items,
            "hist_global": torch.tensor([1, 2]),
            "hist_mask": torch.ones(2, dtype=torch.bool),
            **bb.round_context(p),
        }

    # the penalty reads what the forward of the same ctx recorded, and is the same without a forward first
    c = ctx()
    v = bb.item_repr(p, items, c)
    shared = mix(torch.full((3,), 1 / 3), p[FUSED][items].view(3, 3, bb.d))  # zero router -> uniform weights
    assert torch.allclose(v, shared + p["item_personal"][items], atol=1e-6)
    reg = bb.regulariser(p, items, torch.ones(3), {"round": 5}, ctx=c)
    assert float(bb.regulariser(p, items, torch.ones(3), {"round": 5}, ctx=ctx())) == pytest.approx(float(reg))
    lam, mu = rap.curriculum(5)
    a = p["item_personal"][items]
    want = (-lam * ((a - shared) ** 2).mean(-1).sum() + mu * shared.abs().mean(-1).sum()) / 3
    assert float(reg) == pytest.approx(float(want), rel=1e-5)


def test_an_undeclared_private_item_table_is_refused_clearly():
    from fedvlr_plus.adapters.base import Backbone, ParamSpec, take_rows

    class Odd(Backbone):
        name = "odd"

        def specs(self):
            return [
                ParamSpec("item_emb", (self.n_items, self.dim), shared=True, item_table=True),
                ParamSpec("mine", (self.n_items, self.dim), shared=False, item_table=True),
                ParamSpec("head_w", (self.dim,), shared=False),
            ]

        def item_repr(self, p, items, ctx):
            return take_rows(p["item_emb"], items) * take_rows(p["mine"], items)

    data, views = toy()
    with pytest.raises(ValueError, match="mine"):
        FusionLayer(Odd(data.n_items, 8), views)


def test_router_report_works_whichever_simulator_ran():
    """The report reads the users' histories from the run, not from a simulator method (the sequential reference
    used to lack it)."""
    from fedvlr_plus.fedvlr import router_report

    data, views = toy()
    reports = {}
    for sim in ("batched", "sequential"):
        run = FederatedRun(data, layer(data, views), cfg(rounds=1, simulator=sim), progress=False)
        run.run_round()
        reports[sim] = router_report(run)
    assert reports["batched"]["n_users"] == reports["sequential"]["n_users"] == len(run.eligible)
    assert reports["batched"]["mean_entropy"] == pytest.approx(reports["sequential"]["mean_entropy"], abs=1e-4)


def test_per_round_is_refused_where_it_has_no_meaning():
    from fedvlr_plus.adapters.base import ParamSpec

    assert ParamSpec("ok", (3,), shared=False, init="zeros", per_round=True).per_round
    with pytest.raises(ValueError, match="per_round"):
        ParamSpec("noisy", (3,), shared=False, init="normal", per_round=True)
    with pytest.raises(ValueError, match="per_round"):
        ParamSpec("global", (3,), shared=True, init="zeros", per_round=True)
