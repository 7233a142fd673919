"""Uploads aggregated a chunk at a time (``federation/simulation/running_sum.py``,
``federation/simulation/upload_stream.py``) give the
all-at-once aggregate: the same numbers whatever the chunking, the same up to float rounding in another order,
and the same training run when the engine streams a batched RecBole round."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedvlr_plus.adapters import ParamSpec
from fedvlr_plus.federation import ClientUpdate, make_strategy
from fedvlr_plus.federation.simulation.running_sum import RunningSums
from fedvlr_plus.federation.simulation.upload_stream import fit_streamed
from fedvlr_plus.federation.state.store import CompactStore
from fedvlr_plus.federation.strategies.base import example_weights

SPECS = {"table": ParamSpec("table", (50, 4), shared=True, item_table=True), "w": ParamSpec("w", (3,), shared=True)}
STRATEGIES = [
    ("fedavg", {}),
    ("sparse-avg", {}),
    ("fedgrad", {"server_lr": 0.7}),
    ("fedgrad", {"server_lr": 0.1, "server_optimizer": "adam"}),
]


def _uploads(kind: str, n_clients: int = 20, seed: int = 0) -> tuple[dict, list[ClientUpdate]]:
    g = torch.Generator().manual_seed(seed)
    shared = {"table": torch.randn(50, 4, generator=g), "w": torch.randn(3, generator=g)}
    ups = []
    for c in range(n_clients):
        rows = torch.randperm(50, generator=g)[: int(torch.randint(1, 30, (1,), generator=g))].sort().values
        ups.append(
            ClientUpdate(
                cid=c,
                kind=kind,
                arrays={"table": torch.randn(len(rows), 4, generator=g), "w": torch.randn(3, generator=g)},
                rows={"table": rows},
                num_examples=int(torch.randint(1, 9, (1,), generator=g)),
            )
        )
    return shared, ups


def _streamed(strategy, shared, ups, cuts, weights_of) -> dict:
    sums = RunningSums(shared, ["table"])
    bounds = [0, *cuts, len(ups)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        sums.add(ups[a:b], weights_of(ups[a:b]))
    return strategy.from_sums(shared, sums, SPECS)


@pytest.mark.parametrize("name,kw", STRATEGIES, ids=["fedavg", "sparse-avg", "fedgrad-sgd", "fedgrad-adam"])
def test_chunked_sums_equal_the_whole_list(name, kw):
    """Same order, any chunking: bit-equal; another order: equal to float rounding."""
    make = lambda: make_strategy(name, **kw)  # noqa: E731
    probe = make()
    shared, ups = _uploads(probe.upload)
    whole = make().aggregate(shared, ups, SPECS)
    w = dict(zip([u.cid for u in ups], example_weights(ups)))
    weights_of = lambda chunk: torch.stack([w[u.cid] for u in chunk])  # noqa: E731
    assert any(not torch.equal(whole[k], shared[k]) for k in shared)
    for cuts in ([1], [3, 10, 11], list(range(1, 20))):
        got = _streamed(make(), shared, ups, cuts, weights_of)
        assert all(torch.equal(got[k], whole[k]) for k in whole), cuts
    order = np.random.default_rng(1).permutation(len(ups))
    got = _streamed(make(), shared, [ups[i] for i in order], [5, 13], weights_of)
    for k in whole:
        assert torch.allclose(got[k], whole[k], rtol=1e-6, atol=1e-6), k


class _Chunks:
    """A simulator that hands over fixed uploads in two chunks."""

    def __init__(self, ups):
        self.ups = ups

    def fit_chunks(self, cids, shared, config):
        yield self.ups[:2]
        yield self.ups[2:]


def test_a_client_reporting_another_example_count_is_an_error():
    strategy = make_strategy("fedavg")
    shared, ups = _uploads("params", n_clients=4)
    examples = np.array([u.num_examples for u in ups])
    got = fit_streamed(_Chunks(ups), strategy, [u.cid for u in ups], shared, SPECS, {"round": 1}, examples)
    assert got.sums.count == 4 and len(got) == 4
    examples[3] += 1
    with pytest.raises(RuntimeError, match="client 3 reported"):
        fit_streamed(_Chunks(ups), strategy, [u.cid for u in ups], shared, SPECS, {"round": 1}, examples)
    with pytest.raises(RuntimeError, match="3 uploads for 4 clients"):
        fit_streamed(
            _Chunks(ups[:3]), strategy, [u.cid for u in ups], shared, SPECS, {"round": 1}, examples[:3].tolist() + [1]
        )


def test_only_linear_strategies_that_aggregate_from_the_sums_are_streamed():
    from fedvlr_plus.federation.simulation.upload_stream import can_stream
    from fedvlr_plus.federation.strategies.fedavg import FedAvgStrategy

    class OwnRule(FedAvgStrategy):  # linear by inheritance, but with its own aggregate
        def aggregate(self, shared, updates, specs):
            return super().aggregate(shared, updates, specs)

    sim = _Chunks([])
    assert can_stream(sim, make_strategy("fedavg")) and can_stream(sim, make_strategy("fedgrad", server_lr=1.0))
    assert not can_stream(sim, make_strategy("median")) and not can_stream(sim, OwnRule())
    assert not can_stream(object(), make_strategy("fedavg"))  # a simulator without chunks


def test_compact_store_with_a_capacity_makes_its_tables_once():
    vals = lambda n: {"h": torch.ones(n, 2)}  # noqa: E731
    grown, sized = CompactStore(), CompactStore(capacity=6)
    for store in (grown, sized):
        store.save_block(np.array([3]), vals(1))
        first = store._cols["h"]
        store.save_block(np.array([5]), vals(1))
    assert len(grown._cols["h"]) == 2  # one row per client written, doubled as they come
    assert len(sized._cols["h"]) == 6 and sized._cols["h"] is first  # made once, never regrown
    sized.save_block(np.array([9, 11, 12, 13, 14]), vals(5))  # seven clients: one past the capacity still fits
    assert len(sized._cols["h"]) == 7 and torch.equal(sized.load(9)["h"], torch.ones(2))
    assert torch.equal(sized.load(3)["h"], torch.ones(2)) and sized.load(4) is None


# ---------------------------------------------------------------------------------------------- the engine
@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # RecBole writes its logs under the working folder
    return tmp_path


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize(
    "kw", [dict(strategy="fedavg"), dict(strategy="fedgrad", server_lr=0.1)], ids=["fedavg", "fedgrad"]
)
def test_engine_streams_batched_recbole_rounds_with_the_whole_list_numbers(workdir, kw, monkeypatch):
    pytest.importorskip("recbole")
    from test_recbole_adapter import small_cfg, tiny_data

    from fedvlr_plus.adapters.recbole.backbone import federate
    from fedvlr_plus.federation import engine
    from fedvlr_plus.federation.engine import FederatedRun

    data = tiny_data()
    bb, _ = federate("BPR", data=data, workdir=workdir)
    cfg = replace(small_cfg(rounds=3, **kw), simulator="batched")
    runs = {}
    for streamed in (True, False):
        if not streamed:
            monkeypatch.setattr(engine, "can_stream", lambda sim, strategy: False)
        run = FederatedRun(data, bb, cfg, progress=False)
        run.sim.lanes_per_chunk = 40  # several chunks per round on the tiny data
        chunks = []
        real = run.sim.fit_chunks
        run.sim.fit_chunks = lambda *a, chunks=chunks, real=real, **k: (
            chunks.append(len(c)) or c for c in real(*a, **k)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no fallback to the one-at-a-time client
            for _ in range(3):
                run.run_round()
        runs[streamed] = (run, chunks)
    (a, chunks), (b, unused) = runs[True], runs[False]
    assert len(chunks) > 3 and max(chunks) < len(a.eligible) and not unused  # every round in chunks, the first too
    assert a.sim.fallback is None and a.sim.checked
    for k in a.shared:
        assert torch.allclose(a.shared[k], b.shared[k], rtol=1e-5, atol=1e-6), k
    start = FederatedRun(data, bb, cfg, progress=False).shared
    assert any(not torch.allclose(a.shared[k], start[k]) for k in start)  # the rounds trained something
    for c in a.eligible:
        sa, sb = a.store.load(int(c)), b.store.load(int(c))
        assert all(torch.allclose(sa[k], sb[k], rtol=1e-5, atol=1e-6) for k in sa)
    assert [r["loss"] for r in a.history] == pytest.approx([r["loss"] for r in b.history], rel=1e-6)
    assert [r["clients"] for r in a.history] == [len(a.eligible)] * 3
