"""FedConfig is the union of typed concerns; each concern can be taken out on its own."""

from __future__ import annotations

from dataclasses import fields

import pytest

from fedvlr_plus.federation.config import CONCERNS, FedConfig


def test_every_setting_belongs_to_exactly_one_concern():
    owners = [f.name for cls in CONCERNS.values() for f in fields(cls)]
    assert len(owners) == len(set(owners))
    assert sorted(owners) == sorted(f.name for f in fields(FedConfig))


def test_a_part_carries_the_run_settings_of_its_concern():
    cfg = FedConfig(lr=0.5, strategy="fedgrad", upload_noise=1.0, seed=3, patience=4)
    assert cfg.part("training").lr == 0.5
    assert cfg.part("aggregation").strategy == "fedgrad"
    assert cfg.part("privacy").upload_noise == 1.0
    assert cfg.part("runtime").seed == 3 and cfg.part("evaluation").patience == 4
    assert type(cfg.part("training")).__name__ == "TrainingConfig"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"rounds": 0}, "rounds must be >= 1"),
        ({"strategy": "krum"}, "strategy must be one of"),
        ({"valid_protocol": "x"}, "valid_protocol must be full or sampled"),
        ({"device": "tpu"}, "device must be cpu, cuda or auto"),
        ({"dp_delta": 2.0}, "dp_delta must be in (0, 1)"),
    ],
)
def test_each_concern_checks_its_own_settings(bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FedConfig(**bad)


def test_the_validation_metric_is_always_computed():
    cfg = FedConfig(valid_metric="mrr@40", ks=(10,), metrics=("hr",))
    assert 40 in cfg.ks and "mrr" in cfg.metrics
