"""Bad run folders: every fault is one ``error:`` line naming the file or flag, exit code 2, and the folder is left
exactly as it was (no temporary file, no half-written checkpoint, nothing unpickled)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _bad_input import assert_user_error, files_under, run_cli  # noqa: E402

import fedvlr_plus.atomic_write as atomic_write  # noqa: E402

FAST = ["--backbone", "fedavg", "--dim", "4", "--local-epochs", "1", "--no-progress"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A RecBole atomic folder: 30 users, 150 items, 8 timed interactions each (loads in milliseconds)."""
    folder = tmp_path_factory.mktemp("data") / "tiny"
    folder.mkdir()
    rng = np.random.default_rng(0)
    lines = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    for u in range(30):
        lines += [f"u{u}\ti{i}\t5\t{1000 + 100 * u + j}" for j, i in enumerate(rng.choice(150, 8, replace=False))]
    (folder / "tiny.inter").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def finished(source, tmp_path_factory) -> Path:
    """A finished two-round run folder (copied by each test that changes it)."""
    out = tmp_path_factory.mktemp("runs") / "two"
    res = run_cli("run", source, *FAST, "--rounds", "2", "--out", out)
    assert res.code == 0, res.err
    return out


@pytest.fixture
def run_dir(finished, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(finished, dst)
    return dst


def contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the sha256 of its bytes: equal before and after means nothing changed
    (the empty lock file a run creates to lock the folder aside)."""
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in files_under(folder)
        if name != ".fedvlr.lock"
    }


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "seed-0" / "manifest.json").read_text())


def checkpoint_file(run_dir: Path, ext: str) -> Path:
    return run_dir / "seed-0" / f"{manifest(run_dir)['checkpoint']}.{ext}"


def relist(run_dir: Path, path: Path) -> None:
    """Update the manifest's checksum of ``path`` (someone who knows the format and forges a consistent folder)."""
    m = manifest(run_dir)
    m["files"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (run_dir / "seed-0" / "manifest.json").write_text(json.dumps(m))


class _PlantedPayload:
    """Unpickling this creates the marker file: proof that a loader executed code from the folder."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _flip_a_tensor_byte(run_dir):
    path = checkpoint_file(run_dir, "safetensors")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # inside the tensor data, after the header
    path.write_bytes(bytes(data))
    return path.name


def _truncate_metadata(run_dir):
    path = checkpoint_file(run_dir, "json")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path.name


def _edit_a_checksum(run_dir):
    m = manifest(run_dir)
    name = f"{m['checkpoint']}.json"
    m["files"][name] = "0" * 64
    (run_dir / "seed-0" / "manifest.json").write_text(json.dumps(m))
    return name


def _garble_the_manifest(run_dir):
    (run_dir / "seed-0" / "manifest.json").write_text('{"format": 1, "files": ')
    return "manifest.json"


def _delete_the_result(run_dir):
    (run_dir / "seed-0" / "result.json").unlink()
    return "result.json"


@pytest.mark.parametrize(
    "fault",
    [_flip_a_tensor_byte, _truncate_metadata, _edit_a_checksum, _garble_the_manifest, _delete_the_result],
    ids=lambda f: f.__name__.strip("_"),
)
def test_a_changed_run_folder_is_refused_naming_the_file(source, run_dir, fault):
    named = fault(run_dir)
    before = contents(run_dir)
    res = run_cli("run", source, *FAST, "--rounds", "2", "--resume", run_dir)
    line = assert_user_error(res, str(run_dir / "seed-0" / named))
    assert "sha256" in line or "manifest" in line or "missing" in line
    assert contents(run_dir) == before


def test_a_planted_pickle_checkpoint_is_never_unpickled(source, tmp_path):
    marker = tmp_path / "code-ran"
    seed = tmp_path / "old" / "seed-0"
    seed.mkdir(parents=True)
    (seed / "checkpoint.pt").write_bytes(pickle.dumps(_PlantedPayload(marker)))
    before = contents(tmp_path / "old")
    res = run_cli("run", source, *FAST, "--rounds", "2", "--resume", tmp_path / "old")
    assert_user_error(res, str(seed / "checkpoint.pt"), "pickled")
    assert not marker.exists()
    assert contents(tmp_path / "old") == before


def test_a_pickle_in_place_of_the_tensors_with_a_forged_manifest_is_not_executed(source, run_dir, tmp_path):
    marker = tmp_path / "code-ran"
    path = checkpoint_file(run_dir, "safetensors")
    path.write_bytes(pickle.dumps(_PlantedPayload(marker)))
    relist(run_dir, path)
    before = contents(run_dir)
    res = run_cli("run", source, *FAST, "--rounds", "2", "--resume", run_dir)
    assert_user_error(res, str(path), "not a safetensors file")
    assert not marker.exists()
    assert contents(run_dir) == before


def test_resume_of_a_missing_folder_is_an_error_and_creates_nothing(source, tmp_path):
    res = run_cli("run", source, *FAST, "--rounds", "2", "--resume", tmp_path / "nope")
    assert_user_error(res, str(tmp_path / "nope"), "--out")
    assert not (tmp_path / "nope").exists()


def test_resume_of_a_folder_without_a_run_is_an_error(source, tmp_path):
    (tmp_path / "empty").mkdir()
    res = run_cli("run", source, *FAST, "--rounds", "2", "--resume", tmp_path / "empty")
    assert_user_error(res, str(tmp_path / "empty"), "no checkpointed run")
    assert files_under(tmp_path / "empty") <= {".fedvlr.lock"}


@pytest.mark.parametrize(
    "flags,needles",
    [
        (["--lr", "0.3"], ["--lr", "0.5", "0.3"]),
        (["--metrics", "hr@10,ndcg@10,hr@50,ndcg@50,mrr@10"], ["--metrics", "'mrr'"]),
        (["--mask-history", "all"], ["--mask-history", "'train'", "'all'"]),
        (["--seed", "3"], ["--seed", "0", "3"]),
        (["--rounds", "1"], ["--rounds", "already trained 2"]),
    ],
    ids=["lr", "metrics", "mask-history", "seed", "fewer-rounds"],
)
def test_resume_with_a_different_setting_names_it_and_both_values(source, run_dir, flags, needles):
    before = contents(run_dir)
    res = run_cli("run", source, *FAST, "--rounds", "2", "--resume", run_dir, *flags)
    assert_user_error(res, str(run_dir), *needles)
    assert contents(run_dir) == before


def test_a_locked_folder_is_refused_while_another_run_writes_it(source, run_dir):
    from filelock import FileLock

    before = contents(run_dir)
    with FileLock(str(run_dir / ".fedvlr.lock"), is_singleton=False):  # what a running writer holds
        res = run_cli("run", source, *FAST, "--rounds", "3", "--resume", run_dir)
    assert_user_error(res, str(run_dir), "another run is writing")
    assert contents(run_dir) == before


def test_an_existing_run_folder_without_resume_is_refused(source, run_dir):
    before = contents(run_dir)
    res = run_cli("run", source, *FAST, "--rounds", "2", "--out", run_dir)
    assert_user_error(res, str(run_dir), "--resume")
    assert contents(run_dir) == before


def test_resume_with_a_different_out_is_refused(source, run_dir, tmp_path):
    res = run_cli("run", source, *FAST, "--rounds", "2", "--resume", run_dir, "--out", tmp_path / "other")
    assert_user_error(res, "--out", str(tmp_path / "other"))
    assert not (tmp_path / "other").exists()


def _failing_fsync(code: int):
    def fsync(path):  # the data reached the temporary file; flushing it to the disk fails
        assert Path(path).exists()
        raise OSError(code, os.strerror(code))

    return fsync


@pytest.mark.parametrize(
    "code,hint", [(errno.ENOSPC, "free some disk space"), (errno.EROFS, "read-only")], ids=["disk-full", "read-only"]
)
def test_a_failing_disk_is_one_line_and_leaves_the_last_checkpoint(source, run_dir, monkeypatch, code, hint):
    before = contents(run_dir)
    monkeypatch.setattr(atomic_write, "_fsync", _failing_fsync(code))
    res = run_cli("run", source, *FAST, "--rounds", "3", "--resume", run_dir)
    assert_user_error(res, str(run_dir / "seed-0" / "checkpoint-000003"), hint, os.strerror(code))
    assert contents(run_dir) == before  # no temporary file, the round-2 checkpoint still current
    monkeypatch.undo()
    res = run_cli("run", source, *FAST, "--rounds", "3", "--resume", run_dir)  # the disk has room again
    assert res.code == 0, res.err


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root writes into a read-only folder anyway; the fake disk above covers it",
)
def test_a_read_only_folder_is_one_line(source, run_dir):
    before = contents(run_dir)
    for folder in (run_dir, run_dir / "seed-0"):
        folder.chmod(0o555)
    try:
        res = run_cli("run", source, *FAST, "--rounds", "3", "--resume", run_dir)
    finally:
        for folder in (run_dir, run_dir / "seed-0"):
            folder.chmod(0o755)
    assert_user_error(res, str(run_dir))
    assert contents(run_dir) == before


def test_a_full_disk_on_a_new_run_leaves_no_temporary_file(source, tmp_path, monkeypatch):
    monkeypatch.setattr(atomic_write, "_fsync", _failing_fsync(errno.ENOSPC))
    res = run_cli("run", source, *FAST, "--rounds", "2", "--out", tmp_path / "new")
    assert_user_error(res, str(tmp_path / "new" / "seed-0" / "checkpoint-000001.safetensors"), "No space left")
    assert files_under(tmp_path / "new") <= {".fedvlr.lock"}


def _figures(res: dict):
    history = [{k: v for k, v in h.items() if "seconds" not in k} for h in res["history"]]
    return history, res["valid"], res["test"], res["selected_round"]


def test_resume_with_more_rounds_extends_a_finished_run_to_the_same_numbers(source, run_dir, tmp_path):
    res = run_cli("run", source, *FAST, "--rounds", "4", "--resume", run_dir, "--json", "--json-history")
    assert res.code == 0, res.err
    extended = json.loads(res.out.strip().splitlines()[-1])
    fresh = run_cli("run", source, *FAST, "--rounds", "4", "--json", "--json-history")
    assert fresh.code == 0, fresh.err
    assert extended["rounds_run"] == 4 and not extended["stopped_early"]
    assert _figures(extended) == _figures(json.loads(fresh.out.strip().splitlines()[-1]))
    assert manifest(run_dir)["checkpoint"] == "checkpoint-000004"
    assert not any(atomic_write.is_temp_file(Path(p)) for p in files_under(run_dir))
    assert sorted(p for p in files_under(run_dir / "seed-0") if p.startswith("checkpoint-")) == [
        "checkpoint-000004.json",
        "checkpoint-000004.safetensors",
    ]  # the old checkpoint is gone


def test_resume_with_more_seeds_adds_them(source, run_dir):
    res = run_cli("run", source, *FAST, "--rounds", "2", "--resume", run_dir, "--seeds", "2", "--json")
    assert res.code == 0, res.err
    out = json.loads(res.out.strip().splitlines()[-1])
    assert [r["seed"] for r in out["per_seed"]] == [0, 1]
    assert (run_dir / "seed-1" / "manifest.json").exists()


def test_what_a_killed_writer_left_behind_is_removed_on_resume(source, run_dir):
    """A temporary file and a checkpoint written but never listed (killed before the manifest) are leftovers."""
    seed = run_dir / "seed-0"
    leftovers = [seed / ".checkpoint-000003.safetensors.tmp4242", seed / "checkpoint-000003.json"]
    for path in leftovers:
        path.write_bytes(b"partial")
    res = run_cli("run", source, *FAST, "--rounds", "2", "--resume", run_dir)
    assert res.code == 0, res.err
    assert not any(path.exists() for path in leftovers)
    assert manifest(run_dir)["checkpoint"] == "checkpoint-000002"


def _swapped_copy(source: Path, dest: Path) -> Path:
    """``source`` with the items of two users' first (training) rows traded: same users, items, counts and the
    same sum of (user, item) keys, so only a real digest of the split tells the two apart."""
    lines = (source / "tiny.inter").read_text().splitlines()
    rows = [line.split("\t") for line in lines[1:]]
    items_of = {}
    for r in rows:
        items_of.setdefault(r[0], set()).add(r[1])
    # user u's first row is rows[8 * u] (8 timed rows each); users 5 and 6 appear after every item has been seen
    a, b = rows[8 * 5], rows[8 * 6]
    assert a[1] not in items_of[b[0]] and b[1] not in items_of[a[0]]
    a[1], b[1] = b[1], a[1]
    dest.mkdir(parents=True)
    (dest / "tiny.inter").write_text("\n".join([lines[0]] + ["\t".join(r) for r in rows]) + "\n")
    return dest


def test_resume_on_data_whose_rows_trade_items_is_refused(source, run_dir, tmp_path):
    from fedvlr_plus.federation.engine import dataset_identity
    from fedvlr_plus.run_data import load_and_split

    other = _swapped_copy(source, tmp_path / "swapped" / "tiny")
    old = dataset_identity(load_and_split(str(source))[0])
    new = dataset_identity(load_and_split(str(other))[0])
    assert {k: v for k, v in old.items() if k != "digest"} == {k: v for k, v in new.items() if k != "digest"}
    before = contents(run_dir)
    res = run_cli("run", other, *FAST, "--rounds", "3", "--resume", run_dir)
    assert_user_error(res, str(run_dir), "other data", "split digest")
    assert contents(run_dir) == before


def test_a_checkpoint_written_before_the_digest_still_resumes(source, run_dir):
    """Checkpoints of earlier versions carry no digest: they are compared by the count and sum they have."""
    path = checkpoint_file(run_dir, "json")
    ck = json.loads(path.read_text())
    del ck["state"]["dataset"]["digest"]
    path.write_text(json.dumps(ck))
    relist(run_dir, path)
    res = run_cli("run", source, *FAST, "--rounds", "3", "--resume", run_dir)
    assert res.code == 0, res.err
    assert manifest(run_dir)["checkpoint"] == "checkpoint-000003"


def test_the_split_digest_sees_pairs_ids_and_features_but_not_row_order():
    from fedvlr_plus.data_identity import split_digest
    from fedvlr_plus.federation.synthetic import synthetic_data

    data = synthetic_data(20, 30, 6.0, groups=2, seed=1, name="d")
    base = split_digest(data)
    shuffled = replace_inter(data, data.inter.sample(frac=1.0, random_state=0))
    assert split_digest(shuffled) == base
    moved = data.inter.copy()
    moved.loc[moved.index[0], "split"] = 2 if moved["split"].iloc[0] != 2 else 0
    assert split_digest(replace_inter(data, moved)) != base
    renamed = replace_inter(data, data.inter)
    renamed.item_ids = np.array([f"x{i}" for i in range(data.n_items)], dtype=object)
    assert split_digest(renamed) != base
    featured = replace_inter(data, data.inter)
    featured.features = {"text": np.zeros((data.n_items, 3), np.float32)}
    changed = replace_inter(data, data.inter)
    changed.features = {"text": np.zeros((data.n_items, 3), np.float32)}
    changed.features["text"][4, 1] = 1.0
    assert split_digest(featured) not in (base, split_digest(changed))


def replace_inter(data, inter):
    from dataclasses import replace

    return replace(data, inter=inter.reset_index(drop=True), features=dict(data.features))
