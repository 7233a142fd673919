"""fedvlr-plus under Flower's deployment engine: real SuperLink and SuperNode processes on loopback.

- the deployment (3 SuperNodes training their users with the batched simulator and sending one aggregate each,
  FedAvg-MF with the FedVLR layer, 2 rounds, 24 KU users) ends with the sequential simulator's metrics;
- nothing the ServerApp received holds private state (router, user embedding): names and values checked;
- a SuperNode killed in the middle of a round: the round finishes with the other two, and the node, restarted,
  resumes from its private state file, which the kill left intact;
- every process is ended afterwards (checked), also when a test fails (fixture finalizer, process groups).

Plus fast in-process checks of the wire format, the settings and the partitioning.
"""

from __future__ import annotations

import hashlib
import json
import signal
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedvlr-plus[flower]')")

from _shared import shared_data  # noqa: E402

from fedvlr_plus.errors import ConfigError  # noqa: E402
from fedvlr_plus.federation.messages import ClientUpdate  # noqa: E402
from fedvlr_plus.flower import app as fl  # noqa: E402

N_NODES, N_USERS = 3, 24


def base_config(tmp: Path, **kw) -> dict:
    cfg = {
        "data": str(shared_data("ku")),
        "max-users": N_USERS,
        "backbone": "fedavg",
        "fusion": "fedvlr",
        "dim": 16,
        "rounds": 2,
        "local-epochs": 1,
        "eval-every": 2,
        "seed": 3,
        "min-train-nodes": N_NODES,
        "min-evaluate-nodes": N_NODES,
        "min-available-nodes": N_NODES,
        "round-timeout": 180,
        "result": str(tmp / "result.json"),
        "audit-dir": str(tmp / "audit"),
    }
    cfg.update(kw)
    return cfg


# ---------------------------------------------------------------------------------------------- fast checks
def test_wire_format_round_trip_keeps_rows_and_weights():
    ups = [
        ClientUpdate(
            cid=7,
            kind="grads",
            arrays={"fusion.F": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)},
            rows={"fusion.F": torch.tensor([4, 9])},
            num_examples=5,
            metrics={"loss": 0.5, "steps": 2},
        ),
        ClientUpdate(
            cid=2,
            kind="grads",
            arrays={"fusion.F": torch.zeros(1, 3), "b": torch.zeros(2)},
            rows={"fusion.F": torch.tensor([1])},
            num_examples=3,
            metrics={"loss": 0.25, "steps": 1},
        ),
    ]
    content = fl.updates_to_content(ups)
    assert sorted(content["arrays"].keys()) == [
        "u2/b",
        "u2/fusion.F",
        "u2/fusion.F/rows",
        "u7/b",
        "u7/fusion.F",
        "u7/fusion.F/rows",
    ]
    assert content["metrics"]["num-examples"] == 8
    back = fl.content_to_updates(content, "grads")
    assert [u.cid for u in back] == [7, 2]
    assert torch.equal(back[0].arrays["fusion.F"], ups[0].arrays["fusion.F"])
    assert back[0].rows["fusion.F"].tolist() == [4, 9] and back[1].num_examples == 3
    assert back[0].metrics["loss"] == 0.5


def test_reply_with_a_foreign_user_is_refused():
    content = fl.updates_to_content([ClientUpdate(cid=1, kind="params", arrays={"b": torch.ones(2)}, num_examples=1)])
    content["arrays"]["u5/b"] = content["arrays"]["u1/b"]
    with pytest.raises(ValueError, match="user 5"):
        fl.content_to_updates(content, "params")


def test_partitions_cover_every_user_once():
    parts = [fl.partition_users(10, i, 3) for i in range(3)]
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    with pytest.raises(ValueError, match="partition-id"):
        fl.partition_users(10, 3, 3)


def test_settings_from_run_config():
    s = fl.Settings.from_run_config(
        {
            "data": "ml-100k",
            "local-epochs": 2,
            "ks": "10,50",
            "strategy": "",
            "server-lr": 0.0,
            "min-train-nodes": 2,
            "fusion": "fedvlr",
        }
    )
    assert s.cfg.local_epochs == 2 and s.cfg.ks == (10, 50) and s.cfg.strategy is None and s.cfg.server_lr is None
    assert s.min_train_nodes == 2 and s.fusion == "fedvlr"
    with pytest.raises(ValueError, match="unknown key 'epochs'"):
        fl.Settings.from_run_config({"data": "x", "epochs": 3})
    with pytest.raises(ValueError, match="'data'"):
        fl.Settings.from_run_config({"rounds": 3})


class LoopbackGrid:
    """A Flower ``Grid`` without processes: messages go straight to the ClientApp handlers of N in-process
    nodes, each with its own persistent ``Context`` (as a SuperNode keeps it). For fast checks only."""

    def __init__(self, run_config: dict, n_nodes: int, state_root: Path):
        from flwr.app import Context, RecordDict
        from flwr.supercore.task_identity import TaskIdentity

        # what Flower's ServerApp process sets before messages can be created
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0
        self.contexts = {
            100 + i: Context(
                run_id=7,
                node_id=100 + i,
                state=RecordDict(),
                run_config=run_config,
                node_config={"partition-id": i, "num-partitions": n_nodes, "state-dir": str(state_root / f"node{i}")},
            )
            for i in range(n_nodes)
        }

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            handler = fl.node_train if m.metadata.message_type == "train" else fl.node_evaluate
            out.append(handler(m, self.contexts[m.metadata.dst_node_id]))
        return out


def run_loopback(cfg: dict, tmp: Path, n_nodes: int = 3) -> dict:
    from flwr.app import Context, RecordDict
    from flwr.serverapp import Grid

    grid = type(
        "Loopback",
        (LoopbackGrid, Grid),
        {k: (lambda *a, **k: None) for k in ("set_run", "run", "create_message", "push_messages", "pull_messages")},
    )(cfg, n_nodes, tmp)
    # these grids answer send_and_receive only (no push/pull): Flower's own wait, not reply-poll-interval's
    cfg = {**cfg, "reply-poll-interval": 0}
    return fl.server_main(grid, Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))


@pytest.mark.parametrize(
    "extra",
    [
        {"fusion": "none", "strategy": "sparse-avg", "backbone": "fedncf"},
        {"fusion": "none", "strategy": "fedgrad", "server-lr": 0.5, "backbone": "fcf"},
    ],
)
def test_flower_strategy_in_process_equals_simulator(tmp_path, extra):
    """The ServerApp's strategy loop with our sparse row averaging / gradient aggregation, nodes in-process."""
    from fedvlr_plus.federation.run_seeds import run_federated

    cfg = base_config(tmp_path, **{"max-users": 12, "eval-every": 1, **extra})
    res = run_loopback(cfg, tmp_path)
    s = fl.Settings.from_run_config(cfg)
    data = fl.load_data(s.data, s.max_users)
    sim = run_federated(data, fl.build_backbone(data, s), replace(s.cfg, simulator="sequential"), progress=False)
    assert res["selected_round"] == sim["selected_round"] and res["strategy"] == extra["strategy"]
    for part in ("valid", "test"):
        for k, v in sim[part].items():
            assert res[part][k] == pytest.approx(v, abs=1e-4), (part, k)
    assert [h["valid"]["hr@50"] for h in res["history"]] == pytest.approx(
        [h["valid"]["hr@50"] for h in sim["history"]], abs=1e-4
    )
    assert json.loads(Path(cfg["result"]).read_text())["selected_round"] == res["selected_round"]


def test_node_keeps_private_state_in_its_file(tmp_path):
    """A node's store is written to its state file after each local training; a process that starts afresh (a
    new ClientApp process, a restarted SuperNode) reads the states back from it, the same tensors."""
    cfg = base_config(
        tmp_path,
        **{
            "max-users": 6,
            "fusion": "none",
            "rounds": 2,
            "eval-every": 2,
            "min-train-nodes": 2,
            "min-evaluate-nodes": 2,
            "min-available-nodes": 2,
        },
    )
    run_loopback(cfg, tmp_path, n_nodes=2)
    journal = tmp_path / "node1" / "journal-run7-part1of2.jsonl"
    events = [json.loads(x)["event"] for x in journal.read_text().splitlines()]
    assert events == ["fit-start", "saved", "fit-done", "fit-start", "saved", "fit-done"]  # one process: no restore
    from flwr.app import Context, RecordDict

    ctx = Context(
        run_id=7,
        node_id=5,
        state=RecordDict(),
        run_config=cfg,
        node_config={"partition-id": 1, "num-partitions": 2, "state-dir": str(tmp_path / "node1")},
    )
    fl._NODE_CACHE.clear()  # what a fresh ClientApp process holds
    node = fl.node_run(ctx)
    assert node.run.store.load(4) is None
    node.state.restore_into(node.run.store)
    saved_round, on_disk = fl.read_states(tmp_path / "node1" / "private-run7-part1of2.pt")
    assert saved_round == 2 and sorted(on_disk) == [3, 4, 5]
    st = node.run.store.load(4)
    assert st.keys() == on_disk[4].keys() and all(torch.equal(st[k], on_disk[4][k]) for k in st)
    restored = json.loads(journal.read_text().splitlines()[-1])
    assert restored["event"] == "restore" and restored["round"] == 2
    assert restored["sha256"] == fl.file_digest(tmp_path / "node1" / "private-run7-part1of2.pt")


@pytest.mark.parametrize(
    "extra",
    [
        {"fusion": "fedvlr"},
        {"fusion": "none", "strategy": "fedavg", "backbone": "fedncf"},
        {"fusion": "none", "strategy": "median", "backbone": "fedavg"},
    ],
)
def test_batched_nodes_equal_the_sequential_reference_nodes(tmp_path, extra):
    """Nodes that train with the batched simulator (one aggregate per node where the strategy is linear, each
    upload for the median) end with the figures of nodes that run the sequential reference clients."""
    cfg = base_config(tmp_path, **{"max-users": 12, "eval-every": 1, **extra})
    batched = run_loopback({**cfg, "result": str(tmp_path / "b.json")}, tmp_path / "b")
    audit = sorted((tmp_path / "audit" / "round001-train").glob("*.json"))
    keys = json.loads(audit[0].read_text())["arrays"]
    linear = extra.get("strategy") != "median"
    assert all(k.startswith("arrays::sums/") for k in keys) == linear and keys
    fl._NODE_CACHE.clear()
    reference = run_loopback(
        {**cfg, "simulator": "sequential", "result": str(tmp_path / "s.json"), "audit-dir": ""}, tmp_path / "s"
    )
    assert batched["selected_round"] == reference["selected_round"]
    for part in ("valid", "test", "test_warm", "test_cold"):
        for k, v in reference[part].items():
            assert batched[part][k] == pytest.approx(v, abs=1e-4), (part, k)
    assert [h["loss"] for h in batched["history"]] == pytest.approx([h["loss"] for h in reference["history"]], abs=1e-5)
    assert [h["clients"] for h in batched["history"]] == [12, 12]


# ---------------------------------------------------------------------------------------------- real processes
@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """A SuperLink and 3 SuperNodes (partitions 0/3, 1/3, 2/3) on loopback, for the whole module."""
    shared_data("ku")
    from _flower_harness import Federation

    fed = Federation(tmp_path_factory.mktemp("flower"))
    try:
        fed.start_superlink()
        for i in range(N_NODES):
            fed.start_supernode(i, N_NODES)
        yield fed
    finally:
        left = fed.close()
        assert not left, f"processes still alive after the tests: {left}"


@pytest.fixture(scope="module")
def deployed(federation, tmp_path_factory):
    """One 2-round run of FedAvg-MF + FedVLR on 24 KU users over the 3 SuperNodes."""
    tmp = tmp_path_factory.mktemp("run-a")
    cfg = base_config(tmp)
    t0 = time.perf_counter()
    sub = federation.submit(cfg)
    res = federation.wait_result(tmp / "result.json", timeout=400)
    return {"cfg": cfg, "run_id": int(sub["run-id"]), "result": res, "tmp": tmp, "seconds": time.perf_counter() - t0}


@pytest.mark.slow  # real processes: SuperLink start-up, a torch import per Flower message
def test_deployment_matches_the_simulator(deployed):
    from fedvlr_plus.federation.run_seeds import run_federated

    s = fl.Settings.from_run_config({k: v for k, v in deployed["cfg"].items()})
    data = fl.load_data(s.data, s.max_users)
    sim = run_federated(data, fl.build_backbone(data, s), replace(s.cfg, simulator="sequential"), progress=False)
    res = deployed["result"]
    assert res["rounds_run"] == 2 and res["selected_round"] == sim["selected_round"]
    assert [h["nodes"] for h in res["history"]] == [N_NODES, N_NODES]
    assert [h["clients"] for h in res["history"]] == [N_USERS, N_USERS]
    for part in ("valid", "test", "test_warm", "test_cold"):
        assert set(res[part]) == set(sim[part])
        for k, v in sim[part].items():
            assert res[part][k] == pytest.approx(v, abs=1e-4), (part, k)
    # the per-round training loss (example-weighted over users) is the simulator's too
    assert [h["loss"] for h in res["history"]] == pytest.approx([h["loss"] for h in sim["history"]], abs=1e-6)
    assert res["n_users"] == sim["n_users"]
    print(f"deployment run: {deployed['seconds']:.1f} s")


def _private_states(state_dir: Path, run_id: int) -> dict[int, dict]:
    files = sorted(state_dir.glob(f"private-run{run_id}-part*.pt"))
    assert len(files) == 1, files
    return fl.read_states(files[0])[1]


@pytest.mark.slow  # real processes: SuperLink start-up, a torch import per Flower message
def test_private_state_never_reaches_the_server(deployed, federation):
    run_id = deployed["run_id"]
    audit = Path(deployed["cfg"]["audit-dir"])
    private = {}
    for i in range(N_NODES):
        private.update(_private_states(federation.supernode_state(i), run_id))
    assert sorted(private) == list(range(N_USERS))
    names = set(next(iter(private.values())))
    s = fl.Settings.from_run_config(deployed["cfg"])
    shared_names = set(fl.build_backbone(fl.load_data(s.data, s.max_users), s).shared_names)
    assert shared_names == {"fusion.F"} and not shared_names & names
    assert {"router.w1", "router.b1", "router.w2", "router.b2"} <= names
    replies = sorted(audit.glob("round*/node*.npz"))
    assert len(replies) == 2 * N_NODES + N_NODES  # 2 training rounds + 1 evaluation, 3 nodes each
    # every private vector (a row of a matrix, or a whole vector) with at least 3 non-zero values
    private_rows = [
        r[r != 0]
        for st in private.values()
        for v in st.values()
        for r in (v.numpy().reshape(-1, v.shape[-1]) if v.dim() > 1 else v.numpy().reshape(1, -1))
    ]
    private_rows = [r for r in private_rows if len(r) >= 3]
    assert len(private_rows) > 100
    for f in replies:
        meta = json.loads(f.with_suffix(".json").read_text())
        arrays = np.load(f)
        uploaded = []
        for key in arrays.files:
            rname, _, aname = key.partition("::")
            assert rname == "arrays"
            head, _, rest = aname.partition("/")  # sums/<name>[/rows|/weight]: the node's aggregate
            assert head == "sums" and rest.split("/")[0] in shared_names, aname
            assert not any(n in rest for n in names), f"{f}: {aname} carries private state"
            if not aname.endswith(("/rows", "/weight")):
                uploaded.append(arrays[key].astype(np.float32).ravel())
        if uploaded:
            values = np.unique(np.concatenate(uploaded))
            # no private vector is contained in what the node sent (values may coincide one by one, by chance)
            assert not any(np.isin(r, values).all() for r in private_rows), f"{f} holds a private vector"
        if "evaluate" in f.parent.name:  # evaluation replies: metric sums only, no arrays
            assert arrays.files == [] and meta["records"] == ["metrics"]
            assert all(
                k.split("/")[-1] in ("n",) or "@" in k or k == "num-examples" for k in meta["scalars"]["metrics"]
            )


def _journal(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow  # real processes: SuperLink start-up, a torch import per Flower message
def test_killed_supernode_rejoins_with_its_private_state(federation, deployed, tmp_path):
    """Run B: 3 rounds; the node of partition 2 is killed while it trains in round 2. Round 2 is aggregated from
    the other two nodes (min-train-nodes 2); the node restarts, rejoins in round 3 from its state file, which is
    byte-for-byte the file it had before the kill."""
    victim = N_NODES - 1
    cfg = base_config(
        tmp_path,
        rounds=3,
        **{"eval-every": 3, "min-train-nodes": 2, "fault-partition": victim, "fault-round": 2, "fault-delay-s": 120.0},
    )
    sub = federation.submit(cfg)
    run_id = int(sub["run-id"])
    state_dir = federation.supernode_state(victim)
    journal = state_dir / f"journal-run{run_id}-part{victim}of{N_NODES}.jsonl"
    state_file = state_dir / f"private-run{run_id}-part{victim}of{N_NODES}.pt"
    deadline = time.time() + 300
    while not any(e["event"] == "fit-start" and e["round"] == 2 for e in _journal(journal)):
        assert time.time() < deadline, "the victim never started round 2\n" + federation.logs()
        time.sleep(0.1)
    before = state_file.read_bytes()
    federation.kill(f"supernode-{victim}", sig=signal.SIGTERM)  # SIGTERM to the node, then SIGKILL to its group
    after_kill = state_file.read_bytes()
    assert after_kill == before  # the kill left the file as it was
    saved_round, saved = fl.read_states(state_file)
    assert saved_round == 1 and sorted(saved) == fl.partition_users(N_USERS, victim, N_NODES).tolist()
    federation.start_supernode(victim, N_NODES, tag="-restarted")
    res = federation.wait_result(tmp_path / "result.json", timeout=400)

    assert [h["nodes"] for h in res["history"]] == [3, 2, 3]
    n_victim = len(fl.partition_users(N_USERS, victim, N_NODES))
    assert [h["clients"] for h in res["history"]] == [N_USERS, N_USERS - n_victim, N_USERS]
    assert res["selected_round"] == 3 and res["test"]["hr@50"] is not None
    events = _journal(journal)
    assert [e["round"] for e in events if e["event"] == "fit-done"] == [1, 3]
    # every message runs in a fresh ClientApp process, which reads the node's states from its file: the restarted
    # node's round 3 started from the round-1 file the kill left intact
    rejoined = events.index(next(e for e in events if e["event"] == "fit-start" and e["round"] == 3))
    restore = next(e for e in events[rejoined:] if e["event"] == "restore")
    assert restore["round"] == 1 and restore["sha256"] == hashlib.sha256(after_kill).hexdigest()
    assert fl.read_states(state_file)[0] == 3


def test_flower_command_lines():
    from fedvlr_plus.cli.flower import parse_partition
    from fedvlr_plus.flower import deploy as fc

    link = fc.superlink_command(port=9999, insecure=True)
    assert link[1:] == [
        "--insecure",
        "--host",
        "127.0.0.1",
        "--port",
        "9999",
        "--disable-runtime-dependency-installation",
    ]
    node = fc.supernode_command(
        superlink="10.0.0.1:9093", partition=(1, 4), runtime_port=9200, root_certificates="ca.crt", state_dir="/tmp/s"
    )
    assert node[1:3] == ["--root-certificates", "ca.crt"]
    assert node[node.index("--node-config") + 1] == 'partition-id=1 num-partitions=4 state-dir="/tmp/s"'
    with pytest.raises(ConfigError, match="--insecure"):
        fc.superlink_command(port=1)  # neither TLS files nor --insecure
    with pytest.raises(ConfigError, match="both"):
        fc.supernode_command(superlink="x:1", partition=(0, 1), insecure=True, root_certificates="ca.crt")
    assert parse_partition("2/3") == (2, 3)
    with pytest.raises(Exception, match="0 <= I < N"):
        parse_partition("3/3")
    run = fc.run_command("examples/flower_app", config={"rounds": "3", "data": "/d/ku", "fusion": "fedvlr"})
    assert run[-1] == 'rounds=3 data="/d/ku" fusion="fedvlr"'


def test_flower_run_wait_needs_a_result_path(capsys):
    from fedvlr_plus.cli import main

    assert main(["flower", "run", "examples/flower_app", "--superlink", "127.0.0.1:1", "--insecure", "--wait"]) == 2
    assert "result=PATH" in capsys.readouterr().err


def test_example_app_config_is_valid():
    """Every key of the example app's [tool.flwr.app.config] is understood (flwr run only overrides keys that
    exist there, so the file lists all of them)."""
    import tomllib

    conf = tomllib.loads(
        (Path(__file__).resolve().parents[1] / "examples" / "flower_app" / "pyproject.toml").read_text()
    )["tool"]["flwr"]["app"]
    assert conf["components"] == {
        "serverapp": "fedvlr_flower.server_app:app",
        "clientapp": "fedvlr_flower.client_app:app",
    }
    s = fl.Settings.from_run_config(conf["config"])
    assert s.fusion == "fedvlr" and s.cfg.lr is None and s.cfg.strategy is None and s.cfg.metrics == ("hr", "ndcg")
    assert s.fault_partition == -1 and s.evaluation == "federated"


def test_server_side_evaluation_sends_no_evaluate_messages(tmp_path):
    """evaluation = "server": the ServerApp scores the global model for users with a fresh private state; no node
    is asked to evaluate. The figures equal the simulator's model scored with initial private states."""
    from fedvlr_plus.federation.engine import FederatedRun
    from fedvlr_plus.federation.state.store import MemoryStore

    cfg = base_config(
        tmp_path, **{"max-users": 9, "fusion": "none", "backbone": "fedncf", "eval-every": 2, "evaluation": "server"}
    )
    res = run_loopback(cfg, tmp_path)
    assert res["evaluation"] == "server" and res["selected_round"] == 2
    assert sorted(p.name for p in (tmp_path / "audit").iterdir()) == ["round001-train", "round002-train"]
    s = fl.Settings.from_run_config(cfg)
    data = fl.load_data(s.data, s.max_users)
    run = FederatedRun(data, fl.build_backbone(data, s), replace(s.cfg, simulator="sequential"), progress=False)
    run.run_round(), run.run_round()
    run.store, run.sim.store = MemoryStore(), MemoryStore()  # forget every private state: fresh users
    fresh = run.evaluate("test", "full").summary()
    assert res["test"] == pytest.approx(fresh, abs=1e-6)


def test_a_deployment_chooses_what_the_router_weighs_as_run_does():
    from fedvlr_plus.flower.settings import fedvlr_options

    default = fl.Settings.from_run_config({"data": "ml-100k", "fusion": "fedvlr"})
    assert default.router_over == "auto" and fedvlr_options(default).router_over == "auto"
    operators = fl.Settings.from_run_config({"data": "ml-100k", "fusion": "fedvlr", "router-over": "operators"})
    assert fedvlr_options(operators).router_over == "operators"
    wrong = fl.Settings.from_run_config({"data": "ml-100k", "fusion": "fedvlr", "router-over": "modalities"})
    with pytest.raises(ValueError, match="router over must be one of"):
        fedvlr_options(wrong)
