"""A batched chunk writes its private item tables and personal copies into the store's own rows (no fresh
``[C, N, d]`` block a chunk), with the sequential reference's uploads and stored states over two rounds."""

import numpy as np
import torch
from test_simulator import tiny_csr

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation import BatchedSimulator, MemoryStore, SequentialSimulator
from fedvlr_plus.federation.state.initial import init_shared_state
from fedvlr_plus.federation.state.store import CompactStore

CONFIG = dict(seed=0, epochs=2, negatives=2, batch_size=4, lr=0.3, item_lr_scale=3.0)


def two_rounds(sim_cls, bb, config, store_cls=MemoryStore):
    """Rounds 3 and 4 from the same perturbed shared state (the second starts from trained private states): the
    uploads of both and the store."""
    indptr, indices = tiny_csr()
    store = store_cls()
    sim = sim_cls(bb, indptr, indices, store, seed=0, chunk_floats=4096)  # several chunks
    shared = init_shared_state(bb, 0)
    noise = torch.Generator().manual_seed(1)
    shared = {k: v + 0.2 * torch.randn(v.shape, generator=noise) for k, v in shared.items()}
    cids = np.arange(len(indptr) - 1)
    ups = [sim.fit(cids, shared, dict(config, round=r)) for r in (3, 4)]
    return ups, store


def assert_same(batched, sequential):
    """The uploads, losses and stored private states of two :func:`two_rounds` agree."""
    (ups_b, store_b), (ups_s, store_s) = batched, sequential
    for round_b, round_s in zip(ups_b, ups_s):
        for a, b in zip(round_b, round_s):
            assert a.cid == b.cid and a.num_examples == b.num_examples
            for k in a.arrays:
                assert torch.allclose(a.arrays[k], b.arrays[k], atol=1e-5), (a.cid, k)
            assert abs(a.metrics["loss"] - b.metrics["loss"]) < 1e-5, a.cid
    for c in range(len(tiny_csr()[0]) - 1):
        for k, v in store_b.load(c).items():
            assert torch.allclose(v, store_s.load(c)[k], atol=1e-5), (c, k)


def test_private_item_tables_stay_the_reference_s_overtwo_rounds():
    # FedRAP's personal table: the touched rows go into the chunk's own table (the store's rows from round 2 on)
    bb = make_backbone("fedrap", 40, 8)
    config = dict(CONFIG, upload="params", weight_decay=0.0)
    batched = two_rounds(BatchedSimulator, bb, config, store_cls=CompactStore)
    assert_same(batched, two_rounds(SequentialSimulator, bb, config))


def test_personal_copies_written_into_the_stores_rows_match_the_reference(monkeypatch):
    # PFedRec keeps a personal copy of the item table: from round 2 on the simulator writes it into the store's own
    # rows (no fresh [C, N, d] block a chunk); the copies and uploads stay the sequential reference's
    given = []
    real = BatchedSimulator._personal_rows
    monkeypatch.setattr(BatchedSimulator, "_personal_rows", lambda self, *a: given.append(real(self, *a)) or given[-1])
    bb = make_backbone("pfedrec", 40, 8)
    config = dict(CONFIG, upload="params", weight_decay=0.0)
    batched = two_rounds(BatchedSimulator, bb, config, store_cls=CompactStore)  # (the store that hands rows out)
    assert_same(batched, two_rounds(SequentialSimulator, bb, config))
    column = batched[1]._cols["item_emb_personal"]
    inside = [column.data_ptr() <= rows.data_ptr() < column.data_ptr() + column.nbytes for rows in given]
    assert len(given) % 2 == 0 and not any(inside[: len(given) // 2]) and all(inside[len(given) // 2 :])
