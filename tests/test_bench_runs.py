"""``fedvlr-plus bench runs``: whole commands timed from outside, with the phases each command records."""

from __future__ import annotations

import json
from pathlib import Path

from fedvlr_plus.bench import runs
from fedvlr_plus.phases import PHASES_ENV, phase


def test_a_whole_command_is_timed_with_its_phases(tmp_path, monkeypatch):
    tiny = ["run", "synthetic:60x40", "--backbone", "fedavg", "--rounds", "2", "--dim", "8", "--no-progress"]
    monkeypatch.setattr(
        runs,
        "cases",
        lambda shared: [
            dict(id="tiny", title="a tiny run", argv=tiny, quick=True),
            dict(id="broken", title="a bad source", argv=["run", str(tmp_path / "nothing.csv")], quick=True),
            dict(id="away", title="needs a folder", argv=tiny, needs=str(tmp_path / "absent"), quick=True),
            dict(id="long", title="not quick", argv=tiny),
            dict(id="folder", title="with a run folder", argv=[*tiny, "--out", runs.RUN_DIR], quick=True),
        ],
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(runs.tempfile, "tempdir", str(scratch))
    doc = runs.run_all(tmp_path / "out", shared_data=tmp_path, quick=True)
    by_id = {c["id"]: c for c in doc["cases"]}
    tiny_case = by_id["tiny"]
    assert tiny_case["status"] == "ok" and tiny_case["wall_s"] > 0 and tiny_case["cpu_s"] > 0
    phases = tiny_case["phases"]
    for name in ("start-up", "loading", "training", "evaluation"):
        assert phases[name]["cpu_s"] > 0, name
    assert sum(p["cpu_s"] for p in phases.values()) <= tiny_case["cpu_s"] + 1e-6
    assert by_id["broken"]["status"] == "failed" and "exit code 2" in by_id["broken"]["reason"]
    assert by_id["away"]["status"] == "skipped" and "not found" in by_id["away"]["reason"]
    assert by_id["long"]["status"] == "skipped" and "--quick" in by_id["long"]["reason"]
    assert by_id["folder"]["status"] == "ok" and list(scratch.iterdir()) == []  # its run folder is removed after
    assert not Path(runs.RUN_DIR).exists()  # the placeholder was replaced by a folder of its own
    saved = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert [c["id"] for c in saved["cases"]] == ["tiny", "broken", "away", "long", "folder"]
    md = (tmp_path / "out" / "runs.md").read_text()
    assert "a tiny run" in md and "training CPU" in md


def test_phases_cost_nothing_and_write_nothing_when_off(tmp_path, monkeypatch):
    monkeypatch.delenv(PHASES_ENV, raising=False)
    with phase("training"):
        pass
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(PHASES_ENV, str(tmp_path / "p.jsonl"))
    with phase("training"):
        sum(range(10000))
    line = json.loads((tmp_path / "p.jsonl").read_text())
    assert line["phase"] == "training" and line["cpu_s"] >= 0 and line["wall_s"] > 0


def test_a_coldstart_study_records_its_loading_and_its_own_evaluations(tmp_path, monkeypatch, capsys):
    """The study loads through its own splitter and scores cold items and users itself (not through a run's
    evaluation): both are timed, so that ``bench runs`` does not count them as the command's other time."""
    from test_coldstart import _feature_folder

    from fedvlr_plus.cli import main

    log = tmp_path / "phases.jsonl"
    monkeypatch.setenv(PHASES_ENV, str(log))
    argv = ["coldstart", str(_feature_folder(tmp_path / "fx")), "--backbone", "fcf", "--rounds", "2", "--seeds", "1"]
    assert main([*argv, "--dim", "8", "--local-epochs", "1", "--no-progress", "--metrics", "hr@5", "--json"]) == 0
    capsys.readouterr()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["phase"] for x in lines].count("loading") == 1
    evaluations = [x for x in lines if x["phase"] == "evaluation"]
    # the run's own validation each round (2) and the study's scoring of the selected model on top of them
    assert len(evaluations) > 2 and all(x["cpu_s"] >= 0 and x["wall_s"] > 0 for x in evaluations)
