"""The server's fusion experts (FedVLR Eq. 2): per-modality projections and the ``sum`` / ``mlp`` / ``gate`` experts.

Li, Long, Jiang, Zhang, Yang, "Federated Vision-Language-Recommendation with Personalized Fusion", AAAI-26
(arXiv 2410.08478). Each modality (the ID table ``D`` and every content view) is projected into the backbone's
latent size by Linear + LayerNorm, then fused by the experts

- ``sum``:  ``Σ_m z_m``;
- ``mlp``:  ``LN(W2 · relu(W1 · [z_1; ...; z_M]))``;
- ``gate``: ``LN(W · [σ(G_1 z_1) ⊙ z_1; ...; σ(G_M z_M) ⊙ z_M])``, a gate that multiplies its inputs.

The fusion runs on the server only, once per round, so its parameters never reach a client; see docs/method.md.
"""

from __future__ import annotations

import torch

from ..adapters.base import ParamSpec
from ..nn import layer_norm, linear

EXPERTS = ("sum", "mlp", "gate")


def _linear(prefix: str, n_in: int, n_out: int) -> list[ParamSpec]:
    return [
        ParamSpec(f"{prefix}.w", (n_in, n_out), shared=True, init="xavier"),
        ParamSpec(f"{prefix}.b", (n_out,), shared=True, init="zeros"),
    ]


def _norm(prefix: str, d: int) -> list[ParamSpec]:
    return [
        ParamSpec(f"{prefix}.ln_g", (d,), shared=True, init="ones"),
        ParamSpec(f"{prefix}.ln_b", (d,), shared=True, init="zeros"),
    ]


def fusion_specs(keys: list[str], in_dims: list[int], d: int, experts: list[str]) -> list[ParamSpec]:
    """The projections of the modalities ``keys`` (input sizes ``in_dims``) and the experts' parameters."""
    m = len(keys)
    out = []
    for key, n_in in zip(keys, in_dims):
        out += _linear(key, n_in, d) + _norm(key, d)
    if "mlp" in experts:
        out += _linear("mlp.l1", m * d, 2 * d) + _linear("mlp.l2", 2 * d, d) + _norm("mlp", d)
    if "gate" in experts:
        for key in keys:
            out += _linear(f"gate.{key}", d, d)
        out += _linear("gate.out", m * d, d) + _norm("gate", d)
    return out


def project(inputs: list[torch.Tensor], keys: list[str], sp: dict) -> list[torch.Tensor]:
    """Each modality in the shared latent space: ``LN(W_m x_m + b_m)``."""
    return [
        layer_norm(linear(x, sp[f"{k}.w"], sp[f"{k}.b"]), sp[f"{k}.ln_g"], sp[f"{k}.ln_b"])
        for x, k in zip(inputs, keys)
    ]


def expert_outputs(zs: list[torch.Tensor], keys: list[str], experts: list[str], sp: dict) -> list[torch.Tensor]:
    """One ``[N, d]`` output per expert from the projected modalities ``zs``."""
    outs = []
    for e in experts:
        if e == "sum":
            outs.append(torch.stack(zs, 0).sum(0))
        elif e == "mlp":
            h = torch.relu(linear(torch.cat(zs, -1), sp["mlp.l1.w"], sp["mlp.l1.b"]))
            outs.append(layer_norm(linear(h, sp["mlp.l2.w"], sp["mlp.l2.b"]), sp["mlp.ln_g"], sp["mlp.ln_b"]))
        else:
            gated = [torch.sigmoid(linear(z, sp[f"gate.{k}.w"], sp[f"gate.{k}.b"])) * z for z, k in zip(zs, keys)]
            outs.append(
                layer_norm(
                    linear(torch.cat(gated, -1), sp["gate.out.w"], sp["gate.out.b"]), sp["gate.ln_g"], sp["gate.ln_b"]
                )
            )
    return outs


def mix(w: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """``Σ_j w[..., j] · experts[..., l, j, :]`` (FedVLR Eq. 4).

    ``w [J]`` / ``[C, J]`` with ``experts [L, J, d]`` / ``[C, L, J, d]`` (aligned), or, when scoring with the
    server's fused views, ``w [B, J]`` with ``experts [N, J, d]`` -> ``[B, N, d]`` as one matrix product.
    """
    if experts.dim() == w.dim() + 2:
        return (w.unsqueeze(-2).unsqueeze(-1) * experts).sum(-2)
    if w.dim() == 2 and experts.dim() == 3:
        n, j, d = experts.shape
        return (w @ experts.permute(1, 0, 2).reshape(j, n * d)).view(w.shape[0], n, d)
    raise ValueError(f"mix: weights {tuple(w.shape)} do not fit experts {tuple(experts.shape)}")
