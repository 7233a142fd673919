"""The CLI wiring of the federated engine: ``run SOURCE --backbone <federated>``, ``--resume`` and ``bench round``."""

import json

import pytest
from _shared import shared_data

from fedvlr_plus.cli import main


def last_json(capsys):
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_run_federated_backbone_on_ku(capsys, tmp_path):
    ku = str(shared_data("ku"))
    run_dir = tmp_path / "run"
    code = main(
        [
            "run",
            ku,
            "--backbone",
            "fedavg",
            "--rounds",
            "2",
            "--local-epochs",
            "1",
            "--dim",
            "16",
            "--no-progress",
            "--out",
            str(run_dir),
            "--json",
        ]
    )
    assert code == 0
    res = last_json(capsys)
    for key in (
        "valid",
        "test",
        "test_ci",
        "test_warm",
        "test_cold",
        "selected_round",
        "baselines",
        "per_seed",
        "files",
    ):
        assert key in res, key
    assert "history" not in res  # the JSON line is a summary; the per-round history is in the run folder
    assert res["backbone"] == "fedavg" and res["n_users"] == 204
    assert res["test_cold_n_users"] == 88 and res["test_warm_n_users"] == 116
    saved = json.loads((run_dir / "result.json").read_text())
    assert res["selected_round"] in (1, 2) and len(saved["history"]) == 2
    assert set(res["baselines"]) == {"pop", "random", "antipop"}
    assert (run_dir / "seed-0" / "manifest.json").exists() and (run_dir / "result.json").exists()
    # resuming a finished run reads it back instead of training again
    code = main(
        [
            "run",
            ku,
            "--backbone",
            "fedavg",
            "--rounds",
            "2",
            "--local-epochs",
            "1",
            "--dim",
            "16",
            "--no-progress",
            "--resume",
            str(run_dir),
            "--json",
        ]
    )
    assert code == 0 and last_json(capsys)["test"] == res["test"]


def test_run_rejects_unknown_backbone_and_bad_flags(capsys):
    with pytest.raises(SystemExit):
        main(["run", "ml-100k", "--backbone", "nope", "--rounds", "1"])
    with pytest.raises(SystemExit):
        main(["run", "ml-100k", "--backbone", "fedavg", "--strategy", "krum"])


def test_bench_round_on_synthetic_source(capsys):
    code = main(
        [
            "bench",
            "round",
            "synthetic:60x300",
            "--backbone",
            "fedavg",
            "--local-epochs",
            "1",
            "--repeats",
            "1",
            "--json",
        ]
    )
    assert code == 0
    res = last_json(capsys)
    assert res["clients"] == 60 and res["items"] == 300
    assert res["speedup"] > 0 and res["max_abs_diff"] < 1e-5


def test_resume_says_that_it_resumed_and_from_which_round(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    common = ["run", "synthetic:60x40", "--backbone", "fedavg", "--dim", "8", "--eval-every", "1"]
    assert main([*common, "--rounds", "2", "--out", run_dir, "--no-progress"]) == 0
    capsys.readouterr()
    assert main([*common, "--rounds", "4", "--resume", run_dir]) == 0
    err = capsys.readouterr().err
    assert err.startswith("resuming fedavg on synthetic-60x40") and f"writing to {run_dir}" in err
    assert "seed 0: resumed from its checkpoint at round 2 of up to 4" in err
    assert main([*common, "--rounds", "4", "--resume", run_dir]) == 0
    assert "seed 0: finished at round 4; its result is read back" in capsys.readouterr().err
