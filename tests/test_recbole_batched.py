"""RecBole clients batched over a round (``federation/simulation/modules/batched.py``) give the one-at-a-time module
client's
numbers: the aggregated shared state after a round, the private states, and the metrics of a 2-round run; models
that cannot be batched fall back to the reference, and say why."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("recbole")

from fedvlr_plus._compat import patch_recbole  # noqa: E402

patch_recbole()

from recbole.model.general_recommender import BPR  # noqa: E402
from test_recbole_adapter import small_cfg, tiny_data, workdir  # noqa: E402,F401  (workdir: a fixture)

from fedvlr_plus.adapters.recbole.backbone import federate  # noqa: E402
from fedvlr_plus.federation import run_federated  # noqa: E402
from fedvlr_plus.federation.engine import FederatedRun  # noqa: E402
from fedvlr_plus.federation.simulation.modules.batched import BatchedModuleSimulator  # noqa: E402
from fedvlr_plus.federation.simulation.modules.client import ModuleSimulator  # noqa: E402
from fedvlr_plus.fedvlr.recbole_layer import fedvlr  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

CASES = [
    ("BPR", dict(strategy="fedavg")),  # local steps on shared rows, several steps
    # dense towers, dropout, gradient uploads; server SGD: Adam's first step, g / (|g| + eps), turns rounding
    # differences of gradients near zero into steps of up to its lr (the uploads are compared below)
    ("NeuMF", dict(strategy="fedgrad", server_lr=0.1, server_optimizer="sgd")),
    ("NeuMF", dict(strategy="fedavg", weight_decay=0.01)),
]  # stacked towers, lazy row decay


def _round(data, bb, cfg, simulator):
    run = FederatedRun(data, bb, replace(cfg, simulator=simulator), progress=False)
    run.run_round()
    return run


@pytest.mark.parametrize("model,kw", CASES, ids=["BPR-fedavg", "NeuMF-fedgrad", "NeuMF-fedavg-wd"])
def test_batched_round_equals_the_one_at_a_time_round(workdir, model, kw):
    data = tiny_data()
    bb, _ = federate(model, data=data, workdir=workdir)
    cfg = small_cfg(rounds=2, **kw)
    seq, bat = _round(data, bb, cfg, "sequential"), _round(data, bb, cfg, "batched")
    assert isinstance(seq.sim, ModuleSimulator) and not isinstance(seq.sim, BatchedModuleSimulator)
    assert isinstance(bat.sim, BatchedModuleSimulator) and bat.sim.fallback is None and bat.sim.checked
    assert set(seq.shared) == set(bat.shared)
    moved = max(float((seq.shared[k] - seq.shared[k].new_tensor(0)).abs().max()) for k in seq.shared)
    assert moved > 0
    for k in seq.shared:
        assert torch.allclose(seq.shared[k], bat.shared[k], rtol=1e-5, atol=1e-6), k
    for c in seq.eligible:
        a, b = seq.store.load(int(c)), bat.store.load(int(c))
        assert set(a) == set(b) and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)
    assert abs(seq.history[0]["loss"] - bat.history[0]["loss"]) < 1e-6


def test_neumf_batched_clients_draw_their_own_dropout_masks(workdir):
    """NeuMF trains with dropout: the batched round matches only because every client draws its masks from its
    own generator as it does alone (with other masks the uploads differ by far more than rounding)."""
    data = tiny_data()
    bb, _ = federate("NeuMF", data=data, workdir=workdir)
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in bb.template.modules())
    cfg = small_cfg(rounds=1, strategy="fedgrad", server_lr=0.1)
    runs = {s: FederatedRun(data, bb, replace(cfg, simulator=s), progress=False) for s in ("sequential", "batched")}
    ups = {s: r.sim.fit(r.eligible, r.shared, r.round_config(1)) for s, r in runs.items()}
    worst = max(
        float((a.arrays[k] - b.arrays[k]).abs().max())
        for a, b in zip(ups["sequential"], ups["batched"])
        for k in a.arrays
    )
    assert worst < 1e-5
    other = small_cfg(rounds=1, strategy="fedgrad", server_lr=0.1, seed=1)  # other seeds, other masks
    run1 = FederatedRun(data, bb, replace(other, simulator="batched"), progress=False)
    up1 = run1.sim.fit(run1.eligible, runs["batched"].shared, runs["batched"].round_config(1))
    far = max(float((a.arrays[k] - b.arrays[k]).abs().max()) for a, b in zip(ups["batched"], up1) for k in a.arrays)
    assert far > 100 * max(worst, 1e-8)


@pytest.mark.parametrize("model", ["BPR", "NeuMF"])
def test_two_round_runs_report_the_same_metrics(workdir, model):
    data = tiny_data()
    bb, _ = federate(model, data=data, workdir=workdir)
    res = {
        s: run_federated(data, bb, small_cfg(rounds=2, simulator=s, strategy="fedgrad", server_lr=0.1), progress=False)
        for s in ("sequential", "batched")
    }
    assert res["batched"]["simulator"] == "module-batched" and res["sequential"]["simulator"] == "module"
    for part in ("valid", "test"):
        for k, v in res["sequential"][part].items():
            assert res["batched"][part][k] == pytest.approx(v, abs=1e-6), (part, k)
    for a, b in zip(res["sequential"]["history"], res["batched"]["history"]):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)


class ItemBPR(BPR):
    """BPR whose loss reads a tensor's value in Python (data-dependent control flow: vmap cannot run it)."""

    def calculate_loss(self, interaction):
        loss = super().calculate_loss(interaction)
        return loss * 2.0 if loss.item() > 1e6 else loss


class SumBPR(BPR):
    """BPR with a loss summed over the batch's rows times their count (couples the rows of a batch: one-row lanes
    give other numbers, which the first round's check catches)."""

    def calculate_loss(self, interaction):
        return super().calculate_loss(interaction) * len(interaction)


@pytest.mark.parametrize(
    "model,why",
    [("LightGCN", "own graph"), (ItemBPR, "vmap cannot run"), (SumBPR, "differ from the one-at-a-time")],
    ids=["graph", "item-call", "coupled-rows"],
)
def test_models_that_cannot_be_batched_fall_back_and_say_so(workdir, model, why):
    data = tiny_data()
    bb, _ = federate(model, data=data, workdir=workdir, config_dict={"embedding_size": 8})
    cfg = small_cfg(rounds=1, strategy="fedgrad", server_lr=0.1)
    seq = _round(data, bb, cfg, "sequential")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bat = _round(data, bb, cfg, "batched")
        bat.run_round()  # a later round does not try again
    assert why in bat.sim.fallback
    said = [w for w in caught if issubclass(w.category, RuntimeWarning) and "one at a time" in str(w.message)]
    assert len(said) <= 1 and (said or why == "own graph")  # said once (a graph model at construction)
    bat_one = FederatedRun(data, bb, replace(cfg, simulator="batched"), progress=False)
    bat_one.run_round()
    for k in seq.shared:  # the fallback is the reference itself
        assert torch.equal(seq.shared[k], bat_one.shared[k]), k


def test_the_first_round_checks_itself_then_streams_chunk_by_chunk(workdir):
    """The self-check trains its two clients apart, so the first round need not come as one list of every
    client's uploads: it comes chunk by chunk, each chunk's uploads those of the one-at-a-time client."""
    data = tiny_data()
    bb, _ = federate("NeuMF", data=data, workdir=workdir)
    cfg = small_cfg(rounds=1, strategy="fedgrad", server_lr=0.1)
    runs = {s: FederatedRun(data, bb, replace(cfg, simulator=s), progress=False) for s in ("sequential", "batched")}
    runs["batched"].sim.lanes_per_chunk = 16
    conf = runs["batched"].round_config(1)
    chunks = list(runs["batched"].sim.fit_chunks(runs["batched"].eligible, runs["batched"].shared, conf))
    assert runs["batched"].sim.checked and runs["batched"].sim.fallback is None
    assert len(chunks) > 1 and sorted(u.cid for c in chunks for u in c) == sorted(runs["batched"].eligible.tolist())
    ref = {u.cid: u for u in runs["sequential"].sim.fit(runs["sequential"].eligible, runs["sequential"].shared, conf)}
    worst = max(float((ref[u.cid].arrays[k] - u.arrays[k]).abs().max()) for c in chunks for u in c for k in u.arrays)
    assert worst < 1e-5


@pytest.mark.parametrize("fusion", [False, True], ids=["model", "layer"])
def test_fresh_clients_start_from_their_own_initial_state_drawn_as_one_block(workdir, fusion):
    """Clients without a stored state start from the model's own initial user rows (and the layer's keyed router
    draws), read for a whole chunk at once: each row is what that client starts from alone."""
    data = tiny_data()
    bb, _ = federate("NeuMF", data=data, workdir=workdir)
    if fusion:
        views = {"text": np.random.default_rng(1).normal(size=(data.n_items, 6)).astype(np.float32)}
        bb = fedvlr(bb, views, data)
    cfg = small_cfg(rounds=1, simulator="batched", strategy="fedgrad" if fusion else "fedavg")
    run = FederatedRun(data, bb, cfg, progress=False)
    cids = run.eligible[[0, 3, 5]]
    block = run.sim.private_block(cids)
    assert set(block) == {s.name for s in bb.private_specs()}
    module = run.sim.base.build_module(run.sim.seed)
    for name, prm in module.named_parameters():
        if run.sim.base.kinds[name] == "user":
            assert torch.equal(block[name], prm.detach()[run.sim.base.user_map[torch.as_tensor(cids)]])
    for j, c in enumerate(cids):
        alone = run.sim.client(int(c)).private_state()
        assert all(torch.equal(block[k][j], alone[k]) for k in block)
    drawn = [s for s in bb.private_specs() if s.init in ("normal", "xavier") and s.name not in run.sim.base.kinds]
    assert bool(drawn) == fusion  # the layer's router: keyed draws, one row per client
    assert all(not torch.equal(block[s.name][0], block[s.name][1]) for s in drawn)
