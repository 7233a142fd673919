"""A resumed run restores the clients' state tables from its checkpoint a block of rows at a time: the tables stay
in the file (:class:`StoredTensor`) until the store reads them, so a resume never holds a population's states
whole (or twice, with the memory store). Same numbers as an uninterrupted run."""

import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from fedvlr_plus.federation import FedConfig, run_federated
from fedvlr_plus.federation.state import streamed_safetensors
from fedvlr_plus.federation.state.store import CompactStore
from fedvlr_plus.federation.state.streamed_safetensors import (
    StoredTensor,
    load_streamed,
    loaded,
    read_header,
    save_streamed,
)
from fedvlr_plus.federation.synthetic import synthetic_data

FAST = dict(
    rounds=4,
    local_epochs=2,
    batch_size=8,
    negatives=2,
    dim=8,
    patience=10,
    ks=(5, 10),
    valid_metric="hr@10",
    chunk_floats=4096,
)


@pytest.mark.parametrize("writer", ["safetensors", "streamed"])
def test_large_tensors_stay_in_the_file_and_read_back_by_rows(tmp_path, writer):
    tensors = {
        "big": torch.randn(10, 3),
        "ids": torch.arange(4),
        "x": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 2),
        "flags": torch.tensor([True, False, True]),
    }
    path = tmp_path / "t.safetensors"
    save_file(tensors, path) if writer == "safetensors" else save_streamed(tensors, path)
    back = load_streamed(path, on_disk_from=100)  # only "big" (120 bytes) is left on disk
    assert isinstance(back["big"], StoredTensor) and back["big"].shape == (10, 3)
    assert not any(isinstance(back[k], StoredTensor) for k in tensors if k != "big")
    assert torch.equal(back["big"].rows(2, 7), tensors["big"][2:7]) and torch.equal(back["big"].load(), tensors["big"])
    whole = loaded({"a": [back["big"], (back["ids"],)]})
    assert torch.equal(whole["a"][0], tensors["big"]) and isinstance(whole["a"][1], tuple)
    assert all(torch.equal(back[k], v) for k, v in tensors.items() if k != "big")


def test_a_header_that_does_not_fit_its_file_is_refused(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.ones(4)}, path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    cases = {
        "short": raw[:5],
        "length": struct.pack("<Q", 10**9) + raw[8:],
        "truncated": raw[: 8 + n + 8],  # the header names 16 bytes of data; 8 are there
        "dtype": raw.replace(b'"F32"', b'"X32"'),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError):
            read_header(tmp_path / name)


@pytest.fixture
def reads(monkeypatch):
    """The number of rows of each read of a table left on disk."""
    sizes, rows = [], StoredTensor.rows

    def counting(self, start, stop):
        sizes.append(stop - start)
        return rows(self, start, stop)

    monkeypatch.setattr(StoredTensor, "rows", counting)
    return sizes


def test_a_store_restores_a_table_left_on_disk_block_by_block(tmp_path, monkeypatch, reads):
    values = torch.arange(40.0).reshape(10, 4)
    path = tmp_path / "t.safetensors"
    save_streamed({"v": values}, path)
    monkeypatch.setattr(streamed_safetensors, "ROW_BLOCK_BYTES", 48)  # three rows of 16 bytes a block
    store = CompactStore(capacity=10)
    cids = np.array([9, 3, 5, 0, 1, 2, 4, 6, 7, 8])
    store.restore(
        {
            "format": "compact",
            "params": {"v": {"clients": torch.from_numpy(cids), "values": load_streamed(path, on_disk_from=1)["v"]}},
        }
    )
    assert reads == [3, 3, 3, 1]
    for i, cid in enumerate(cids):
        assert torch.equal(store.load(int(cid))["v"], values[i])


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_run_resumed_from_blocks_gives_the_uninterrupted_numbers(tmp_path, monkeypatch, reads, kind):
    data = synthetic_data(40, 150, 10, seed=0)
    cfg = FedConfig(**FAST, private_store=kind)
    full = run_federated(data, "fcf", cfg, progress=False)

    def interrupt(run, record):
        if record["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_federated(data, "fcf", cfg, out_dir=tmp_path / "cut", progress=False, on_round=interrupt)
    monkeypatch.setattr(streamed_safetensors, "ROW_BLOCK_BYTES", 64)
    resumed = run_federated(data, "fcf", cfg, out_dir=tmp_path / "cut", resume=True, progress=False)
    assert len(reads) > 1 and max(reads) < 40  # the tables came in blocks, never a whole population's
    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in full["history"]]
    assert resumed["test"] == full["test"]


def test_the_resume_at_scale_example_trains_then_resumes(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "resume_at_scale.py"
    res = subprocess.run(
        [
            sys.executable,
            str(script),
            "--out",
            str(tmp_path / "run"),
            "--clients",
            "60",
            "--items",
            "40",
            "--store",
            "file",
            "--study",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    train, resume, study = (json.loads(line) for line in res.stdout.strip().splitlines())
    assert (study["step"], study["rounds"], study["store"]) == ("study", 3, "file")
    assert (train["step"], train["rounds"], resume["step"], resume["rounds"]) == ("train", 1, "resume", 2)
    assert train["store"] == resume["store"] == "file" and resume["peak_rss_gb"] > 0
    assert json.loads((tmp_path / "run" / "seed-0" / "result.json").read_text())["rounds_run"] == 2


def test_states_kept_in_a_file_come_back_after_the_store_moved_on(tmp_path):
    from fedvlr_plus.federation.state.file_store import FileStore
    from fedvlr_plus.federation.state.kept import KeptStates

    store = FileStore(tmp_path / "t", capacity=6)
    store.save_block(np.array([4, 1, 5]), {"w.a/b": torch.arange(12.0).reshape(3, 4), "n": torch.tensor([1, 2, 3])})
    store.commit()
    before = {c: store.load(c) for c in (4, 1, 5)}
    kept = KeptStates(store, tmp_path / "kept.safetensors")
    store.save_block(np.array([1, 0]), {"w.a/b": -torch.ones(2, 4), "n": torch.tensor([9, 9])})
    store.commit()
    kept.restore_into(store)
    assert 0 not in store and len(store) == 3
    for c, state in before.items():
        got = store.load(c)
        assert got.keys() == state.keys() and all(torch.equal(got[k], v) for k, v in state.items())


def test_a_file_written_over_in_place_holds_only_the_new_tensors(tmp_path):
    from safetensors.torch import load_file

    path = tmp_path / "t.safetensors"
    assert save_streamed({"a": torch.randn(50, 4), "b": torch.arange(7)}, path) is not None
    small = {"c": torch.ones(2, 2)}
    assert save_streamed(small, path, with_digest=False) is None
    back = load_file(path)
    assert back.keys() == {"c"} and torch.equal(back["c"], small["c"])
