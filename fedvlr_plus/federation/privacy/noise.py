"""Clipped, noised uploads: the client-side Gaussian mechanism of the FedVLR paper's privacy experiment (Table 4).

The FedVLR paper (Table 4) adds Gaussian noise to the uploaded gradients before aggregation without giving the
scale; we follow the Gaussian mechanism as used in DP-SGD / DP-FedAvg (Abadi et al., CCS 2016; McMahan et al.,
"Learning Differentially Private Recurrent Language Models", ICLR 2018):

1. the client's contribution Δ — its accumulated gradients (``upload="grads"``) or its parameter change
   θ_local − θ_shared (``upload="params"``) — is clipped to L2 norm at most C over all uploaded arrays together:
   Δ ← Δ · min(1, C / ‖Δ‖);
2. every uploaded entry gets independent N(0, (σ·C)²) noise (σ is the noise multiplier; without clipping, C = 1).

Noise is drawn from counter-based streams keyed by (seed, round, client, array, row, column), so a client's noise
is the same whether it trains alone (sequential reference, Flower) or batched with others. The noise is added on
the client, before anything leaves it. What it does not hide: which item rows a client uploads (sparse uploads
reveal the touched rows, as in the paper's design; :mod:`.decoys` pads them to a fixed size first). The (ε, δ) this
buys is accounted in :mod:`.accountant`; what it covers and what it does not is in docs/privacy.md.
"""

from __future__ import annotations

import numpy as np
import torch

from ..messages import ClientUpdate
from ..simulation import rng
from .decoys import pad_with_decoys


def privatise(update: ClientUpdate, shared: dict[str, torch.Tensor], config: dict) -> ClientUpdate:
    """Pad the update with decoy rows (``config['pad_uploads']``, :mod:`.decoys`), clip its contribution to
    ``config['upload_clip']`` (0: no clipping) and add Gaussian noise with standard deviation
    ``config['upload_noise'] * clip`` (clip taken as 1 when off), decoys included. Returns ``update`` itself when
    all three are off."""
    sigma = float(config.get("upload_noise", 0.0) or 0.0)
    clip = float(config.get("upload_clip", 0.0) or 0.0)
    if sigma < 0 or clip < 0:
        raise ValueError(f"upload_noise and upload_clip must be >= 0, got {sigma} and {clip}")
    update = pad_with_decoys(update, shared, config)
    if sigma == 0.0 and clip == 0.0:
        return update
    names = sorted(update.arrays)
    deltas = {}
    for name in names:
        a = update.arrays[name]
        if update.kind == "grads":
            deltas[name] = a
        elif name in update.rows:
            deltas[name] = a - shared[name].to(a.dtype).index_select(0, update.rows[name])
        else:
            deltas[name] = a - shared[name].to(a.dtype)
    if clip > 0.0:
        norm = float(torch.sqrt(sum((d.double() ** 2).sum() for d in deltas.values())))
        if norm > clip:
            deltas = {k: d * (clip / norm) for k, d in deltas.items()}
    std = sigma * (clip if clip > 0.0 else 1.0)
    seed, round_index = int(config.get("seed", 0)), int(config.get("round", 0))
    arrays = {}
    for j, name in enumerate(names):
        d = deltas[name]
        if std > 0.0:
            width = int(np.prod(d.shape[1:])) if d.dim() > 1 else 1
            if name in update.rows:  # key by global row id: independent of which other rows are uploaded
                rows = update.rows[name].numpy().astype(np.int64)
                idx = rows[:, None] * width + np.arange(width, dtype=np.int64)[None, :]
            else:
                idx = np.arange(d.numel(), dtype=np.int64)
            z = rng.normal(seed, round_index, rng.TAG_NOISE, int(update.cid), j, idx.reshape(-1))
            d = d + torch.from_numpy(z.reshape(d.shape)).to(d.dtype) * std
        if update.kind == "grads":
            arrays[name] = d
        elif name in update.rows:
            arrays[name] = shared[name].to(d.dtype).index_select(0, update.rows[name]) + d
        else:
            arrays[name] = shared[name].to(d.dtype) + d
    return ClientUpdate(
        cid=update.cid,
        kind=update.kind,
        arrays=arrays,
        rows=update.rows,
        num_examples=update.num_examples,
        metrics=dict(update.metrics),
    )
