"""A torch/torchvision pair that does not match is one line naming both versions and the pair to install."""

from __future__ import annotations

import builtins

import pytest

from fedvlr_plus.views.errors import EncoderUnavailable
from fedvlr_plus.views.torch_pair import check_torch_pair, matching_torchvision


def test_the_matching_torchvision_release_follows_torch():
    assert matching_torchvision("2.14.1+cu130") == "0.29.1"
    assert matching_torchvision("2.13.0+cpu") == "0.28.0"
    assert matching_torchvision("2.9.1") == "0.24.1"
    assert matching_torchvision("1.13.1") is None and matching_torchvision("nightly") is None


def test_a_torchvision_built_for_another_torch_is_one_line(monkeypatch):
    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "torchvision":
            raise RuntimeError("operator torchvision::nms does not exist\nmore lines of the C++ trace")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(EncoderUnavailable) as caught:
        check_torch_pair()
    message = str(caught.value)
    assert "\n" not in message and "operator torchvision::nms does not exist" in message
    assert message.startswith("torchvision ") and " does not load beside torch " in message
    assert "pip install 'torch==" in message and "'torchvision==0." in message


def test_the_encoders_check_the_pair_before_importing_open_clip(monkeypatch):
    from fedvlr_plus.views import open_clip_encoder, torch_pair

    def mismatched():
        raise torch_pair.mismatch_error(RuntimeError("operator torchvision::nms does not exist"))

    monkeypatch.setattr(torch_pair, "check_torch_pair", mismatched)
    with pytest.raises(EncoderUnavailable, match="does not load beside torch"):
        open_clip_encoder.OpenClipEncoder(model="ViT-B-32", pretrained=None)
