"""A node's aggregate upload (fedvlr_plus.flower.node_sums) and the progress a waiting ``flower run`` prints: fast
in-process checks, no Flower processes."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedvlr-plus[flower]')")

from fedvlr_plus.federation.messages import ClientUpdate  # noqa: E402
from fedvlr_plus.federation.simulation.running_sum import RunningSums  # noqa: E402
from fedvlr_plus.federation.simulation.upload_stream import StreamedUploads  # noqa: E402
from fedvlr_plus.federation.strategies.base import example_weights, summed  # noqa: E402
from fedvlr_plus.flower import node_sums  # noqa: E402
from fedvlr_plus.flower.deploy import wait_for_result  # noqa: E402
from fedvlr_plus.flower.progress import ProgressFile  # noqa: E402

SHARED = {"item": torch.zeros(30, 4), "w": torch.zeros(3, 2)}
SPECS = {"item": SimpleNamespace(item_table=True), "w": SimpleNamespace(item_table=False)}


def _uploads(g, cids):
    out = []
    for c in cids:
        rows = torch.from_numpy(np.sort(g.choice(30, size=int(g.integers(1, 8)), replace=False)))
        out.append(
            ClientUpdate(
                cid=int(c),
                kind="params",
                arrays={"item": torch.randn(len(rows), 4), "w": torch.randn(3, 2)},
                rows={"item": rows},
                num_examples=int(g.integers(1, 20)),
                metrics={"loss": float(g.random())},
            )
        )
    return out


def _node_reply(updates):
    """What a node sends: its users' sums weighted within the node, as the engine's streamed round makes them."""
    sums = RunningSums(SHARED, ["item"])
    sums.add(updates, example_weights(updates))
    n = np.array([u.num_examples for u in updates], dtype=np.float64)
    losses = np.array([u.metrics["loss"] for u in updates])
    return node_sums.sums_to_content(StreamedUploads(sums, n, losses), [u.cid for u in updates])


def test_node_sums_merged_on_the_server_equal_the_sums_of_every_upload():
    torch.manual_seed(0)
    g = np.random.default_rng(0)
    a, b = _uploads(g, range(0, 7)), _uploads(g, range(7, 12))
    merged, loss, n_all, cids = node_sums.merged_sums([_node_reply(a), _node_reply(b)], SHARED, {"item"})
    whole = summed(SHARED, a + b, SPECS, "params")
    for name in ("item",):
        for got, want in zip(merged.row_sums(name), whole.row_sums(name)):
            assert torch.allclose(got.double(), want.double(), atol=1e-6)
    assert torch.allclose(merged.dense_sum("w"), whole.dense_sum("w"), atol=1e-9)
    n = np.array([u.num_examples for u in a + b], dtype=np.float64)
    assert loss == pytest.approx(float(np.dot(n, [u.metrics["loss"] for u in a + b]) / n.sum()))
    assert n_all == int(n.sum()) and sorted(cids) == list(range(12)) and merged.count == 12


def test_node_sums_that_do_not_fit_the_shared_state_are_refused():
    reply = _node_reply(_uploads(np.random.default_rng(1), range(3)))
    with pytest.raises(ValueError, match="do not fit"):
        node_sums.merged_sums([reply], {"item": torch.zeros(30, 5), "w": torch.zeros(3, 2)}, {"item"})
    with pytest.raises(ValueError, match="lack"):
        node_sums.merged_sums([reply], {**SHARED, "extra": torch.zeros(2)}, {"item"})


def test_a_waiting_run_prints_each_stage_then_returns_the_result(tmp_path):
    result = tmp_path / "r.json"
    progress = ProgressFile(str(result), rounds=2)

    def server():
        progress.sent(1, "train", 3)
        time.sleep(0.3)
        progress.arrived(2, 3)
        time.sleep(0.3)
        progress.replied(1, "train", 3, 3, loss=0.5)
        time.sleep(0.3)
        result.write_text('{"selected_round": 1}')

    t = threading.Thread(target=server)
    lines = []
    t.start()
    got = wait_for_result(result, 10, progress=lines.append, every=60)
    t.join()
    assert got == {"selected_round": 1}
    assert any("round 1/2 train: 2 of 3 nodes replied so far" in x for x in lines), lines
    assert any("round 1/2 train: 3 of 3 nodes replied in" in x and "loss 0.5000" in x for x in lines), lines


class _SlowGrid:
    """A grid whose replies come in one per pull: what reply polling sees of a real SuperLink."""

    def __init__(self):
        self.pulls = 0
        self.other = "delegated"

    def push_messages(self, messages):
        self.pending = [m for m in messages]
        return [f"id{i}" for i in range(len(self.pending))]

    def pull_messages(self, ids):
        self.pulls += 1
        ready = sorted(ids)[:1]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ready]


def test_reply_polling_collects_every_reply_and_reports_each_arrival():
    from fedvlr_plus.flower.reply_poll import QuickPollGrid

    seen = []
    grid = QuickPollGrid(_SlowGrid(), 0.01, on_reply=lambda got, expected: seen.append((got, expected)))
    replies = grid.send_and_receive(["a", "b", "c"], timeout=5)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["id0", "id1", "id2"]
    assert seen == [(1, 3), (2, 3), (3, 3)] and grid.other == "delegated"


def test_reply_polling_stops_at_the_timeout():
    from fedvlr_plus.flower.reply_poll import QuickPollGrid

    class Silent(_SlowGrid):
        def pull_messages(self, ids):
            return []

    started = time.time()
    assert QuickPollGrid(Silent(), 0.05).send_and_receive(["a"], timeout=0.3) == []
    assert time.time() - started < 2


def test_the_waited_result_is_printed_as_run_prints_it():
    from fedvlr_plus.cli.flower import _result_table

    result = {
        "dataset": "ku",
        "backbone": "fedavg+fedvlr",
        "strategy": "fedgrad",
        "rounds_run": 20,
        "selected_round": 17,
        "valid": {"hr@10": 0.5, "ndcg@10": 0.25},
        "test": {"hr@10": 0.2, "ndcg@10": 0.125},
        "n_users": 204,
        "test_warm": {"hr@10": 0.3, "ndcg@10": 0.15},
        "test_warm_n_users": 116,
        "test_cold": {"hr@10": 0.0, "ndcg@10": 0.0},
        "test_cold_n_users": 88,
    }
    lines = _result_table(result).splitlines()
    assert lines[0] == "ku | fedavg+fedvlr | flower, fedgrad | 20 rounds, selected round 17"
    assert lines[1].split() == ["hr@10", "ndcg@10"]
    assert lines[3].split() == ["test", "0.2000", "0.1250", "(204", "users)"]
    assert [x.split()[:2] for x in lines[4:]] == [["test", "warm"], ["test", "cold"]]
