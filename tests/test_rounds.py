"""The shared round loop (order of the steps, evaluation schedule, store protocol) and the one server Adam."""

import torch

from fedvlr_plus.adapters import ParamSpec
from fedvlr_plus.alignment.fedvpa_gp.method import fedadam_step
from fedvlr_plus.federation import ClientUpdate, FedGradStrategy, RoundLoop, ServerAdam
from fedvlr_plus.federation.rounds import fit_each, over_the_wire
from fedvlr_plus.federation.state.plain import join_tensors, split_tensors


class _Client:
    def __init__(self, cid, calls):
        self.cid, self.calls = cid, calls

    def fit(self, message, config):
        self.calls.append(("fit", self.cid, config["round"]))
        return ClientUpdate(cid=self.cid, kind="params", arrays={"w": message["w"] + self.cid}, num_examples=1)


class _Store:
    def __init__(self, calls):
        self.calls = calls

    def begin_round(self, r):
        self.calls.append(("begin", r))

    def prepare(self, r):
        self.calls.append(("prepare", r))

    def commit(self):
        self.calls.append(("commit",))


def _loop(calls, **kw):
    clients = [_Client(c, calls) for c in range(3)]

    def aggregate(r, state, updates, config):
        calls.append(("aggregate", r, [u.cid for u in updates]))
        return {"w": torch.stack([u.arrays["w"] for u in updates]).mean(0)}, {"round": r}

    return RoundLoop(clients, aggregate, **kw)


def test_one_round_runs_its_steps_in_order():
    calls = []
    loop = _loop(
        calls,
        sample=lambda r: loop.clients[1:],
        store=_Store(calls),
        evaluate=lambda r, s: calls.append(("evaluate", r)) or {"valid": float(s["w"][0])},
        checkpoint=lambda r, s, rec: calls.append(("checkpoint", r, dict(rec))),
        on_round=lambda r, s, rec: calls.append(("on_round", r)),
    )
    state, record = loop.step(4, {"w": torch.zeros(1)})
    assert calls == [
        ("begin", 4),
        ("fit", 1, 4),
        ("fit", 2, 4),
        ("aggregate", 4, [1, 2]),
        ("prepare", 4),
        ("evaluate", 4),
        ("checkpoint", 4, {"round": 4, "valid": 1.5}),
        ("commit",),
        ("on_round", 4),
    ]
    assert record == {"round": 4, "valid": 1.5} and state["w"].item() == 1.5


def test_evaluation_every_n_rounds_and_at_the_last():
    calls = []
    loop = _loop(calls, evaluate=lambda r, s: {"evaluated": True}, eval_every=3, last_round=7)
    _, history = loop.run({"w": torch.zeros(1)}, range(1, 8))
    assert [h["round"] for h in history if "evaluated" in h] == [3, 6, 7]
    assert [c[2] for c in calls if c[0] == "fit" and c[1] == 0] == list(range(1, 8))


def test_configure_sets_message_and_config_and_every_client_fits_by_default():
    calls = []
    loop = _loop(calls, configure=lambda r, s: ({"w": s["w"] * 10}, {"round": r + 100}))
    state, _ = loop.step(1, {"w": torch.ones(1)})
    assert [c for c in calls if c[0] == "fit"] == [("fit", 0, 101), ("fit", 1, 101), ("fit", 2, 101)]
    assert state["w"].item() == 11.0  # mean of 10 + cid over the three clients


def test_over_the_wire_hands_the_server_copies():
    calls = []
    clients = [_Client(0, calls)]
    sent = fit_each(clients, {"w": torch.ones(2)}, {"round": 1})
    got = over_the_wire(fit_each)(clients, {"w": torch.ones(2)}, {"round": 1})
    assert torch.equal(got[0].arrays["w"], sent[0].arrays["w"])
    got[0].arrays["w"] += 5  # the server's copy is its own
    assert torch.equal(sent[0].arrays["w"], torch.ones(2))


def test_server_adam_against_the_formula_written_out():
    adam = ServerAdam()
    p = torch.tensor([1.0, -2.0])
    grads = [torch.tensor([0.5, -4.0]), torch.tensor([-1.0, 2.0])]
    m = v = torch.zeros(2)
    want = p
    for t, g in enumerate(grads, 1):
        adam.tick()
        p = adam.update("p", p, g, 0.1)
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        want = want - 0.1 * (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-8)
    assert torch.allclose(p, want, atol=1e-7)
    assert adam.t == 2 and not torch.equal(p, torch.tensor([1.0, -2.0]))


def test_fedgrad_and_fedadam_take_the_same_adam_step():
    specs = {"net.w": ParamSpec("net.w", (3,), shared=True)}
    old = {"net.w": torch.tensor([1.0, -2.0, 0.5])}
    fedgrad = FedGradStrategy(server_lr=0.05, optimizer="adam")
    adam = ServerAdam()
    state = old
    for g in (torch.tensor([0.3, -0.1, 2.0]), torch.tensor([-0.2, 0.4, 1.0])):
        up = ClientUpdate(cid=0, kind="grads", arrays={"net.w": g}, num_examples=2)
        new = fedgrad.aggregate(state, [up], specs)
        # FedAdam's pseudo-gradient old - averaged equals g when averaged = old - g
        via_fedadam = fedadam_step(adam, state, {"net.w": state["net.w"] - g}, lr=0.05)
        assert torch.allclose(new["net.w"], via_fedadam["net.w"], atol=1e-7)
        state = new


def test_fedgrad_adam_state_round_trips_through_a_checkpoint_exactly():
    specs = {"w": ParamSpec("w", (4,), shared=True)}
    s = {"w": torch.randn(4, generator=torch.Generator().manual_seed(0))}
    a = FedGradStrategy(server_lr=0.1, optimizer="adam")
    ups = [ClientUpdate(cid=0, kind="grads", arrays={"w": torch.tensor([0.1, -0.2, 0.3, 0.0])}, num_examples=1)]
    for _ in range(3):
        s = a.aggregate(s, ups, specs)
    b = FedGradStrategy(server_lr=0.1, optimizer="adam")
    b.load_state_dict(join_tensors(*split_tensors(a.state_dict())))
    assert torch.equal(b.aggregate(s, ups, specs)["w"], a.aggregate(s, ups, specs)["w"])
    assert b.adam.t == a.adam.t == 4
    assert FedGradStrategy(server_lr=0.1).state_dict() == {}
