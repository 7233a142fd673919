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
- FedAvg (example-weighted, :func:`fedvlr_plus.federation.strategy.make_strategy`) of every trained array: prompts,
  adapters, gate, feature-token projections, scale and biases. Clients are k-means clusters of the label vectors
  of the training items (label co-occurrence skew), the test set is global;
- decision rule (``MPTConfig.threshold``): per-label thresholds that maximise F1 on the clients' own training items,
  from per-client counts summed by the server (:func:`f1_thresholds`), or a fixed 0.5; both are reported.

Variants (``MPTConfig.variant``): ``baseline`` (one prompt per label, one adapter, mean-pooled tokens: a PromptFL-
style FedAvg baseline), ``prompts`` (condition prompts and per-condition adapters, mean pooling, uniform condition
weights), ``prompts_ot`` (+ OT), ``prompts_gate`` (+ gate, no OT) and ``fedmpt`` (+ OT + gate). Every variant gets
the same feature tokens, label contexts, scale and biases, so the comparison isolates prompts, OT and gate.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources

import numpy as np
import torch
import torch.nn.functional as F

from ..adapters.base import ParamSpec
from ..federation.messages import ClientUpdate
from ..federation.rounds import RoundLoop
from ..federation.strategy import make_strategy
from .sinkhorn import sinkhorn_log

VARIANTS = ("baseline", "prompts", "prompts_ot", "prompts_gate", "fedmpt")
_USES = {"baseline": (False, False), "prompts": (False, False), "prompts_ot": (True, False),
         "prompts_gate": (False, True), "fedmpt": (True, True)}   # (OT, gate)


# ----------------------------------------------------------------------------------------------- task
@dataclass
class TaggingTask:
    """Everything the method needs about the items, already numeric. No raw text travels past this point."""

    tokens: np.ndarray                 #: [n_items, T, d] frozen text-token embeddings (zero-padded)
    token_mask: np.ndarray             #: [n_items, T] bool
    side: dict[str, np.ndarray]        #: feature group -> [n_items, k] standardised features (one token each)
    labels: np.ndarray                 #: [n_items, L] float32 multi-hot
    label_names: list[str]
    prompt_emb: np.ndarray             #: [N, L, d] frozen embeddings of the condition sentences
    base_prompt_emb: np.ndarray        #: [L, d] frozen embeddings of the baseline sentence
    condition_names: list[str]
    #: optional set-valued evidence: one token per sampled rater of the item, [n_items, K, k] (a label-free user
    #: embedding and the rating given; see :func:`rater_tokens`) and its mask [n_items, K]
    raters: np.ndarray | None = None
    rater_mask: np.ndarray | None = None

    @property
    def n_items(self) -> int:
        return int(self.labels.shape[0])

    @property
    def dim(self) -> int:
        return int(self.tokens.shape[-1])


def load_conditions(path=None) -> dict:
    """A condition list: the shipped one (``fedvlr_plus/alignment/data/fedmpt_conditions.json``, written for
    films) or a JSON file of the same layout (``baseline`` and ``conditions[].template`` with ``{label}``)."""
    if path is None:
        where = "fedmpt_conditions.json"
        text = resources.files(__package__).joinpath("data/fedmpt_conditions.json").read_text(encoding="utf-8")
    else:
        where = str(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from e
    if not spec.get("conditions") or "baseline" not in spec:
        raise ValueError(f"{where}: needs a 'baseline' template and a non-empty 'conditions' list")
    for k, c in enumerate(spec["conditions"]):
        if "{label}" not in c.get("template", "") or "name" not in c:
            raise ValueError(f"{where}: conditions[{k}] needs a 'name' and a 'template' containing {{label}}")
    return spec


def prompt_sentences(label_names: list[str], conditions: dict) -> tuple[list[list[str]], list[str]]:
    """Condition sentences [N][L] and baseline sentences [L] for these labels."""
    rename = conditions.get("label_text", {})
    text = [rename.get(c, c.lower()) for c in label_names]
    cond = [[c["template"].format(label=t) for t in text] for c in conditions["conditions"]]
    base = [conditions["baseline"].format(label=t) for t in text]
    return cond, base


# ----------------------------------------------------------------------------------------------- losses, metrics
def asymmetric_loss(logits: torch.Tensor, targets: torch.Tensor, gamma_neg: float = 2.0, gamma_pos: float = 1.0,
                    margin: float = 0.05, eps: float = 1e-8) -> torch.Tensor:
    """ASL: -y (1-p)^g+ log p - (1-y) p_m^g- log(1-p_m), p_m = max(p - m, 0); summed over labels, mean over items."""
    p = torch.sigmoid(logits)
    p_m = (p - margin).clamp_min(0.0) if margin > 0 else p
    pos = targets * (1 - p).pow(gamma_pos) * torch.log(p.clamp_min(eps))
    neg = (1 - targets) * p_m.pow(gamma_neg) * torch.log((1 - p_m).clamp_min(eps))
    return -(pos + neg).sum(-1).mean()


def average_precision(scores: np.ndarray, y: np.ndarray) -> float:
    """AP of one label: mean precision at the rank of each positive (ties broken by order, scores descending)."""
    order = np.argsort(-scores, kind="stable")
    hits = y[order] > 0
    if not hits.any():
        return float("nan")
    prec = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float(prec[hits].mean())


def usual_co_labels(labels: np.ndarray, min_count: int = 5) -> dict[int, int]:
    """For each label j, the label i != j it co-occurs with most often (at least ``min_count`` items)."""
    co = labels.T @ labels
    np.fill_diagonal(co, 0)
    out = {}
    for j in range(labels.shape[1]):
        i = int(np.argmax(co[j]))
        if co[j, i] >= min_count:
            out[j] = i
    return out


def multilabel_metrics(scores: np.ndarray, labels: np.ndarray, co_label: dict[int, int],
                       threshold: float = 0.5) -> dict:
    """mAP (over labels with a positive), CP/CR/CF1 (per-label means), OP/OR/OF1 (pooled), spurious rate.

    ``scores`` are probabilities; a label is predicted when its probability exceeds ``threshold`` (a scalar or one
    value per label). The spurious
    activation rate pools, over labels j with a usual co-label i, the items where i is present and j absent, and
    counts how often j is predicted there; ``spurious_rate_at_r`` does the same when each label j is predicted on
    exactly its top-R_j items (R_j its positives), the same count for every model. ``co_label_auc`` is threshold-free: per such label, the AUC of j's score
    between the items that carry j and the items that carry only its co-label (higher = fewer spurious
    activations at any threshold), averaged over labels.
    """
    y = labels > 0
    pred = scores > threshold
    ap_all = [average_precision(scores[:, j], y[:, j]) if y[:, j].any() else None for j in range(y.shape[1])]
    aps = [a for a in ap_all if a is not None]
    tp = (pred & y).sum(0).astype(float)
    n_pred, n_true = pred.sum(0).astype(float), y.sum(0).astype(float)
    has = n_true > 0
    cp = float(np.mean(np.where(n_pred[has] > 0, tp[has] / np.maximum(n_pred[has], 1), 0.0)))
    cr = float(np.mean(tp[has] / n_true[has]))
    op = float(tp.sum() / max(n_pred.sum(), 1.0))
    orr = float(tp.sum() / max(n_true.sum(), 1.0))
    f1 = lambda p, r: 2 * p * r / (p + r) if p + r > 0 else 0.0  # noqa: E731
    # rank-matched companion: label j predicted on its top-R_j items (R_j = its number of positives here), so two
    # models predict exactly as many items per label and the spurious rate compares rankings, not thresholds
    pred_r = np.zeros_like(y)
    for j in range(y.shape[1]):
        r = int(y[:, j].sum())
        if r:
            pred_r[np.argsort(-scores[:, j], kind="stable")[:r], j] = True
    eligible = fired = fired_r = 0
    aucs = []
    for j, i in co_label.items():
        rows = y[:, i] & ~y[:, j]
        eligible += int(rows.sum())
        fired += int(pred[rows, j].sum())
        fired_r += int(pred_r[rows, j].sum())
        # threshold-free companion: how well j's score separates true j items from co-label-only items
        pos, neg = scores[y[:, j], j], scores[rows, j]
        if len(pos) and len(neg):
            diff = pos[:, None] - neg[None, :]
            aucs.append(float((diff > 0).mean() + 0.5 * (diff == 0).mean()))
    return {"mAP": float(np.mean(aps)) if aps else float("nan"), "CP": cp, "CR": cr, "CF1": f1(cp, cr),
            "OP": op, "OR": orr, "OF1": f1(op, orr),
            "spurious_rate": fired / eligible if eligible else float("nan"), "spurious_eligible": eligible,
            "spurious_rate_at_r": fired_r / eligible if eligible else float("nan"),
            "co_label_auc": float(np.mean(aucs)) if aucs else float("nan"), "ap_per_label": ap_all}


# ----------------------------------------------------------------------------------------------- model
@dataclass
class MPTConfig:
    variant: str = "fedmpt"
    rank: int = 32               #: adapter rank (the paper's D_s)
    scale: float = 10.0          #: initial logit scale (learned in log space; 10 beat 20 and 40 on validation)
    bias_init: float = -2.0      #: initial label bias (sigmoid(-2) = 0.12, near the mean label frequency)
    ot_eps: float = 0.1          #: Sinkhorn entropic regularisation (FedOTP: 0.1)
    ot_iter: int = 50
    ot_tol: float = 1e-3
    #: unbalanced OT: KL weight on the label marginal (None: every label receives exactly 1/C of the token mass);
    #: a finite rho lets labels compete for the tokens, so a token claimed by a label is not also a co-label's.
    #: chosen on validation mAP: rho 1 with rater tokens (the command's default), rho 0.1 without them (the sweep
    #: is in docs/alignment-vlm.md)
    ot_rho: float | None = 1.0
    tau_a: float = 0.1           #: temperature of the importance-weighted token marginal
    gamma_neg: float = 2.0
    gamma_pos: float = 1.0
    margin: float = 0.05
    lr: float = 2e-3
    batch_size: int = 32
    local_epochs: int = 1
    weight_decay: float = 0.0
    #: OT variants: also score the mean-pooled (global) token and add the OT (local) score times
    #: ``local_weight`` (global + local logits, as in global/local prompt learners); False = OT score alone
    global_local: bool = True
    local_weight: float = 1.0
    #: global + local OT variants: learn the weight of the local (OT) score per label (initialised at
    #: ``local_weight``) instead of one fixed lambda for every label
    label_local_weight: bool = False
    #: side-feature tokens: "group" (one token per feature group, a linear map of the group's columns) or
    #: "column" (one token per column, ``x_k e_k + f_k``: one per occupation share, age band, rating level, ...),
    #: so that OT can match a label to one specific piece of evidence; "both": the pooled (global) score and the
    #: gate read the group tokens, the OT (local) score the column tokens (a global summary next to fine-grained
    #: local evidence; variants without OT then use the group tokens only)
    side_tokens: str = "group"
    #: read the task's rater tokens (when it has them): one token per sampled rater, for every variant alike
    rater_tokens: bool = True
    #: decision rule for CP/CR/CF1/OP/OR/OF1 and the spurious rate: "fixed" (probability > 0.5) or "f1" (per-label
    #: thresholds that maximise F1 on the clients' own training items, from summed per-client counts)
    threshold: str = "f1"

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.side_tokens not in ("group", "column", "both"):
            raise ValueError(f"side_tokens must be 'group', 'column' or 'both', got {self.side_tokens!r}")
        if self.threshold not in ("fixed", "f1"):
            raise ValueError(f"threshold must be 'fixed' or 'f1', got {self.threshold!r}")


def param_specs(task: TaggingTask, cfg: MPTConfig) -> dict[str, ParamSpec]:
    d, L, r = task.dim, task.labels.shape[1], cfg.rank
    n = 1 if cfg.variant == "baseline" else task.prompt_emb.shape[0]
    specs = [ParamSpec("adapter_down", (n, r, d), True, init="normal", std=1.0 / math.sqrt(d)),
             ParamSpec("adapter_up", (n, d, r), True, init="zeros"),
             ParamSpec("cond_ctx", (n, d), True, init="zeros"),
             ParamSpec("shared_ctx", (d,), True, init="zeros"),
             ParamSpec("label_ctx", (L, d), True, init="zeros"),
             ParamSpec("log_scale", (1,), True, init="zeros"),
             ParamSpec("bias", (L,), True, init="zeros")]
    if _USES[cfg.variant][1]:
        specs += [ParamSpec("gate_w", (n, d), True, init="zeros"), ParamSpec("gate_b", (n,), True, init="zeros")]
    if _USES[cfg.variant][0] and cfg.global_local and cfg.label_local_weight:
        specs.append(ParamSpec("local_w", (L,), True, init="zeros"))
    if task.raters is not None and cfg.rater_tokens:
        k = task.raters.shape[-1]
        specs += [ParamSpec("rater_w", (d, k), True, init="normal", std=1.0 / math.sqrt(k)),
                  ParamSpec("rater_b", (d,), True, init="zeros")]
    column = cfg.side_tokens == "column" or (cfg.side_tokens == "both" and _USES[cfg.variant][0])
    for g, x in task.side.items():
        if cfg.side_tokens in ("group", "both"):
            specs += [ParamSpec(f"side_w.{g}", (d, x.shape[1]), True, init="normal",
                                std=1.0 / math.sqrt(x.shape[1])),
                      ParamSpec(f"side_b.{g}", (d,), True, init="zeros")]
        if column:
            # token k = x_k e_k + f_k: the column's value scales its own direction, f_k its offset
            specs += [ParamSpec(f"side_e.{g}", (x.shape[1], d), True, init="normal", std=1.0),
                      ParamSpec(f"side_f.{g}", (x.shape[1], d), True, init="normal", std=0.1)]
    return {s.name: s for s in specs}


def init_params(task: TaggingTask, cfg: MPTConfig, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(int(seed))
    out = {}
    for name, s in param_specs(task, cfg).items():
        if s.init == "zeros":
            out[name] = torch.zeros(s.shape)
        else:
            out[name] = torch.randn(s.shape, generator=g) * s.std
    out["log_scale"] = torch.full((1,), math.log(cfg.scale))
    out["bias"] = torch.full(out["bias"].shape, cfg.bias_init)
    if "local_w" in out:
        out["local_w"] = torch.full(out["local_w"].shape, cfg.local_weight)
    return out


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the token axis (-2) of x [..., T, d] with mask [B, T] broadcast over the middle axes."""
    m = mask.to(x.dtype)
    while m.dim() < x.dim() - 1:
        m = m.unsqueeze(1)
    return (x * m.unsqueeze(-1)).sum(-2) / m.sum(-1, keepdim=True).clamp_min(1.0)


def _batch_trimmed(values: np.ndarray, mask: np.ndarray, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``idx`` of a left-aligned padded array [n, T, ...] and its mask [n, T], cut to the batch's longest row
    (most items are far shorter than the padded length)."""
    width = max(int(mask[idx].sum(1).max()), 1) if len(idx) else 1
    return torch.from_numpy(values[idx, :width]), torch.from_numpy(mask[idx, :width])


def item_tokens(p: dict, task: TaggingTask, idx: np.ndarray, kind: str | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Content tokens [B, T + G, d] and mask: frozen text tokens, then one projected token per feature group
    (``kind="group"``, ``side_w.*`` parameters) or one token per feature column (``"column"``, ``side_e.*`` /
    ``side_f.*``); by default the group tokens when the parameters have them."""
    tok, mask = _batch_trimmed(task.tokens, task.token_mask, idx)
    extra = []
    for g, x in task.side.items():
        v = torch.from_numpy(x[idx])
        if (kind or ("group" if f"side_w.{g}" in p else "column")) == "column":
            extra.append(v.unsqueeze(-1) * p[f"side_e.{g}"] + p[f"side_f.{g}"])          # [B, k, d]
        else:
            extra.append((v @ p[f"side_w.{g}"].T + p[f"side_b.{g}"]).unsqueeze(1))       # [B, 1, d]
    if extra:
        extra = torch.cat(extra, 1)
        tok = torch.cat([tok, extra], 1)
        mask = torch.cat([mask, torch.ones(len(idx), extra.shape[1], dtype=torch.bool)], 1)
    if "rater_w" in p:                       # one token per sampled rater: a shared linear map of its embedding
        rt, rm = _batch_trimmed(task.raters, task.rater_mask, idx)
        tok = torch.cat([tok, rt @ p["rater_w"].T + p["rater_b"]], 1)
        mask = torch.cat([mask, rm], 1)
    return tok, mask


def forward(p: dict, task: TaggingTask, idx: np.ndarray, cfg: MPTConfig) -> tuple[torch.Tensor, dict]:
    """Label logits [B, L] for items ``idx`` and diagnostics (gate weights, OT marginal error)."""
    use_ot, use_gate = _USES[cfg.variant]
    x, mask = item_tokens(p, task, idx)                                  # [B, T, d]

    def adapt(t):   # per-condition low-rank adapters: x_n = x + B_n A_n x            -> [B, N, T, d]
        return t.unsqueeze(1) + torch.einsum("bntr,ner->bnte", torch.einsum("btd,nrd->bntr", t, p["adapter_down"]),
                                             p["adapter_up"])

    xa = adapt(x)
    # "both": the OT score reads the per-column tokens, the pooled score and the gate the per-group ones
    split = cfg.side_tokens == "both" and use_ot
    xl, mask_l = (item_tokens(p, task, idx, "column") if split else (x, mask))
    xla = adapt(xl) if split else xa
    base = torch.from_numpy(task.base_prompt_emb)[None] if cfg.variant == "baseline" \
        else torch.from_numpy(task.prompt_emb)                          # [N, L, d]
    prompts = F.normalize(base + p["cond_ctx"][:, None] + p["shared_ctx"] + p["label_ctx"][None], dim=-1)
    diag = {}
    if use_ot:
        xn = F.normalize(xla, dim=-1)
        S = torch.einsum("bntd,nld->bntl", xn, prompts)                 # [B, N, T, L]
        with torch.no_grad():
            imp = S.max(-1).values / cfg.tau_a
            imp = imp.masked_fill(~mask_l[:, None, :], -torch.inf)
            a = torch.softmax(imp, -1)                                   # importance-weighted token marginal
            L = S.shape[-1]
            b = torch.full(S.shape[:-2] + (L,), 1.0 / L, dtype=S.dtype)
            res = sinkhorn_log(1.0 - S, a, b, eps=cfg.ot_eps, max_iter=cfg.ot_iter, tol=cfg.ot_tol, rho=cfg.ot_rho)
        psi = L * (res.plan * S).sum(-2)                                 # [B, N, L]
        diag["ot_marginal_error"] = res.marginal_error
        diag["ot_iter"] = res.n_iter
    if not use_ot or cfg.global_local:
        pooled = F.normalize(_masked_mean(xa, mask), dim=-1)            # [B, N, d]
        glob_psi = torch.einsum("bnd,nld->bnl", pooled, prompts)
        # the OT score is a re-weighted mean of per-token cosines: it adds local evidence to the pooled
        # (global) cosine rather than replacing it, which on short titles is the stronger signal
        lam = p["local_w"] if "local_w" in p else cfg.local_weight      # per label, or one lambda
        psi = glob_psi + lam * psi if use_ot else glob_psi
    n = psi.shape[1]
    if use_gate:
        glob = _masked_mean(x, mask)                                     # [B, d]
        gate = torch.softmax(glob @ p["gate_w"].T + p["gate_b"], -1)     # [B, N]
        diag["gate_entropy"] = float(-(gate * gate.clamp_min(1e-12).log()).sum(-1).mean().detach())
    else:
        gate = torch.full((psi.shape[0], n), 1.0 / n)
    score = (gate.unsqueeze(-1) * psi).sum(1)
    # centre over labels: every "<label> film" prompt sits close to every film token, and that common offset
    # would otherwise start all labels far on the positive side
    score = score - score.mean(-1, keepdim=True)
    return p["log_scale"].exp() * score + p["bias"], diag


def predict(p: dict, task: TaggingTask, idx: np.ndarray, cfg: MPTConfig, batch: int = 256) -> np.ndarray:
    out = []
    with torch.no_grad():
        for s in range(0, len(idx), batch):
            out.append(torch.sigmoid(forward(p, task, idx[s:s + batch], cfg)[0]).numpy())
    return np.concatenate(out) if out else np.zeros((0, task.labels.shape[1]), np.float32)


# ----------------------------------------------------------------------------------------------- federation
class TaggingClient:
    """One client of the tagging task: its training items (private) and, optionally, local held-out items.

    Uploads every trained array (the whole model is shared under FedAvg); never its items, tokens or labels.
    """

    def __init__(self, cid: int, task: TaggingTask, train_idx, cfg: MPTConfig, *, eval_idx=None, seed: int = 0):
        self.cid = int(cid)
        self.task = task
        self.train_idx = np.asarray(train_idx, dtype=np.int64)
        self.eval_idx = np.asarray(eval_idx if eval_idx is not None else [], dtype=np.int64)
        self.cfg = cfg
        self.seed = int(seed)
        if len(self.train_idx) == 0:
            raise ValueError(f"client {cid} has no training items")

    def fit(self, shared: dict, config: dict) -> ClientUpdate:
        cfg = self.cfg
        p = {k: torch.as_tensor(v, dtype=torch.float32).clone().requires_grad_(True) for k, v in shared.items()}
        opt = torch.optim.Adam(list(p.values()), lr=float(config.get("lr", cfg.lr)), weight_decay=cfg.weight_decay)
        rng = np.random.default_rng([self.seed, self.cid, int(config.get("round", 0))])
        losses, gate_h = [], []
        for _ in range(int(config.get("epochs", cfg.local_epochs))):
            order = rng.permutation(self.train_idx)
            for s in range(0, len(order), cfg.batch_size):
                idx = order[s:s + cfg.batch_size]
                logits, diag = forward(p, self.task, idx, cfg)
                loss = asymmetric_loss(logits, torch.from_numpy(self.task.labels[idx]), cfg.gamma_neg,
                                       cfg.gamma_pos, cfg.margin)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                if "gate_entropy" in diag:
                    gate_h.append(diag["gate_entropy"])
        metrics = {"loss": float(np.mean(losses)), "steps": len(losses)}
        if gate_h:
            metrics["gate_entropy"] = float(np.mean(gate_h))
        return ClientUpdate(cid=self.cid, kind="params", arrays={k: v.detach().clone() for k, v in p.items()},
                            num_examples=len(self.train_idx), metrics=metrics)

    def threshold_counts(self, shared: dict, grid: np.ndarray) -> dict[str, np.ndarray]:
        """Per-label counts on this client's training items for every candidate threshold: predicted [G, L],
        true positives [G, L], positives [L]. Only these sums leave the client (no item, score or label)."""
        p = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in shared.items()}
        probs = predict(p, self.task, self.train_idx, self.cfg)
        y = self.task.labels[self.train_idx] > 0
        pred = probs[None] > grid[:, None, None]                          # [G, n, L]
        return {"pred": pred.sum(1).astype(np.float64), "tp": (pred & y[None]).sum(1).astype(np.float64),
                "pos": y.sum(0).astype(np.float64)}

    def evaluate(self, shared: dict, config: dict) -> dict:
        idx = self.eval_idx if len(self.eval_idx) else self.train_idx
        p = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in shared.items()}
        probs = predict(p, self.task, idx, self.cfg)
        co = config.get("co_label") or usual_co_labels(self.task.labels[self.train_idx])
        return {"n": int(len(idx)), **multilabel_metrics(probs, self.task.labels[idx], co)}


THRESHOLD_GRID = np.round(np.arange(0.05, 0.951, 0.025), 3)


def f1_thresholds(counts: list[dict], grid: np.ndarray = THRESHOLD_GRID) -> np.ndarray:
    """Per-label threshold maximising F1 over the clients' summed training counts (ties: the one nearest 0.5;
    a label with no positive keeps 0.5). ``counts`` are :meth:`TaggingClient.threshold_counts` outputs."""
    pred = sum(c["pred"] for c in counts)
    tp = sum(c["tp"] for c in counts)
    pos = sum(c["pos"] for c in counts)
    f1 = 2 * tp / np.maximum(pred + pos[None], 1e-12)                    # [G, L]
    out = np.full(f1.shape[1], 0.5)
    for j in range(f1.shape[1]):
        if pos[j] > 0:
            best = np.flatnonzero(f1[:, j] >= f1[:, j].max() - 1e-12)
            out[j] = grid[best[np.argmin(np.abs(grid[best] - 0.5))]]
    return out


def kmeans_label_clients(labels: np.ndarray, k: int, seed: int = 0, iters: int = 50) -> np.ndarray:
    """Cluster id per item by Lloyd's k-means on the label vectors (k-means++ seeding); every cluster non-empty."""
    n = len(labels)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= clients <= items, got {k} clients for {n} items")
    rng = np.random.default_rng(seed)
    x = labels.astype(np.float64)
    centres = [x[rng.integers(n)]]
    for _ in range(1, k):
        d2 = np.min(((x[:, None] - np.array(centres)[None]) ** 2).sum(-1), 1)
        probs = d2 / d2.sum() if d2.sum() > 0 else np.full(n, 1.0 / n)
        centres.append(x[rng.choice(n, p=probs)])
    c = np.array(centres)
    assign = np.zeros(n, dtype=np.int64)
    for _ in range(iters):
        new = np.argmin(((x[:, None] - c[None]) ** 2).sum(-1), 1)
        for j in range(k):                       # an empty cluster takes the point farthest from its centre
            if not (new == j).any():
                far = np.argmax(((x - c[new]) ** 2).sum(-1))
                new[far] = j
        if np.array_equal(new, assign):
            break
        assign = new
        c = np.array([x[assign == j].mean(0) for j in range(k)])
    return assign


@dataclass
class FedMPTResult:
    variant: str
    test: dict
    history: list[dict] = field(default_factory=list)
    n_params: int = 0


def train_federated(task: TaggingTask, train_idx: np.ndarray, test_idx: np.ndarray, cfg: MPTConfig, *,
                    n_clients: int = 5, rounds: int = 20, seed: int = 0, log=None) -> FedMPTResult:
    """FedAvg over k-means label clients; returns the global model's figures on the global test items."""
    assign = kmeans_label_clients(task.labels[train_idx], n_clients, seed)
    clients = [TaggingClient(c, task, train_idx[assign == c], cfg, seed=seed) for c in range(n_clients)]
    specs = param_specs(task, cfg)
    shared = init_params(task, cfg, seed)
    strategy = make_strategy("fedavg")
    torch.manual_seed(seed)

    def aggregate(r, shared, updates, config):
        shared = {k: v.to(torch.float32) for k, v in strategy.aggregate(shared, updates, specs).items()}
        row = {"round": r, "loss": float(np.average([u.metrics["loss"] for u in updates],
                                                    weights=[u.num_examples for u in updates]))}
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
    rules = {"fixed": multilabel_metrics(probs, task.labels[test_idx], co),
             "f1": multilabel_metrics(probs, task.labels[test_idx], co, threshold=thr)}
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


# ----------------------------------------------------------------------------------------------- real data
def item_side_features(data, idx_items: int | None = None) -> dict[str, np.ndarray]:
    """Per-item usage features from the interactions and user attributes (none of them reads the labels).

    Groups: ``year`` (release decade one-hot + standardised year, when ``release_year`` exists), ``ratings``
    (5-bin rating histogram shares and mean), ``popularity`` (log count), and where user attributes exist ``age``
    (rater shares in six bands), ``gender`` (share of each value) and ``occupation`` (shares). Every column is
    standardised over all items.
    """
    n = data.n_items if idx_items is None else idx_items
    inter = data.inter
    groups: dict[str, np.ndarray] = {}
    if "release_year" in data.items.columns:
        import pandas as pd

        yr = pd.to_numeric(data.items["release_year"].reindex(range(n)), errors="coerce").to_numpy(np.float64)
        ok = np.isfinite(yr)
        dec = np.zeros((n, 8))
        bins = np.clip(((np.nan_to_num(yr, nan=1990) - 1930) // 10).astype(int), 0, 7)
        dec[np.arange(n)[ok], bins[ok]] = 1
        groups["year"] = np.column_stack([dec, np.where(ok, yr, np.nanmean(yr) if ok.any() else 0.0)])
    items = inter["item"].to_numpy()
    cnt = np.bincount(items, minlength=n).astype(np.float64)
    denom = np.maximum(cnt, 1)[:, None]
    r = inter["rating"].to_numpy().astype(np.float64)
    if np.unique(r).size > 1:
        rb = np.clip(np.rint(r).astype(int), 1, 5) - 1
        hist = np.zeros((n, 5))
        np.add.at(hist, (items, rb), 1)
        mean = np.bincount(items, weights=r, minlength=n) / np.maximum(cnt, 1)
        groups["ratings"] = np.column_stack([hist / denom, mean])
    groups["popularity"] = np.log1p(cnt)[:, None]
    users = data.users
    if len(users):
        u = inter["user"].to_numpy()
        if "age" in users.columns:
            age = np.asarray(users["age"].reindex(range(data.n_users)), dtype=np.float64)
            band = np.digitize(np.nan_to_num(age, nan=30), [18, 25, 35, 45, 55])
            sh = np.zeros((n, 6))
            np.add.at(sh, (items, band[u]), 1)
            groups["age"] = sh / denom
        for col in ("gender", "occupation"):
            if col in users.columns:
                codes, _ = users[col].reindex(range(data.n_users)).astype(str).factorize()
                sh = np.zeros((n, codes.max() + 1))
                np.add.at(sh, (items, codes[u]), 1)
                groups[col] = sh / denom
    out = {}
    for g, x in groups.items():
        sd = x.std(0)
        out[g] = ((x - x.mean(0)) / np.where(sd > 0, sd, 1.0)).astype(np.float32)
    return out


def item_label_matrix(data, *, min_count: int = 2, max_share: float = 0.9) -> tuple[np.ndarray, list[str]]:
    """Multi-hot labels from ``items.categories``; drops labels on fewer than ``min_count`` items or on more than
    ``max_share`` of the labelled items (a catalogue-wide tag such as "Magazine Subscriptions" says nothing)."""
    if "categories" not in data.items.columns:
        raise ValueError(f"{data.source or data.name}: the items have no 'categories' column to use as labels")
    cats = [list(c) if isinstance(c, (list, tuple, np.ndarray)) else [] for c in
            data.items["categories"].reindex(range(data.n_items))]
    names = sorted({c for cs in cats for c in cs})
    col = {c: j for j, c in enumerate(names)}
    y = np.zeros((data.n_items, len(names)), np.float32)
    for i, cs in enumerate(cats):
        for c in cs:
            y[i, col[c]] = 1
    labelled = y.any(1).sum()
    keep = (y.sum(0) >= min_count) & (y.sum(0) <= max_share * max(labelled, 1))
    if keep.sum() < 2:
        raise ValueError(f"{data.source or data.name}: fewer than 2 usable labels in items.categories "
                         f"(each needs >= {min_count} items and <= {max_share:.0%} of the labelled items)")
    return y[:, keep], [n for n, k in zip(names, keep) if k]


def build_task(data, embed_tokens, embed_sentences, conditions: dict | None = None, *, max_tokens: int = 16,
               min_count: int = 2, proj_dim: int | None = 96, raters: int = 0,
               rater_dim: int = 32) -> tuple[TaggingTask, np.ndarray]:
    """A :class:`TaggingTask` from an :class:`InteractionData` and two offline encoders.

    ``embed_tokens(texts) -> list of [T_i, d] arrays`` (token outputs of the text encoder) and
    ``embed_sentences(texts) -> [n, d]``. Items text = title (description when there is no title). Returns the task
    and the ids of the items that carry at least one kept label (the only ones used for training and testing).
    ``proj_dim``: project tokens and prompts onto this many fixed directions (None keeps the encoder's width).
    ``raters``: also give every item up to this many rater tokens (:func:`rater_tokens`, rank ``rater_dim``; 0: none).
    """
    conditions = conditions or load_conditions()
    y, names = item_label_matrix(data, min_count=min_count)
    items = data.items.reindex(range(data.n_items))
    title = items["title"].fillna("").astype(str) if "title" in items.columns else None
    desc = items["description"].fillna("").astype(str) if "description" in items.columns else None
    texts = []
    for i in range(data.n_items):
        t = title.iloc[i].strip() if title is not None else ""
        if not t and desc is not None:
            t = desc.iloc[i].strip()
        texts.append(t or "untitled")
    tok_list = embed_tokens(texts)
    d = int(np.asarray(tok_list[0]).shape[-1])
    tokens = np.zeros((data.n_items, max_tokens, d), np.float32)
    mask = np.zeros((data.n_items, max_tokens), bool)
    for i, t in enumerate(tok_list):
        t = np.asarray(t, dtype=np.float32)[:max_tokens]
        tokens[i, :len(t)] = t
        mask[i, :len(t)] = True
    cond, base = prompt_sentences(names, conditions)
    flat = embed_sentences([s for row in cond for s in row])
    prompt_emb = np.asarray(flat, np.float32).reshape(len(cond), len(names), -1)
    base_emb = np.asarray(embed_sentences(base), np.float32)
    if proj_dim and proj_dim < d:
        # one fixed linear map for tokens and prompts alike (the top right-singular vectors of the stacked,
        # uncentred token and prompt embeddings): cosines keep most of their structure and every step gets
        # d / proj_dim times cheaper; no label is read
        stack = np.concatenate([tokens[mask], prompt_emb.reshape(-1, d), base_emb])
        basis = np.linalg.svd(stack.astype(np.float64), full_matrices=False)[2][:proj_dim].T.astype(np.float32)
        tokens = tokens @ basis
        prompt_emb = prompt_emb @ basis
        base_emb = base_emb @ basis
    task = TaggingTask(tokens=tokens, token_mask=mask, side=item_side_features(data), labels=y, label_names=names,
                       prompt_emb=prompt_emb, base_prompt_emb=base_emb,
                       condition_names=[c["name"] for c in conditions["conditions"]])
    if raters:
        task.raters, task.rater_mask = rater_tokens(data, max_raters=raters, dim=rater_dim)
    return task, np.flatnonzero(y.any(1))


def minilm_encoders(device: str = "cpu"):
    """``(embed_tokens, embed_sentences)`` from the offline all-MiniLM-L6-v2 (token outputs / pooled, unit norm)."""
    from ..views.sentence_encoder import SentenceEncoder

    enc = SentenceEncoder(device=device, progress=False)

    def embed_tokens(texts):
        model = enc._load()          # lazily: a fully cached run never loads the weights
        out = model.encode(list(texts), output_value="token_embeddings", batch_size=128, show_progress_bar=False)
        return [o.detach().cpu().numpy() if hasattr(o, "detach") else np.asarray(o) for o in out]

    return embed_tokens, enc.embed


def cached_encoders(embed_tokens, embed_sentences, cache_dir, tag: str = "minilm"):
    """Wrap ``(embed_tokens, embed_sentences)`` so every call's output is kept in ``cache_dir`` and reused.

    The key is the SHA-256 of the encoder ``tag``, the call kind and the exact texts, so a changed title or
    condition list is encoded afresh. Files are written atomically (temp file, then ``os.replace``). Encoding
    the ml-100k titles and prompts costs 1-2 CPU-minutes; a cached run skips it.
    """
    import hashlib
    import os
    from pathlib import Path

    root = Path(cache_dir)

    def _path(kind, texts):
        h = hashlib.sha256("\x1f".join([tag, kind, *texts]).encode("utf-8")).hexdigest()[:24]
        return root / f"{tag}-{kind}-{h}.npz"

    def _save(path, **arrays):
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)

    def tokens(texts):
        texts = list(texts)
        path = _path("tokens", texts)
        if path.exists():
            z = np.load(path)
            return np.split(z["flat"], np.cumsum(z["lengths"])[:-1])
        out = [np.asarray(t, np.float32) for t in embed_tokens(texts)]
        _save(path, flat=np.concatenate(out), lengths=np.array([len(t) for t in out]))
        return out

    def sentences(texts):
        texts = list(texts)
        path = _path("sentences", texts)
        if path.exists():
            return np.load(path)["emb"]
        out = np.asarray(embed_sentences(texts), np.float32)
        _save(path, emb=out)
        return out

    return tokens, sentences


def split_items(ids: np.ndarray, test_share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    perm = rng.permutation(ids)
    n_test = int(round(test_share * len(ids)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def rater_tokens(data, *, max_raters: int = 32, dim: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Set-valued item evidence: for each item, up to ``max_raters`` of its raters, each one token.

    A rater's token is ``[u, r - mean_u]``: ``u`` its row of a rank-``dim`` truncated SVD of the binary user x item
    matrix (every interaction; no label is read: genres never enter), scaled by the singular values' square roots,
    and the rating it gave this item centred on its own mean rating. Items with more raters keep a seeded random
    sample of them. Returns ``(tokens [n_items, K, dim + 1] float32, mask [n_items, K] bool)``; columns are
    standardised over all rater tokens.
    """
    import scipy.sparse as sp
    from scipy.sparse.linalg import svds

    inter = data.inter
    u = inter["user"].to_numpy()
    i = inter["item"].to_numpy()
    r = inter["rating"].to_numpy().astype(np.float64) if "rating" in inter.columns else np.ones(len(u))
    n_u, n_i = int(data.n_users), int(data.n_items)
    k = max(1, min(dim, min(n_u, n_i) - 1))
    m = sp.csr_matrix((np.ones(len(u)), (u, i)), shape=(n_u, n_i))
    m.data[:] = 1.0                                                         # repeated pairs count once
    uu, ss, _ = svds(m, k=k, random_state=seed)
    emb = uu[:, ::-1] * np.sqrt(ss[::-1])[None]
    mean_u = np.bincount(u, weights=r, minlength=n_u) / np.maximum(np.bincount(u, minlength=n_u), 1)
    feat = np.column_stack([emb[u], r - mean_u[u]])                        # one row per interaction
    sd = feat.std(0)
    feat = ((feat - feat.mean(0)) / np.where(sd > 0, sd, 1.0)).astype(np.float32)
    rng = np.random.default_rng(seed)
    order = np.argsort(i, kind="stable")
    starts = np.searchsorted(i[order], np.arange(n_i + 1))
    tokens = np.zeros((n_i, max_raters, feat.shape[1]), np.float32)
    mask = np.zeros((n_i, max_raters), bool)
    for item in range(n_i):
        rows = order[starts[item]:starts[item + 1]]
        if len(rows) > max_raters:
            rows = np.sort(rng.choice(rows, max_raters, replace=False))
        tokens[item, :len(rows)] = feat[rows]
        mask[item, :len(rows)] = True
    return tokens, mask
