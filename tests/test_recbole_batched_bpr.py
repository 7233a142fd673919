"""RecBole's BPR in the batched module clients takes its gradients in closed form
(``federation/simulation/modules/bpr.py``):
the uploads, private states and losses of autograd's flat path, and only for BPR itself."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("recbole")

from fedvlr_plus._compat import patch_recbole  # noqa: E402

patch_recbole()

from test_recbole_adapter import small_cfg, tiny_data, workdir  # noqa: E402,F401  (workdir: a fixture)
from test_recbole_batched import ItemBPR, SumBPR  # noqa: E402

from fedvlr_plus.adapters.recbole.backbone import federate  # noqa: E402
from fedvlr_plus.federation.engine import FederatedRun  # noqa: E402
from fedvlr_plus.federation.simulation.modules import chunk as module_chunk  # noqa: E402
from fedvlr_plus.federation.simulation.modules.bpr import closed_form_bpr  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def _fit(data, bb, cfg, closed_form: bool, monkeypatch):
    calls = []
    real = module_chunk.bpr_gradients
    monkeypatch.setattr(module_chunk, "bpr_gradients", lambda *a, **k: calls.append(1) or real(*a, **k))
    if not closed_form:
        monkeypatch.setattr(module_chunk.ChunkTraining, "bpr", property(lambda self: None))
    run = FederatedRun(data, bb, replace(cfg, simulator="batched"), progress=False)
    run.sim.lanes_per_chunk = 40  # several chunks
    ups = run.sim.fit(run.eligible, run.shared, run.round_config(1))
    monkeypatch.undo()
    return ups, run, len(calls)


@pytest.mark.parametrize(
    "kw",
    [dict(strategy="fedgrad", server_lr=0.1), dict(strategy="fedavg"), dict(strategy="fedavg", weight_decay=0.05)],
    ids=["grads", "params", "params+wd"],
)
def test_bpr_closed_form_gives_autograds_numbers(workdir, kw, monkeypatch):
    data = tiny_data()
    bb, _ = federate("BPR", data=data, workdir=workdir)
    assert closed_form_bpr(bb) is not None
    cfg = small_cfg(rounds=1, **kw)
    fast, run_f, n_fast = _fit(data, bb, cfg, True, monkeypatch)
    slow, run_s, n_slow = _fit(data, bb, cfg, False, monkeypatch)
    assert n_fast > 1 and n_slow == 0
    assert run_f.sim.fallback is None and run_s.sim.fallback is None
    moved = 0.0
    for a, b in zip(fast, slow):
        assert a.cid == b.cid and set(a.arrays) == set(b.arrays)
        for k in a.arrays:
            assert torch.allclose(a.arrays[k], b.arrays[k], rtol=1e-5, atol=1e-7), (a.cid, k)
            start = 0.0 if a.kind == "grads" else run_f.shared[k][a.rows[k]]  # a gradient, or the new rows
            moved = max(moved, float((a.arrays[k] - start).abs().max()))
        assert a.metrics["loss"] == pytest.approx(b.metrics["loss"], abs=1e-7)
    assert moved > 1e-4  # the round changed something


@pytest.mark.parametrize("model", [ItemBPR, SumBPR], ids=["subclass-item-call", "subclass-summed-loss"])
def test_only_bpr_itself_takes_the_closed_form(workdir, model):
    data = tiny_data()
    bb, _ = federate(model, data=data, workdir=workdir, config_dict={"embedding_size": 8})
    assert closed_form_bpr(bb) is None
    neumf, _ = federate("NeuMF", data=data, workdir=workdir)
    assert closed_form_bpr(neumf) is None


@pytest.mark.parametrize(
    "kw", [dict(strategy="fedgrad", server_lr=0.1), dict(strategy="fedavg")], ids=["grads-as-rows", "params-as-blocks"]
)
def test_bpr_chunks_as_blocks_give_the_per_client_sums(workdir, kw):
    """A later round's chunks handed over as blocks: BPR's gradient rows of every step (a fixed item table), or
    the clients' stepped tables; the sums of the per-client uploads (bit for bit for the tables)."""
    import numpy as np

    from fedvlr_plus.federation.simulation.running_sum import RunningSums
    from fedvlr_plus.federation.simulation.summed_chunk import SummedChunk, check_summed

    data = tiny_data()
    bb, _ = federate("BPR", data=data, workdir=workdir)
    cfg = replace(small_cfg(rounds=2, **kw), simulator="batched")
    sums = {}
    for summed in (True, False):
        run = FederatedRun(data, bb, cfg, progress=False)
        run.sim.lanes_per_chunk = 40
        run.run_round()  # the self-checked first round
        shared, conf = run.shared, run.round_config(2)
        cids = np.asarray(run.eligible)
        n = torch.tensor(np.diff(run.indptr)[cids], dtype=torch.float64)
        w = dict(zip(cids.tolist(), (n / n.sum()).tolist()))
        acc = RunningSums(shared, list(bb.shared_names))
        for chunk in run.sim.fit_chunks(cids, shared, conf, summed=summed):
            assert isinstance(chunk, SummedChunk) == summed
            if summed:
                check_summed(shared, chunk, run.strategy.upload)
                acc.add_summed(chunk, torch.tensor([w[int(c)] for c in chunk.cids], dtype=torch.float64))
            else:
                acc.add(chunk, torch.tensor([w[u.cid] for u in chunk], dtype=torch.float64))
        sums[summed] = {k: acc.row_sums(k) for k in shared}
    for k, (num, den) in sums[True].items():
        want_num, want_den = sums[False][k]
        assert float(want_num.abs().max()) > 0 and torch.equal(den, want_den)
        if kw["strategy"] == "fedavg":
            assert torch.equal(num, want_num), k
        else:
            assert torch.allclose(num, want_num, rtol=1e-5, atol=1e-8), k
