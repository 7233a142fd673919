"""Every command's ``--out`` is checked before any data is read: a file where a folder goes, a folder where a
file goes, or a place nobody may write is one line at once (each case here would otherwise train first)."""

from __future__ import annotations

import os

import pytest
from _bad_input import assert_user_error, run_cli

#: commands that write a folder, with the least each needs to start
FOLDER_COMMANDS = [
    ["run", "ml-100k", "--backbone", "fedavg", "--rounds", "1"],
    ["coldstart", "ml-100k", "--cold-items", "0.2", "--backbone", "fedavg", "--rounds", "1"],
    ["experiment", "paper-table", "ml-100k", "--rounds", "1"],
    ["experiment", "privacy-table", "ml-100k", "--rounds", "1"],
    ["experiment", "poisoning", "ml-100k", "--rounds", "1"],
    ["experiment", "leakage", "ml-100k", "--rounds", "1"],
    ["experiment", "planted", "--users", "60", "--items", "80", "--rounds", "1"],
    ["experiment", "view-routing", "ml-100k", "--rounds", "1"],
    ["views", "build", "ml-100k"],
    ["bench", "runs", "--quick"],
]


@pytest.mark.parametrize("command", FOLDER_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_file_given_as_the_output_folder_is_refused_before_any_work(tmp_path, command):
    afile = tmp_path / "a-file"
    afile.write_text("keep me\n")
    res = run_cli(*command, "--out", afile)
    assert_user_error(res, f"--out {afile}", "is a file")
    assert afile.read_text() == "keep me\n"


def test_a_folder_given_as_the_report_file_is_refused(tmp_path):
    res = run_cli("report", tmp_path, "--out", tmp_path)
    assert_user_error(res, f"--out {tmp_path}", "is a folder")


def test_an_output_under_a_file_is_refused(tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("")
    res = run_cli("run", "ml-100k", "--backbone", "pop", "--out", afile / "sub" / "run")
    assert_user_error(res, f"--out {afile / 'sub' / 'run'}", "is a file, so no folder can be made under it")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_an_output_in_a_read_only_folder_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    res = run_cli("run", "ml-100k", "--backbone", "pop", "--out", locked / "run")
    assert_user_error(res, "is not writable")


@pytest.mark.parametrize(
    "command, needles",
    [
        (
            ["run", "ml-100k", "--backbone", "fedavg", "--clients-per-round", "5000"],
            ["--clients-per-round 5000", "943 users"],
        ),
        (["run", "ml-100k", "--backbone", "fedavg", "--negatives", "100000"], ["--negatives 100000", "1,682"]),
        (["experiment", "paper-table", "ml-100k", "--clients-per-round", "944"], ["--clients-per-round 944", "943"]),
        (["experiment", "poisoning", "ml-100k", "--popular-pool", "99999"], ["--popular-pool 99999", "1,682 items"]),
        (
            ["coldstart", "ml-100k", "--cold-items", "0.2", "--backbone", "fedavg", "--negatives", "5000"],
            ["--negatives"],
        ),
    ],
    ids=["run-clients", "run-negatives", "paper-table-clients", "poisoning-pool", "coldstart-negatives"],
)
def test_counts_beyond_the_data_are_one_line_before_any_round(command, needles):
    res = run_cli(*command, "--rounds", "1", "--no-progress")
    assert_user_error(res, *needles)
    assert "round 1" not in res.err


def test_a_cut_off_every_item_passes_is_a_note(monkeypatch):
    from fedvlr_plus.federation.state import choice

    monkeypatch.setattr(choice, "_SAID", set())  # said once per process: an earlier test may have said it
    res = run_cli("run", "synthetic:60x40", "--backbone", "fedavg", "--rounds", "1", "--no-progress")
    assert res.code == 0
    assert "note: cut-off 50 is at least the catalogue of synthetic-60x40 (40 items)" in res.err
    assert "--valid-metric hr@50 cannot choose a round" in res.err
