"""Bad flags of ``fedvlr-plus align feddtl`` on the class-skewed split: one line, exit 2, nothing written."""

import numpy as np
import pytest
from _bad_input import assert_user_error, files_under, run_cli


def _folder(tmp_path):
    """A tiny feature folder: 12 users, 9 items with a 4-dimensional feature ``vec``."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [f"{u},{(u + k) % 9},1" for u in range(12) for k in range(4)]
    (data / "inter.csv").write_text("userID,itemID,rating\n" + "\n".join(rows) + "\n")
    np.save(data / "vec.npy", np.random.default_rng(0).standard_normal((9, 4)).astype(np.float32))
    return data


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--novel-classes", "1", "--classes", "0"], ("--novel-classes", "--classes K, or auto", "--classes 0")),
        (["--novel-classes", "1"], ("--content text", "vec")),  # auto makes k-means classes; no text to encode
        (["--content", "nosuch"], ("--content nosuch", "vec")),
        (["--content", "vec", "--classes", "1"], ("--classes 1", "between 2 and the 9 items")),
        (["--content", "vec", "--classes", "3", "--novel-classes", "3"], ("--novel-classes 3", "fewer than the 3")),
        (["--content", "vec", "--prototypes", "class"], ("--prototypes", "'class'", "item", "example")),
    ],
)
def test_bad_feddtl_class_flags(tmp_path, flags, needles):
    data = _folder(tmp_path)
    out = tmp_path / "table"
    res = run_cli("align", "feddtl", str(data), "--rounds", "1", "--sft-rounds", "1", "--out-dir", str(out), *flags)
    assert_user_error(res, *needles)
    assert not out.exists()


def test_bad_feddtl_out_dir_is_a_file(tmp_path):
    data = _folder(tmp_path)
    out = tmp_path / "result.json"
    out.write_text("keep me")
    res = run_cli("align", "feddtl", str(data), "--content", "vec", "--out-dir", str(out))
    assert_user_error(res, "--out-dir", str(out), "not a folder")
    assert out.read_text() == "keep me" and files_under(tmp_path) == {"result.json", "data/inter.csv", "data/vec.npy"}
