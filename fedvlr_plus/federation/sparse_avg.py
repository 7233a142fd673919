"""Sparse row-wise averaging for item tables: each row is averaged over the clients that touched it.

For an item table, ``θ[r] ← Σ_{u ∋ r} w_u θ_u[r] / Σ_{u ∋ r} w_u`` over the clients whose upload contains row
``r`` (``w_u = n_u / Σ n``); rows nobody touched keep their value. Dense parameters are averaged as in FedAvg.
Unlike dense FedAvg, a row that one client in a thousand trains is not diluted a thousandfold.

References: Niu, Wu, Tang, Hua, Jia, Lv, Wu, Chen, "Billion-scale Federated Learning on Mobile Clients: A
Submodel Design with Tunable Privacy", MobiCom 2020 (clients download and upload only their rows of the embedding
table); Ding, Niu, Tang, Lv, Wu, Chen, "Federated Submodel Optimization for Hot and Cold Data Features",
NeurIPS 2022 (FedSubAvg: average each row over the clients involved with it).
"""
from __future__ import annotations

import torch

from .strategy import Strategy, check_updates, example_weights, weighted_dense, weighted_row_sums


class SparseRowAvg(Strategy):
    name = "sparse-avg"
    upload = "params"

    def aggregate(self, shared, updates, specs):
        check_updates(shared, updates, self.upload)
        w = example_weights(updates)
        out = {}
        for name, g in shared.items():
            if specs[name].item_table:
                num, den = weighted_row_sums(updates, name, g.shape, w, g.dtype)
                hit = den > 0
                new = g.reshape(g.shape[0], -1).clone()
                new[hit] = num[hit] / den[hit].to(g.dtype).unsqueeze(1)
                out[name] = new.reshape(g.shape)
            else:
                out[name] = weighted_dense(updates, name, w).to(g.dtype)
        return out
