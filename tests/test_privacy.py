"""Clipped, noised uploads (--upload-noise): the client-side Gaussian mechanism."""

import numpy as np
import pytest
import torch
from test_simulator import tiny_csr

from fedvlr_plus.adapters import make_backbone
from fedvlr_plus.federation import BatchedSimulator, ClientUpdate, FedConfig, MemoryStore, SequentialSimulator
from fedvlr_plus.federation.engine import FederatedRun
from fedvlr_plus.federation.privacy.noise import privatise
from fedvlr_plus.federation.state.initial import init_shared_state
from fedvlr_plus.federation.synthetic import synthetic_data


def _update(kind="grads"):
    return ClientUpdate(
        cid=3,
        kind=kind,
        arrays={"t": torch.full((2, 2), 3.0), "w": torch.tensor([4.0])},
        rows={"t": torch.tensor([1, 5])},
        num_examples=2,
    )


def test_off_returns_the_update_unchanged():
    u = _update()
    assert privatise(u, {}, {"upload_noise": 0.0, "upload_clip": 0.0}) is u


def test_clipping_bounds_the_norm_of_gradients_hand_computed():
    u = _update()  # ||(3,3,3,3,4)|| = sqrt(36 + 16) = sqrt(52)
    out = privatise(u, {}, {"upload_clip": 1.0, "upload_noise": 0.0})
    norm = torch.sqrt(sum((a**2).sum() for a in out.arrays.values()))
    assert float(norm) == pytest.approx(1.0, rel=1e-6)
    assert float(out.arrays["w"][0]) == pytest.approx(4.0 / np.sqrt(52.0), rel=1e-6)
    assert torch.equal(out.rows["t"], u.rows["t"]) and out.num_examples == 2
    small = privatise(u, {}, {"upload_clip": 100.0, "upload_noise": 0.0})  # inside the ball: unchanged
    assert torch.allclose(small.arrays["t"], u.arrays["t"])


def test_parameter_uploads_clip_the_change_not_the_value():
    shared = {"t": torch.zeros(8, 2), "w": torch.tensor([1.0])}
    shared["t"][[1, 5]] = 2.0
    u = ClientUpdate(
        cid=0,
        kind="params",
        arrays={"t": torch.full((2, 2), 2.0), "w": torch.tensor([3.0])},
        rows={"t": torch.tensor([1, 5])},
        num_examples=1,
    )
    out = privatise(u, shared, {"upload_clip": 0.5, "upload_noise": 0.0})
    # the table rows did not change; the head moved by 2 -> clipped to 0.5
    assert torch.allclose(out.arrays["t"], torch.full((2, 2), 2.0))
    assert float(out.arrays["w"][0]) == pytest.approx(1.5)


def test_noise_has_the_stated_scale_and_is_keyed_by_client_and_row():
    big = ClientUpdate(
        cid=7, kind="grads", arrays={"t": torch.zeros(4000, 8)}, rows={"t": torch.arange(4000)}, num_examples=1
    )
    cfg = {"upload_clip": 0.5, "upload_noise": 2.0, "seed": 1, "round": 4}
    z = privatise(big, {}, cfg).arrays["t"]
    assert float(z.std()) == pytest.approx(1.0, rel=0.03)  # sigma * C = 2 * 0.5
    assert abs(float(z.mean())) < 0.01
    # the same row gets the same noise whichever other rows are uploaded (batched == sequential needs this)
    part = ClientUpdate(
        cid=7, kind="grads", arrays={"t": torch.zeros(2, 8)}, rows={"t": torch.tensor([10, 3999])}, num_examples=1
    )
    zp = privatise(part, {}, cfg).arrays["t"]
    assert torch.allclose(zp, z[[10, 3999]])
    other = privatise(
        ClientUpdate(
            cid=8, kind="grads", arrays={"t": torch.zeros(4000, 8)}, rows={"t": torch.arange(4000)}, num_examples=1
        ),
        {},
        cfg,
    ).arrays["t"]
    assert not torch.allclose(other, z)
    later = privatise(big, {}, {**cfg, "round": 5}).arrays["t"]
    assert not torch.allclose(later, z)


def test_negative_settings_are_errors():
    with pytest.raises(ValueError, match=">= 0"):
        privatise(_update(), {}, {"upload_noise": -1.0})
    with pytest.raises(ValueError, match="upload_noise"):
        FedConfig(upload_noise=-0.1)


@pytest.mark.parametrize("name,upload", [("fedavg", "params"), ("fcf", "grads")])
def test_batched_and_sequential_add_the_same_noise(name, upload):
    indptr, indices = tiny_csr()
    bb = make_backbone(name, 40, 8)
    config = dict(
        seed=0,
        round=2,
        epochs=2,
        negatives=2,
        batch_size=4,
        lr=0.3,
        item_lr_scale=1.0,
        weight_decay=0.0,
        upload=upload,
        upload_noise=0.5,
        upload_clip=1.0,
    )
    shared = init_shared_state(bb, 0)
    outs = []
    for cls in (BatchedSimulator, SequentialSimulator):
        sim = cls(bb, indptr, indices, MemoryStore(), seed=0)
        outs.append(sim.fit(np.arange(len(indptr) - 1), shared, config))
    plain = SequentialSimulator(bb, indptr, indices, MemoryStore(), seed=0).fit(
        np.arange(len(indptr) - 1), shared, {**config, "upload_noise": 0.0, "upload_clip": 0.0}
    )
    for a, b, p in zip(*outs, plain):
        for k in a.arrays:
            assert torch.allclose(a.arrays[k], b.arrays[k], atol=1e-5), (a.cid, k)
        assert any(not torch.allclose(a.arrays[k], p.arrays[k], atol=1e-3) for k in a.arrays)


def test_a_noised_run_trains_and_uploads_only_shared_arrays():
    data = synthetic_data(40, 150, 6, seed=2)
    seen = []
    cfg = FedConfig(rounds=2, local_epochs=1, upload_noise=0.3, dim=8)
    run = FederatedRun(data, "fcf", cfg, progress=False, on_upload=lambda r, u: seen.append(u))
    assert run.round_config(1)["upload_clip"] == 1.0  # clipping defaults on with noise
    run.run()
    assert seen and all(set(u.arrays) == set(run.bb.shared_names) for u in seen)
    assert all(float(torch.sqrt(sum((a**2).sum() for a in u.arrays.values()))) > 0 for u in seen)
