"""NeuMF's every-item scores with its first tower layer split into user and item halves
(``adapters/recbole/neumf.py``) are ``predict``'s on every pair, and the split is taken only where it applies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("recbole")

from fedvlr_plus._compat import patch_recbole  # noqa: E402

patch_recbole()

from recbole.model.general_recommender import NeuMF  # noqa: E402
from test_recbole_adapter import small_cfg, tiny_data, workdir  # noqa: E402,F401  (workdir: a fixture)

from fedvlr_plus.adapters.recbole import neumf as recbole_neumf  # noqa: E402
from fedvlr_plus.adapters.recbole.backbone import federate  # noqa: E402
from fedvlr_plus.federation.engine import FederatedRun  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


class SubNeuMF(NeuMF):
    """A subclass may change ``forward``: it keeps ``predict`` on every pair."""


def _trained(workdir, **config):
    """A run whose shared and private parameters are spread out (a short run barely moves NeuMF's initial
    values, and nearly equal scores would compare nothing)."""
    data = tiny_data()
    bb, _ = federate("NeuMF", data=data, workdir=workdir, config_dict={"embedding_size": 16, **config})
    run = FederatedRun(data, bb, small_cfg(rounds=1), progress=False)
    run.run_round()
    gen = torch.Generator().manual_seed(3)
    run.shared = {k: torch.randn(v.shape, generator=gen) * 0.3 for k, v in run.shared.items()}
    for c in run.eligible:
        state = run.store.load(int(c))
        run.store.save(int(c), {k: torch.randn(v.shape, generator=gen) * 0.3 for k, v in state.items()})
    return bb, run


@pytest.mark.parametrize(
    "config",
    [{}, {"mlp_hidden_size": [32, 16, 8]}, {"mf_train": False}, {"mlp_train": False}],
    ids=["default", "three-layers", "tower-only", "gmf-only"],
)
def test_the_split_scores_are_predicts_on_every_pair(workdir, monkeypatch, config):
    monkeypatch.setattr(recbole_neumf, "USERS_PER_BLOCK", 5)  # several blocks of users and of items
    monkeypatch.setattr(recbole_neumf, "ITEMS_PER_BLOCK", 17)
    bb, run = _trained(workdir, **config)
    assert recbole_neumf.plan(bb.template) is not None
    users = np.arange(len(run.eligible))
    split = run.sim.scores(users, run.shared)
    bb.score_decomposed = False
    pairs = run.sim.scores(users, run.shared)
    assert split.shape == pairs.shape == (len(users), bb.n_items)
    assert float(pairs.std()) > 1e-2  # the scores differ by item
    assert torch.allclose(split, pairs, rtol=0, atol=1e-6)
    top = 10
    assert (split.topk(top).indices == pairs.topk(top).indices).float().mean() > 0.99


def test_the_split_is_taken_only_where_it_applies(workdir):
    bb, _ = _trained(workdir)
    module = bb.template
    assert recbole_neumf.plan(module) is not None
    module.train()
    assert recbole_neumf.plan(module) is None  # dropout active: not a deterministic tower
    module.eval()
    module.__class__ = SubNeuMF
    try:
        assert recbole_neumf.plan(module) is None
    finally:
        module.__class__ = NeuMF
    bn, _ = _trained(workdir / "bn")
    bn.template.mlp_layers.mlp_layers.insert(2, torch.nn.BatchNorm1d(bn.template.mlp_hidden_size[0]))
    assert recbole_neumf.plan(bn.template) is None
