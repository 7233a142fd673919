"""``--private-store auto`` (the default): the file store for a population whose states reach the threshold and
whose temporary folder is on a disk with room; the memory store otherwise. Either way the same numbers."""

import math
from collections import namedtuple

import pytest

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation import FedConfig, FederatedRun, run_federated
from fedvlr_plus.federation.state import choice as store_choice
from fedvlr_plus.federation.state.choice import FILE_STORE_FROM_BYTES, choose_private_store, private_state_bytes
from fedvlr_plus.federation.synthetic import synthetic_data

FAST = dict(
    rounds=2,
    local_epochs=1,
    batch_size=8,
    negatives=2,
    dim=8,
    patience=10,
    ks=(5, 10),
    valid_metric="hr@10",
    chunk_floats=4096,
)
Usage = namedtuple("Usage", "total used free")


def test_a_setting_other_than_auto_is_kept_whatever_the_size():
    for kind in ("memory", "file", "disk"):
        assert choose_private_store(kind, 10 * FILE_STORE_FROM_BYTES) == (kind, None)
        assert choose_private_store(kind, 0) == (kind, None)


def test_auto_keeps_small_populations_in_memory_and_large_ones_in_files(tmp_path, monkeypatch):
    monkeypatch.setattr(store_choice, "memory_file_system", lambda path: None)
    monkeypatch.setattr(store_choice.shutil, "disk_usage", lambda path: Usage(1 << 40, 0, 1 << 40))
    assert choose_private_store("auto", FILE_STORE_FROM_BYTES - 1, str(tmp_path)) == ("memory", None)
    kind, why = choose_private_store("auto", FILE_STORE_FROM_BYTES, str(tmp_path))
    assert kind == "file" and why == (
        f"private states: 1.00 GiB in files under {tmp_path} (--private-store auto; "
        "--private-store memory keeps them in memory)"
    )


def test_auto_stays_in_memory_where_files_would_not_help_or_not_fit(tmp_path, monkeypatch):
    big = 2 * FILE_STORE_FROM_BYTES
    monkeypatch.setattr(store_choice.shutil, "disk_usage", lambda path: Usage(1 << 40, 0, 1 << 40))
    monkeypatch.setattr(store_choice, "memory_file_system", lambda path: "tmpfs")
    kind, why = choose_private_store("auto", big, str(tmp_path))  # files there are memory
    assert kind == "memory" and f"{tmp_path} is a tmpfs (memory); set TMPDIR" in why
    monkeypatch.setattr(store_choice, "memory_file_system", lambda path: None)
    monkeypatch.setattr(store_choice.shutil, "disk_usage", lambda path: Usage(big, big, big))
    kind, why = choose_private_store("auto", big, str(tmp_path))  # no room beyond the tables
    assert kind == "memory" and why.startswith("private states: 2.00 GiB kept in memory") and "2.00 GiB free" in why
    monkeypatch.setattr(store_choice.shutil, "disk_usage", lambda path: Usage(4 * big, 0, 2 * big))
    assert choose_private_store("auto", big, str(tmp_path))[0] == "file"


def test_files_are_refused_in_one_line_where_the_platform_cannot_read_them(tmp_path, monkeypatch):
    from fedvlr_plus.federation.state.file_store import FileStore

    monkeypatch.delattr(store_choice.os, "preadv")
    from fedvlr_plus.errors import UserError

    with pytest.raises(UserError, match="no positioned file reads.*use --private-store memory"):
        FileStore(tmp_path / "t")
    kind, why = choose_private_store("auto", 2 * FILE_STORE_FROM_BYTES, str(tmp_path))
    assert kind == "memory" and "no positioned file reads" in why


def test_private_state_bytes_counts_every_private_parameter():
    bb = make_backbone("fedavg", 30, 8)
    per_client = sum(math.prod(s.shape) for s in bb.all_specs() if not s.shared)
    assert per_client > 0
    assert private_state_bytes(bb, 10) == 10 * per_client * 4


@pytest.fixture
def data():
    return synthetic_data(40, 150, 10, seed=0)


def test_auto_picks_files_at_the_threshold_with_the_same_numbers(data, monkeypatch, tmp_path, capsys):
    """The threshold lowered to one byte: an auto run trains with the file store, records what it chose, and
    reports what the memory store reports."""
    memory = run_federated(data, "fcf", FedConfig(**FAST, private_store="memory"), progress=False)
    monkeypatch.setattr(store_choice, "FILE_STORE_FROM_BYTES", 1)
    monkeypatch.setattr(store_choice, "memory_file_system", lambda path: None)
    monkeypatch.setattr(store_choice, "_SAID", set())
    run = FederatedRun(data, "fcf", FedConfig(**FAST), progress=True)
    assert run.cfg.private_store == "auto" and run.store.kind == "file"
    assert "in files under" in capsys.readouterr().err  # the run says where its states go, once a process
    FederatedRun(data, "fcf", FedConfig(**FAST), progress=True)
    assert "in files under" not in capsys.readouterr().err
    auto = run_federated(data, "fcf", FedConfig(**FAST), out_dir=tmp_path / "run", progress=False)
    assert auto["resolved"]["private_store"] == "file"
    assert [h["loss"] for h in auto["history"]] == [h["loss"] for h in memory["history"]]
    assert auto["test"] == memory["test"] and memory["resolved"]["private_store"] == "memory"


def test_a_run_interrupted_with_the_memory_store_resumes_under_auto_in_files(data, monkeypatch, tmp_path):
    cfg = FedConfig(**{**FAST, "rounds": 4})
    whole = run_federated(data, "fcf", cfg, progress=False)

    def interrupt(run, record):
        if record["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_federated(
            data,
            "fcf",
            FedConfig(**{**cfg.to_dict(), "private_store": "memory"}),
            out_dir=tmp_path / "cut",
            progress=False,
            on_round=interrupt,
        )
    monkeypatch.setattr(store_choice, "FILE_STORE_FROM_BYTES", 1)
    monkeypatch.setattr(store_choice, "memory_file_system", lambda path: None)
    resumed = run_federated(data, "fcf", cfg, out_dir=tmp_path / "cut", resume=True, progress=False)
    assert resumed["resolved"]["private_store"] == "file"
    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in whole["history"]]
    assert resumed["test"] == whole["test"]
