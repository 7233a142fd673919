"""``fedvlr-plus flower drill`` end to end on loopback (real SuperLink and SuperNodes): the report holds per-round
times, each node's bytes and stages, every process kind's peak RSS, and the same figures as the in-process run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedvlr-plus[flower]')")

APP = str(Path(__file__).resolve().parents[1] / "examples" / "flower_app")


@pytest.mark.slow  # real processes: a SuperLink, 2 SuperNodes, a ClientApp process per message
def test_the_drill_reports_a_deployment_beside_the_in_process_run(tmp_path):
    from fedvlr_plus.flower.drill import render, run_drill

    lines = []
    overrides = {"fusion": "none", "dim": 8, "local-epochs": 1, "max-users": 60}
    report = run_drill(
        "ml-100k", 2, 2, tmp_path, app_dir=APP, overrides=overrides, timeout=300, task_poll=0.1, progress=lines.append
    )
    assert json.loads((tmp_path / "drill.json").read_text()) == report
    d = report["deployment"]
    assert [h["round"] for h in d["history"]] == [1, 2] and all(h["train_seconds"] > 0 for h in d["history"])
    assert all(len(h["bytes_up"]) == 2 and min(h["bytes_up"].values()) > 0 for h in d["history"])
    assert sorted((t["node"], t["round"]) for t in d["node_times"]) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert all(t["process_start_s"] > 0 and t["build_s"] > 0 for t in d["node_times"])
    roles = {(p["group"], p["role"]) for p in d["processes"]}
    assert {
        ("supernode-0", "flwr-clientapp"),
        ("supernode-1", "flwr-clientapp"),
        ("superlink", "flwr-serverapp"),
    } <= roles
    assert all(p["peak_rss_mb"] > 0 for p in d["processes"])
    assert d["result"]["selected_round"] == report["in_process"]["result"]["selected_round"] == 2
    assert report["largest_metric_difference"] is not None and report["largest_metric_difference"] < 1e-4
    assert any("round 2/2 train" in x for x in lines)
    assert "largest difference of a figure" in render(report)
