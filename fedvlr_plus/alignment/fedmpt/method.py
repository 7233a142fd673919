"""FedMPT: federated multi-label prompt tuning with condition prompts and optimal transport, for item tagging.

Wang, Wang, Zhao, Yu, Wang, Wang, "FedMPT: Federated Multi-Label Prompt Tuning of Vision-Language Models",
CVPR 2026, arXiv 2605.28347 (the paper's version, see docs/alignment.md, "FedMPT"). Mapped onto items:
an item is a set of content tokens (frozen MiniLM token embeddings of its title, plus one learned token per group
of usage features: release year, rating histogram, rater age / gender / occupation shares, popularity, and,
optionally, one token per sampled rater, :func:`rater_tokens`: the set-valued evidence closest to image patches
here) and its labels are its genres or categories. Per item:

- condition prompts: for condition n and label c, ``p_{n,c} = normalise(E0[n,c] + u_n + w + v_c)`` where ``E0`` is
  the frozen MiniLM embedding of the condition sentence for c (the fixed condition list in
  ``data/fedmpt_conditions.json``, written offline), ``u_n`` a learned condition context, ``w`` a learned context
  shared by all labels and ``v_c`` a learned label context (a cheap stand-in for soft prompts through the frozen
  text encoder: only additive contexts in the encoder's output space);
- per-condition low-rank adapters on the tokens, ``x_n = x + B_n A_n x``;
- similarity ``S_{n,m,c} = cos(x_{n,m}, p_{n,c})``; entropic OT between tokens and labels with importance-weighted
  token marginals ``a_m = softmax_m(max_c S_{n,m,c} / tau_a)`` and uniform label marginals ``b = 1/C``;
  ``psi_{n,c} = C * sum_m T*_{m,c} S_{m,c}`` (the plan is computed without gradient, as in PLOT); by default the
  label marginal is relaxed (unbalanced OT, ``MPTConfig.ot_rho``, as FedOTP relaxes its marginals) so labels
  compete for the tokens instead of each receiving exactly 1/C of them;
- global + local score (``MPTConfig.global_local``, default on): ``psi_{n,c}`` above is added, times
  ``local_weight``, to the cosine between the mean-pooled adapted tokens and ``p_{n,c}`` (a global token next to
  the local OT matching, as global/local prompt learners do); with it off the OT score stands alone;
- a learned gate ``g = softmax(W_g mean_m(x) + b_g)`` over conditions; logit ``= s * sum_n g_n psi_{n,c} + bias_c``;
- asymmetric loss (Ridnik et al., arXiv 2009.14119; gamma- = 2, gamma+ = 1, margin 0.05);
- FedAvg (example-weighted, :func:`fedvlr_plus.federation.strategies.base.make_strategy`) of every trained array:
prompts,
  adapters, gate, feature-token projections, scale and biases. Clients are k-means clusters of the label vectors
  of the training items (label co-occurrence skew), the test set is global;
- decision rule (``MPTConfig.threshold``): per-label thresholds that maximise F1 on the clients' own training items,
  from per-client counts summed by the server (:func:`f1_thresholds`), or a fixed 0.5; both are reported.

Variants (``MPTConfig.variant``): ``baseline`` (one prompt per label, one adapter, mean-pooled tokens: a PromptFL-
style FedAvg baseline), ``prompts`` (condition prompts and per-condition adapters, mean pooling, uniform condition
weights), ``prompts_ot`` (+ OT), ``prompts_gate`` (+ gate, no OT) and ``fedmpt`` (+ OT + gate). Every variant gets
the same feature tokens, label contexts, scale and biases, so the comparison isolates prompts, OT and gate.

Where the parts live: :mod:`.mpt_task` (tokens, labels, conditions, item split), :mod:`.mpt_encoders` (offline
MiniLM, disk cache), :mod:`.mpt_model` (settings, parameters, forward pass), :mod:`.mpt_metrics` (loss, figures,
F1 thresholds), :mod:`.mpt_client` (client, label clients); this module trains one variant and re-exports every
public name.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ...federation.rounds import RoundLoop
from ...federation.strategies.base import make_strategy
from .client import TaggingClient, kmeans_label_clients
from .encoders import cached_encoders, minilm_encoders
from .metrics import (
    THRESHOLD_GRID,
    asymmetric_loss,
    average_precision,
    f1_thresholds,
    multilabel_metrics,
    usual_co_labels,
)
from .model import _USES, VARIANTS, MPTConfig, forward, init_params, item_tokens, param_specs, predict
from .task import (
    TaggingTask,
    build_task,
    item_label_matrix,
    item_side_features,
    load_conditions,
    prompt_sentences,
    rater_tokens,
    split_items,
)

__all__ = [
    "FedMPTResult",
    "MPTConfig",
    "THRESHOLD_GRID",
    "TaggingClient",
    "TaggingTask",
    "VARIANTS",
    "asymmetric_loss",
    "average_precision",
    "build_task",
    "cached_encoders",
    "config_dict",
    "f1_thresholds",
    "forward",
    "init_params",
    "item_label_matrix",
    "item_side_features",
    "item_tokens",
    "kmeans_label_clients",
    "load_conditions",
    "minilm_encoders",
    "multilabel_metrics",
    "param_specs",
    "predict",
    "prompt_sentences",
    "rater_tokens",
    "split_items",
    "train_federated",
    "usual_co_labels",
]


@dataclass
class FedMPTResult:
    variant: str
    test: dict
    history: list[dict] = field(default_factory=list)
    n_params: int = 0


def train_federated(
    task: TaggingTask,
    train_idx: np.ndarray,
    test_idx: np.ndarray,
    cfg: MPTConfig,
    *,
    n_clients: int = 5,
    rounds: int = 20,
    seed: int = 0,
    log=None,
) -> FedMPTResult:
    """FedAvg over k-means label clients; returns the global model's figures on the global test items."""
    assign = kmeans_label_clients(task.labels[train_idx], n_clients, seed)
    clients = [TaggingClient(c, task, train_idx[assign == c], cfg, seed=seed) for c in range(n_clients)]
    specs = param_specs(task, cfg)
    shared = init_params(task, cfg, seed)
    strategy = make_strategy("fedavg")
    torch.manual_seed(seed)

    def aggregate(r, shared, updates, config):
        shared = {k: v.to(torch.float32) for k, v in strategy.aggregate(shared, updates, specs).items()}
        row = {
            "round": r,
            "loss": float(np.average([u.metrics["loss"] for u in updates], weights=[u.num_examples for u in updates])),
        }
        gh = [u.metrics["gate_entropy"] for u in updates if "gate_entropy" in u.metrics]
        if gh:
            row["gate_entropy"] = float(np.mean(gh))
        return shared, row

    def report(r, shared, row):
        if log:
            log(f"[{cfg.variant}] round {r + 1}/{rounds} loss {row['loss']:.4f}")

    shared, history = RoundLoop(clients, aggregate, on_round=report).run(shared, range(rounds))
    co = usual_co_labels(task.labels[train_idx])
    probs = predict(shared, task, test_idx, cfg)
    # the decision rule is part of the model: per-label F1 thresholds from the clients' own training items (only
    # summed counts reach the server), or a fixed 0.5; both are reported, cfg.threshold picks the headline
    thr = f1_thresholds([c.threshold_counts(shared, THRESHOLD_GRID) for c in clients])
    rules = {
        "fixed": multilabel_metrics(probs, task.labels[test_idx], co),
        "f1": multilabel_metrics(probs, task.labels[test_idx], co, threshold=thr),
    }
    test = dict(rules[cfg.threshold])
    test["decision_rule"] = cfg.threshold
    keep = ("CP", "CR", "CF1", "OP", "OR", "OF1", "spurious_rate")
    test["rules"] = {k: {m: v[m] for m in keep} for k, v in rules.items()}
    test["thresholds"] = [float(t) for t in thr]
    if _USES[cfg.variant][1]:
        with torch.no_grad():
            _, diag = forward(shared, task, test_idx, cfg)
        test["gate_entropy"] = diag["gate_entropy"]
        test["gate_entropy_max"] = math.log(task.prompt_emb.shape[0])
    n_params = int(sum(v.numel() for v in shared.values()))
    return FedMPTResult(cfg.variant, test, history, n_params)


def config_dict(cfg: MPTConfig) -> dict:
    return asdict(cfg)
