"""``--private-store file``: the compact store's tables in files, read and written a chunk at a time. Same rows,
same round bookkeeping and the same numbers as the in-memory store; nothing of the population held in memory."""

import os

import numpy as np
import pytest
import torch

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.errors import RunFolderError
from fedvlr_plus.federation import FedConfig, FederatedRun, run_federated
from fedvlr_plus.federation.state.file_store import FileStore, consecutive_runs
from fedvlr_plus.federation.state.kept import KeptStates
from fedvlr_plus.federation.state.store import CompactStore, load_block
from fedvlr_plus.federation.synthetic import synthetic_data
from fedvlr_plus.fedvlr import FedVLROptions, build_fedvlr

FAST = dict(
    rounds=3,
    local_epochs=2,
    batch_size=8,
    negatives=2,
    dim=8,
    patience=10,
    ks=(5, 10),
    valid_metric="hr@10",
    chunk_floats=4096,
)


def test_consecutive_runs_cut_where_rows_stop_going_up_by_one():
    assert consecutive_runs(np.array([], dtype=np.int64)) == []
    assert consecutive_runs(np.array([3, 4, 5, 9, 0, 0, 1])) == [(0, 3), (3, 4), (4, 5), (5, 7)]


def _fill(store):
    """The same writes into any compact store: out of order, two dtypes, a partial overwrite, a new client."""
    store.begin_round(1)
    store.save_block(
        np.array([5, 2, 7]), {"a": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3, 2, dtype=torch.float64)}
    )
    store.save(11, {"a": torch.full((4,), 3.5)})
    store.commit()
    store.begin_round(2)
    store.save_block(np.array([2, 9]), {"a": -torch.ones(2, 4)})
    store.commit()
    return store


def test_file_store_reads_back_what_the_memory_store_does(tmp_path):
    mem, disk = _fill(CompactStore()), _fill(FileStore(tmp_path / "t"))
    assert len(disk) == len(mem) == 5 and 9 in disk and 3 not in disk and disk.load(3) is None
    for cids in ([9, 5, 1, 2], [7], [2, 5, 7, 11], [1, 3]):
        got, want = load_block(disk, np.array(cids), ["a", "b"]), load_block(mem, np.array(cids), ["a", "b"])
        for name in ("a", "b"):
            assert np.array_equal(got[name][1], want[name][1])
            assert (got[name][0] is None) == (want[name][0] is None)
            if want[name][0] is not None:
                assert got[name][0].dtype == want[name][0].dtype and torch.equal(got[name][0], want[name][0])
    for cid in (2, 5, 7, 9, 11):
        a, b = disk.load(cid), mem.load(cid)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    snap, want = disk.snapshot(), mem.snapshot()
    for name, part in want["params"].items():
        assert torch.equal(snap["params"][name]["clients"], part["clients"])
        assert torch.equal(snap["params"][name]["values"], part["values"])
    # nothing of the population is held in memory: the rows are in the files, which are as long as the rows
    assert disk._cols == {} and disk.view_block(np.array([5, 2, 7]), ["a"]) is None
    sizes = sorted(os.fstat(t.fd).st_size for t in disk._tables.values())
    assert sizes == sorted([disk._tables["a"].rows * 16, disk._tables["b"].rows * 16])


def test_file_store_restores_a_snapshot_into_fresh_files_and_keeps_the_round_rules(tmp_path):
    mem = _fill(CompactStore())
    disk = FileStore(tmp_path / "t", capacity=4)
    disk.restore(mem.snapshot())
    assert all(torch.equal(disk.load(c)["a"], mem.load(c)["a"]) for c in (2, 5, 7, 9, 11))
    disk.begin_round(3)
    disk.save(1, {"a": torch.zeros(4)})
    disk.begin_round(3)  # the unfinished round's new client is gone, as in memory
    assert 1 not in disk
    disk.save(5, {"a": torch.zeros(4)})
    with pytest.raises(RuntimeError, match="checkpoint"):
        disk.begin_round(3)  # it had overwritten a stored state: only the checkpoint can undo that


def test_a_truncated_table_file_is_one_line_naming_it(tmp_path):
    disk = _fill(FileStore(tmp_path / "t"))
    path = disk._tables["a"].path
    assert not path.exists()  # no name on disk: a killed run leaves nothing behind
    os.ftruncate(disk._tables["a"].fd, 8)
    with pytest.raises(RunFolderError, match=path.name):
        disk.load(5)


def test_a_full_disk_is_one_line_naming_the_table(tmp_path, monkeypatch):
    import errno

    from fedvlr_plus.errors import UserError

    disk = _fill(FileStore(tmp_path / "t"))

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(UserError, match="a.rows.*No space left") as err:
        disk.save(5, {"a": torch.zeros(4)})
    assert "\n" not in str(err.value)
    # the tables' disk space is reserved when they are made: a disk too small stops the run at its start
    monkeypatch.setattr(os, "posix_fallocate", lambda fd, offset, length: full(fd, b"", offset))
    with pytest.raises(UserError, match="c.rows.*No space left"):
        FileStore(tmp_path / "u", capacity=1000).save(0, {"c": torch.zeros(4)})


def _fedvlr(data):
    return build_fedvlr(data, make_backbone("fedavg", data.n_items, 8), FedVLROptions(progress=False))


@pytest.mark.parametrize("backbone", ["fcf", "fedrap", "fedvlr"])
def test_a_run_with_file_tables_gives_the_numbers_of_the_memory_store(backbone):
    data = synthetic_data(40, 150, 10, seed=0)
    if backbone == "fedvlr":
        data.features = {"text": np.random.default_rng(0).standard_normal((data.n_items, 6)).astype(np.float32)}
    model = (lambda: _fedvlr(data)) if backbone == "fedvlr" else (lambda: backbone)
    a = FederatedRun(data, model(), FedConfig(**FAST), progress=False)
    b = FederatedRun(data, model(), FedConfig(**FAST, private_store="file"), progress=False)
    assert isinstance(b.store, FileStore) and b.store.kind == "file"
    ra, rb = a.run(), b.run()
    assert [h["loss"] for h in ra["history"]] == [h["loss"] for h in rb["history"]]
    assert ra["test"] == rb["test"] and ra["valid"] == rb["valid"]
    for cid in a.eligible[:5]:
        sa, sb = a.store.load(int(cid)), b.store.load(int(cid))
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("first", ["file", "memory"])
def test_an_interrupted_run_resumes_with_file_tables_to_the_same_numbers(tmp_path, first):
    """Also a run started with the memory store (one that ran out of memory resumes with the file store)."""
    data = synthetic_data(40, 150, 10, seed=0)
    cfg = FedConfig(**{**FAST, "rounds": 4}, private_store="file")
    full = run_federated(data, "fcf", cfg, out_dir=tmp_path / "full", progress=False)

    def interrupt(run, record):
        if record["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_federated(
            data,
            "fcf",
            FedConfig(**{**cfg.to_dict(), "private_store": first}),
            out_dir=tmp_path / "cut",
            progress=False,
            on_round=interrupt,
        )
    resumed = run_federated(data, "fcf", cfg, out_dir=tmp_path / "cut", resume=True, progress=False)
    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in full["history"]]
    assert resumed["test"] == full["test"]


def test_a_streamed_safetensors_file_reads_back_with_safetensors(tmp_path):
    from safetensors.torch import load_file

    from fedvlr_plus.federation.state.file_store import TableRows
    from fedvlr_plus.federation.state.streamed_safetensors import StreamedTensor, save_streamed

    disk = _fill(FileStore(tmp_path / "t"))
    rows = disk._row[np.array([7, 2, 9])]
    tensors = {
        "t0": torch.randn(3, 4),
        "t1": torch.arange(5),
        "t2": torch.tensor(2.5, dtype=torch.float64),
        "t3": torch.zeros(0, 3),
        "t4": torch.tensor([True, False]),
        "t5": TableRows(disk, "a", rows),
    }
    from fedvlr_plus.federation.runs.folder import sha256_file

    digest = save_streamed(tensors, tmp_path / "s.safetensors")
    assert digest == sha256_file(tmp_path / "s.safetensors")  # taken while writing: the run folder lists it
    back = load_file(tmp_path / "s.safetensors")
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[k], v) for k, v in tensors.items() if k != "t5")
    assert torch.equal(back["t5"], load_block(disk, np.array([7, 2, 9]), ["a"])["a"][0])

    class Short(StreamedTensor):  # a source that gives fewer bytes than its shape says is refused
        def blocks(self):
            yield b"\0" * 4

    with pytest.raises(ValueError, match="'bad'.*4 bytes"):
        save_streamed({"bad": Short((2,), torch.float32)}, tmp_path / "bad.safetensors")


def test_a_checkpoint_of_file_tables_is_written_from_the_files_in_blocks(tmp_path, monkeypatch):
    """The engine's checkpoint takes the file store's rows as sources read a block at a time (never the whole
    population in memory), and the checkpoint reads back to the stored states."""
    from fedvlr_plus.federation.runs.folder import SeedFolder
    from fedvlr_plus.federation.state import file_store, streamed_safetensors

    monkeypatch.setattr(streamed_safetensors, "ROW_BLOCK_BYTES", 64)  # several blocks per table even at this size
    reads = []
    original = FileStore._read_rows

    def counted(self, name, rows):
        reads.append(len(rows))
        return original(self, name, rows)

    monkeypatch.setattr(FileStore, "_read_rows", counted)
    data = synthetic_data(40, 150, 10, seed=0)
    run = FederatedRun(
        data,
        "fcf",
        FedConfig(**{**FAST, "rounds": 1}, private_store="file"),
        run_dir=tmp_path / "seed-0",
        progress=False,
    )
    run.run()
    snap = run.store.snapshot(copy=False)
    assert all(isinstance(p["values"], file_store.TableRows) for p in snap["params"].values())
    reads.clear()
    run.save_checkpoint()
    row_bytes = max(t.row_bytes for t in run.store._tables.values())
    assert reads and max(reads) <= max(1, 64 // row_bytes)
    private = SeedFolder(tmp_path / "seed-0").read_checkpoint()["private"]["params"]
    for name, part in private.items():
        cids = part["clients"].numpy()
        assert torch.equal(part["values"], load_block(run.store, cids, [name])[name][0])


def test_a_cold_start_training_keeps_its_selected_round_with_file_tables():
    """The cold-start study restores the selected round's states into the store it trained with: the file
    store ends with the states of the memory store (a disk store is replaced by memory there)."""
    from fedvlr_plus.coldstart.experiment import train_selected

    data = synthetic_data(40, 150, 10, seed=0)
    cfg = FedConfig(**{**FAST, "rounds": 8, "eval_every": 1})  # selects round 6 of 8
    mem = train_selected(data, "fcf", cfg)
    kept = []
    real = KeptStates.__init__

    def keeping(self, store, path):  # the selected round's states are kept in a file, not in memory
        kept.append(path)
        real(self, store, path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(KeptStates, "__init__", keeping)
        disk = train_selected(data, "fcf", FedConfig(**{**cfg.to_dict(), "private_store": "file"}))
    assert isinstance(disk.store, FileStore) and disk.best["round"] == mem.best["round"]
    assert kept and not any(p.exists() for p in kept)  # and the file is gone once the states are back
    assert disk.best["round"] < disk.round  # (the run trained past its selected round, so the restore mattered)
    for cid in mem.eligible[:5]:
        a, b = disk.store.load(int(cid)), mem.store.load(int(cid))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_memory_file_system_under_tmpdir_is_named():
    from fedvlr_plus.federation.state.file_store import memory_file_system

    mounts = (
        "/dev/vda1 / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n/dev/vdb /tmp/disk xfs rw 0 0\n"
        "tmpfs /run/user\\0401 tmpfs rw 0 0\n"
    )
    assert memory_file_system("/tmp/fedvlr-private-x/tables", mounts) == "tmpfs"
    assert memory_file_system("/tmp/disk/tables", mounts) is None  # the deepest mount point decides
    assert memory_file_system("/tmpfoo/tables", mounts) is None  # a name that only starts like /tmp
    assert memory_file_system("/run/user 1/x", mounts) == "tmpfs"  # octal-escaped spaces in mount points
    assert memory_file_system("/home/x", mounts) is None


def test_the_run_warns_when_its_state_files_would_sit_in_memory(monkeypatch):
    from fedvlr_plus.federation.state import file_store

    monkeypatch.setattr(file_store, "memory_file_system", lambda path: "tmpfs")
    data = synthetic_data(20, 40, 6, seed=0)
    with pytest.warns(RuntimeWarning, match="tmpfs.*set TMPDIR"):
        FederatedRun(data, "fedavg", FedConfig(**{**FAST, "rounds": 1}, private_store="file"), progress=False)
