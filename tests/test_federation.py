"""The federated engine end to end: simulators agree, resume is exact, uploads hold only shared arrays, private
state is really restored, and a few rounds on real data beat a random ranker."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from _fed_helpers import load_ml100k

from fedvlr_plus.adapters import BACKBONES, make_backbone
from fedvlr_plus.errors import ResumeMismatch, RunFolderError
from fedvlr_plus.federation import DiskStore, FedConfig, FederatedRun, MemoryStore, RecClient, run_federated
from fedvlr_plus.federation.runs.folder import SeedFolder
from fedvlr_plus.federation.state.initial import init_shared_state
from fedvlr_plus.federation.synthetic import synthetic_data

FAST = dict(
    rounds=3,
    local_epochs=2,
    batch_size=8,
    negatives=2,
    dim=8,
    patience=10,
    ks=(5, 10, 50),
    valid_metric="hr@10",
    test_both_protocols=True,  # the sampled test figures are compared too
)


@pytest.fixture(scope="module")
def small():
    return synthetic_data(40, 150, 10, seed=0)


def _figures(res):
    return [(h["round"], h["loss"], h.get("valid")) for h in res["history"]], res["test"], res["test_sampled"]


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_batched_and_sequential_give_the_same_metrics(small, name):
    cfg = FedConfig(**FAST, weight_decay=1e-3, lr=0.3, item_lr_scale=5.0)
    a = run_federated(small, name, cfg, progress=False)
    b = run_federated(small, name, FedConfig(**{**cfg.to_dict(), "simulator": "sequential"}), progress=False)
    assert a["selected_round"] == b["selected_round"]
    for (ra, la, va), (rb, lb, vb) in zip(_figures(a)[0], _figures(b)[0]):
        assert ra == rb and abs(la - lb) < 1e-4
        assert all(abs(va[k] - vb[k]) < 1e-4 for k in va)
    for key in ("test", "test_sampled", "valid"):
        assert all(abs(a[key][k] - b[key][k]) < 1e-4 for k in a[key]), key
    assert a["history"][-1]["loss"] < a["history"][0]["loss"]  # it trains


class Stop(Exception):
    pass


@pytest.mark.parametrize(
    "name,extra",
    [
        ("fedavg", {}),
        ("fcf", {"server_optimizer": "adam", "private_store": "disk"}),
        ("pfedrec", {"clients_per_round": 0.5}),
    ],
)
def test_resume_after_interrupt_ends_with_the_same_numbers(small, tmp_path, name, extra):
    cfg = FedConfig(**{**FAST, "rounds": 5, "checkpoint_every": 1}, **extra)
    full = run_federated(small, name, cfg, out_dir=tmp_path / "full", progress=False)

    def interrupt(run, record):
        if record["round"] == 2:
            raise KeyboardInterrupt  # what Ctrl-C raises

    with pytest.raises(KeyboardInterrupt):
        run_federated(small, name, cfg, out_dir=tmp_path / "cut", progress=False, on_round=interrupt)
    ck = SeedFolder(tmp_path / "cut" / "seed-0").read_checkpoint()
    assert ck["round"] == 2
    with pytest.raises(RunFolderError, match="already holds a run"):
        run_federated(small, name, cfg, out_dir=tmp_path / "cut", progress=False)  # never overwrite silently
    resumed = run_federated(small, name, cfg, out_dir=tmp_path / "cut", resume=True, progress=False)
    assert _figures(resumed) == _figures(full)
    assert resumed["selected_round"] == full["selected_round"]
    saved = json.loads((tmp_path / "cut" / "result.json").read_text())
    assert saved["test"] == full["test"]


def test_sparse_checkpoints_resume_from_the_last_one_with_the_same_numbers(small, tmp_path):
    cfg = FedConfig(**{**FAST, "rounds": 7, "eval_every": 7, "checkpoint_every": 3})
    full = run_federated(
        small,
        "fedavg",
        FedConfig(**{**cfg.to_dict(), "checkpoint_every": 1}),
        out_dir=tmp_path / "full",
        progress=False,
    )
    written = []

    def interrupt(run, record):
        ck = run.folder.read_checkpoint()
        written.append(ck["round"] if ck is not None else None)
        if record["round"] == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_federated(small, "fedavg", cfg, out_dir=tmp_path / "cut", progress=False, on_round=interrupt)
    assert written == [None, None, 3, 3, 3]  # every 3 rounds: round 5 is lost, round 3 is kept
    resumed = run_federated(small, "fedavg", cfg, out_dir=tmp_path / "cut", resume=True, progress=False)
    assert _figures(resumed) == _figures(full) and resumed["rounds_run"] == 7
    assert SeedFolder(tmp_path / "cut" / "seed-0").read_checkpoint()["round"] == 7  # the end


def test_auto_checkpoints_keep_writing_near_their_share_of_the_time():
    from fedvlr_plus.federation.runs.checkpoint_clock import AUTO_SHARE, CheckpointClock

    now = [0.0]
    clock = CheckpointClock(clock=lambda: now[0])
    assert clock.due()  # the first measures the cost

    def write():
        now[0] += 1.0  # a checkpoint that takes a second

    clock.timed(write)
    assert clock.cost == 1.0
    wait = 1.0 / AUTO_SHARE - 1.0
    now[0] += wait - 0.5
    assert not clock.due()
    now[0] += 0.5
    assert clock.due()


def test_auto_checkpoints_skip_rounds_when_dear_and_resume_with_the_same_numbers(small, tmp_path, monkeypatch):
    """Under --checkpoint-every auto a checkpoint that costs much beside a round is written after the first round
    and at the end only; a run interrupted between them resumes from round 1 to the uninterrupted figures."""
    from fedvlr_plus.federation.runs import checkpoint_clock

    cfg = FedConfig(**{**FAST, "rounds": 5})
    assert cfg.checkpoint_every is None  # auto is the default
    full = run_federated(small, "fedavg", cfg, out_dir=tmp_path / "full", progress=False)
    monkeypatch.setattr(checkpoint_clock, "AUTO_SHARE", 1e-9)  # each checkpoint "costs" a billion rounds
    written = []

    def interrupt(run, record):
        written.append(run.folder.read_checkpoint()["round"])
        if record["round"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_federated(small, "fedavg", cfg, out_dir=tmp_path / "cut", progress=False, on_round=interrupt)
    assert written == [1, 1, 1, 1]
    resumed = run_federated(small, "fedavg", cfg, out_dir=tmp_path / "cut", resume=True, progress=False)
    assert _figures(resumed) == _figures(full) and resumed["selected_round"] == full["selected_round"]
    assert SeedFolder(tmp_path / "cut" / "seed-0").read_checkpoint()["round"] == 5  # the end


def test_each_seed_folder_keeps_its_test_users_metrics_for_paired_tests(small, tmp_path):
    import pandas as pd

    res = run_federated(small, "fedavg", FedConfig(**{**FAST, "seeds": 2}), out_dir=tmp_path / "run", progress=False)
    for i, seed in enumerate(res["seeds"]):
        folder = tmp_path / "run" / f"seed-{seed}"
        per_user = pd.read_csv(folder / "per_user_test.csv")
        assert "per_user_test.csv" in json.loads((folder / "manifest.json").read_text())["files"]
        assert per_user["user"].is_unique and len(per_user) == res["per_seed"][i]["test_n_users"]
        assert per_user["hr@10"].mean() == pytest.approx(res["per_seed"][i]["test"]["hr@10"], abs=1e-12)


def test_resume_refuses_changed_settings(small, tmp_path):
    cfg = FedConfig(**FAST)
    run_federated(small, "fedavg", cfg, out_dir=tmp_path, progress=False)
    with pytest.raises(ResumeMismatch, match="lr"):
        run_federated(small, "fedavg", FedConfig(**FAST, lr=0.01), out_dir=tmp_path, resume=True, progress=False)
    more = run_federated(
        small, "fedavg", FedConfig(**{**FAST, "rounds": 4}), out_dir=tmp_path, resume=True, progress=False
    )  # extending a finished run by more rounds is allowed
    assert more["rounds_run"] == 4


def test_resume_treats_a_default_and_the_same_explicit_value_alike(small, tmp_path):
    fast = {k: v for k, v in FAST.items() if k not in ("local_epochs", "rounds")}
    default_epochs = make_backbone("fedavg", 10, 4).default_local_epochs
    run_federated(small, "fedavg", FedConfig(**fast, rounds=2), out_dir=tmp_path, progress=False)  # None: default
    more = run_federated(
        small,
        "fedavg",
        FedConfig(**fast, rounds=3, local_epochs=default_epochs),
        out_dir=tmp_path,
        resume=True,
        progress=False,
    )
    assert more["rounds_run"] == 3 and more["resolved"]["local_epochs"] == default_epochs
    with pytest.raises(
        ResumeMismatch, match=f"--local-epochs: the run used {default_epochs}, this call {default_epochs + 1}"
    ):
        run_federated(
            small,
            "fedavg",
            FedConfig(**fast, rounds=4, local_epochs=default_epochs + 1),
            out_dir=tmp_path,
            resume=True,
            progress=False,
        )


@pytest.mark.slow
def test_killed_process_resumes(small, tmp_path):
    """A run killed from outside (SIGKILL right after round 2 is checkpointed) resumes to the uninterrupted
    result."""
    EVERY_ROUND = {**FAST, "checkpoint_every": 1}  # noqa: N806 (a constant of the child's script)
    script = textwrap.dedent(f"""
        import os, signal, sys
        from fedvlr_plus.federation import FedConfig, run_federated
        from fedvlr_plus.federation.synthetic import synthetic_data
        def kill(run, record):
            if record["round"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        run_federated(synthetic_data(40, 150, 10, seed=0), "fedncf", FedConfig(**{EVERY_ROUND!r}),
                      out_dir=sys.argv[1], progress=False, on_round=kill)
    """)
    f = tmp_path / "job.py"
    f.write_text(script)
    cfg = FedConfig(**FAST)
    killed = subprocess.run(
        [sys.executable, str(f), str(tmp_path / "a")],
        capture_output=True,
        text=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert killed.returncode == -9, killed.stderr
    ck = SeedFolder(tmp_path / "a" / "seed-0").read_checkpoint()
    assert ck["round"] == 2
    resumed = run_federated(small, "fedncf", cfg, out_dir=tmp_path / "a", resume=True, progress=False)
    full = run_federated(small, "fedncf", cfg, progress=False)
    assert resumed["rounds_run"] == full["rounds_run"] == 3
    for key in ("test", "valid"):
        assert all(abs(resumed[key][k] - full[key][k]) < 1e-6 for k in full[key])
    assert abs(resumed["history"][-1]["loss"] - full["history"][-1]["loss"]) < 1e-6


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_every_upload_holds_only_declared_shared_arrays(small, name):
    bb = make_backbone(name, small.n_items, 8)
    shared, private = set(bb.shared_names), set(bb.private_names)
    train = small.matrix(["train"]).tocsr()
    seen = []

    def inspect(round_index, update):
        seen.append(update.cid)
        assert set(update.arrays) == shared and not (set(update.arrays) & private)
        assert set(update.rows) == {s.name for s in bb.shared_specs() if s.item_table}
        msg = update.to_message()  # what would travel: only the shared arrays, row ids and scalars
        assert set(msg) == {"cid", "kind", "arrays", "rows", "num_examples", "metrics"}
        assert set(msg["metrics"]) <= {"loss", "steps"}
        pos = train.indices[train.indptr[update.cid] : train.indptr[update.cid + 1]]
        assert update.num_examples == len(pos)
        for rows in update.rows.values():  # row-wise uploads cover the client's positives
            assert set(pos.tolist()) <= set(rows.tolist())

    run_federated(small, name, FedConfig(**{**FAST, "rounds": 2}), progress=False, on_upload=inspect)
    n_clients = int((np.diff(train.indptr) > 0).sum())
    assert len(seen) == 2 * n_clients


def test_private_state_is_restored_and_personalises(small, tmp_path):
    run = FederatedRun(small, "fedavg", FedConfig(**{**FAST, "rounds": 2}), progress=False)
    saved, loaded = {}, {}
    store = run.store
    orig_save, orig_load, orig_view = store.save_block, store.load_block, store.view_block

    def save(cids, block):  # the compact store reads and writes a chunk of clients at once
        for c, cid in enumerate(cids.tolist()):
            saved.setdefault(run.round + 1, {})[cid] = {k: v[c].clone() for k, v in block.items()}
        return orig_save(cids, block)

    def first_read(cids, names, got):  # the first read of a round is the one training starts from
        first = loaded.setdefault(run.round + 1, {})
        for c, cid in enumerate(cids.tolist()):
            if cid not in first:
                has = all(got[n][1][c] for n in names)
                first[cid] = {n: got[n][0][c].clone() for n in names} if has else None

    def load(cids, names):
        got = orig_load(cids, names)
        first_read(cids, names, got)
        return got

    def view(cids, names, dtype=None):  # a chunk handed out as the store's own rows, to train in place
        got = orig_view(cids, names, dtype)
        if got is not None:
            first_read(cids, names, {n: (v, np.ones(len(cids), bool)) for n, v in got.items()})
        return got

    store.save_block, store.load_block, store.view_block = save, load, view
    run.run_round()
    run.run_round()
    # round 2 (and its evaluation) restored exactly what round 1 stored, for every client
    for cid, st in saved[1].items():
        got = loaded[2][cid]
        assert got is not None and all(torch.equal(got[k], st[k]) for k in st)
    # two users with different histories get different scores
    users = np.array([0, 1])
    scores = run.scorer()(users)
    assert not torch.allclose(scores[0], scores[1])
    # the scores come from the stored state: changing one user's stored head changes only that user's scores
    st = dict(store.load(0))
    st["head_w"] = -st["head_w"]
    store.save(0, st)
    again = run.scorer()(users)
    assert not torch.allclose(again[0], scores[0]) and torch.allclose(again[1], scores[1])


def test_store_round_trips_are_exact(tmp_path):
    state = {"head_w": torch.randn(8), "head_b": torch.tensor(0.25), "table": torch.randn(5, 3)}
    for store in (MemoryStore(), DiskStore(tmp_path / "p")):
        store.begin_round(1)
        store.save(4, state)
        store.prepare(1)
        store.commit()
        back = store.load(4)
        assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
        assert store.load(5) is None
    # a disk store re-opened from its folder sees the same state; an unfinished round is discarded
    reopened = DiskStore(tmp_path / "p")
    assert torch.equal(reopened.load(4)["table"], state["table"])
    reopened.begin_round(2)
    reopened.save(4, {k: v + 1 for k, v in state.items()})
    again = DiskStore(tmp_path / "p")
    again.recover(checkpoint_round=1)  # round 2 never reached its checkpoint
    assert torch.equal(again.load(4)["table"], state["table"])


def test_client_runs_alone_on_plain_messages():
    """A RecClient needs nothing but its own items, numpy arrays from the server and a dict of scalars."""
    bb = make_backbone("fedavg", 30, 8)
    shared = {k: v.numpy() for k, v in init_shared_state(bb, 0).items()}
    client = RecClient(7, bb, positives=[1, 4, 9, 12], store=MemoryStore(), targets={"valid": [20]})
    config = {"seed": 0, "round": 1, "epochs": 2, "negatives": 1, "batch_size": 8, "lr": 0.5, "upload": "params"}
    update = client.fit(shared, config)
    assert set(update.arrays) == {"item_emb"} and update.num_examples == 4
    assert set(client.private_state()) == {"head_w", "head_b"}
    res = client.evaluate(shared, {"split": "valid", "ks": [5, 10]})
    s = client.scores(shared).clone()
    s[[1, 4, 9, 12]] = -float("inf")
    assert res["ranks"] == [int((s > s[20]).sum())] and res["hr@10"] == float(res["ranks"][0] < 10)


def test_a_few_rounds_on_real_data_beat_random():
    data = load_ml100k(n_users=150)
    res = run_federated(
        data,
        "fedavg",
        FedConfig(rounds=12, local_epochs=5, dim=32, lr=1.0, item_lr_scale=300.0, patience=12, eval_every=3),
        progress=False,
    )
    random_hr50 = 50.0 / data.n_items  # a random ranker's expected HR@50 (about 0.034 here)
    assert res["valid"]["hr@50"] > 3.0 * random_hr50
    assert res["test"]["hr@50"] > 2.0 * random_hr50
    first = next(h for h in res["history"] if "valid" in h)
    assert first["valid"]["hr@50"] < res["valid"]["hr@50"]  # it learnt; not a lucky first evaluation


def test_a_checkpoint_file_is_the_safetensors_bytes_and_reads_back(tmp_path):
    import os

    from safetensors.torch import save

    from fedvlr_plus.federation.state.plain import split_tensors

    folder = SeedFolder(tmp_path / "seed-0")
    state = {"round": 3, "private": {"w": torch.arange(12.0).view(3, 4), "b": torch.ones(2)}, "shared": torch.zeros(5)}
    folder.write_state("checkpoint-000003", state, checkpoint=True)
    tensor_file = tmp_path / "seed-0" / "checkpoint-000003.safetensors"
    # written from the tensors' memory, byte for byte what safetensors' in-memory serialiser gives
    assert tensor_file.read_bytes() == save(split_tensors(state)[1])
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tensor_file).st_mode & 0o777 == 0o666 & ~umask
    back = folder.read_checkpoint()
    assert back["round"] == 3 and torch.equal(back["private"]["w"], state["private"]["w"])
    assert torch.equal(back["shared"], state["shared"]) and folder.verify()["checkpoint"] == "checkpoint-000003"


def test_a_checkpoint_file_takes_the_umask_of_the_process(tmp_path):
    import os

    from fedvlr_plus.federation.runs.folder import process_umask

    old = os.umask(0o027)
    try:
        assert process_umask() == 0o027 and os.umask(0o027) == 0o027  # read without changing it
        SeedFolder(tmp_path / "seed-0").write_state("checkpoint-000001", {"w": torch.ones(2)}, checkpoint=True)
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "seed-0" / "checkpoint-000001.safetensors").st_mode & 0o777 == 0o640


def test_a_listed_file_that_is_missing_or_changed_is_refused_naming_it(tmp_path):
    folder = SeedFolder(tmp_path / "seed-0")
    folder.write_state("checkpoint-000001", {"w": torch.ones(3)}, checkpoint=True)
    tensors = tmp_path / "seed-0" / "checkpoint-000001.safetensors"
    doc = tmp_path / "seed-0" / "checkpoint-000001.json"
    doc.write_text(doc.read_text() + " ")  # a file read whole, as bytes
    with pytest.raises(RunFolderError, match="checkpoint-000001.json: does not match its sha256"):
        folder.read_checkpoint()
    folder = SeedFolder(tmp_path / "again")
    folder.write_state("checkpoint-000001", {"w": torch.ones(3)}, checkpoint=True)
    (tmp_path / "again" / "checkpoint-000001.safetensors").unlink()  # read in blocks, by path
    with pytest.raises(RunFolderError, match="checkpoint-000001.safetensors: listed in manifest.json but missing"):
        folder.read_checkpoint()
    assert tensors.exists()


def test_sparse_checkpoints_stay_sparse_where_every_round_is_evaluated(small, tmp_path):
    cfg = FedConfig(**{**FAST, "rounds": 4, "eval_every": 1, "checkpoint_every": 4})
    written = []

    def seen(run, record):
        ck = run.folder.read_checkpoint()
        written.append(ck["round"] if ck is not None else None)

    run_federated(small, "fedavg", cfg, out_dir=tmp_path / "run", progress=False, on_round=seen)
    assert written == [None, None, None, 4]  # evaluated every round, yet checkpointed at the end only
