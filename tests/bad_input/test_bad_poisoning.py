"""Bad input to ``fedvlr-plus experiment poisoning``: one line naming the flag, exit 2, nothing written."""

from __future__ import annotations

import pytest
from _bad_input import assert_user_error, files_under, run_cli


@pytest.mark.parametrize(
    "flag, value, needles",
    [
        ("--attackers", "0,1.5", ("--attackers", "[0, 1)")),  # a fraction of 1 or more
        ("--attackers", "0,a", ("--attackers", "not a comma-separated list")),
        ("--strategies", "fedavg,krum", ("--strategies", "krum")),  # a rule the library does not have
        ("--target-quantile", "2", ("--target-quantile", "fraction")),  # not a fraction of the warm items
        ("--boost", "0", ("--boost", "positive")),
    ],
)
def test_bad_poisoning_flag(tmp_path, flag, value, needles):
    out = tmp_path / "report"
    res = run_cli(
        "experiment",
        "poisoning",
        "synthetic:30x40",
        "--rounds",
        "1",
        "--seeds",
        "1",
        flag,
        value,
        "--out",
        out,
        "--no-progress",
    )
    assert_user_error(res, *needles)
    assert not out.exists() or not files_under(out)
