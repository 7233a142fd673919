"""How FedVPA-GP and its baselines are measured: held-out accuracy per client type, separation of the clients'
mean z by type, the swap test, unseen clients from a few context pairs, and the central linear ceiling."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..pairs import PreferencePairs, kmeans, pairwise_accuracy, purity, silhouette
from .client import accuracy
from .config import VPAConfig
from .model import VPAModel, kl_standard_normal, load_arrays
from .server import train_federated


def evaluate_method(
    train: PreferencePairs,
    test: PreferencePairs,
    unseen: PreferencePairs | None,
    cfg: VPAConfig,
    *,
    context_pairs: int = 10,
    log: list | None = None,
    simulator: str = "batched",
) -> dict:
    """Train one method and measure: held-out accuracy per client type, KL to N(0, I) of the clients' posteriors,
    silhouette / purity of client mean-z by true type, unseen-client accuracy from ``context_pairs`` pairs."""
    shared, clients, table, labels, history = train_federated(train, test, cfg, log=log, simulator=simulator)
    model = VPAModel.from_config(train.chosen.shape[1], cfg)
    load_arrays(model, shared)
    types = train.client_groups()
    names = train.group_names
    hits = {n: [] for n in names}
    mus, kls, tys = [], [], []
    for c in clients:
        mu, logvar = c.infer_z(model)
        mus.append(mu.numpy())
        kls.append(float(kl_standard_normal(mu, logvar)))
        tys.append(types[c.cid])
        if c.test is not None and len(c.test):
            with torch.no_grad():
                sc = model.score(torch.as_tensor(c.test.chosen), mu) - model.score(torch.as_tensor(c.test.rejected), mu)
            hits[names[types[c.cid]]] += ((sc > 0).float() + 0.5 * (sc == 0).float()).tolist()
    mus, tys = np.array(mus), np.array(tys)
    out = {"accuracy": {n: float(np.mean(h)) if h else float("nan") for n, h in hits.items()}, "history": history}
    if cfg.method != "monolithic":
        out["kl"] = float(np.mean(kls))
        out["kl_term"] = history[-1]["kl_term"]
        out["silhouette"] = silhouette(mus, tys)
        if cfg.method == "fedvpa_gp" and (labels >= 0).all():
            lab = labels[[c.cid for c in clients]]
        else:
            lab, _ = kmeans(mus, cfg.prototypes, seed=cfg.seed, balanced=True)
        out["purity"] = purity(lab, tys)
        out["swap_flip_rate"] = swap_flip_rate(model, clients, mus, tys, types)
    if unseen is not None and len(unseen):
        out["unseen_accuracy"] = unseen_accuracy(model, unseen, cfg, context_pairs)
    return out


def _margin(model: VPAModel, pairs: PreferencePairs, z) -> torch.Tensor:
    return model.score(torch.as_tensor(pairs.chosen), z) - model.score(torch.as_tensor(pairs.rejected), z)


def swap_flip_rate(model: VPAModel, clients, mus: np.ndarray, tys: np.ndarray, types: np.ndarray) -> float:
    """Share of held-out pairs whose predicted order flips when a client's own mean z is swapped for the mean z
    of the other type(s)."""
    flips, tot = 0, 0
    for c, mu in zip(clients, mus):
        other = mus[tys != types[c.cid]]
        if not len(other) or c.test is None or not len(c.test):
            continue
        with torch.no_grad():
            own = _margin(model, c.test, torch.as_tensor(mu))
            sw = _margin(model, c.test, torch.as_tensor(other.mean(0)))
        flips += int(((own > 0) != (sw > 0)).sum())
        tot += len(own)
    return flips / tot if tot else float("nan")


def unseen_accuracy(model: VPAModel, unseen: PreferencePairs, cfg: VPAConfig, context_pairs: int) -> float:
    """Pair-weighted accuracy of clients never trained on: z inferred from ``context_pairs`` of their pairs, the
    rest scored."""
    accs = []
    rng = np.random.default_rng(cfg.seed)
    for k in np.unique(unseen.client):
        rows = rng.permutation(np.flatnonzero(unseen.client == k))
        ctx, rest = unseen.take(rows[:context_pairs]), unseen.take(rows[context_pairs:])
        if not len(rest):
            continue
        if cfg.method == "monolithic":
            z = torch.zeros(cfg.latent)
        else:
            with torch.no_grad():
                z, _ = model.posterior(torch.as_tensor(ctx.chosen), torch.as_tensor(ctx.rejected), cfg.logvar_max)
        accs.append((accuracy(model, rest, z), len(rest)))
    return float(np.average([a for a, _ in accs], weights=[n for _, n in accs]))


def fit_linear_bt(
    chosen: np.ndarray,
    rejected: np.ndarray,
    *,
    weight_decay: float = 0.0,
    steps: int = 100,
    lr: float = 1e-2,
    seed: int = 0,
) -> np.ndarray:
    """A linear Bradley-Terry reward r(s) = w^T s fitted centrally (full-batch Adam, L2 ``weight_decay``)."""
    torch.manual_seed(seed)
    w = torch.zeros(chosen.shape[1], requires_grad=True)
    d = torch.as_tensor(chosen - rejected, dtype=torch.float32)
    opt = torch.optim.Adam([w], lr=lr, weight_decay=weight_decay)
    for _ in range(steps):
        loss = -F.logsigmoid(d @ w).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return w.detach().numpy()


def central_ceiling(
    train: PreferencePairs,
    test: PreferencePairs,
    *,
    seed: int = 0,
    weight_decays=(0.0, 1e-3, 1e-2, 1e-1),
    val_fraction: float = 0.2,
) -> dict:
    """How much a type-conditioned reward can gain on these features: linear Bradley-Terry rewards trained
    *centrally* (all pairs in one place, no federation) on the pooled pairs vs one per client type (the true type
    known: an oracle z). ``weight_decay`` is chosen per model on a validation split of ``train``; the test pairs are
    only scored. ``cross``: each type's pairs scored by the *other* type's model (below 50% = the types disagree)."""
    from ..pairs import holdout_split

    tr, va = holdout_split(train, val_fraction, seed=seed + 100)
    names = train.group_names
    groups = np.unique(train.group)

    def pick(rows_tr, rows_va):
        accs = [
            pairwise_accuracy(va.chosen[rows_va] @ w, va.rejected[rows_va] @ w)
            for w in (
                fit_linear_bt(tr.chosen[rows_tr], tr.rejected[rows_tr], weight_decay=wd, seed=seed)
                for wd in weight_decays
            )
        ]
        return weight_decays[int(np.argmax(accs))]

    def acc(w, t):
        rows = test.group == t
        return pairwise_accuracy(test.chosen[rows] @ w, test.rejected[rows] @ w)

    wd = pick(np.ones(len(tr), bool), np.ones(len(va), bool))
    w_pool = fit_linear_bt(train.chosen, train.rejected, weight_decay=wd, seed=seed)
    out = {
        "pooled": {names[t]: acc(w_pool, t) for t in groups},
        "per_type": {},
        "cross": {},
        "weight_decay": {"pooled": wd},
    }
    ws = {}
    for t in groups:
        wd_t = pick(tr.group == t, va.group == t)
        ws[t] = fit_linear_bt(
            train.chosen[train.group == t], train.rejected[train.group == t], weight_decay=wd_t, seed=seed
        )
        out["weight_decay"][names[t]] = wd_t
        out["per_type"][names[t]] = acc(ws[t], t)
    if len(groups) == 2:
        for t in groups:
            out["cross"][names[t]] = acc(ws[groups[groups != t][0]], t)
    return out
