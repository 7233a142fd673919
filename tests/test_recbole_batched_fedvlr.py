"""RecBole clients under the FedVLR layer, batched over a round (``fedvlr/batched_modules.py``), give the
one-at-a-time module client's numbers: every upload (the rows of the fused views, the model's dense gradients),
every private state (user rows and the router), the losses and the aggregated state; what cannot be batched falls
back to the reference and says why."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("recbole")

from fedvlr_plus._compat import patch_recbole  # noqa: E402

patch_recbole()

from test_recbole_adapter import N_ITEMS, small_cfg, tiny_data, workdir  # noqa: E402,F401  (workdir: a fixture)
from test_recbole_batched import ItemBPR, SumBPR  # noqa: E402

from fedvlr_plus.adapters.recbole.backbone import federate  # noqa: E402
from fedvlr_plus.federation.engine import FederatedRun  # noqa: E402
from fedvlr_plus.federation.simulation.modules.batched import CHECK_ATOL, CHECK_RTOL, BatchedModuleSimulator  # noqa: E402
from fedvlr_plus.fedvlr.batched_modules import layer_refusal  # noqa: E402
from fedvlr_plus.fedvlr.layer import FUSED  # noqa: E402
from fedvlr_plus.fedvlr.recbole_layer import fedvlr  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

FEDGRAD = dict(strategy="fedgrad", server_lr=0.1, server_optimizer="sgd")
# (model, layer options, run options): the layer's router in front of a pairwise model with closed-form gradients
# (BPR) and a pointwise one with dense towers and dropout (NeuMF), with and without the residual ID path; the
# router balance term with local steps on the shared parts and row decay; fixed uniform weights; one expert
CASES = [
    ("BPR", {}, FEDGRAD),
    ("BPR", dict(residual=True), FEDGRAD),
    ("NeuMF", {}, FEDGRAD),
    ("NeuMF", dict(residual=True), FEDGRAD),
    ("NeuMF", dict(residual=True, residual_gate=True), FEDGRAD),
    ("NeuMF", dict(balance=0.1), dict(FEDGRAD, local_shared=True, weight_decay=0.01)),
    ("BPR", dict(mode="uniform"), FEDGRAD),
    ("NeuMF", dict(mode="sum"), FEDGRAD),
]
IDS = [
    "BPR",
    "BPR-residual",
    "NeuMF",
    "NeuMF-residual",
    "NeuMF-residual-gate",
    "NeuMF-balance-local-wd",
    "BPR-uniform",
    "NeuMF-sum",
]


def _layer(workdir, model: str, **options):
    data = tiny_data()
    bb, _ = federate(model, data=data, workdir=workdir, config_dict={"embedding_size": 8})
    views = {"text": np.random.default_rng(1).normal(size=(N_ITEMS, 6)).astype(np.float32)}
    return data, fedvlr(bb, views, data, **options)


def _runs(data, layer, cfg, on_upload=None):
    """Two rounds of the sequential and of the batched simulator (uploads into ``on_upload[simulator]``)."""
    runs = {}
    for sim in ("sequential", "batched"):
        hook = None if on_upload is None else (lambda r, u, sim=sim: on_upload[sim].append(u))
        runs[sim] = FederatedRun(data, layer, replace(cfg, simulator=sim), progress=False, on_upload=hook)
        for _ in range(2):
            runs[sim].run_round()
    return runs["sequential"], runs["batched"]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=CHECK_RTOL, atol=CHECK_ATOL)


@pytest.mark.parametrize("model,options,run", CASES, ids=IDS)
def test_batched_layer_clients_upload_and_keep_what_they_do_alone(workdir, model, options, run):
    data, layer = _layer(workdir, model, **options)
    ups = {"sequential": [], "batched": []}
    seq, bat = _runs(data, layer, small_cfg(rounds=2, **run), ups)
    assert isinstance(bat.sim, BatchedModuleSimulator) and bat.sim.fallback is None and bat.sim.checked
    assert len(ups["sequential"]) == len(ups["batched"]) == 2 * len(seq.eligible)
    n = len(seq.eligible)
    batched = {(i // n, u.cid): u for i, u in enumerate(ups["batched"])}  # (round, client): the batched upload
    for i, a in enumerate(ups["sequential"]):
        b = batched[(i // n, a.cid)]
        assert a.kind == b.kind and set(a.arrays) == set(b.arrays) and FUSED in a.arrays
        assert torch.equal(a.rows[FUSED], b.rows[FUSED])
        for k in a.arrays:
            assert _close(a.arrays[k], b.arrays[k]), (a.cid, k)
        assert a.metrics["loss"] == pytest.approx(b.metrics["loss"], rel=CHECK_RTOL, abs=CHECK_ATOL)
    routed = 0.0
    for c in seq.eligible:
        a, b = seq.store.load(int(c)), bat.store.load(int(c))
        assert set(a) == set(b) and all(_close(a[k], b[k]) for k in a), int(c)
        routed = max(routed, float(a["router.w2"].abs().max())) if "router.w2" in a else routed
    # the router has learned something (its output layer starts at zero), so its states can differ
    assert routed > 0 or options.get("mode") in ("uniform", "sum")
    for k in seq.shared:
        assert _close(seq.shared[k], bat.shared[k]), k


@pytest.mark.parametrize("model", ["BPR", "NeuMF"])
def test_streamed_rounds_of_batched_layer_clients_reach_the_same_state(workdir, model):
    """Without an upload hook the batched chunks reach the round's sums as blocks (from the second round on):
    the aggregated fused views, the server's fusion and the model's dense parameters as the reference's."""
    data, layer = _layer(workdir, model)
    seq, bat = _runs(data, layer, small_cfg(rounds=2, **FEDGRAD))
    assert bat.sim.fallback is None and bat.sim.checked
    start = FederatedRun(data, layer, small_cfg(rounds=2, **FEDGRAD), progress=False).shared[FUSED]
    assert not _close(seq.shared[FUSED], torch.as_tensor(start))  # the server has moved the fused views
    for k in seq.shared:
        assert _close(seq.shared[k], bat.shared[k]), k
    for a, b in zip(seq.history, bat.history):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)


@pytest.mark.parametrize(
    "model,why",
    [("LightGCN", "own graph"), (ItemBPR, "vmap cannot run"), (SumBPR, "differ from the one-at-a-time")],
    ids=["graph", "item-call", "coupled-rows"],
)
def test_layer_clients_that_cannot_be_batched_fall_back_and_say_so(workdir, model, why):
    """A graph model is refused by its structure; a forward ``vmap`` cannot run, and a loss that couples the rows
    of a batch (caught by the first round's check against the reference client), fall back in round 1."""
    data, layer = _layer(workdir, model)
    cfg = small_cfg(rounds=1, **FEDGRAD)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bat = FederatedRun(data, layer, replace(cfg, simulator="batched"), progress=False)
        bat.run_round()
    assert why in bat.sim.fallback
    said = [w for w in caught if issubclass(w.category, RuntimeWarning) and why in str(w.message)]
    assert len(said) <= 1
    seq = FederatedRun(data, layer, replace(cfg, simulator="sequential"), progress=False)
    seq.run_round()
    for k in seq.shared:  # the fallback is the reference itself
        assert torch.equal(seq.shared[k], bat.shared[k]), k


@pytest.mark.parametrize(
    "parts,why",
    [
        (dict(content_preference=True), "content preference"),
        (dict(offset=True), "personal item parts"),
        (dict(additive=("personal.table",)), "personal item parts"),
    ],
    ids=["content-preference", "offset", "additive"],
)
def test_layer_parts_that_are_not_batched_are_refused(parts, why):
    """Layer parts the batched chunk does not compute (none of them wraps a RecBole model today) are refused by
    structure, so such a layer would train one client at a time rather than get other numbers."""
    from types import SimpleNamespace

    layer = SimpleNamespace(**{**dict(content_preference=False, offset=False, additive=()), **parts})
    assert why in layer_refusal(layer)
    assert layer_refusal(SimpleNamespace(content_preference=False, offset=False, additive=())) is None
