"""The item-promotion attack: a malicious upload looks like a benign one and pushes its target up; the exposure
metric; the ``experiment poisoning`` command end to end on tiny data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.evaluation.exposure import item_hits
from fedvlr_plus.federation.attacks.poisoned import PoisonedSimulator, attacker_count
from fedvlr_plus.federation.attacks.promotion import PromotionAttacker, choose_target, popular_pool
from fedvlr_plus.federation.client import RecClient
from fedvlr_plus.federation.state.initial import init_shared_state
from fedvlr_plus.federation.state.store import MemoryStore
from fedvlr_plus.federation.strategies.base import make_strategy

N_ITEMS, DIM, TARGET = 40, 8, 37


def _config(round_index: int, upload: str = "params") -> dict:
    return {
        "seed": 0,
        "round": round_index,
        "epochs": 2,
        "negatives": 1,
        "batch_size": 64,
        "lr": 0.5,
        "item_lr_scale": 20.0,
        "weight_decay": 0.0,
        "upload": upload,
    }


def _world():
    """20 benign users who mostly hold the first 10 items (popular) and never the target."""
    bb = make_backbone("fedavg", N_ITEMS, DIM)
    g = np.random.default_rng(3)
    clients = [
        RecClient(
            u, bb, np.union1d(g.choice(10, 6, replace=False), g.choice(np.arange(10, 30), 3)), MemoryStore(), seed=0
        )
        for u in range(20)
    ]
    counts = np.zeros(N_ITEMS, np.int64)
    for c in clients:
        counts[c.positives] += 1
    return bb, clients, counts


def _step_norms(update, shared):
    rows = update.rows["item_emb"]
    steps = update.arrays["item_emb"] - shared["item_emb"][rows]
    return rows, steps.norm(dim=1)


@pytest.mark.parametrize("upload", ["params", "grads"])
def test_malicious_upload_has_the_shape_and_scale_of_a_benign_one(upload):
    bb, clients, counts = _world()
    shared = init_shared_state(bb, 0)
    pool = popular_pool(counts, 10, exclude=TARGET)
    attacker = PromotionAttacker(100, bb, TARGET, pool, profile_size=9, seed=0)
    bad = attacker.fit(shared, _config(1, upload))
    good = clients[0].fit(shared, _config(1, upload))
    assert set(bad.arrays) == set(good.arrays) and set(bad.rows) == set(good.rows)
    assert bad.kind == good.kind == upload
    assert bad.arrays["item_emb"].shape[1:] == good.arrays["item_emb"].shape[1:]
    assert bad.num_examples == len(attacker.positives) == 9
    rows = bad.rows["item_emb"]
    at = int(torch.nonzero(rows == TARGET))
    if upload == "grads":
        norms = bad.arrays["item_emb"].norm(dim=1)
    else:
        rows, norms = _step_norms(bad, shared)
    others = torch.cat([norms[:at], norms[at + 1 :]])
    # the target's step is exactly as long as the attacker's largest honest row step (boost 1)
    assert float(norms[at]) == pytest.approx(float(others.max()), rel=1e-5)
    assert float(norms[at]) > 0


def test_one_round_of_attack_pushes_the_target_up_under_fedavg():
    bb, clients, counts = _world()
    fedavg = make_strategy("fedavg")
    specs = {s.name: s for s in bb.all_specs()}
    shared = init_shared_state(bb, 0)
    for r in range(1, 4):  # a few benign rounds, so users' heads learn what popular items look like
        shared = fedavg.aggregate(shared, [c.fit(shared, _config(r)) for c in clients], specs)
    benign = [c.fit(shared, _config(4)) for c in clients]
    pool = popular_pool(counts, 10, exclude=TARGET)
    attackers = [PromotionAttacker(100 + j, bb, TARGET, pool, profile_size=9, seed=0) for j in range(2)]
    bad = [a.fit(shared, _config(4)) for a in attackers]
    clean = fedavg.aggregate(shared, benign, specs)
    poisoned = fedavg.aggregate(shared, benign + bad, specs)

    def target_rank(state):
        ranks = []
        for c in clients:
            s = c.scores(state)
            ranks.append(int((s > s[TARGET]).sum()))
        return np.array(ranks)

    before, after = target_rank(clean), target_rank(poisoned)
    assert after.mean() < before.mean()
    assert (after <= before).mean() >= 0.8


def test_item_hits_on_a_hand_made_case():
    scores = torch.tensor(
        [
            [5.0, 4.0, 3.0, 2.0, 1.0],  # item 2 is third
            [1.0, 3.0, 3.0, 3.0, 0.0],  # item 2 tied with items 1 and 3, item 1 masked
            [9.0, 8.0, 0.0, 7.0, 6.0],
        ]
    )  # item 2 last, items 0 and 1 masked
    masked = sp.csr_matrix(np.array([[0, 0, 0, 0, 0], [0, 1, 1, 0, 0], [1, 1, 0, 0, 0]]))  # item 2 never masked
    hits = item_hits(scores, masked, 2, ks=(1, 2, 3))
    np.testing.assert_allclose(hits[1], [0.0, 0.5, 0.0])  # user 1: item 2 vs item 3 tied for first
    np.testing.assert_allclose(hits[2], [0.0, 1.0, 0.0])
    np.testing.assert_allclose(hits[3], [1.0, 1.0, 1.0])  # user 2: items 3 and 4 above it, 0 and 1 masked


def test_target_is_an_unpopular_warm_item_chosen_by_seed():
    counts = np.array([0, 50, 1, 40, 2, 30, 1, 20, 0, 10] * 5)
    picks = {choose_target(counts, s, quantile=0.2) for s in range(30)}
    assert picks <= set(np.flatnonzero((counts > 0) & (counts <= 1)))
    assert len(picks) > 1
    assert choose_target(counts, 4, 0.2) == choose_target(counts, 4, 0.2)


def test_attackers_take_part_at_the_real_rate():
    assert attacker_count(0.0, 943) == 0 and attacker_count(0.01, 943) == 9 and attacker_count(0.1, 943) == 94

    class Fake:
        def __init__(self, i):
            self.i = i

        def fit(self, shared, config):
            return self.i

    class Inner:
        def fit(self, cids, shared, config):
            return list(cids)

    sim = PoisonedSimulator(Inner(), [Fake(100 + i) for i in range(10)], n_eligible=50, seed=0)
    assert len(sim.fit(list(range(50)), {}, {"round": 1})) == 60
    assert len(sim.fit(list(range(25)), {}, {"round": 1})) == 30


def test_the_command_runs_end_to_end_on_tiny_data(tmp_path):
    from _bad_input import run_cli

    out = tmp_path / "poison"
    res = run_cli(
        "experiment",
        "poisoning",
        "synthetic:40x60",
        "--rounds",
        "2",
        "--eval-every",
        "1",
        "--seeds",
        "2",
        "--strategies",
        "fedavg,median",
        "--attackers",
        "0,0.1",
        "--out",
        out,
        "--no-progress",
        "--json",
    )
    assert res.code == 0, res.err
    assert {p.name for p in out.iterdir()} == {
        "poisoning.md",
        "poisoning.csv",
        "poisoning.png",
        "result.json",
        "config.toml",
        "cells",
        ".fedvlr.lock",
    }
    assert len(list((out / "cells").glob("*.json"))) == 8
    result = json.loads(res.out.strip().splitlines()[-1])
    assert [(r["strategy"], r["fraction"]) for r in result["rows"]] == [
        ("fedavg", 0.0),
        ("fedavg", 0.1),
        ("median", 0.0),
        ("median", 0.1),
    ]
    assert len(result["cells"]) == 8
    assert [r["attackers"] for r in result["rows"]] == [0, 4, 0, 4]
    assert all(0.0 <= r["exposure_hr@10"] <= 1.0 for r in result["rows"])
    assert result["rows"][1]["exposure_hr@10_p"] is not None or result["rows"][1]["exposure_hr@10_std"] >= 0
    assert "| median | 10% | 4 |" in (out / "poisoning.md").read_text()


def test_a_rerun_reads_finished_cells_back_and_refuses_other_settings(tmp_path):
    """The first grid trains its cells in two worker processes, each saving its own cell; the rerun, one cell after
    another, reads them back and retrains a lost one to the same figures (one torch thread in both)."""
    import torch
    from _bad_input import assert_user_error, run_cli

    out = tmp_path / "poison"
    argv = [
        "experiment",
        "poisoning",
        "synthetic:30x50",
        "--rounds",
        "2",
        "--eval-every",
        "1",
        "--seeds",
        "1",
        "--strategies",
        "fedavg",
        "--attackers",
        "0,0.1",
        "--out",
        out,
        "--json",
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = run_cli(*argv, "--jobs", "2")
        assert first.code == 0, first.err
        assert "2 cells side by side in 2 worker processes" in first.err
        # a killed grid: one cell's file is gone; the rerun trains only that one and gives the same table
        (out / "cells" / "seed0-fedavg-0.1.json").unlink()
        again = run_cli(*argv, "--jobs", "1")
    finally:
        torch.set_num_threads(threads)
    assert again.code == 0, again.err
    assert "seed0-fedavg-0: read back" in again.err and "seed0-fedavg-0.1: read back" not in again.err
    timing = ("cpu_s", "wall_s")
    rows = [
        [
            {k: v for k, v in row.items() if k not in timing}
            for row in json.loads(r.out.strip().splitlines()[-1])["rows"]
        ]
        for r in (first, again)
    ]
    assert rows[0] == rows[1]
    # the same folder under another setting is refused, naming the setting
    other = run_cli(*[a if a != "2" else "3" for a in argv])
    assert_user_error(other, "config.rounds")
