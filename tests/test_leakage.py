"""Item-set leakage: the server-side attack's scores by hand, decoy padding (fixed size, lower precision, same
model under FedAvg/FedGrad), batched == sequential with decoys, and the leakage command."""

import json

import numpy as np
import pytest
import torch
from _bad_input import run_cli
from test_simulator import tiny_csr

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.errors import ConfigError
from fedvlr_plus.federation import BatchedSimulator, ClientUpdate, MemoryStore, SequentialSimulator
from fedvlr_plus.federation.privacy.leakage import ItemSetAttack, guesses, precision_recall, score, upload_bytes
from fedvlr_plus.federation.state.initial import init_shared_state
from fedvlr_plus.federation.strategies.base import make_strategy


def test_attack_scores_a_hand_made_upload():
    # rows 2, 5, 7, 9 uploaded; the client trained on 5 and 9 (num_examples 2) and on item 11, which it did not
    # upload; gradient norms 3 (row 2), 5 (row 5), 0 (row 7), 4 (row 9) -> the top two by magnitude are 5 and 9
    grads = torch.tensor([[3.0, 0.0], [3.0, 4.0], [0.0, 0.0], [0.0, 4.0]])
    up = ClientUpdate(cid=0, kind="grads", arrays={"t": grads}, rows={"t": torch.tensor([2, 5, 7, 9])}, num_examples=2)
    g = guesses(up, {"t": torch.zeros(12, 2)})
    assert g["row_ids"].tolist() == [2, 5, 7, 9] and g["magnitude"].tolist() == [5, 9]
    truth = np.array([5, 9, 11])
    assert score(g["row_ids"], truth) == (2, 4, 3)
    assert precision_recall(*score(g["row_ids"], truth)) == {"precision": 0.5, "recall": pytest.approx(2 / 3)}
    assert precision_recall(*score(g["magnitude"], truth)) == {"precision": 1.0, "recall": pytest.approx(2 / 3)}
    assert upload_bytes(up) == 8 * 4 + 4 * 8


def test_parameter_uploads_are_ranked_by_their_change_and_pooled_over_uploads():
    shared = {"t": torch.ones(6, 1)}
    a = ClientUpdate(
        cid=0,
        kind="params",
        arrays={"t": torch.tensor([[1.0], [3.0], [0.5]])},
        rows={"t": torch.tensor([0, 1, 2])},
        num_examples=1,
    )  # changes 0, 2, 0.5 -> guess row 1
    b = ClientUpdate(
        cid=1,
        kind="params",
        arrays={"t": torch.tensor([[1.0], [1.2]])},
        rows={"t": torch.tensor([3, 4])},
        num_examples=1,
    )  # changes 0, 0.2 -> guess row 4
    attack = ItemSetAttack({0: [1, 2], 1: [3]}.__getitem__, lambda: shared)
    attack.observe(1, a)
    attack.observe(1, b)
    s = attack.summary()
    # magnitude: hits 1 (row 1) + 0 over 2 guesses, 3 true items; row ids: 2 + 1 hits over 5 rows
    assert s["overall"]["magnitude"] == {"precision": 0.5, "recall": pytest.approx(1 / 3)}
    assert s["overall"]["row_ids"] == {"precision": pytest.approx(3 / 5), "recall": 1.0}
    assert s["per_round"][0]["uploads"] == 2 and s["bytes_per_round"] == upload_bytes(a) + upload_bytes(b)


def _fit(cls, name, config, shared=None):
    indptr, indices = tiny_csr()
    bb = make_backbone(name, 40, 8)
    shared = shared if shared is not None else init_shared_state(bb, 0)
    return (
        bb,
        shared,
        cls(bb, indptr, indices, MemoryStore(), seed=0).fit(np.arange(len(indptr) - 1), shared, config),
        (indptr, indices),
    )


CONFIG = dict(seed=0, round=2, epochs=1, negatives=1, batch_size=4, lr=0.3, item_lr_scale=1.0, weight_decay=0.0)


@pytest.mark.parametrize("name,upload", [("fedavg", "params"), ("fcf", "grads")])
def test_decoys_make_uploads_fixed_size_and_cut_the_row_id_attack(name, upload):
    config = {**CONFIG, "upload": upload}
    bb, shared, plain, (indptr, indices) = _fit(SequentialSimulator, name, config)
    _, _, padded, _ = _fit(SequentialSimulator, name, {**config, "pad_uploads": 36})
    truth = lambda c: indices[indptr[c] : indptr[c + 1]]  # noqa: E731
    tables = list(plain[0].rows)
    assert tables
    assert len({len(u.rows[t]) for u in plain for t in tables}) > 1  # sizes differ without padding
    assert {len(u.rows[t]) for u in padded for t in tables} == {36}
    for p, q in zip(plain, padded):
        for t in tables:
            r = q.rows[t].numpy()
            assert np.all(np.diff(r) > 0) and set(p.rows[t].tolist()) <= set(r.tolist())  # sorted, real rows kept

    def precision(ups):
        attack = ItemSetAttack(truth, lambda: shared)
        for u in ups:
            attack.observe(1, u)
        return attack.summary()["overall"]["row_ids"]

    assert precision(padded)["precision"] < precision(plain)["precision"]
    assert precision(padded)["recall"] == precision(plain)["recall"] == 1.0
    # a decoy carries no change, so FedAvg / FedGrad aggregate the same model
    strategy = make_strategy("fedavg" if upload == "params" else "fedgrad", server_lr=1.0)
    specs = {s.name: s for s in bb.all_specs()}
    a = strategy.aggregate(shared, plain, specs)
    b = make_strategy("fedavg" if upload == "params" else "fedgrad", server_lr=1.0).aggregate(shared, padded, specs)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("noise", [0.0, 0.7])
@pytest.mark.parametrize("name,upload", [("fedavg", "params"), ("fcf", "grads")])
def test_batched_and_sequential_pad_with_the_same_decoys(name, upload, noise):
    config = {**CONFIG, "upload": upload, "pad_uploads": 30, "upload_noise": noise, "upload_clip": 1.0 if noise else 0}
    _, _, seq, _ = _fit(SequentialSimulator, name, config)
    _, _, bat, _ = _fit(BatchedSimulator, name, config)
    for a, b in zip(seq, bat):
        assert a.cid == b.cid and set(a.rows) == set(b.rows)
        for k in a.rows:
            assert torch.equal(a.rows[k], b.rows[k])
        for k in a.arrays:
            assert torch.allclose(a.arrays[k], b.arrays[k], atol=1e-5), (a.cid, k)


def test_noise_reaches_the_decoys_so_their_change_is_not_zero():
    config = {**CONFIG, "upload": "grads", "pad_uploads": 30, "upload_noise": 0.5, "upload_clip": 1.0}
    _, _, ups, (indptr, indices) = _fit(SequentialSimulator, "fcf", config)
    _, _, plain, _ = _fit(
        SequentialSimulator, "fcf", {**config, "upload_noise": 0.0, "upload_clip": 0.0, "pad_uploads": 0}
    )
    for u, p in zip(ups, plain):
        for t, rows in u.rows.items():
            decoy = ~np.isin(rows.numpy(), p.rows[t].numpy())
            assert decoy.any() and bool((u.arrays[t][torch.from_numpy(decoy)].abs().sum(-1) > 0).all())


def test_a_pad_smaller_than_an_upload_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match="--pad-uploads 3"):
        _fit(SequentialSimulator, "fcf", {**CONFIG, "upload": "grads", "pad_uploads": 3})


def _leakage_table(out, jobs: int, *more: str):
    """The tiny leakage table, its runs in ``jobs`` worker processes (one torch thread in this process)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _leakage_cli(out, jobs, *more)
    finally:
        torch.set_num_threads(threads)


def _leakage_cli(out, jobs: int, *more: str):
    return run_cli(
        "experiment",
        "leakage",
        "synthetic:30x80",
        "--backbone",
        "fcf",
        "--pads",
        "0,all",
        "--noise",
        "0",
        "--rounds",
        "2",
        "--local-epochs",
        "1",
        "--dim",
        "8",
        "--metric",
        "ndcg@10",
        "--no-progress",
        "--jobs",
        str(jobs),
        *(("--out", str(out)) if out is not None else ()),
        "--json",
        *more,
    )


def test_leakage_command_runs_on_tiny_data_and_its_runs_side_by_side_change_nothing(tmp_path):
    out = tmp_path / "leak"
    res = _leakage_table(out, 2)
    assert res.code == 0, res.err
    assert "2 runs side by side in 2 worker processes" in res.err
    result = json.loads(res.out.strip().splitlines()[-1])
    one_by_one = json.loads(_leakage_table(tmp_path / "one", 1).out.strip().splitlines()[-1])
    assert result["config"].pop("jobs") == 2 and one_by_one["config"].pop("jobs") == 1
    assert result == one_by_one  # (the attacks' summaries came back from the workers)
    rows = result["rows"]
    plain, dense = rows
    assert (plain["defence"], dense["defence"]) == ("none", "all (dense)")
    assert (
        dense["row_ids_precision"] < plain["row_ids_precision"] and dense["bytes_per_round"] > plain["bytes_per_round"]
    )
    assert all(0 <= r[k] <= 1 for r in rows for k in ("magnitude_precision", "magnitude_recall", "row_ids_recall"))
    assert {p.name for p in out.iterdir()} == {
        "table.md",
        "table.csv",
        "result.json",
        "config.toml",
        "runs",
        ".fedvlr.lock",
    }
    assert f"--config {out / 'config.toml'}" in res.err  # the table says how to repeat it
    _a_longer_table_goes_on_from_the_runs_and_their_attackers_counts(out, tmp_path / "straight")


def _a_longer_table_goes_on_from_the_runs_and_their_attackers_counts(out, straight):
    """Each run of the table in ``out`` continues from its checkpoint with what its attacker saw up to it: the table
    of 4 rounds is the one trained straight to 4, attacks per round included (without the attacker's counts the
    resumed runs would report rounds 3-4 only)."""
    from _bad_input import assert_user_error

    assert_user_error(_leakage_table(out, 1), "already holds runs", f"--resume {out}")
    resumed = _leakage_table(None, 1, "--resume", str(out), "--rounds", "4")
    again = _leakage_table(straight, 1, "--rounds", "4")
    assert resumed.code == 0 and again.code == 0, resumed.err + again.err
    one, two = (json.loads(r.out.strip().splitlines()[-1]) for r in (resumed, again))
    assert one == two
    assert [r["round"] for r in one["rows"][0]["per_seed_attack"][0]["per_round"]] == [1, 2, 3, 4]


def test_a_run_with_an_attacker_refuses_a_checkpoint_that_kept_none(tmp_path):
    """A checkpoint made without an observer cannot give an attacker what it saw: resuming from it is refused
    rather than reporting the rounds after it alone."""
    from fedvlr_plus.errors import ResumeMismatch
    from fedvlr_plus.experiments.leakage import ItemSetWatch
    from fedvlr_plus.federation.config import FedConfig
    from fedvlr_plus.federation.engine import FederatedRun
    from fedvlr_plus.federation.synthetic import synthetic_data

    data = synthetic_data(20, 40, 6.0, seed=0)
    cfg = FedConfig(rounds=1, local_epochs=1, dim=4, seed=0)
    FederatedRun(data, "fcf", cfg, tmp_path / "seed-0", progress=False).run()
    watched = FederatedRun(data, "fcf", cfg, tmp_path / "seed-0", progress=False)
    watched.on_upload = ItemSetWatch()(watched)
    with pytest.raises(ResumeMismatch, match="keeps no observer's state"):
        watched.load_checkpoint()
    attack = watched.attack
    attack.counts[(1, "row_ids")] += (2, 3, 4)
    attack.bytes[1], attack.uploads[1] = 100, 2
    again = ItemSetAttack(None, None)
    again.load_state(json.loads(json.dumps(attack.state())))
    assert again.summary() == attack.summary()
