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

from .fedavg import FedAvgStrategy


class SparseRowAvg(FedAvgStrategy):
    name = "sparse-avg"

    def table_from_row_sums(self, table: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
        hit = den > 0
        new = table.clone()
        new[hit] = num[hit] / den[hit].to(table.dtype).unsqueeze(1)
        return new
