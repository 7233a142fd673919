"""Bad flags of ``fedvlr-plus align fedvpa-gp``: one line, exit 2, nothing trained or written."""

from _bad_input import assert_user_error, files_under, run_cli


def test_bad_fedvpa_gp_out_dir_is_a_file(tmp_path):
    out = tmp_path / "table.md"
    out.write_text("keep me")
    res = run_cli("align", "fedvpa-gp", tmp_path / "no-such-hh", "--seeds", "0", "1", "--out-dir", str(out))
    assert_user_error(res, "--out-dir", str(out), "not a folder")
    assert out.read_text() == "keep me" and files_under(tmp_path) == {"table.md"}


def test_bad_fedvpa_gp_negative_seed(tmp_path):
    out = tmp_path / "table"
    res = run_cli("align", "fedvpa-gp", tmp_path / "no-such-hh", "--seeds", "0", "-1", "--out-dir", str(out))
    assert_user_error(res, "--seeds", "-1")
    assert not out.exists()
