"""TLS, SuperNode authentication and secure aggregation on real Flower processes (loopback).

One federation for the module: a SuperLink with TLS (a CA and a server certificate made here with
``cryptography``) and SuperNode authentication, three SuperNodes whose public keys were registered with
``flwr supernode register``, each holding a third of 24 KU users.

- refused: a node with an unregistered key, a node without a key, and a node that does not trust the
  SuperLink's CA; none of them is ever listed by the SuperLink;
- a run with SecAgg+ (FedAvg-MF + the FedVLR layer, 2 rounds) over the authorised nodes ends with the simulator's
  figures and the simulator's shared state after round 1 (to SecAgg+'s quantisation), and every training reply the
  ServerApp received holds masked vectors only.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedvlr-plus[flower]')")

from _shared import shared_data  # noqa: E402
from test_flower import N_NODES, N_USERS, base_config  # noqa: E402
from test_flower_secagg import assert_only_masked_vectors, simulator_shared_after  # noqa: E402

from fedvlr_plus.flower import app as fl  # noqa: E402

pytestmark = pytest.mark.slow  # real processes: SuperLink start-up, a torch import per Flower message


@pytest.fixture(scope="module")
def secure_federation(tmp_path_factory):
    shared_data("ku")
    from _flower_certs import make_node_key, make_tls_files
    from _flower_harness import Federation

    root = tmp_path_factory.mktemp("flower-secure")
    fed = Federation(root, certificates=make_tls_files(root / "certs"), supernode_auth=True)
    try:
        fed.start_superlink()
        fed.registered = []
        for i in range(N_NODES):
            key, pub = make_node_key(root / "keys" / f"node{i}")
            fed.registered.append(fed.register(pub))
            fed.start_supernode(i, N_NODES, auth_key=key)
        fed.keys = root / "keys"
        yield fed
    finally:
        left = fed.close()
        assert not left, f"processes still alive after the tests: {left}"


def _online(fed) -> list[int]:
    proc = fed.flwr("supernode", "list", "fedvlr", "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nodes = json.loads(proc.stdout[proc.stdout.index("{") :])["nodes"]
    return sorted(int(n["node-id"]) for n in nodes if n["status"] == "online")


def test_unauthenticated_nodes_are_refused(secure_federation, tmp_path):
    from _flower_certs import make_node_key, make_tls_files

    fed = secure_federation
    rogue_key, _ = make_node_key(tmp_path / "rogue")  # a valid key pair, never registered
    other_ca = make_tls_files(tmp_path / "other-ca") / "ca.crt"  # a CA that did not sign the SuperLink
    procs = {
        "unregistered": fed.start_supernode(0, N_NODES, tag="-unregistered", auth_key=rogue_key, max_wait_time=15),
        "no key": fed.start_supernode(0, N_NODES, tag="-nokey", max_wait_time=15),
        "wrong CA": fed.start_supernode(
            0,
            N_NODES,
            tag="-wrongca",
            auth_key=fed.keys / "node0",
            tls={"root_certificates": str(other_ca)},
            max_wait_time=15,
        ),
    }
    deadline = time.time() + 120
    while any(p.poll() is None for p in procs.values()) and time.time() < deadline:
        time.sleep(0.5)
    assert all(p.returncode not in (None, 0) for p in procs.values()), {k: p.returncode for k, p in procs.items()}
    logs = {
        k: (fed.root / f"supernode-0-{tag}.log").read_text(errors="replace")
        for k, tag in (("unregistered", "unregistered"), ("no key", "nokey"), ("wrong CA", "wrongca"))
    }
    assert "Failed to activate SuperNode" in logs["unregistered"], logs["unregistered"][-2000:]
    assert "must be registered" in logs["no key"], logs["no key"][-2000:]
    link = (fed.root / "superlink.log").read_text(errors="replace")
    assert "No SuperNode found with the given public key" in link
    assert _online(fed) == sorted(fed.registered)  # only the authorised nodes were ever let in


def test_secure_aggregation_over_tls_matches_the_simulator(secure_federation, tmp_path):
    fed = secure_federation
    cfg = base_config(tmp_path, secagg=1)
    t0 = time.perf_counter()
    fed.submit(cfg)
    res = fed.wait_result(tmp_path / "result.json", timeout=500)
    seconds = time.perf_counter() - t0

    from fedvlr_plus.federation.run_seeds import run_federated

    s = fl.Settings.from_run_config(cfg)
    data = fl.load_data(s.data, s.max_users)
    sim = run_federated(data, fl.build_backbone(data, s), replace(s.cfg, simulator="sequential"), progress=False)
    assert res["rounds_run"] == 2 and res["selected_round"] == sim["selected_round"]
    assert [h["nodes"] for h in res["history"]] == [N_NODES, N_NODES]
    assert [h["clients"] for h in res["history"]] == [N_USERS, N_USERS]
    for part in ("valid", "test", "test_warm", "test_cold"):
        for k, v in sim[part].items():
            assert res[part][k] == pytest.approx(v, abs=1e-4), (part, k)
    assert [h["loss"] for h in res["history"]] == pytest.approx([h["loss"] for h in sim["history"]], abs=1e-5)
    audit = Path(cfg["audit-dir"])
    after_one = np.load(audit / "round001-shared.npz")
    for k, v in simulator_shared_after(cfg | {"secagg": 0}, 1).items():
        assert np.abs(after_one[k] - v.numpy()).max() < 5e-5, k
    sizes = assert_only_masked_vectors(audit, rounds=2, nodes=N_NODES)
    print(f"secure deployment run: {seconds:.1f} s; masked bytes per node and round: {sorted(set(sizes.values()))}")
