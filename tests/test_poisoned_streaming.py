"""A poisoned round is never streamed through the real simulator's chunks, which would leave the attackers out."""

import torch

from fedvlr_plus.federation import ClientUpdate
from fedvlr_plus.federation.attacks.poisoned import PoisonedSimulator
from fedvlr_plus.federation.config import FedConfig
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.simulation.upload_stream import can_stream
from fedvlr_plus.run_data import load_and_split


class _Attacker:
    """Uploads row 0 of the item table far from where it is."""

    def __init__(self, cid: int):
        self.cid = cid

    def fit(self, shared, config):
        row = shared["item_emb"][:1] + 100.0
        return ClientUpdate(
            cid=self.cid, kind="params", arrays={"item_emb": row}, rows={"item_emb": torch.tensor([0])}, num_examples=5
        )


def _first_row_after_one_round(poisoned: bool):
    data = load_and_split("synthetic:30x40")[0]
    run = FederatedRun(data, "fedavg", FedConfig(rounds=1, simulator="batched", strategy="fedavg"), progress=False)
    if poisoned:
        run.sim = PoisonedSimulator(run.sim, [_Attacker(run.n_users)], len(run.eligible), 0)
        assert not can_stream(run.sim, run.strategy)
    else:
        assert can_stream(run.sim, run.strategy)
    run.run_round()
    return run.shared["item_emb"][0]


def test_attackers_reach_the_aggregate_of_a_batched_fedavg_round():
    clean, poisoned = _first_row_after_one_round(False), _first_row_after_one_round(True)
    assert float((poisoned - clean).abs().max()) > 1.0
