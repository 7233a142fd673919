"""Bad flags of ``fedvlr-plus align fedmpt``: one line, exit 2, nothing trained or written."""

from _bad_input import assert_user_error, files_under, run_cli


def test_bad_fedmpt_out_dir_is_a_file(tmp_path):
    out = tmp_path / "table.md"
    out.write_text("keep me")
    res = run_cli("align", "fedmpt", "ml-100k", "--seeds", "0", "1", "--out-dir", str(out))
    assert_user_error(res, "--out-dir", str(out), "not a folder")
    assert out.read_text() == "keep me" and files_under(tmp_path) == {"table.md"}
