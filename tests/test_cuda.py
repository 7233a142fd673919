"""On a CUDA device the simulator computes what it computes on the CPU, to float rounding.

Skipped where no CUDA device is visible (the CPU-only CI); run it where one is, as ``fedvlr-plus bench suite
--device cuda`` times the same paths. The device changes which kernels sum the floats, so losses agree to a relative
1e-4 and ranking metrics to a few ties, not bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from fedvlr_plus.federation import FedConfig, FederatedRun
from fedvlr_plus.federation.synthetic import synthetic_data

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none is visible)")

SETTINGS = dict(rounds=3, local_epochs=2, batch_size=16, dim=16, ks=(10,), valid_metric="ndcg@10", eval_every=3)


def _fedvlr(data):
    from fedvlr_plus.bench.case import synthetic_views
    from fedvlr_plus.fedvlr import FedVLROptions, build_fedvlr

    return build_fedvlr(data, "fedavg", FedVLROptions(progress=False), synthetic_views(data.n_items))


def _recbole_bpr(data):
    from fedvlr_plus.adapters.recbole.backbone import federate

    return federate("BPR", data=data, seed=0)[0]


def _run(data, model, device: str, **extra) -> dict:
    cfg = FedConfig(**SETTINGS, seed=0, device=device, **extra)
    return FederatedRun(data, model, cfg, progress=False).run()


def _assert_close(cpu: dict, gpu: dict) -> None:
    loss_cpu = torch.tensor([h["loss"] for h in cpu["history"]], dtype=torch.float64)
    loss_gpu = torch.tensor([h["loss"] for h in gpu["history"]], dtype=torch.float64)
    assert torch.isfinite(loss_gpu).all()
    torch.testing.assert_close(loss_gpu, loss_cpu, rtol=1e-4, atol=1e-6)
    for name, value in cpu["test"].items():
        assert abs(gpu["test"][name] - value) <= 0.02, (name, value, gpu["test"][name])


@pytest.mark.parametrize(
    "make",
    [lambda d: "fedavg", lambda d: "fedncf", _fedvlr, _recbole_bpr],
    ids=["fedavg", "fedncf", "fedavg+fedvlr", "recbole:BPR"],
)
def test_a_cuda_run_matches_the_cpu_run(make):
    data = synthetic_data(120, 90, 12, seed=3)
    _assert_close(_run(data, make(data), "cpu"), _run(data, make(data), "cuda"))


def test_cuda_with_private_states_in_files_matches_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    data = synthetic_data(120, 90, 12, seed=4)
    memory = _run(data, _fedvlr(data), "cuda", private_store="memory")
    files = _run(data, _fedvlr(data), "cuda", private_store="file")
    _assert_close(memory, files)


def test_with_a_gpu_the_states_in_memory_are_page_locked_and_trained_in_place():
    data = synthetic_data(120, 90, 12, seed=5)
    cfg = FedConfig(**SETTINGS, seed=0, device="cuda", private_store="memory")
    run = FederatedRun(data, _fedvlr(data), cfg, progress=False)
    run.run_round()
    tables = dict(run.store._cols)
    assert tables and all(t.is_pinned() for t in tables.values())
    before = {k: v.clone() for k, v in tables.items()}
    run.run_round()  # round 2 trains the stored rows: they change where they are, in the same tables
    assert all(run.store._cols[k] is tables[k] for k in tables)
    assert any(not torch.equal(before[k], tables[k]) for k in tables)
