"""Bad flags of ``fedvlr-plus align mor`` (the implicit-feedback seeds comparison): one line, exit 2, nothing
written."""

import pytest
from _bad_input import assert_user_error, files_under, run_cli


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--pooled-baseline"], ("--pooled-baseline", "rating-gaps")),
        (["--groups", "3", "--held-out-clients", "3"], ("--held-out-clients", "3 of 3 groups")),
        (
            ["--architectures", "bilinear,cooc"],
            ("--architectures bilinear,cooc", "cooc is not a reward of --reward-view features"),
        ),
        (
            ["--reward-view", "items", "--architectures", "mlp"],
            ("--architectures mlp", "--reward-view items", "cooc, next"),
        ),
        (["--reward-view", "items", "--router-holdout", "1"], ("--router-holdout 1.0", "below 1")),
    ],
)
def test_bad_mor_flags(tmp_path, flags, needles):
    out = tmp_path / "table"
    res = run_cli("align", "mor", "ml-100k", "--seeds", "1", "--out", str(out), *flags)
    assert_user_error(res, *needles)
    assert not out.exists()


def test_bad_mor_out_is_a_file(tmp_path):
    out = tmp_path / "result.json"
    out.write_text("keep me")
    res = run_cli("align", "mor", "ml-100k", "--seeds", "1", "--out", str(out))
    assert_user_error(res, str(out), "names a folder")
    assert out.read_text() == "keep me" and files_under(tmp_path) == {"result.json"}
