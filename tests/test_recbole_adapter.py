"""The RecBole adapter: parameter split, the model's own loss and scoring, private state, graph locality,
refusals, the FedVLR layer on a RecBole model, RecBole's evaluator against ours, the compat shim and the CLI.

Everything runs on a tiny synthetic data set (24 users, 120 items) written as RecBole atomic files under
``tmp_path``; the current directory is ``tmp_path`` so RecBole cannot write into the repository.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("recbole")

from fedvlr_plus._compat import patch_recbole  # noqa: E402

patch_recbole()

from fedvlr_plus.adapters.recbole.backbone import RefusedModel, align_views, federate, recbole_evaluate, resolve_model  # noqa: E402
from fedvlr_plus.datasets import InteractionData  # noqa: E402
from fedvlr_plus.datasets.splits import leave_one_out  # noqa: E402
from fedvlr_plus.evaluation import evaluate  # noqa: E402
from fedvlr_plus.federation import FedConfig, run_federated  # noqa: E402
from fedvlr_plus.federation.engine import FederatedRun  # noqa: E402
from fedvlr_plus.fedvlr import FUSED  # noqa: E402
from fedvlr_plus.fedvlr.recbole_layer import fedvlr  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

ROOT = Path(__file__).resolve().parents[1]
N_USERS, N_ITEMS = 24, 120


def tiny_data(seed: int = 0, drop_user: int | None = None) -> InteractionData:
    """Users prefer one of three item blocks; raw ids are shuffled strings so RecBole's id order differs from
    ours. ``drop_user``: remove every training interaction of that user but the last three (the privacy test)."""
    rng = np.random.default_rng(seed)
    users, items, ts = [], [], []
    for u in range(N_USERS):
        block = np.arange(40) + 40 * (u % 3)
        chosen = rng.choice(block, size=7, replace=False)
        extra = rng.choice(N_ITEMS, size=2, replace=False)
        for t, i in enumerate(np.unique(np.concatenate([chosen, extra]))):
            users.append(u)
            items.append(int(i))
            ts.append(1000 * u + t + rng.random())
    users, items, ts = np.array(users), np.array(items), np.array(ts)
    if drop_user is not None:
        own = np.flatnonzero(users == drop_user)
        keep = np.ones(len(users), bool)
        keep[own[:-3]] = False
        users, items, ts = users[keep], items[keep], ts[keep]
    perm_u = rng.permutation(N_USERS)
    perm_i = rng.permutation(N_ITEMS)
    data = InteractionData.from_raw(
        "tiny",
        [f"u{perm_u[u]}" for u in users],
        [f"i{perm_i[i]}" for i in items],
        timestamp=ts,
        item_order=[f"i{k}" for k in range(N_ITEMS)],
    )
    return leave_one_out(data)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def small_cfg(**kw) -> FedConfig:
    base = dict(
        rounds=2,
        local_epochs=2,
        batch_size=4,
        ks=(5, 10),
        valid_metric="ndcg@10",
        patience=5,
        lr=0.5,
        item_lr_scale=1.0,
        strategy="fedavg",
    )
    base.update(kw)
    return FedConfig(**base)


# ---------------------------------------------------------------------------------------------- split
def test_parameter_split_bpr_and_neumf(workdir):
    data = tiny_data()
    bpr, _ = federate("BPR", data=data, workdir=workdir / "bpr")
    assert bpr.kinds == {"user_embedding.weight": "user", "item_embedding.weight": "item"}
    spec = {s.name: s for s in bpr.all_specs()}
    d = bpr.template.user_embedding.weight.shape[1]
    assert spec["user_embedding.weight"].shape == (d,) and not spec["user_embedding.weight"].shared
    assert spec["item_embedding.weight"].shape == (N_ITEMS, d) and spec["item_embedding.weight"].item_table
    neumf, _ = federate("NeuMF", data=data, workdir=workdir / "neumf")
    assert {n for n, k in neumf.kinds.items() if k == "user"} == {
        "user_mf_embedding.weight",
        "user_mlp_embedding.weight",
    }
    assert {n for n, k in neumf.kinds.items() if k == "item"} == {
        "item_mf_embedding.weight",
        "item_mlp_embedding.weight",
    }
    assert neumf.kinds["predict_layer.weight"] == "dense"
    # override: keep NeuMF's output layer on the device
    neumf2, _ = federate("NeuMF", data=data, workdir=workdir / "neumf2", private=[r"predict_layer\..*"])
    assert neumf2.kinds["predict_layer.weight"] == "private" and "predict_layer.weight" in neumf2.private_names


def test_item_and_user_maps_follow_recbole_tokens(workdir):
    data = tiny_data()
    bb, _ = federate("BPR", data=data, workdir=workdir)
    tokens = bb.dataset.field2id_token["item_id"]
    assert tokens[0] == "[PAD]"
    assert [tokens[int(r)] for r in bb.item_map] == [str(x) for x in data.item_ids]
    utokens = bb.dataset.field2id_token["user_id"]
    assert [utokens[int(r)] for r in bb.user_map] == [str(x) for x in data.user_ids]
    assert bb.item_map.tolist() != list(range(1, N_ITEMS + 1))  # the shuffle made the orders differ
    init = bb.initial_values(0)
    w = bb.build_module(0).item_embedding.weight.detach()
    assert torch.equal(init["item_embedding.weight"][5], w[int(bb.item_map[5])])


# ---------------------------------------------------------------------------------------------- training
def test_local_step_is_the_models_own_sgd_step(workdir):
    """One local step of client c equals calculate_loss + autograd + SGD on the plain RecBole module."""
    data = tiny_data()
    bb, _ = federate("BPR", data=data, workdir=workdir)
    cfg = small_cfg(local_epochs=1, batch_size=100, lr=0.3, item_lr_scale=2.0, strategy="fedavg")
    run = FederatedRun(data, bb, cfg, progress=False)
    c = int(run.eligible[0])
    client = run.sim.client(c)
    update = client.fit(run.shared, run.round_config(1))
    # replay by hand on the module
    from fedvlr_plus.federation.simulation.schedule import build_schedule

    sched = build_schedule(
        client._indptr,
        client.positives,
        np.array([0]),
        bb.n_items,
        ids=np.array([c]),
        seed=0,
        round=1,
        epochs=1,
        negatives=1,
        batch_size=100,
    )
    ((items, labels),) = sched.steps_of(0)
    m = bb.build_module(0)
    U = m.user_embedding.weight.detach().clone().requires_grad_(True)
    V = m.item_embedding.weight.detach().clone().requires_grad_(True)
    uid = int(bb.user_map[c])
    pos, neg = bb.item_map[torch.as_tensor(items[0::2])], bb.item_map[torch.as_tensor(items[1::2])]
    # BPR: -log sigmoid(<u, i> - <u, j>) averaged (recbole.model.loss.BPRLoss)
    u = U[uid]
    loss = -torch.log(1e-10 + torch.sigmoid((u * V[pos]).sum(-1) - (u * V[neg]).sum(-1))).mean()
    gu, gv = torch.autograd.grad(loss, [U, V])
    assert float(update.metrics["loss"]) == pytest.approx(float(loss), rel=1e-5)
    new_v = V.detach() - 0.3 * 2.0 * gv
    rows = update.rows["item_embedding.weight"]
    assert torch.allclose(update.arrays["item_embedding.weight"], new_v[bb.item_map[rows]], atol=1e-6)
    stored = run.store.load(c)["user_embedding.weight"]
    assert torch.allclose(stored, U.detach()[uid] - 0.3 * gu[uid], atol=1e-6)


def test_param_swap_matches_functional_call_and_restores_the_module():
    """_ParamSwap (the adapter's replacement for torch.func.functional_call) gives the same values and gradients,
    replaces a tied parameter under both names, and leaves the module's own parameters in place, also on error."""
    from torch.func import functional_call

    from fedvlr_plus.adapters.recbole.backbone import _ParamSwap

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(5, 3)
            self.out = torch.nn.Linear(3, 5, bias=False)
            self.out.weight = self.emb.weight  # tied: one Parameter, two names
            self.scale = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, ids):
            return self.scale * self.out(self.emb(ids))

        def fail(self, ids):
            raise RuntimeError("boom")

    torch.manual_seed(0)
    m = Tied()
    own = m.emb.weight
    w = torch.randn(5, 3, requires_grad=True)
    s = torch.tensor(0.5, requires_grad=True)
    ids = torch.tensor([0, 3])
    swap = _ParamSwap(m)
    assert swap.slots["emb.weight"] == [(m.emb, "weight"), (m.out, "weight")]
    got = swap({"emb.weight": w, "scale": s}, "forward", ids)
    # by hand: the tied table is w under both names
    assert torch.allclose(got, 0.5 * (w[ids] @ w.T))
    ref = functional_call(m, {"emb.weight": w, "scale": s}, (ids,))
    assert torch.equal(got, ref)
    g1 = torch.autograd.grad(got.square().sum(), [w, s])
    g2 = torch.autograd.grad(ref.square().sum(), [w, s])
    assert torch.equal(g1[0], g2[0]) and torch.equal(g1[1], g2[1]) and float(g1[0].abs().sum()) > 0
    assert m.emb.weight is own and m.out.weight is own and isinstance(m.scale, torch.nn.Parameter)
    with pytest.raises(RuntimeError, match="boom"):
        swap({"emb.weight": w}, "fail", ids)
    assert m.emb.weight is own and m.out.weight is own
    with pytest.raises(KeyError, match="nope"):
        swap({"nope": w}, "forward", ids)
    assert m.emb.weight is own


def test_module_clients_clip_their_uploads_like_the_other_clients(workdir):
    """--upload-clip / --upload-noise apply to RecBole clients too (the shared LocalTraining.finish)."""
    data = tiny_data()
    bb, _ = federate("BPR", data=data, workdir=workdir)
    seen = []
    run = FederatedRun(
        data,
        bb,
        small_cfg(rounds=1, strategy="fedgrad", server_lr=0.1, upload_clip=0.01),
        progress=False,
        on_upload=lambda r, u: seen.append(u),
    )
    run.run_round()
    norms = [float(torch.sqrt(sum((a.double() ** 2).sum() for a in u.arrays.values()))) for u in seen]
    assert seen and max(norms) <= 0.01 + 1e-6
    assert max(norms) > 0.005  # the unclipped gradient sums are larger than the clip


def test_module_clients_train_and_score_on_one_thread(workdir, monkeypatch):
    """The module simulator runs its clients (and its scoring) on one torch thread and restores the caller's
    setting; the uploads are those of a plain one-thread run. (The one-at-a-time client, which calls the loss
    once per step; the batched one runs under the same rule, tests/test_recbole_batched.py.)"""
    data = tiny_data()
    bb, _ = federate("BPR", data=data, workdir=workdir)
    seen, orig = [], bb.loss
    monkeypatch.setattr(bb, "loss", lambda *a, **k: (seen.append(torch.get_num_threads()), orig(*a, **k))[1])
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref = FederatedRun(data, bb, small_cfg(rounds=1, simulator="sequential"), progress=False)
        ref_up = ref.sim.fit(ref.eligible[:4], ref.shared, ref.round_config(1))
        torch.set_num_threads(2)
        run = FederatedRun(data, bb, small_cfg(rounds=1, simulator="sequential"), progress=False)
        up = run.sim.fit(run.eligible[:4], run.shared, run.round_config(1))
        assert set(seen) == {1} and len(seen) == sum(u.metrics["steps"] for u in ref_up + up) > 0
        assert torch.get_num_threads() == 2
        for a, b in zip(ref_up, up):
            assert all(torch.equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
        s = run.sim.scores(run.eligible[:3], run.shared)
        assert s.shape == (3, bb.n_items) and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


def test_uploads_hold_only_shared_arrays_and_private_state_is_reloaded(workdir):
    data = tiny_data()
    bb, _ = federate("NeuMF", data=data, workdir=workdir)
    seen, loads = [], []
    run = FederatedRun(data, bb, small_cfg(rounds=2), progress=False, on_upload=lambda r, u: seen.append((r, u)))
    original, original_block = run.store.load, getattr(run.store, "load_block", None)
    run.store.load = lambda cid: (loads.append(int(cid)), original(cid))[1]
    if original_block is not None:  # the batched simulator reads a chunk's states as one block
        run.store.load_block = lambda cids, names: (loads.extend(int(c) for c in cids), original_block(cids, names))[1]
    shared = set(bb.shared_names)
    user_rows = {n for n, k in bb.kinds.items() if k == "user"}
    for _ in range(2):
        run.run_round()
    assert len(seen) == 2 * len(run.eligible)
    for _, u in seen:
        assert set(u.arrays) == shared and not (set(u.arrays) & user_rows)
        for name, a in u.arrays.items():
            assert a.shape[0] == len(u.rows[name]) if name in u.rows else a.shape == run.shared[name].shape
    # every client loaded its private state in both rounds (and for scoring)
    for c in run.eligible:
        assert loads.count(int(c)) >= 2
    st = run.store.load(int(run.eligible[0]))
    assert set(st) == user_rows and st["user_mf_embedding.weight"].shape == (bb.template.mf_embedding_size,)


def test_scores_are_the_models_full_sort_and_predict(workdir):
    """BPR scores come from full_sort_predict, NeuMF's from predict (it has no full_sort_predict); both in our
    item order."""
    data = tiny_data()
    for name in ("BPR", "NeuMF"):
        bb, _ = federate(name, data=data, workdir=workdir / name)
        run = FederatedRun(data, bb, small_cfg(rounds=1), progress=False)
        run.run_round()
        users = np.array([0, 3, 7])
        S = run.sim.scores(users, run.shared)
        m = bb.build_module(0)
        params = dict(m.named_parameters())
        with torch.no_grad():
            for k, v in run.shared.items():
                if bb.kinds[k] == "item":
                    params[k].data[bb.item_map] = v
                else:
                    params[k].data.copy_(v)
            for u in users:
                for k, v in run.store.load(int(u)).items():
                    params[k].data[int(bb.user_map[u])] = v
            m.eval()
            from recbole.data.interaction import Interaction

            for r, u in enumerate(users):
                inter = Interaction({"user_id": bb.user_map[u].repeat(N_ITEMS), "item_id": bb.item_map})
                want = m.predict(inter)
                assert torch.allclose(S[r], want, atol=1e-5), name


def test_lightgcn_client_sees_only_its_own_graph(workdir):
    """Another user's interactions change nothing in client 0's upload (its graph is its own). Both runs start
    from the same shared and private values (RecBole's id order differs between the two data sets)."""
    ups, start = [], None
    for variant, drop in (("a", None), ("b", 5)):
        data = tiny_data(drop_user=drop)
        bb, _ = federate("LightGCN", data=data, workdir=workdir / variant)
        assert bb.graph
        run = FederatedRun(data, bb, small_cfg(rounds=1, strategy="fedavg"), progress=False)
        c = 0
        client = run.sim.client(c)
        if start is None:
            start = ({k: v.clone() for k, v in run.shared.items()}, client.private_state())
        run.store.save(c, {k: v.clone() for k, v in start[1].items()}, copy=False)
        ups.append(client.fit(start[0], run.round_config(1)))
        m = bb.template
        assert m.interaction_matrix.nnz == len(client.positives)
        assert set(m.interaction_matrix.row.tolist()) == {int(bb.user_map[c])}
    a, b = ups
    assert torch.equal(a.rows["item_embedding.weight"], b.rows["item_embedding.weight"])
    assert torch.allclose(a.arrays["item_embedding.weight"], b.arrays["item_embedding.weight"], atol=1e-6)
    assert not torch.allclose(
        a.arrays["item_embedding.weight"], start[0]["item_embedding.weight"][a.rows["item_embedding.weight"]]
    )  # it did train


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "name,words",
    [
        ("SASRec", "sequential"),
        ("KGAT", "knowledge-graph"),
        ("Pop", "not trained by gradient"),
        ("NoSuchModel", "not a RecBole general recommender"),
    ],
)
def test_refusals_name_the_reason(name, words):
    with pytest.raises(ValueError, match=words):
        resolve_model(name)


def test_refuses_models_holding_global_interactions_and_fedvlr_without_item_table(workdir):
    data = tiny_data()
    with pytest.raises(RefusedModel, match="history_item_id"):
        federate("MultiVAE", data=data, workdir=workdir / "mvae")
    from recbole.model.abstract_recommender import GeneralRecommender
    from recbole.utils import InputType

    class UserOnly(GeneralRecommender):  # scores items with an MLP over the user embedding: no item table
        input_type = InputType.POINTWISE

        def __init__(self, config, dataset):
            super().__init__(config, dataset)
            self.LABEL = config["LABEL_FIELD"]
            self.user_embedding = torch.nn.Embedding(self.n_users, 8)
            self.out = torch.nn.Linear(8, self.n_items)

        def predict(self, interaction):
            logits = self.out(self.user_embedding(interaction[self.USER_ID]))
            return logits.gather(1, interaction[self.ITEM_ID].unsqueeze(1)).squeeze(1)

        def calculate_loss(self, interaction):
            return torch.nn.functional.binary_cross_entropy_with_logits(
                self.predict(interaction), interaction[self.LABEL]
            )

    bb, _ = federate(UserOnly, data=data, workdir=workdir / "uo")
    assert bb.kinds["out.weight"] == "item"  # [n_items, 8]: an item-indexed matrix, still shared row-wise
    views = {"text": np.random.default_rng(0).normal(size=(N_ITEMS, 4)).astype(np.float32)}
    bb.kinds = {k: ("dense" if v == "item" else v) for k, v in bb.kinds.items()}  # pretend: no item table
    with pytest.raises(RefusedModel, match="no item embedding table"):
        fedvlr(bb, views, data)


# ---------------------------------------------------------------------------------------------- user model
def _example_module():
    spec = importlib.util.spec_from_file_location("recbole_federated", ROOT / "examples" / "recbole_federated.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_user_defined_model_from_the_example_runs_federated_unchanged(workdir):
    ex = _example_module()
    data = tiny_data()
    bb, _ = federate(ex.BiasedMF, data=data, workdir=workdir, config_dict={"embedding_size": 8})
    assert bb.kinds == {"user_embedding.weight": "user", "item_embedding.weight": "item", "item_bias.weight": "item"}
    res = run_federated(data, bb, small_cfg(rounds=2), progress=False)
    assert res["backbone"] == "recbole:BiasedMF" and np.isfinite(res["test"]["ndcg@10"])
    assert res["simulator"] == "module-batched"  # the result names the simulator that really ran
    assert res["history"][1]["loss"] < res["history"][0]["loss"] + 1e-6


# ---------------------------------------------------------------------------------------------- FedVLR layer
def test_fedvlr_layer_replaces_the_item_tables(workdir):
    data = tiny_data()
    bb, _ = federate("NeuMF", data=data, workdir=workdir)
    rng = np.random.default_rng(1)
    views = {"text": rng.normal(size=(N_ITEMS, 6)).astype(np.float32)}
    layer = fedvlr(bb, views, data)
    assert layer.d == bb.dim == 2 * bb.template.mf_embedding_size  # MF and MLP item tables side by side
    assert [s.name for s in layer.id_specs] == ["item_mf_embedding.weight", "item_mlp_embedding.weight"]
    seen = []
    run = FederatedRun(
        data,
        layer,
        small_cfg(rounds=1, strategy="fedgrad", server_lr=0.1),
        progress=False,
        on_upload=lambda r, u: seen.append(u),
    )
    run.run_round()
    private = set(layer.private_names)
    assert {n for n in private if n.startswith("router.")} and "user_mf_embedding.weight" in private
    for u in seen:
        assert u.kind == "grads" and FUSED in u.arrays and not (set(u.arrays) & private)
        assert "item_mf_embedding.weight" not in u.arrays  # D stays on the server
    # scoring with the fused table = the module's predict with its item tables replaced by the mixture
    c = int(run.eligible[0])
    client = run.sim.client(c)
    got = client.scores(run.shared)
    p = {**run.shared, **run.store.load(c)}
    mixed = layer.item_repr(p, None, client._ctx(run.shared))
    tables = bb.split_item_repr(mixed)
    assert torch.allclose(tables["item_mf_embedding.weight"], mixed[:, : bb.template.mf_embedding_size])
    full = bb.module_params({**p, **tables}, torch.tensor([c]))
    with torch.no_grad():
        want = bb.scores(full, torch.tensor([c]))[0]
    assert torch.allclose(got, want) and torch.isfinite(got).all()


def test_cold_items_follow_the_same_rule_as_every_backbone(workdir):
    """Without content views the cold items of a RecBole model take the mean warm ID row, as with every other
    backbone (the same builder); with views, their content neighbours."""
    data = tiny_data()
    cold = np.flatnonzero(data.cold_items())
    assert len(cold)
    bb, _ = federate("BPR", data=data, workdir=workdir)
    layer = fedvlr(bb, {}, data)
    assert torch.equal(layer.cold_items.cold_idx, torch.as_tensor(cold)) and layer.cold_items.neighbours is None
    assert layer.describe()["cold_items_with_warm_mean"] == len(cold)
    layer = fedvlr(bb, {"text": np.random.default_rng(0).normal(size=(N_ITEMS, 4)).astype(np.float32)}, data)
    nbrs = layer.cold_items.neighbours
    assert nbrs.shape == (len(cold), 10) and not np.isin(nbrs.numpy(), cold).any()


def test_recbole_backbones_default_to_fedgrad_with_server_adam(workdir):
    """A RecBole model (and FedVLR around it) trains with fedgrad + server Adam unless the run says otherwise;
    our functional backbones keep SGD (FedVLR Algorithm 1)."""
    data = tiny_data()
    bb, _ = federate("BPR", data=data, workdir=workdir)
    assert bb.default_server_optimizer == "adam"
    run = FederatedRun(data, bb, small_cfg(rounds=1, strategy=None, lr=None, local_epochs=None), progress=False)
    assert (run.strategy_name, run.server_optimizer, run.strategy.optimizer_name) == ("fedgrad", "adam", "adam")
    assert (run.lr, run.server_lr, run.local_epochs) == (bb.default_lr, bb.default_server_lr, 1)
    assert run.round_config(1)["epochs"] == 1
    resolved = run.run()["resolved"]
    assert (resolved["server_optimizer"], resolved["local_epochs"]) == ("adam", 1)
    run = FederatedRun(data, bb, small_cfg(strategy=None, server_optimizer="sgd"), progress=False)
    assert run.strategy.optimizer_name == "sgd"
    layer = fedvlr(bb, {"text": np.ones((N_ITEMS, 4), np.float32)}, data)
    run = FederatedRun(data, layer, small_cfg(strategy=None, local_epochs=None), progress=False)
    assert (run.strategy_name, run.server_optimizer, run.server_lr) == ("fedgrad", "adam", bb.default_server_lr)
    assert run.local_epochs == 1
    # the layer built straight from the builder (as the Python API's FedVLR recipe does) keeps the model's recipe
    from fedvlr_plus.fedvlr import FedVLROptions, build_fedvlr

    direct = build_fedvlr(data, bb, FedVLROptions(), views={"text": np.ones((N_ITEMS, 4), np.float32)})
    assert (direct.default_server_optimizer, direct.default_server_lr, direct.default_local_epochs) == (
        "adam",
        bb.default_server_lr,
        1,
    )
    run = FederatedRun(data, "fcf", small_cfg(strategy="fedgrad", server_lr=1.0, local_epochs=None), progress=False)
    assert (run.server_optimizer, run.strategy.optimizer_name, run.local_epochs) == ("sgd", "sgd", 5)
    assert FederatedRun(data, "fcf", small_cfg(local_epochs=3), progress=False).round_config(2)["epochs"] == 3


def test_layer_scales_fused_views_to_the_wrapped_models_item_rows(workdir):
    """Behind the layer a RecBole model sees item vectors of the size its own rows start at (NeuMF: N(0, 0.01)),
    not unit vectors; the package's own backbones keep unit-size views."""
    data = tiny_data()
    bb, _ = federate("NeuMF", data=data, workdir=workdir)
    rows = torch.cat([v for k, v in bb.initial_values(0).items() if bb.kinds[k] == "item"], -1)
    own = float(rows.norm(dim=-1).mean())
    assert bb.fused_item_norm() == pytest.approx(own, rel=0.15) and bb.fused_item_norm() < 0.3
    layer = fedvlr(bb, {"text": np.random.default_rng(0).normal(size=(N_ITEMS, 4)).astype(np.float32)}, data)
    fused = layer.fused_views(layer.init_server(0)).reshape(N_ITEMS, len(layer.experts), layer.d)
    # each expert's LayerNorm-ed output (the sum expert adds two) scaled to the model's row size, not to 1
    assert layer.out_scale * np.sqrt(layer.d) == pytest.approx(bb.fused_item_norm())
    assert 0.7 < float(fused.norm(dim=-1).mean()) / bb.fused_item_norm() < 1.6
    from fedvlr_plus.adapters import BACKBONES

    assert BACKBONES["fedavg"](N_ITEMS, 8).fused_item_norm() == 1.0


def test_align_views_reorders_by_token():
    data = tiny_data()
    ids = list(data.item_ids)[::-1]
    v = np.arange(N_ITEMS, dtype=np.float32)[:, None].repeat(2, 1)  # row r belongs to ids[r]
    out = align_views({"t": v}, ids, data)["t"]
    assert out[0, 0] == N_ITEMS - 1 and out[-1, 0] == 0
    with pytest.raises(ValueError, match="no view row"):
        align_views({"t": v[:-1]}, ids[:-1], data)


# ---------------------------------------------------------------------------------------------- evaluators
@pytest.mark.parametrize("mask", ["train", "all"])
def test_recbole_evaluator_agrees_with_ours_on_the_federated_model(workdir, mask):
    data = tiny_data()
    bb, _ = federate("BPR", data=data, workdir=workdir)
    run = FederatedRun(data, bb, small_cfg(rounds=1), progress=False)
    run.run_round()
    scorer = run.scorer()
    ours = evaluate(data, scorer, split="test", ks=(5, 10), metrics=("hr", "ndcg", "mrr"), mask_history=mask)
    rb = recbole_evaluate(data, scorer, split="test", ks=(5, 10), metrics=("hr", "ndcg", "mrr"), mask_history=mask)
    s = ours.summary()
    for key in ("hr@5", "hr@10", "ndcg@5", "ndcg@10", "mrr@10"):
        assert rb[key] == pytest.approx(s[key], abs=1e-6), key
    assert s["hr@10"] > 0  # not a vacuous agreement


# ---------------------------------------------------------------------------------------------- compat
def test_fill_nan_patch_imputes_under_copy_on_write():
    import types

    import pandas as pd
    from recbole.data.dataset.dataset import Dataset
    from recbole.utils import FeatureType

    assert getattr(Dataset._fill_nan, "_fedvlr_plus_patched", False)
    feat = pd.DataFrame({"tok": [1.0, np.nan, 3.0], "x": [1.0, np.nan, 3.0]})
    fake = types.SimpleNamespace(
        feat_name_list=["f"], f=feat, field2type={"tok": FeatureType.TOKEN, "x": FeatureType.FLOAT}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pandas' ChainedAssignmentError warning would fail here
        Dataset._fill_nan(fake)
    assert fake.f["tok"].tolist() == [1.0, 0.0, 3.0] and fake.f["x"].tolist() == [1.0, 2.0, 3.0]


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_run_recbole_backbone_with_recbole_evaluator(workdir, capsys):
    from fedvlr_plus.cli import main
    from fedvlr_plus.datasets.recbole_atomic import write_atomic

    data = tiny_data()
    folder = write_atomic(data.replace(inter=data.inter.assign(split=-1)), workdir / "tiny", "tiny", splits=False)
    cfg = workdir / "bpr.yaml"
    cfg.write_text("embedding_size: 8\n")
    rc = main(
        [
            "run",
            str(folder),
            "--backbone",
            "recbole:BPR",
            "--recbole-config",
            str(cfg),
            "--rounds",
            "2",
            "--local-epochs",
            "1",
            "--batch-size",
            "8",
            "--metrics",
            "hr@10,ndcg@10",
            "--evaluator",
            "recbole",
            "--mask-history",
            "all",
            "--no-progress",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["backbone"] == "recbole:BPR" and out["model"]["recbole_model"] == "BPR"
    assert out["model"]["shared"]["item_embedding.weight"] == [N_ITEMS, 8]
    for k in ("hr@10", "ndcg@10"):
        assert out["test_recbole"][k] == pytest.approx(out["test"][k], abs=1e-6)
    assert not (workdir / "log").exists() and not (workdir / "log_tensorboard").exists()
    assert main(["run", str(folder), "--backbone", "recbole:SASRec", "--rounds", "1", "--no-progress"]) == 2
    assert "sequential" in capsys.readouterr().err


def test_federate_from_a_users_recbole_config(workdir):
    """The example's path: a RecBole Config -> RecBole creates the dataset -> our data (id i = RecBole id i+1)."""
    from recbole.config import Config

    from fedvlr_plus.adapters.recbole.backbone import recbole_workdir
    from fedvlr_plus.datasets.recbole_atomic import write_atomic

    data = tiny_data()
    write_atomic(data.replace(inter=data.inter.assign(split=-1)), workdir / "tiny", "tiny", splits=False)
    with recbole_workdir(workdir):
        config = Config(
            model="BPR",
            dataset="tiny",
            config_dict={
                "data_path": str(workdir),
                "embedding_size": 8,
                "use_gpu": False,
                "load_col": {"inter": ["user_id", "item_id", "rating", "timestamp"]},
            },
        )
    bb, ours = federate("BPR", config)
    tokens = bb.dataset.field2id_token["item_id"]
    assert list(ours.item_ids) == list(tokens[1:]) and bb.item_map.tolist() == list(range(1, len(tokens)))
    assert ours.n_users == N_USERS and len(ours.test()) == N_USERS
    assert len(ours.inter) == len(data.inter)  # nothing lost in the round trip
    run = FederatedRun(ours, bb, small_cfg(rounds=2, eval_every=2), progress=False)
    run.run_round()  # (no evaluation: too few items here for the sampled-99 protocol the engine also runs)
    S = run.sim.scores(np.arange(4), run.shared)
    assert S.shape == (4, ours.n_items) and torch.isfinite(S).all()


def test_cli_fusion_options_reach_the_recbole_layer(workdir):
    """--fusion-residual (and the router options) are passed to the layer around a RecBole model."""
    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.cli.recbole import cli_backbone

    data = tiny_data()
    data.features = {"text": np.random.default_rng(0).normal(size=(N_ITEMS, 5)).astype(np.float32)}
    args = build_parser().parse_args(
        [
            "run",
            "unused",
            "--backbone",
            "recbole:BPR",
            "--fusion",
            "fedvlr",
            "--fusion-residual",
            "--router-temperature",
            "2.0",
        ]
    )
    layer = cli_backbone(args, data)
    assert layer.residual and layer.temperature == 2.0
    assert layer.view_scale == "model" and layer.out_scale * np.sqrt(layer.d) == pytest.approx(
        layer.base.fused_item_norm()
    )
    unit = cli_backbone(
        build_parser().parse_args(
            ["run", "unused", "--backbone", "recbole:BPR", "--fusion", "fedvlr", "--fusion-view-scale", "unit"]
        ),
        data,
    )
    assert unit.view_scale == "unit" and unit.out_scale * np.sqrt(unit.d) == pytest.approx(1.0)
    sp = layer.init_server(0)
    plain = dict(vars(args), fusion_residual=False)
    import argparse

    base = cli_backbone(argparse.Namespace(**plain), data)
    with torch.no_grad():  # the residual layer adds the raw ID rows (the model's item table) to every expert
        diff = layer.server_forward(sp) - base.server_forward(sp)
        d = layer.d
        ids = layer.base.item_repr(sp, None, {"items_global": torch.arange(N_ITEMS)})
        warm = torch.as_tensor(~data.cold_items())  # cold rows hold their content neighbours' mean ID row
        assert warm.any() and torch.allclose(diff[warm, :d], ids[warm], atol=1e-6)


def test_residual_gate_starts_the_layer_as_the_models_own_item_rows_and_scales_each_table(workdir):
    """--fusion-residual-gate (implies the residual path): one server scale per expert and NeuMF item table (MF,
    MLP), zero at start, so the broadcast rows are the model's own; each scale moves only its table's columns."""
    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.cli.recbole import cli_backbone
    from fedvlr_plus.fedvlr.layer import GATE

    data = tiny_data()
    data.features = {"text": np.random.default_rng(0).normal(size=(N_ITEMS, 5)).astype(np.float32)}
    args = build_parser().parse_args(
        [
            "run",
            "unused",
            "--backbone",
            "recbole:NeuMF",
            "--fusion",
            "fedvlr",
            "--fusion-residual-gate",
            "--cold-neighbours",
            "0",
        ]
    )
    layer = cli_backbone(args, data)
    assert layer.residual and layer.residual_gate and layer.describe()["residual_gate"]
    widths = [int(layer.base.template.get_parameter(n).shape[1]) for n in layer.base.item_table_names]
    assert len(widths) == 2 and layer.table_widths == widths and sum(widths) == layer.d
    sp = layer.init_server(0)
    assert sp[GATE].shape == (3, 2) and not sp[GATE].any()
    ungated = cli_backbone(
        build_parser().parse_args(
            [
                "run",
                "unused",
                "--backbone",
                "recbole:NeuMF",
                "--fusion",
                "fedvlr",
                "--fusion-residual",
                "--cold-neighbours",
                "0",
            ]
        ),
        data,
    )
    plain_sp = ungated.init_server(0)  # the gate draws nothing: every other server parameter is the same
    assert set(sp) - set(plain_sp) == {GATE} and all(torch.equal(sp[k], plain_sp[k]) for k in plain_sp)
    ids = layer.base.item_repr(sp, None, {"items_global": torch.arange(N_ITEMS)})
    d, w0 = layer.d, widths[0]
    with torch.no_grad():
        f = layer.server_forward(sp)
        assert torch.equal(f, ids.repeat(1, 3))  # the model's own rows, every expert
        full = ungated.server_forward(plain_sp) - ids.repeat(1, 3)  # the ungated fused part
        sp[GATE] = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.5, 0.5]])
        g = layer.server_forward(sp) - ids.repeat(1, 3)
        assert torch.allclose(g[:, :w0], full[:, :w0], atol=1e-6) and not g[:, w0:d].any()
        assert not g[:, d : d + w0].any() and torch.allclose(
            g[:, d + w0 : 2 * d], 2 * full[:, d + w0 : 2 * d], atol=1e-6
        )
        assert torch.allclose(g[:, 2 * d :], 0.5 * full[:, 2 * d :], atol=1e-6)
    # the server step reaches the gate (the fusion parameters' gradient is zero while it is zero)
    sp[GATE].zero_()
    params = {k: v.clone().requires_grad_(True) for k, v in sp.items()}
    out = layer.server_forward(params)
    grads = dict(zip(params, torch.autograd.grad(out, list(params.values()), torch.randn_like(out), allow_unused=True)))
    assert grads[GATE].abs().min() > 0 and grads["proj.v0.w"] is not None and not grads["proj.v0.w"].any()
    with pytest.raises(ValueError, match="residual"):
        from fedvlr_plus.fedvlr import FedVLROptions

        FedVLROptions(residual_gate=True)


def test_models_without_full_sort_score_the_sampled_candidates_alone(workdir):
    """NeuMF (predict only) scores a sampled pass's candidates through predict on those pairs, with the figures of
    scoring every item; BPR (its own full_sort_predict) keeps scoring every item."""
    from fedvlr_plus.evaluation import evaluate

    data = tiny_data()
    for name, wanted in (("BPR", False), ("NeuMF", True)):
        bb, _ = federate(name, data=data, workdir=workdir / name)
        run = FederatedRun(data, bb, small_cfg(rounds=1), progress=False)
        run.run_round()
        assert run.sim.prefers_candidates is wanted
        users, cand = np.array([0, 3, 3, 7]), np.array([[1, 5, 9], [2, 3, 4], [8, 0, 6], [7, 1, 2]])
        full = run.sim.scores(users, run.shared)
        got = run.sim.score_items(users, cand, run.shared, batch=3)  # two batches, a user in both
        assert torch.allclose(got, torch.gather(full, 1, torch.from_numpy(cand)), atol=1e-6), name
        kw = dict(split="test", protocol="sampled", n_negatives=20, ks=(5, 10), metrics=("hr", "ndcg"), seed=0)
        plain = evaluate(data, lambda u, run=run: run.sim.scores(np.asarray(u), run.shared), **kw)
        assert evaluate(data, run.scorer(), **kw).summary() == plain.summary(), name
