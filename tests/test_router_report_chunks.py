"""The router report computes its users' weights in bounded chunks, with the numbers of one pass over all."""

import numpy as np
import pytest

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation.config import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import FusionLayer, report


def _run(**cfg):
    data = synthetic_data(40, 120, 10.0, groups=4, seed=3)
    g = np.random.default_rng(3)
    views = {"attributes": g.standard_normal((data.n_items, 10))}
    bb = FusionLayer(make_backbone("fedavg", data.n_items, 8), views, mode="fedvlr", router_hidden=8)
    run = FederatedRun(data, bb, FedConfig(rounds=1, local_epochs=1, seed=0, **cfg), progress=False)
    run.run_round()
    return run


def test_chunked_report_equals_one_pass(monkeypatch):
    run = _run()
    calls = []
    chunk = report._chunk_weights
    monkeypatch.setattr(report, "_chunk_weights", lambda *a: calls.append(len(a[1])) or chunk(*a))
    monkeypatch.setattr(report, "_USERS_PER_CHUNK", 10_000)
    whole = report.router_report(run)
    monkeypatch.setattr(report, "_USERS_PER_CHUNK", 7)
    chunked = report.router_report(run)
    assert calls[0] == len(run.eligible) and calls[1:] == [7] * (len(run.eligible) // 7) + [len(run.eligible) % 7]
    assert chunked["n_users"] == whole["n_users"] == len(run.eligible)
    for key in ("mean_weights", "std_across_users"):
        np.testing.assert_allclose(chunked[key], whole[key], rtol=0, atol=1e-7)
    for key in ("mean_entropy", "min_entropy"):
        assert chunked[key] == pytest.approx(whole[key], abs=1e-7)
    assert max(whole["std_across_users"]) > 1e-4  # routers differ between users, so chunks could disagree


def test_block_read_gives_each_users_own_router_and_fresh_ones_for_newcomers():
    import torch

    from fedvlr_plus.federation.state.initial import init_private_states, stored_or_initial

    run = _run(clients_per_round=0.5)  # half the users train in round 1; the others have no stored state
    names = [s.name for s in run.bb.private_specs() if s.name.startswith("router.")]
    stored = [u for u in run.eligible if run.store.load(int(u)) is not None]
    newcomers = [u for u in run.eligible if run.store.load(int(u)) is None]
    users = np.array(stored[:5] + newcomers[:3], dtype=np.int64)
    assert len(stored) >= 5 and len(newcomers) >= 1  # one round of a sampled population leaves both kinds
    got = stored_or_initial(run.bb, run.store, users, names, run.cfg.seed)
    fresh = dict(zip(newcomers[:3], init_private_states(run.bb, np.array(newcomers[:3]), run.cfg.seed)))
    for i, u in enumerate(users):
        want = run.store.load(int(u)) or fresh[u]
        for name in names:
            assert torch.equal(got[name][i], want[name]), (u, name)
