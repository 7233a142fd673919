"""Bad privacy settings: noise and a target epsilon together, a budget no noise reaches, an upload padding too
small for what a client touched, malformed lists of the privacy experiments. One line naming the flag, exit code
2, no traceback, nothing written."""

from __future__ import annotations

import pytest
from _bad_input import assert_user_error, files_under, run_cli

RUN = (
    "run",
    "synthetic:30x80",
    "--backbone",
    "fcf",
    "--rounds",
    "2",
    "--local-epochs",
    "1",
    "--dim",
    "8",
    "--no-progress",
)


@pytest.mark.parametrize(
    "args,needles",
    [
        (
            RUN + ("--target-epsilon", "2", "--upload-noise", "1"),
            ("--target-epsilon", "cannot be combined with --upload-noise"),
        ),
        (RUN + ("--target-epsilon", "0"), ("--target-epsilon", "must be > 0")),
        (
            RUN + ("--target-epsilon", "0.001", "--dp-delta", "1e-10"),
            ("--target-epsilon 0.001", "no noise multiplier up to 1e4 reaches it", "delta 1e-10"),
        ),
        (RUN + ("--dp-delta", "1"), ("--dp-delta", "(0, 1)")),
        (RUN + ("--pad-uploads", "-3"), ("--pad-uploads", ">= 0")),
        (RUN + ("--pad-uploads", "3"), ("--pad-uploads 3", "touched", "more than the padded size", "'all'")),
    ],
)
def test_bad_privacy_setting_of_run_is_one_line_and_writes_nothing(tmp_path, args, needles):
    out = tmp_path / "run"
    assert_user_error(run_cli(*args, "--out", str(out)), *needles)
    assert not {
        f for f in (files_under(out) if out.exists() else set()) if f.endswith("result.json") or "checkpoint" in f
    }


EXP = ("synthetic:30x80", "--backbone", "fcf", "--rounds", "1", "--local-epochs", "1", "--dim", "8", "--no-progress")


@pytest.mark.parametrize(
    "args,needles",
    [
        (("experiment", "privacy-table") + EXP + ("--noise", "0,-1"), ("--noise", "numbers >= 0", "'0,-1'")),
        (
            ("experiment", "privacy-table") + EXP + ("--target-epsilon", "3"),
            ("--target-epsilon", "sets the noise of each row itself"),
        ),
        (("experiment", "leakage") + EXP + ("--pads", "0,many"), ("--pads", "row counts or 'all'", "'0,many'")),
        (("experiment", "leakage") + EXP + ("--metric", "ndcg"), ("--metric ndcg", "expected METRIC@K", "ndcg@50")),
    ],
)
def test_bad_privacy_experiment_flag_is_one_line(tmp_path, args, needles):
    out = tmp_path / "table"
    assert_user_error(run_cli(*args, "--out", str(out)), *needles)
    assert not out.exists()
