"""A real full disk, not a fake: a small tmpfs (mounted where the machine lets this process mount; skipped with
the reason elsewhere) filled to a few kilobytes, then ``run --out`` and ``views build`` write into it. Each ends
with one line naming the path and the cause, exit 2, no traceback, and no temporary file left behind. ``coldstart``
and ``experiment paper-table`` are held to the same."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from _bad_input import assert_user_error, files_under, run_cli

from fedvlr_plus.atomic_write import is_temp_file

RUN = ("--backbone", "fedavg", "--dim", "4", "--rounds", "2", "--local-epochs", "1", "--no-progress")


@pytest.fixture
def nearly_full(tmp_path, request):
    """A 1 MB tmpfs with ``request.param`` KB left free (a filler file takes the rest)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; this test runs where it is allowed (CI containers as root)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {done.stderr.decode().strip()}")
    try:
        with open(mount / "filler", "wb") as f:
            f.write(b"\0" * ((1024 - request.param) * 1024))
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _left_behind(mount: Path) -> set[str]:
    """Temporary files and folders a failed write left (``.NAME.tmpPID`` files, ``.NAME.tmp-*`` folders)."""
    return {str(p.relative_to(mount)) for p in mount.rglob("*") if is_temp_file(p) or ".tmp" in p.name}


@pytest.mark.parametrize("nearly_full", [4, 16, 48], indirect=True, ids=["4k", "16k", "48k"])
def test_run_out_on_a_full_disk_is_one_line(nearly_full):
    out = nearly_full / "run"
    res = run_cli("run", "synthetic:30x40", *RUN, "--out", out)
    line = assert_user_error(res, str(out), "No space left on device", "free some disk space")
    assert "Safetensor" not in line
    assert _left_behind(nearly_full) == set()


@pytest.mark.parametrize("nearly_full", [16, 200], indirect=True, ids=["16k", "200k"])
def test_views_build_on_a_full_disk_is_one_line(nearly_full):
    store = nearly_full / "store"
    res = run_cli("views", "build", "ml-100k", "--encoder", "hashing", "--no-progress", "--out", store)
    assert_user_error(res, str(store), "No space left on device")
    assert _left_behind(nearly_full) == set() and not store.exists()


def test_a_killed_final_result_write_is_cleaned_at_the_next_start(tmp_path):
    out = tmp_path / "run"
    assert run_cli("run", "synthetic:20x30", *RUN, "--out", out).code == 0
    leftovers = [out / ".result.json.tmp4242", out / ".per_user_test.csv.tmp4243"]
    for path in leftovers:
        path.write_text("partial")
    res = run_cli("run", "synthetic:20x30", *RUN, "--resume", out)
    assert res.code == 0, res.err
    assert not any(p.exists() for p in leftovers)
    assert not any(is_temp_file(Path(p)) for p in files_under(out))


@pytest.mark.parametrize("nearly_full", [24], indirect=True, ids=["24k"])
def test_coldstart_on_a_full_disk_is_one_line(nearly_full):
    out = nearly_full / "cold"
    res = run_cli("coldstart", "ml-100k", "--cold-items", "0.2", *RUN, "--out", out)
    assert_user_error(res, str(nearly_full), "No space left on device")
    assert _left_behind(nearly_full) == set()


@pytest.mark.parametrize("nearly_full", [24], indirect=True, ids=["24k"])
def test_paper_table_on_a_full_disk_is_one_line(nearly_full):
    out = nearly_full / "table"
    res = run_cli(
        "experiment", "paper-table", "ml-100k", "--backbones", "fedavg", "--variants", "none", "--seeds", "1",
        "--dim", "4", "--rounds", "2", "--local-epochs", "1", "--no-progress", "--out", out,
    )  # fmt: skip
    assert_user_error(res, str(nearly_full), "No space left on device")
    assert _left_behind(nearly_full) == set()
