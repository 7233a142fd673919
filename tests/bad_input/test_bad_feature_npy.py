"""Bad extra .npy views in a feature folder: one line naming the file, exit 2, nothing written."""

import numpy as np
import pytest
from _bad_input import assert_user_error, files_under, run_cli
from _shared import make_feature_folder


def _folder(tmp_path):
    folder = make_feature_folder(tmp_path / "f")
    np.save(folder / "whisper.npy", np.zeros((4, 6), np.float32))
    return folder


@pytest.mark.parametrize(
    "fault, needles",
    [("rows", ("whisper.npy", "3 rows", "4 items")), ("twice", ("text.npy", "text_features.npy", "rename"))],
)
def test_bad_extra_feature_file(tmp_path, fault, needles):
    folder = _folder(tmp_path)
    if fault == "rows":
        np.save(folder / "whisper.npy", np.zeros((3, 6), np.float32))
    else:
        np.save(folder / "text.npy", np.zeros((4, 3), np.float32))
    before = files_under(folder)
    assert_user_error(run_cli("data", "stats", str(folder)), *needles)
    assert files_under(folder) == before
