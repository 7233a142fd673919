"""A RecBole model behind the FedVLR layer scores a batch of users together
(``federation/simulation/modules/fused_scoring.py``): the scores are those of scoring each user alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("recbole")

from test_recbole_adapter import small_cfg  # noqa: E402
from test_recbole_batched_fedvlr import FEDGRAD, _layer, workdir  # noqa: E402,F401  (workdir: a fixture)

from fedvlr_plus.federation.engine import FederatedRun  # noqa: E402
from fedvlr_plus.federation.simulation.modules import fused_scoring as module_fused_scoring  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

CASES = [
    ("BPR", {}),
    ("BPR", dict(residual=True)),
    ("NeuMF", {}),
    ("NeuMF", dict(residual=True, residual_gate=True)),
    ("BPR", dict(mode="uniform")),
    ("NeuMF", dict(mode="sum")),
]


@pytest.mark.parametrize(
    "model,options", CASES, ids=["BPR", "BPR-residual", "NeuMF", "NeuMF-residual-gate", "BPR-uniform", "NeuMF-sum"]
)
def test_users_scored_together_get_the_scores_they_get_alone(workdir, monkeypatch, model, options):
    monkeypatch.setattr(module_fused_scoring, "users_per_batch", lambda sim: 5)  # batches of 5, one of 4 at the end
    data, layer = _layer(workdir, model, **options)
    run = FederatedRun(data, layer, replace(small_cfg(rounds=2, **FEDGRAD), simulator="batched"), progress=False)
    run.run_round()
    gen = torch.Generator().manual_seed(5)  # routers far apart: each user's item tables clearly their own
    for c in run.eligible:
        state = run.store.load(int(c))
        run.store.save(int(c), {k: v + torch.randn(v.shape, generator=gen) for k, v in state.items()})
    users = run.eligible[::-1].copy()
    assert module_fused_scoring.together_refusal(run.sim) is None
    together = run.sim.scores(users, run.shared)
    run.sim.score_users_together = False
    alone = run.sim.scores(users, run.shared)
    assert together.shape == alone.shape == (len(users), data.n_items)
    assert float(alone.std(1).mean()) > 1e-6
    assert torch.allclose(together, alone, rtol=1e-5, atol=1e-6)


def test_a_model_without_the_layer_is_not_scored_this_way(workdir):
    data, layer = _layer(workdir, "BPR")
    run = FederatedRun(data, layer.base, replace(small_cfg(rounds=1), simulator="batched"), progress=False)
    assert module_fused_scoring.together_refusal(run.sim) == "no FedVLR layer"
