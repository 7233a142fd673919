import math

import numpy as np
import pytest
import torch

from fedvlr_plus.alignment.fedvpa_gp.method import (
    POSTERIOR_LOGVAR,
    POSTERIOR_MU,
    BatchedVPAClients,
    PriorTable,
    VPAClient,
    VPAConfig,
    VPAModel,
    central_ceiling,
    context_target_sizes,
    fedadam_step,
    gumbel_weights,
    kl_standard_normal,
    load_arrays,
    local_optimizer,
    mixture_kl_mc,
    named_arrays,
    ortho_loss,
    orthonormal_rows,
    posterior_summary,
    prototype_labels,
    prototype_matrix,
    round_lr,
    run_fedvpa_gp,
    train_federated,
)
from fedvlr_plus.alignment.pairs import PreferencePairs, holdout_split
from fedvlr_plus.federation.messages import ClientUpdate
from fedvlr_plus.federation.strategies.server_adam import ServerAdam


def test_mixture_kl_with_one_standard_normal_component_matches_the_closed_form():
    g = torch.Generator().manual_seed(0)
    mu = torch.tensor([0.5, -1.0, 0.2])
    logvar = torch.tensor([-0.5, 0.0, -1.0])
    n = 200_000
    z = mu + torch.exp(0.5 * logvar) * torch.randn(n, 3, generator=g)
    mc = mixture_kl_mc(z, mu, logvar, torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1))
    exact = float(kl_standard_normal(mu, logvar))
    # hand check of the closed form: 0.5 * sum(mu^2 + sigma^2 - 1 - log sigma^2)
    hand = 0.5 * sum(m * m + math.exp(lv) - 1 - lv for m, lv in zip(mu.tolist(), logvar.tolist()))
    assert exact == pytest.approx(hand, rel=1e-6)
    assert float(mc.mean()) == pytest.approx(exact, abs=0.01)


def test_gumbel_weights_sum_to_one_and_temperature():
    g = torch.Generator().manual_seed(1)
    logits = torch.tensor([0.0, 1.0, -2.0, 0.5])
    for tau in (0.1, 1.0, 5.0):
        w = gumbel_weights(logits, tau, g)
        assert float(w.sum()) == pytest.approx(1.0, abs=1e-6) and (w >= 0).all()
    assert torch.allclose(gumbel_weights(logits, 2.0, noise=False), torch.softmax(logits / 2.0, -1))
    # low temperature: near one-hot samples whose frequencies follow softmax(logits)
    hits = torch.stack([gumbel_weights(logits, 0.01, g).argmax() for _ in range(4000)])
    freq = torch.bincount(hits, minlength=4).float() / 4000
    assert torch.allclose(freq, torch.softmax(logits, -1), atol=0.03)


def test_bilinear_reward_direction_depends_on_z():
    m = VPAModel(3, 2)

    def sc(x, z):
        with torch.no_grad():
            return float(m.score(x, z).sum())

    s = torch.tensor([1.0, 1.0, 1.0])
    assert sc(s, torch.tensor([3.0, -1.0])) == 0.0  # zero init: r = 0 for every z
    with torch.no_grad():
        m.w0.weight[:] = torch.tensor([[1.0, 0.0, 0.0]])
        m.U.weight[:] = torch.tensor([[0.0, 0.0], [2.0, -2.0], [0.0, 0.0]])  # [d_in, latent]
    za, zb = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert m.direction(za).detach().tolist() == [1.0, 2.0, 0.0]
    assert m.direction(zb).detach().tolist() == [1.0, -2.0, 0.0]
    assert sc(s, za) == pytest.approx(3.0) and sc(s, zb) == pytest.approx(-1.0)
    # the same pair is preferred one way under z_a and the other way under z_b: opposite types are representable
    chosen, rejected = torch.tensor([[0.0, 1.0, 0.0]]), torch.zeros(1, 3)
    assert sc(chosen, za) - sc(rejected, za) == pytest.approx(2.0)
    assert sc(chosen, zb) - sc(rejected, zb) == pytest.approx(-2.0)
    # a batch of z gives one direction each
    assert m.direction(torch.stack([za, zb])).shape == (2, 3)
    with pytest.raises(ValueError, match="bilinear"):
        VPAModel(3, 2, decoder="concat").direction(za)
    with pytest.raises(ValueError, match="decoder"):
        VPAConfig(decoder="film")


def test_context_and_target_sizes_and_lr_schedule():
    cfg = VPAConfig(context_size=8, batch_size=32, rounds=10, lr=0.2, lr_schedule="cosine")
    assert context_target_sizes(40, cfg) == (8, 32)
    assert context_target_sizes(10, cfg) == (5, 5)  # context at most half, the rest are targets
    assert context_target_sizes(3, cfg) == (1, 2)
    assert context_target_sizes(2, cfg) == (1, 1)
    assert round_lr(cfg, 1) == pytest.approx(0.2)
    assert round_lr(cfg, 6) == pytest.approx(0.1)  # half way: (1 + cos(pi / 2)) / 2 = 1/2
    assert round_lr(VPAConfig(lr=0.2), 6) == 0.2


def test_posterior_summary_modes():
    zs = torch.tensor([[1.0, 3.0], [3.0, 5.0]])
    mus = torch.tensor([[0.0, 2.0], [2.0, 2.0]])
    logvars = torch.zeros(2, 2)
    mu_all = torch.tensor([7.0, 8.0])
    m, lv = posterior_summary(zs, mus, logvars, "samples")
    assert m.tolist() == [2.0, 4.0]
    # variance: mean posterior variance 1 + variance of the posterior means (1 in dim 0, 0 in dim 1)
    assert torch.allclose(lv, torch.log(torch.tensor([2.0, 1.0])))
    assert posterior_summary(zs, mus, logvars, "posterior")[0].tolist() == [1.0, 2.0]
    assert posterior_summary(zs, mus, logvars, "all_pairs", mu_all)[0].tolist() == [7.0, 8.0]
    with pytest.raises(ValueError, match="mu_all"):
        posterior_summary(zs, mus, logvars, "all_pairs")
    with pytest.raises(ValueError, match="mean_of"):
        posterior_summary(zs, mus, logvars, "median")


def test_server_adam_first_step_and_local_sgd():
    old = {"net.w": torch.tensor([1.0, -2.0, 0.0]), "prior.mu": torch.zeros(2)}
    avg = {"net.w": torch.tensor([0.5, -1.0, 0.0]), "prior.mu": torch.ones(2)}
    out = fedadam_step(ServerAdam(), old, avg, lr=0.1)
    # first Adam step on g = old - avg: bias-corrected m / sqrt(v) = g / |g| = sign(g); g = 0 stays put
    assert torch.allclose(out["net.w"], torch.tensor([0.9, -1.9, 0.0]), atol=1e-6)
    assert out["prior.mu"].tolist() == [1.0, 1.0]  # non-network arrays pass through
    # the clients' optimiser keeps gradient sizes (plain SGD) when the server adapts the step
    w = torch.tensor([1.0, 1.0], requires_grad=True)
    opt = local_optimizer(VPAConfig(server_optimizer="adam", local_lr=0.5), [w], None, 1)
    opt.zero_grad()
    (w * torch.tensor([2.0, 0.2])).sum().backward()
    opt.step()
    assert torch.allclose(w.detach(), torch.tensor([0.0, 0.9]))
    with pytest.raises(ValueError, match="server_optimizer"):
        VPAConfig(server_optimizer="yogi")


def test_orthonormal_rows():
    p = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, -3.0]])
    assert torch.allclose(orthonormal_rows(p, 3.0), p)  # already orthogonal at that scale: unchanged
    q = orthonormal_rows(torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]), 5.0)
    assert torch.allclose(q @ q.T, 25 * torch.eye(2), atol=1e-5)
    # Gram-Schmidt by hand: the first row keeps its direction, the second is its part orthogonal to the first
    assert torch.allclose(q[0], 5 * torch.tensor([1.0, 1.0, 0.0]) / math.sqrt(2), atol=1e-5)
    assert torch.allclose(q[1], 5 * torch.tensor([1.0, -1.0, 0.0]) / math.sqrt(2), atol=1e-5)
    assert orthonormal_rows(torch.randn(4, 2, 3), 1.0).shape == (4, 2, 3)  # batched over clients


@pytest.mark.parametrize("mode", ["fixed", "learnable"])
def test_sequential_and_batched_simulators_both_train(mode):
    p = _conflict(2, 20)
    train, test = holdout_split(p, 0.25, seed=0)
    cfg = VPAConfig(rounds=3, latent=3, ortho_warmup=2, prototype_mode=mode)
    for sim in ("sequential", "batched"):
        shared, clients, table, labels, history = train_federated(train, test, cfg, simulator=sim)
        assert len(history) == 3 and table.present.all()
        assert sorted(np.bincount(labels).tolist()) == [2, 2]  # balanced prototype labels from round 2
        assert float(torch.as_tensor(shared["net.U.weight"]).abs().sum()) > 0  # U moved off its zero start
        assert ("net.proto" in shared) == (mode == "learnable")
        if mode == "learnable":
            # shared, moved by the prototype loss, and orthonormal again once a client loads it
            P = orthonormal_rows(torch.as_tensor(shared["net.proto"]), cfg.prototype_scale)
            assert torch.allclose(P @ P.T, 25 * torch.eye(2), atol=1e-4)
            torch.manual_seed(cfg.seed)
            init = VPAModel.from_config(4, cfg).proto.detach()
            assert not torch.allclose(P, init, atol=1e-3)


def _update(cid, mu, n=5):
    return ClientUpdate(
        cid=cid,
        kind="params",
        num_examples=n,
        arrays={POSTERIOR_MU: torch.full((2,), float(mu)), POSTERIOR_LOGVAR: torch.zeros(2)},
    )


def test_prior_table_keeps_absent_clients():
    t = PriorTable(3, 2)
    t.update([_update(0, 1.0), _update(2, 2.0)])
    t.update([_update(2, 5.0, n=7)])  # client 0 absent this round
    assert t.present.tolist() == [True, False, True]
    assert t.mu[0].tolist() == [1.0, 1.0] and t.mu[2].tolist() == [5.0, 5.0]
    assert t.count.tolist() == [5.0, 0.0, 7.0]


def test_prototypes_orthogonal_and_balanced_labels():
    p = prototype_matrix(2, 4, 5.0)
    assert torch.allclose(p @ p.T, 25 * torch.eye(2))
    # the penalty on P P^T - I is on the normalised prototypes: zero for orthogonal rows
    assert float(ortho_loss(p[1], p, 1, gamma=0.1)) == pytest.approx(0.0)
    assert float(ortho_loss(torch.zeros(4), p, 0, gamma=0.1)) == pytest.approx(25.0)
    mu = np.array([[4.0, 0, 0, 0], [5, 0, 0, 0], [6, 0.5, 0, 0], [0, 5, 0, 0]])
    labels = prototype_labels(mu, p.numpy())
    assert np.bincount(labels).tolist() == [2, 2]  # balanced although three points sit near prototype 0
    assert labels[3] == 1


def _conflict(n_clients_per_type=4, pairs=40, d=4, seed=0):
    """Type 0 prefers a large feature 0, type 1 a small one: pooled, the two cancel out (about 50%)."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in (0, 1):
        for k in range(n_clients_per_type):
            a = rng.normal(size=(pairs, d)).astype(np.float32)
            b = rng.normal(size=(pairs, d)).astype(np.float32)
            a_wins = (a[:, 0] > b[:, 0]) if t == 0 else (a[:, 0] < b[:, 0])
            ch = np.where(a_wins[:, None], a, b)
            rj = np.where(a_wins[:, None], b, a)
            rows.append((ch, rj, np.full(pairs, t), np.full(pairs, t * n_clients_per_type + k)))
    ch, rj, g, c = (np.concatenate([r[i] for r in rows]) for i in range(4))
    return PreferencePairs(
        context=np.zeros_like(ch),
        chosen=ch,
        rejected=rj,
        client=c.astype(np.int64),
        group=g.astype(np.int64),
        group_names=("up", "down"),
    )


def test_client_uploads_parameters_and_posterior_summary_only():
    p = _conflict()
    cfg = VPAConfig(local_steps=3, latent=4)
    c = VPAClient(0, p.of_client(0), None, cfg, n_table=8)
    shared = named_arrays(VPAModel(4, 4))
    u = c.fit(shared, {"round": 1})
    assert set(u.arrays) == set(shared) | {POSTERIOR_MU, POSTERIOR_LOGVAR}
    assert u.arrays[POSTERIOR_MU].shape == (4,) and u.num_examples == 40
    assert "pi" in c.store.load(0)  # the mixture logits stay on the client
    mono = VPAClient(0, p.of_client(0), None, VPAConfig(method="monolithic", local_steps=2, latent=4), n_table=8)
    assert set(mono.fit(shared, {"round": 1}).arrays) == set(shared)


def test_uploaded_mean_z_is_the_broadcast_posterior_over_all_pairs_in_both_simulators():
    p = _conflict(2, 40)
    p = p.take(np.flatnonzero((p.client != 1) | (np.arange(len(p)) % 4 != 0)))  # client 1: 30 pairs, padded
    cfg = VPAConfig(method="fedvpl", local_steps=2, latent=3, lr=0.5)
    model = VPAModel(4, 3)
    torch.nn.init.normal_(model.U.weight)
    shared = named_arrays(model)
    batched = {u.cid: u for u in BatchedVPAClients(p, cfg, n_table=4).fit(shared, {"round": 1})}
    assert batched[1].num_examples == 30
    ref = VPAModel(4, 3)
    load_arrays(ref, shared)
    for k in range(4):
        own = p.of_client(k)
        with torch.no_grad():
            want = ref.posterior(torch.as_tensor(own.chosen), torch.as_tensor(own.rejected))[0]
        seq = VPAClient(k, own, None, cfg, n_table=4).fit(shared, {"round": 1})
        assert torch.allclose(torch.as_tensor(seq.arrays[POSTERIOR_MU]), want, atol=1e-5)
        assert torch.allclose(torch.as_tensor(batched[k].arrays[POSTERIOR_MU]), want, atol=1e-5)
        # the network itself did move (lr 0.5): the summary is not taken after the local steps
        assert not torch.allclose(torch.as_tensor(batched[k].arrays["net.mu.weight"]), shared["net.mu.weight"])


def test_central_ceiling_sees_opposite_types():
    p = _conflict(3, 60, seed=2)
    train, test = holdout_split(p, 0.3, seed=0)
    c = central_ceiling(train, test, seed=0)
    assert min(c["per_type"].values()) > 0.85  # one linear reward per type solves it
    assert np.mean(list(c["pooled"].values())) < 0.7  # the pooled one cannot serve both
    assert max(c["cross"].values()) < 0.2  # the other type's reward is mostly wrong
    assert set(c["weight_decay"]) == {"pooled", "up", "down"}


@pytest.mark.slow
def test_fedvpa_gp_beats_the_monolithic_reward_on_conflicting_types():
    cfg = VPAConfig(rounds=80, local_steps=2, latent=4, context_size=8)
    rep = run_fedvpa_gp(
        "synthetic", cfg=cfg, pairs=_conflict(6, 40), clients_per_type=4, unseen_per_type=2, context_pairs=10
    )
    mono, gp = rep["accuracy"]["monolithic"], rep["accuracy"]["fedvpa_gp"]
    assert np.mean(list(mono.values())) < 0.65  # the pooled reward cannot serve both types
    assert min(gp.values()) > 0.75 and min(gp.values()) > max(mono.values())
    assert rep["prototype_purity"] >= 0.9
    assert rep["swap"]["flip_rate"] > 0.5  # the reward direction follows z
    assert rep["unseen_accuracy"]["fedvpa_gp"] > 0.7
    assert set(rep["uplink"]["arrays"]) >= {POSTERIOR_MU, POSTERIOR_LOGVAR}


def test_align_fedvpa_gp_command_json_contract(tmp_path, capsys):
    import json

    from test_alignment_pairs import make_hh_cached

    from fedvlr_plus.cli import main

    root, cache = make_hh_cached(tmp_path)
    assert (
        main(
            [
                "align",
                "fedvpa-gp",
                str(root),
                "--cache-dir",
                str(cache),
                "--rounds",
                "3",
                "--clients-per-type",
                "2",
                "--unseen-per-type",
                "1",
                "--context-pairs",
                "3",
                "--latent",
                "2",
                "--json",
            ]
        )
        == 0
    )
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(rep["accuracy"]) == {"monolithic", "fedvpl", "fedvpa_gp"}
    assert set(rep["accuracy"]["fedvpa_gp"]) == {"helpful-base", "harmless-base"}
    assert rep["kl"]["monolithic"] is None and rep["kl"]["fedvpl"] >= 0
    assert 0.5 <= rep["prototype_purity"] <= 1 and -1 <= rep["silhouette"] <= 1
    assert set(rep["unseen_accuracy"]) == {"monolithic", "fedvpl", "fedvpa_gp"}
    assert "posterior.mu" in rep["uplink"]["arrays"] and not any("pi" == a for a in rep["uplink"]["arrays"])
    assert set(rep["ceiling"]) >= {"pooled", "per_type", "cross"}
    assert set(rep["ceiling"]["per_type"]) == {"helpful-base", "harmless-base"}


def test_fedvpa_gp_cli_defaults_mirror_the_config():
    from fedvlr_plus.cli import build_parser

    args = build_parser().parse_args(["align", "fedvpa-gp", "x"])
    d = VPAConfig()
    for name in (
        "rounds",
        "local_steps",
        "latent",
        "beta",
        "ortho",
        "tau",
        "prior_weights",
        "decoder",
        "lr",
        "server_optimizer",
        "local_lr",
        "context_size",
        "ortho_warmup",
        "summary_mean",
        "lr_schedule",
        "prototype_mode",
    ):
        assert getattr(args, name) == getattr(d, name), name
