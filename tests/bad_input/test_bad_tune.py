"""``--tune`` without a fusion layer: one line that names the flag."""

from _bad_input import assert_user_error, run_cli


def test_tune_without_fusion_names_the_flag():
    res = run_cli("run", "ml-100k", "--backbone", "fedavg", "--tune")
    assert_user_error(res, "--tune", "no fusion layer")


def test_coldstart_tune_without_fusion_names_the_flag():
    res = run_cli("coldstart", "ml-100k", "--backbone", "fedavg", "--cold-users", "0.2", "--tune")
    assert_user_error(res, "--tune", "no fusion layer")
