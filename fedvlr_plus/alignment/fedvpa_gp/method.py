"""FedVPA-GP: federated variational preference alignment with a Gumbel-Softmax mixture prior.

Koo, Kim, Jang, Ok, "Federated Variational Preference Alignment with Gumbel-Softmax Prior for Personalized User
Preferences", ICML 2026, arXiv 2605.30873; built on VPL (Poddar et al., "Personalizing Reinforcement Learning from
Human Feedback with Variational Preference Learning", NeurIPS 2024, arXiv 2408.10075). Stage 1 (the reward model)
at CPU scale (what differs from the paper, and why: docs/alignment.md, "FedVPA-GP"):

- encoder: a pair encoder MLP over [e_chosen ; e_rejected], mean-pooled over a client's context pairs, linear heads
  to (mu, log sigma^2) of q(z | C), d-dimensional; log sigma^2 <- min(log sigma^2, logvar_max) (variance cap);
  z = mu + sigma * eps;
- decoder: a z-conditioned Bradley-Terry reward; p(chosen > rejected) = sigma(r(chosen, z) - r(rejected, z)).
  Default ``decoder="bilinear"``: r(s, z) = e_s^T (w_0 + U z), a reward *direction* that depends on z, so two
  client types with opposite preferences are both representable (w_0 + U z_A and w_0 + U z_B may point in opposite
  directions). ``decoder="concat"`` is VPL's r(s, z) = MLP([e_s ; z]): there z only shifts hidden pre-activations,
  its additive part cancels in r(chosen) - r(rejected), and on HH-RLHF it learned to ignore z (measured, see
  docs/alignment-preference.md). (The paper adds f(z) to an LLM's choice logits instead.)
- federated mixture prior p_mix^(i)(z) = sum_j w_j N(z; mubar_j, sigmabar_j^2) over the peers' posterior summaries
  (the server's prior table: this round's uploads overwrite their rows, absent clients keep theirs), with
  w = softmax((log pi + g) / tau), Gumbel noise g and per-client logits pi learned locally and never uploaded
  (``prior_weights="samples"``: the released code's sample-size weights). One-sample Monte-Carlo KL:
  log q(z | C) - logsumexp_j [log w_j + log N(z; mubar_j, sigmabar_j^2)]. Round 1 (empty table): N(0, I);
- orthogonal prototypes: L_ortho = ||z - p_{y*}||^2 + gamma ||Phat Phat^T - I||_F^2, P = scale x orthonormal rows
  (``prototype_mode="fixed"``: scaled identity rows; ``"learnable"``: QR init, shared through FedAvg, QR
  re-orthonormalised after every step), y* the
  prototype label the server assigns by balanced k-means (k = M) over the clients' mean z;
- local loss L = L_BT + beta KL + lambda L_ortho; upload = the shared network parameters (sample-weighted FedAvg,
  the federation's :class:`~fedvlr_plus.federation.strategies.fedavg.FedAvgStrategy`) + the posterior summary (mubar_i,
  log sigmabar^2_i) + n_i. mubar_i is by default the posterior mean from all the client's pairs under the broadcast
  encoder (see :func:`posterior_summary`); context and target pairs of a local step are disjoint;
- optimisation (``server_optimizer="adam"``, default): local SGD, then a server Adam on FedAvg's averaged update
  (FedAdam, Reddi et al., "Adaptive Federated Optimization", ICLR 2021); ``"none"``: local Adam + FedAvg. Why:
  :func:`local_optimizer`. The departures from the paper are measured in docs/alignment-preference.md.

Baselines in the same code: ``method="fedvpl"`` (N(0, I) prior, no prototypes: VPL federated) and
``method="monolithic"`` (z fixed at 0: one federated Bradley-Terry reward for everybody).

Where the parts live: :mod:`.vpa_config` (settings), :mod:`.vpa_model` (model, KL terms, prototypes, posterior
summary), :mod:`.vpa_optim` (step sizes, local optimisers, server Adam), :mod:`.vpa_client` (one client, the
reference), :mod:`.vpa_batched` (all clients of a round at once), :mod:`.vpa_server` (prior table, prototype
labels, training), :mod:`.vpa_evaluation` (figures, ceiling); this module runs the comparison and re-exports
every public name.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ...federation.messages import ClientUpdate
from ..pairs import PreferencePairs
from .batched import BatchedVPAClients
from .client import VPAClient, accuracy, context_target_sizes
from .config import DECODERS, METHODS, POSTERIOR_LOGVAR, POSTERIOR_MU, SUMMARY_MEANS, VPAConfig
from .evaluation import central_ceiling, evaluate_method, fit_linear_bt, swap_flip_rate, unseen_accuracy
from .model import (
    VPAModel,
    gumbel_weights,
    kl_standard_normal,
    load_arrays,
    log_normal,
    mixture_kl_mc,
    named_arrays,
    ortho_loss,
    orthonormal_rows,
    posterior_summary,
    prototype_matrix,
)
from .optim import fedadam_step, local_optimizer, round_lr
from .server import PriorTable, prototype_labels, train_federated

__all__ = ["BatchedVPAClients", "DECODERS", "METHODS", "POSTERIOR_LOGVAR", "POSTERIOR_MU", "PriorTable",
           "SUMMARY_MEANS", "VPAClient", "VPAConfig", "VPAModel", "accuracy", "central_ceiling",
           "context_target_sizes", "evaluate_method", "fedadam_step", "fit_linear_bt", "gumbel_weights",
           "kl_standard_normal", "load_arrays", "local_optimizer", "log_normal", "mixture_kl_mc", "named_arrays",
           "ortho_loss", "orthonormal_rows", "posterior_summary", "prototype_labels", "prototype_matrix",
           "round_lr", "run_fedvpa_gp", "swap_flip_rate", "train_federated", "unseen_accuracy"]


def run_fedvpa_gp(source, *, cfg: VPAConfig | None = None, hh: bool = False, limit: int | None = None,
                  clients_per_type: int = 10, pairs_per_client: int = 40, unseen_per_type: int = 2,
                  context_pairs: int = 10, test_fraction: float = 0.25, text: str = "none", encoder=None,
                  cache_dir=None, progress: bool = False, pairs: PreferencePairs | None = None,
                  simulator: str = "batched") -> dict:
    """The three methods on the same clients; the JSON-ready report of the issue's contract."""
    from ..pairs import holdout_split

    cfg = cfg or VPAConfig()
    t0 = time.perf_counter()
    per_type = clients_per_type + unseen_per_type
    if pairs is None:
        pairs, name = load_pairs(source, cfg, hh=hh, limit=limit, per_type=per_type,
                                 pairs_per_client=pairs_per_client, text=text, encoder=encoder,
                                 cache_dir=cache_dir, progress=progress)
    else:
        from ..pairs import assign_clients

        name = str(source)
        pairs = replace(pairs, client=assign_clients(pairs.group, per_type, seed=cfg.seed))
    seen, unseen, n_unseen = split_unseen(pairs, clients_per_type)
    train, test = holdout_split(seen, test_fraction, seed=cfg.seed)
    results = {}
    uploads: list[ClientUpdate] = []
    for method in METHODS:
        results[method] = evaluate_method(train, test, unseen, replace(cfg, method=method),
                                          context_pairs=context_pairs, log=uploads if method == "fedvpa_gp" else None,
                                          simulator=simulator)
    report = {"source": name, "types": list(pairs.group_names), **_figures(results)}
    report.update({
        "ceiling": central_ceiling(train, test, seed=cfg.seed),
        "clients": {"train": int(train.n_clients), "unseen": n_unseen,
                    "pairs_per_client": len(train) / max(train.n_clients, 1), "test_pairs": len(test),
                    "context_pairs_unseen": context_pairs},
        "uplink": {"arrays": sorted({k for u in uploads for k in u.arrays})},
        "history": {m: results[m]["history"] for m in METHODS},
        "config": {k: v for k, v in cfg.__dict__.items() if k != "method"},
        "seconds": time.perf_counter() - t0,
    })
    return report


def load_pairs(source, cfg: VPAConfig, *, hh: bool, limit, per_type: int, pairs_per_client: int, text: str,
               encoder, cache_dir, progress: bool) -> tuple[PreferencePairs, str]:
    """(pairs, source name): HH-RLHF splits as client types, or a rating dataset's simulated annotator types."""
    from ..pairs import annotator_pairs, hh_pairs, item_features, item_stats

    if hh:
        pairs = hh_pairs(source, limit_per_split=limit, encoder=encoder, cache_dir=cache_dir,
                         clients_per_split=per_type, seed=cfg.seed, progress=progress)
        return pairs, str(source)
    from fedvlr_plus.datasets import load

    data = load(source)
    feats = item_features(data, text=text, encoder=encoder, cache_dir=cache_dir, progress=progress)
    # the "quality" annotator reads the mean rating: give the models that statistic as a feature
    feats = np.concatenate([feats, item_stats(data)], 1)
    pairs = annotator_pairs(data, feats, n_clients_per_type=per_type, pairs_per_client=pairs_per_client,
                            seed=cfg.seed)
    return pairs, getattr(data, "name", str(source))


def split_unseen(pairs: PreferencePairs, clients_per_type: int) -> tuple[PreferencePairs, PreferencePairs, int]:
    """(seen, unseen, number of unseen clients): the clients after the first ``clients_per_type`` of every type are
    unseen; the seen ones are renumbered 0..K-1."""
    types = pairs.client_groups()
    unseen_ids = np.concatenate([np.flatnonzero(types == t)[clients_per_type:] for t in np.unique(types)])
    is_unseen = np.isin(pairs.client, unseen_ids)
    seen = pairs.take(np.flatnonzero(~is_unseen))
    remap = {c: j for j, c in enumerate(np.unique(seen.client))}
    seen = replace(seen, client=np.array([remap[c] for c in seen.client], np.int64))
    return seen, pairs.take(np.flatnonzero(is_unseen)), int(len(unseen_ids))


def _figures(results: dict) -> dict:
    """The report's comparison of the three methods."""
    return {
        "accuracy": {m: results[m]["accuracy"] for m in METHODS},
        "kl": {m: results[m].get("kl") for m in METHODS},
        "kl_term": {m: results[m].get("kl_term") for m in METHODS},
        "prototype_purity": results["fedvpa_gp"]["purity"],
        "silhouette": results["fedvpa_gp"]["silhouette"],
        "separation": {m: {"purity": results[m].get("purity"), "silhouette": results[m].get("silhouette")}
                       for m in ("fedvpl", "fedvpa_gp")},
        "swap": {"flip_rate": results["fedvpa_gp"]["swap_flip_rate"],
                 "fedvpl_flip_rate": results["fedvpl"]["swap_flip_rate"]},
        "unseen_accuracy": {m: results[m].get("unseen_accuracy") for m in METHODS},
    }
