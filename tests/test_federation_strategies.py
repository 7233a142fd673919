"""Aggregation strategies against hand-computed values."""

import math

import pytest
import torch

from fedvlr_plus.adapters import ParamSpec
from fedvlr_plus.federation import (
    ClientUpdate,
    CoordinateMedian,
    FedAvgStrategy,
    FedGradStrategy,
    SparseRowAvg,
    TrimmedMean,
    make_strategy,
)
from fedvlr_plus.federation.strategies.base import example_weights

SPECS = {"table": ParamSpec("table", (3, 2), shared=True, item_table=True), "w": ParamSpec("w", (2,), shared=True)}


def shared0():
    return {"table": torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]), "w": torch.tensor([0.0, 0.0])}


def upd(cid, n, rows, vals, w, kind="params"):
    return ClientUpdate(
        cid=cid,
        kind=kind,
        arrays={"table": torch.tensor(vals), "w": torch.tensor(w)},
        rows={"table": torch.tensor(rows)},
        num_examples=n,
    )


def test_weights_are_normalised():
    ups = [upd(0, 1, [0], [[0.0, 0.0]], [0.0, 0.0]), upd(1, 3, [0], [[0.0, 0.0]], [0.0, 0.0])]
    w = example_weights(ups)
    assert torch.allclose(w, torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert math.isclose(float(w.sum()), 1.0)


def test_fedavg_dense_semantics_for_untouched_rows():
    # client 0 (n=1) touched row 0 -> 5; client 1 (n=3) touched rows 0 -> 9 and 1 -> 10; row 2 untouched
    ups = [upd(0, 1, [0], [[5.0, 5.0]], [4.0, 0.0]), upd(1, 3, [0, 1], [[9.0, 9.0], [10.0, 10.0]], [0.0, 8.0])]
    out = FedAvgStrategy().aggregate(shared0(), ups, SPECS)
    # row 0: 0.25*5 + 0.75*9 = 8; row 1: 0.25*2 (client 0 keeps the global 2) + 0.75*10 = 8; row 2 unchanged
    assert torch.allclose(out["table"], torch.tensor([[8.0, 8.0], [8.0, 8.0], [3.0, 3.0]]))
    assert torch.allclose(out["w"], torch.tensor([1.0, 6.0]))


def test_sparse_row_average_only_over_contributors():
    ups = [upd(0, 1, [0], [[5.0, 5.0]], [4.0, 0.0]), upd(1, 3, [0, 1], [[9.0, 9.0], [10.0, 10.0]], [0.0, 8.0])]
    out = SparseRowAvg().aggregate(shared0(), ups, SPECS)
    # row 1 is averaged over client 1 alone -> 10 (FedAvg would give 8)
    assert torch.allclose(out["table"], torch.tensor([[8.0, 8.0], [10.0, 10.0], [3.0, 3.0]]))


def test_fedgrad_sgd_step_and_server_params_change():
    g = FedGradStrategy(server_lr=0.5, item_lr_scale=2.0)
    ups = [upd(0, 1, [0], [[4.0, 4.0]], [4.0, 0.0], "grads"), upd(1, 3, [1], [[8.0, 0.0]], [0.0, 4.0], "grads")]
    s0 = shared0()
    out = g.aggregate(s0, ups, SPECS)
    # grad table: row 0 = 0.25*4 = 1, row 1 = 0.75*[8,0] = [6,0]; item rows step with lr 0.5*2 = 1
    assert torch.allclose(out["table"], torch.tensor([[0.0, 0.0], [-4.0, 2.0], [3.0, 3.0]]))
    # dense: grad = [1, 3], lr 0.5
    assert torch.allclose(out["w"], torch.tensor([-0.5, -1.5]))
    assert not torch.equal(out["table"], s0["table"])  # the optimizer that owns the server state steps


def test_fedgrad_adam_by_hand():
    g = FedGradStrategy(server_lr=0.1, optimizer="adam")
    ups = [upd(0, 2, [0, 2], [[1.0, -2.0], [0.5, 0.5]], [3.0, 1.0], "grads")]
    s1 = g.aggregate(shared0(), ups, SPECS)
    # step 1: m_hat = g, v_hat = g^2, so every coordinate with g != 0 moves by lr * sign(g) (eps aside)
    expect = shared0()["table"] - 0.1 * torch.tensor([[1.0, -1.0], [0.0, 0.0], [1.0, 1.0]])
    assert torch.allclose(s1["table"], expect, atol=1e-6)
    assert torch.allclose(s1["w"], torch.tensor([-0.1, -0.1]), atol=1e-6)
    # step 2 with gradient 0 on w: m = 0.9 * 0.1 * g1, v = 0.999 * 0.001 * g1^2, bias corrections for t = 2
    zero = [upd(0, 2, [0], [[0.0, 0.0]], [0.0, 0.0], "grads")]
    state = g.state_dict()
    s2 = g.aggregate(s1, zero, SPECS)
    m_hat = 0.9 * 0.1 * 3.0 / (1 - 0.9**2)
    v_hat = 0.999 * 0.001 * 9.0 / (1 - 0.999**2)
    assert abs(float(s2["w"][0]) - (-0.1 - 0.1 * m_hat / (v_hat**0.5 + 1e-8))) < 1e-6
    # the state round-trips: a fresh strategy loaded with it takes the same step
    g2 = FedGradStrategy(server_lr=0.1, optimizer="adam")
    g2.load_state_dict(state)
    assert torch.allclose(g2.aggregate(s1, zero, SPECS)["w"], s2["w"])


def test_coordinate_median_and_trimmed_mean_resist_an_outlier():
    vals = [1.0, 2.0, 3.0, 1000.0]
    ups = [upd(i, 1, [0], [[v, -v]], [v, 0.0]) for i, v in enumerate(vals)]
    med = CoordinateMedian().aggregate(shared0(), ups, SPECS)
    assert torch.allclose(med["table"][0], torch.tensor([2.5, -2.5]))  # mean of the middle two
    assert torch.allclose(med["table"][1:], shared0()["table"][1:])  # untouched rows keep their value
    assert torch.allclose(med["w"], torch.tensor([2.5, 0.0]))
    tm = TrimmedMean(0.25).aggregate(shared0(), ups, SPECS)  # drop 1 per side of 4
    assert torch.allclose(tm["table"][0], torch.tensor([2.5, -2.5]))
    tm0 = TrimmedMean(0.0).aggregate(shared0(), ups, SPECS)  # no trimming = plain mean
    assert torch.allclose(tm0["w"], torch.tensor([251.5, 0.0]))


def test_row_groups_of_different_sizes():
    ups = [
        upd(0, 1, [0, 1], [[1.0, 1.0], [7.0, 7.0]], [0.0, 0.0]),
        upd(1, 1, [0], [[3.0, 3.0]], [0.0, 0.0]),
        upd(2, 1, [0], [[2.0, 2.0]], [0.0, 0.0]),
    ]
    med = CoordinateMedian(chunk_floats=2).aggregate(shared0(), ups, SPECS)  # tiny chunks: one row at a time
    assert torch.allclose(med["table"], torch.tensor([[2.0, 2.0], [7.0, 7.0], [3.0, 3.0]]))


def test_uploads_are_checked():
    bad = ClientUpdate(
        cid=0,
        kind="params",
        arrays={"table": torch.zeros(1, 2), "w": torch.zeros(2), "head": torch.zeros(2)},
        rows={"table": torch.tensor([0])},
        num_examples=1,
    )
    with pytest.raises(ValueError, match="not shared"):
        FedAvgStrategy().aggregate(shared0(), [bad], SPECS)
    grads = upd(0, 1, [0], [[0.0, 0.0]], [0.0, 0.0], "grads")
    with pytest.raises(ValueError, match="aggregates 'params'"):
        FedAvgStrategy().aggregate(shared0(), [grads], SPECS)
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("krum")
    with pytest.raises(ValueError, match="row ids"):
        ClientUpdate(cid=0, kind="params", arrays={"t": torch.zeros(2, 2)}, rows={"t": torch.tensor([0])}).validate()
    with pytest.raises(ValueError, match="kind"):
        ClientUpdate(cid=0, kind="weights", arrays={})


def test_message_round_trip_is_plain():
    u = upd(3, 5, [0, 2], [[1.0, 2.0], [3.0, 4.0]], [0.5, 0.5])
    msg = u.to_message()
    import numpy as np

    assert all(isinstance(v, np.ndarray) for v in msg["arrays"].values())
    back = ClientUpdate.from_message(msg)
    assert back.cid == 3 and back.num_examples == 5
    assert torch.equal(back.arrays["table"], u.arrays["table"]) and torch.equal(back.rows["table"], u.rows["table"])


def test_row_sums_do_not_depend_on_the_block_size():
    from fedvlr_plus.federation.strategies.base import weighted_row_sums

    ups = [
        upd(0, 1, [0], [[5.0, 5.0]], [4.0, 0.0]),
        upd(1, 3, [0, 1], [[9.0, 9.0], [10.0, 10.0]], [0.0, 8.0]),
        upd(2, 4, [2, 1], [[1.0, 2.0], [3.0, 4.0]], [0.0, 0.0]),
    ]
    w = example_weights(ups)
    one = weighted_row_sums(ups, "table", (3, 2), w, torch.float32)
    tiny = weighted_row_sums(ups, "table", (3, 2), w, torch.float32, block_floats=2)  # one upload per block
    assert torch.allclose(one[0], tiny[0]) and torch.allclose(one[1], tiny[1])
    # row 1: 3/8 * 10 + 4/8 * 3 = 5.25 ; weight 7/8
    assert torch.allclose(one[0][1], torch.tensor([5.25, 5.75])) and abs(float(one[1][1]) - 0.875) < 1e-12
