"""Routing over the server's views (``router_over="views"``): the experts are views, the closed form and the batched
simulator cover the mode, the router recovers a planted modality preference where operator experts cannot, and no
router state is uploaded."""

import pytest
import torch

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.errors import UserError
from fedvlr_plus.federation.config import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.planted import planted_data, planted_source
from fedvlr_plus.fedvlr import FUSED, FedVLROptions, FusionLayer, build_fedvlr
from fedvlr_plus.fedvlr.experts import project
from fedvlr_plus.fedvlr.recovery import weight_recovery
from fedvlr_plus.fedvlr.report import user_weights


def _planted(preference="mixed", n_users=300, n_items=300):
    return planted_data(n_users, n_items, preference=preference, seed=0)


def _layer(data, over="views", mode="fedvlr", backbone="fedavg", dim=16):
    return FusionLayer(
        make_backbone(backbone, data.n_items, dim), data.features, mode=mode, router_over=over, router_hidden=16
    )


def _trained(data, bb, rounds, **kw):
    cfg = dict(rounds=rounds, dim=bb.base.dim, seed=0, patience=rounds, eval_every=rounds)
    run = FederatedRun(data, bb, FedConfig(**{**cfg, **kw}), progress=False)
    for _ in range(rounds):
        run.run_round()
    return run


def _recovery(run, data):
    w = user_weights(run, run.eligible).numpy()
    return weight_recovery(w, run.bb.experts, data.users["planted"].to_numpy()[run.eligible])


def test_the_experts_are_the_views_each_the_id_row_plus_one_view():
    data = _planted(n_users=40, n_items=60)
    bb = _layer(data)
    assert bb.experts == ["view:image", "view:text"]
    server = {s.name for s in bb.server_specs()}
    assert not any(n.startswith(("mlp.", "gate.")) for n in server)
    sp = bb.init_server(0)
    with torch.no_grad():
        f = bb.server_forward(sp).view(data.n_items, 2, bb.d)
        x_id = bb.base.shared_item_repr(sp, None, {"items_global": torch.arange(data.n_items)})
        z_id, z_image, z_text = project([x_id, bb.views["image"], bb.views["text"]], bb.keys, sp)
    assert torch.allclose(f[:, 0], (z_id + z_image) * bb.out_scale, atol=1e-5)
    assert torch.allclose(f[:, 1], (z_id + z_text) * bb.out_scale, atol=1e-5)
    assert bb.closed_form() is not None and bb.describe()["router_over"] == "views"


def test_uniform_over_views_is_the_mean_of_the_views():
    data = _planted(n_users=40, n_items=60)
    uni = _layer(data, mode="uniform")
    assert uni.experts == ["view:image", "view:text"] and not any(n.startswith("router") for n in uni.private_names)


def test_views_mode_needs_two_views_and_says_which_flag():
    data = _planted(n_users=40, n_items=60)
    with pytest.raises(ValueError, match="--fusion-views"):
        FusionLayer(make_backbone("fedavg", data.n_items, 8), {"image": data.features["image"]}, router_over="views")
    with pytest.raises(ValueError, match="router over"):
        FedVLROptions(router_over="modalities")
    one = build_fedvlr(data, "fedavg", FedVLROptions(mode="sum", router_over="views", progress=False))
    assert one.experts == ["sum"]  # a single-expert mode has nothing to route


def test_planted_source_is_parsed_and_bad_ones_are_one_line():
    data = planted_source("synthetic-planted:60x80:text")
    assert set(data.users["planted"]) == {"text"} and set(data.features) == {"image", "text"}
    for bad in ("synthetic-planted:60", "synthetic-planted:60x80:audio"):
        with pytest.raises(UserError, match="SOURCE"):
            planted_source(bad)


@pytest.mark.parametrize("backbone", ["fedavg", "fedncf"])
def test_batched_equals_sequential_for_view_routing(backbone):
    data = _planted(n_users=40, n_items=60)
    out = {}
    for sim in ("batched", "sequential"):
        # FedNCF: the batched path's autograd fallback (no closed form for its MLP head); FedAvg: the closed form
        run = _trained(data, _layer(data, backbone=backbone, dim=8), 2, simulator=sim, local_epochs=1, batch_size=32)
        w = user_weights(run, run.eligible)
        out[sim] = (run.shared[FUSED].clone(), run.evaluate("valid").summary(), w)
    assert torch.allclose(out["batched"][0], out["sequential"][0], atol=1e-4)
    assert torch.allclose(out["batched"][2], out["sequential"][2], atol=1e-4)
    for k, v in out["batched"][1].items():
        assert abs(v - out["sequential"][1][k]) < 1e-4, k


def test_view_router_recovers_the_planted_modality_and_operator_experts_do_not():
    data = _planted()
    views = _recovery(_trained(data, _layer(data), 8), data)
    operators = _recovery(_trained(data, _layer(data, over="operators"), 8), data)
    assert views["accuracy"] >= 0.85 and views["spearman"] >= 0.6, views
    # the operators' best labelling of their argmax: about the larger group's share (they route everyone alike)
    assert operators["accuracy"] < 0.7 and operators["spearman"] < 0.3, operators


def test_control_where_everyone_shares_one_modality_routes_everyone_to_it():
    data = _planted("image")
    rec = _recovery(_trained(data, _layer(data), 8), data)
    assert rec["accuracy"] >= 0.85 and rec["spearman"] is None, rec


def test_uploads_carry_no_router_state_when_routing_over_views():
    data = _planted(n_users=40, n_items=60)
    bb = _layer(data)
    seen = []
    run = FederatedRun(
        data, bb, FedConfig(rounds=2, dim=16, seed=0), progress=False, on_upload=lambda r, u: seen.append(u)
    )
    for _ in range(2):
        run.run_round()
    assert len(seen) == 2 * run.per_round
    for u in seen:
        assert set(u.arrays) <= set(bb.shared_names) and FUSED in u.arrays
        assert not any(k.startswith(("router", "head")) for k in u.arrays)
        assert u.arrays[FUSED].shape[1:] == (2 * bb.d,)


def test_auto_routes_over_views_where_there_are_two_and_over_operators_where_there_is_one():
    data = _planted(n_users=40, n_items=60)
    assert _layer(data, over="auto").experts == ["view:image", "view:text"]
    one = FusionLayer(make_backbone("fedavg", data.n_items, 8), {"image": data.features["image"]}, router_over="auto")
    assert one.experts == ["sum", "mlp", "gate"] and one.router_over == "operators"


PLANTED = ["experiment", "planted", "--users", "60", "--items", "80", "--seeds", "1", "--rounds", "1", "--dim", "8"]
PLANTED += ["--rows", "single,sum", "--control-only", "--no-progress", "--json"]


def _planted_cli(out, jobs: int, capsys, folder_flag: str = "--out") -> tuple[dict, str]:
    """The tiny planted control's JSON and stderr, its runs in ``jobs`` worker processes (one torch thread)."""
    import json

    import torch

    from fedvlr_plus.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*PLANTED, "--jobs", str(jobs), folder_flag, str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr()
    return json.loads(printed.out.strip().splitlines()[-1]), printed.err


def _without_timings(x):
    if isinstance(x, dict):
        return {k: _without_timings(v) for k, v in x.items() if k != "seconds_per_round"}
    return [_without_timings(v) for v in x] if isinstance(x, list) else x


def test_the_planted_experiment_runs_end_to_end_resumes_and_bad_flags_are_one_line(tmp_path, capsys, monkeypatch):
    from fedvlr_plus.cli import main

    out = tmp_path / "planted"
    result, err = _planted_cli(out, 2, capsys)
    # FedVLR (views), two single views and sum, one seed each: four runs side by side, the same figures
    assert "4 runs side by side in 2 worker processes" in err
    one_by_one, err = _planted_cli(tmp_path / "one", 1, capsys)
    assert "side by side" not in err and _without_timings(one_by_one) == _without_timings(result)
    control = result["control"]
    assert set(control["table"]["models"]) == {
        "FedVLR (views)",
        "view image",
        "view text",
        "sum",
        "content kNN",
        "oracle kNN",
        "oracle view",
    }
    assert control["recovery"]["FedVLR (views)"]["accuracy"] is not None and (out / "report.md").is_file()
    # the per-user look: every test user's weights and gain over sum, and its plot
    per_user = control["per_user"]
    assert len(per_user["users"]) == len(per_user["weights"]) == len(per_user["gain_over_sum"]) > 0
    assert set(per_user["group"]) == {"image"} and all(abs(sum(w) - 1) < 1e-3 for w in per_user["weights"])
    assert (out / "per-user-control.png").stat().st_size > 1000
    with pytest.raises(SystemExit):
        main(["experiment", "planted", "--rows", "single,everything"])
    assert "unknown row group everything" in capsys.readouterr().err
    _resumed_runs_read_back_their_routers(out, result, capsys, monkeypatch)


def _resumed_runs_read_back_their_routers(out, first: dict, capsys, monkeypatch):
    """Every run of the planted command in ``out`` checkpointed there, its routers' weights kept beside: the folder
    is refused when reused, and --resume reads the finished runs back, weights and all, to the same JSON."""
    from _bad_input import assert_user_error, run_cli

    from fedvlr_plus.federation.engine import FederatedRun

    rows = {p.name for p in (out / "runs" / "synthetic-planted-60x80-image").iterdir()}
    assert rows == {"FedVLR-views", "view-image", "view-text", "sum"}
    assert_user_error(run_cli(*PLANTED, "--out", str(out)), "already holds runs", f"--resume {out}")
    loaded = []
    load = FederatedRun.load_checkpoint
    monkeypatch.setattr(FederatedRun, "load_checkpoint", lambda run, *a: loaded.append(run.round) or load(run, *a))
    again, _ = _planted_cli(out, 1, capsys, "--resume")
    assert loaded == [0] * 4 and _without_timings(again) == _without_timings(first)
    assert again["control"]["per_user"]["weights"] == first["control"]["per_user"]["weights"]
