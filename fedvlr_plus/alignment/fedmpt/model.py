"""FedMPT's model: settings and variants, the shared parameters, the item tokens through per-condition adapters,
condition prompts, the OT matching of tokens to labels and the condition gate."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...adapters.base import ParamSpec
from ..sinkhorn import sinkhorn_log
from .task import TaggingTask

VARIANTS = ("baseline", "prompts", "prompts_ot", "prompts_gate", "fedmpt")
_USES = {
    "baseline": (False, False),
    "prompts": (False, False),
    "prompts_ot": (True, False),
    "prompts_gate": (False, True),
    "fedmpt": (True, True),
}  # (OT, gate)


# ----------------------------------------------------------------------------------------------- model
@dataclass
class MPTConfig:
    variant: str = "fedmpt"
    rank: int = 32  #: adapter rank (the paper's D_s)
    scale: float = 10.0  #: initial logit scale (learned in log space; 10 beat 20 and 40 on validation)
    bias_init: float = -2.0  #: initial label bias (sigmoid(-2) = 0.12, near the mean label frequency)
    ot_eps: float = 0.1  #: Sinkhorn entropic regularisation (FedOTP: 0.1)
    ot_iter: int = 50
    ot_tol: float = 1e-3
    #: unbalanced OT: KL weight on the label marginal (None: every label receives exactly 1/C of the token mass);
    #: a finite rho lets labels compete for the tokens, so a token claimed by a label is not also a co-label's.
    #: chosen on validation mAP: rho 1 with rater tokens (the command's default), rho 0.1 without them (the sweep
    #: is in docs/alignment-vlm.md)
    ot_rho: float | None = 1.0
    tau_a: float = 0.1  #: temperature of the importance-weighted token marginal
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
    specs = [
        ParamSpec("adapter_down", (n, r, d), True, init="normal", std=1.0 / math.sqrt(d)),
        ParamSpec("adapter_up", (n, d, r), True, init="zeros"),
        ParamSpec("cond_ctx", (n, d), True, init="zeros"),
        ParamSpec("shared_ctx", (d,), True, init="zeros"),
        ParamSpec("label_ctx", (L, d), True, init="zeros"),
        ParamSpec("log_scale", (1,), True, init="zeros"),
        ParamSpec("bias", (L,), True, init="zeros"),
    ]
    if _USES[cfg.variant][1]:
        specs += [ParamSpec("gate_w", (n, d), True, init="zeros"), ParamSpec("gate_b", (n,), True, init="zeros")]
    if _USES[cfg.variant][0] and cfg.global_local and cfg.label_local_weight:
        specs.append(ParamSpec("local_w", (L,), True, init="zeros"))
    if task.raters is not None and cfg.rater_tokens:
        k = task.raters.shape[-1]
        specs += [
            ParamSpec("rater_w", (d, k), True, init="normal", std=1.0 / math.sqrt(k)),
            ParamSpec("rater_b", (d,), True, init="zeros"),
        ]
    column = cfg.side_tokens == "column" or (cfg.side_tokens == "both" and _USES[cfg.variant][0])
    for g, x in task.side.items():
        if cfg.side_tokens in ("group", "both"):
            specs += [
                ParamSpec(f"side_w.{g}", (d, x.shape[1]), True, init="normal", std=1.0 / math.sqrt(x.shape[1])),
                ParamSpec(f"side_b.{g}", (d,), True, init="zeros"),
            ]
        if column:
            # token k = x_k e_k + f_k: the column's value scales its own direction, f_k its offset
            specs += [
                ParamSpec(f"side_e.{g}", (x.shape[1], d), True, init="normal", std=1.0),
                ParamSpec(f"side_f.{g}", (x.shape[1], d), True, init="normal", std=0.1),
            ]
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


def item_tokens(
    p: dict, task: TaggingTask, idx: np.ndarray, kind: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Content tokens [B, T + G, d] and mask: frozen text tokens, then one projected token per feature group
    (``kind="group"``, ``side_w.*`` parameters) or one token per feature column (``"column"``, ``side_e.*`` /
    ``side_f.*``); by default the group tokens when the parameters have them."""
    tok, mask = _batch_trimmed(task.tokens, task.token_mask, idx)
    extra = []
    for g, x in task.side.items():
        v = torch.from_numpy(x[idx])
        if (kind or ("group" if f"side_w.{g}" in p else "column")) == "column":
            extra.append(v.unsqueeze(-1) * p[f"side_e.{g}"] + p[f"side_f.{g}"])  # [B, k, d]
        else:
            extra.append((v @ p[f"side_w.{g}"].T + p[f"side_b.{g}"]).unsqueeze(1))  # [B, 1, d]
    if extra:
        extra = torch.cat(extra, 1)
        tok = torch.cat([tok, extra], 1)
        mask = torch.cat([mask, torch.ones(len(idx), extra.shape[1], dtype=torch.bool)], 1)
    if "rater_w" in p:  # one token per sampled rater: a shared linear map of its embedding
        rt, rm = _batch_trimmed(task.raters, task.rater_mask, idx)
        tok = torch.cat([tok, rt @ p["rater_w"].T + p["rater_b"]], 1)
        mask = torch.cat([mask, rm], 1)
    return tok, mask


def forward(p: dict, task: TaggingTask, idx: np.ndarray, cfg: MPTConfig) -> tuple[torch.Tensor, dict]:
    """Label logits [B, L] for items ``idx`` and diagnostics (gate weights, OT marginal error)."""
    use_ot, use_gate = _USES[cfg.variant]
    x, mask = item_tokens(p, task, idx)  # [B, T, d]

    def adapt(t):  # per-condition low-rank adapters: x_n = x + B_n A_n x            -> [B, N, T, d]
        return t.unsqueeze(1) + torch.einsum(
            "bntr,ner->bnte", torch.einsum("btd,nrd->bntr", t, p["adapter_down"]), p["adapter_up"]
        )

    xa = adapt(x)
    # "both": the OT score reads the per-column tokens, the pooled score and the gate the per-group ones
    split = cfg.side_tokens == "both" and use_ot
    xl, mask_l = item_tokens(p, task, idx, "column") if split else (x, mask)
    xla = adapt(xl) if split else xa
    base = (
        torch.from_numpy(task.base_prompt_emb)[None] if cfg.variant == "baseline" else torch.from_numpy(task.prompt_emb)
    )  # [N, L, d]
    prompts = F.normalize(base + p["cond_ctx"][:, None] + p["shared_ctx"] + p["label_ctx"][None], dim=-1)
    diag = {}
    if use_ot:
        xn = F.normalize(xla, dim=-1)
        S = torch.einsum("bntd,nld->bntl", xn, prompts)  # [B, N, T, L]
        with torch.no_grad():
            imp = S.max(-1).values / cfg.tau_a
            imp = imp.masked_fill(~mask_l[:, None, :], -torch.inf)
            a = torch.softmax(imp, -1)  # importance-weighted token marginal
            L = S.shape[-1]
            b = torch.full(S.shape[:-2] + (L,), 1.0 / L, dtype=S.dtype)
            res = sinkhorn_log(1.0 - S, a, b, eps=cfg.ot_eps, max_iter=cfg.ot_iter, tol=cfg.ot_tol, rho=cfg.ot_rho)
        psi = L * (res.plan * S).sum(-2)  # [B, N, L]
        diag["ot_marginal_error"] = res.marginal_error
        diag["ot_iter"] = res.n_iter
    if not use_ot or cfg.global_local:
        pooled = F.normalize(_masked_mean(xa, mask), dim=-1)  # [B, N, d]
        glob_psi = torch.einsum("bnd,nld->bnl", pooled, prompts)
        # the OT score is a re-weighted mean of per-token cosines: it adds local evidence to the pooled
        # (global) cosine rather than replacing it, which on short titles is the stronger signal
        lam = p["local_w"] if "local_w" in p else cfg.local_weight  # per label, or one lambda
        psi = glob_psi + lam * psi if use_ot else glob_psi
    n = psi.shape[1]
    if use_gate:
        glob = _masked_mean(x, mask)  # [B, d]
        gate = torch.softmax(glob @ p["gate_w"].T + p["gate_b"], -1)  # [B, N]
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
            out.append(torch.sigmoid(forward(p, task, idx[s : s + batch], cfg)[0]).numpy())
    return np.concatenate(out) if out else np.zeros((0, task.labels.shape[1]), np.float32)
