"""Every .npy beside a feature folder's interactions is an item view: any number of content modalities."""

import numpy as np
from _shared import make_feature_folder

from fedvlr_plus.datasets import load_feature_folder
from fedvlr_plus.fedvlr import FedVLROptions, build_fedvlr
from fedvlr_plus.fedvlr.views import load_views


def _audio_folder(tmp_path):
    folder = make_feature_folder(tmp_path / "f")
    (folder / "image_features.npy").unlink()  # text plus two audio views, no image
    rng = np.random.default_rng(1)
    np.save(folder / "whisper.npy", rng.standard_normal((4, 6)).astype(np.float32))
    np.save(folder / "vggish.npy", rng.standard_normal((4, 2)))  # float64, as shipped
    return folder


def test_other_npy_files_are_views_named_by_their_stem(tmp_path):
    data = load_feature_folder(_audio_folder(tmp_path))
    assert sorted(data.features) == ["text", "vggish", "whisper"]
    assert data.features["vggish"].dtype == np.float32 and data.features["whisper"].shape == (4, 6)
    views = load_views(data, progress=False)
    assert sorted(views) == ["text", "vggish", "whisper"]


def test_the_layer_fuses_every_modality(tmp_path):
    data = load_feature_folder(_audio_folder(tmp_path))
    layer = build_fedvlr(data, "fedavg", FedVLROptions(progress=False))
    assert layer.keys == ["proj.id", "proj.v0", "proj.v1", "proj.v2"]
    assert sorted(layer.in_dims[1:]) == [2, 3, 6]
