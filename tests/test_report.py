"""``fedvlr-plus report RUN_DIR``: one page that needs nothing else, holding the folder's figures with their
intervals, learning curves, the router, cold-start curves and per-bucket gains; a folder that is not a run's is
one line. Headless Chromium (Debian's package) loads the page: every plot decodes and no script fails."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import tempfile
from html import unescape
from pathlib import Path

import numpy as np
import pytest
from _bad_input import assert_user_error, run_cli

FIGURE = '<figure class="plot">'
CHROMIUM = Path("/usr/bin/chromium")
#: headless, and nothing that reaches for the network (without these it waits on connections that never open)
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"Chromium is not installed ({CHROMIUM}); on Debian: apt-get install chromium"
)


def run_folder(out):
    """A FedVLR run of two seeds with its per-round CSV log, written by the command line."""
    res = run_cli(
        "run", "synthetic-planted:60x80", "--backbone", "fedavg", "--fusion", "fedvlr", "--no-tune", "--rounds",
        "2", "--seeds", "2", "--dim", "8", "--local-epochs", "1", "--log", "csv", "--no-progress", "--out", out,
    )  # fmt: skip
    assert res.code == 0, res.err
    return out


def feature_folder(path, n_users=30, n_items=110):
    """Interactions (6 per user: 4 train, 1 valid, 1 test) and two item views, in the FedVLR folder layout."""
    g = np.random.default_rng(7)
    lines = ["userID,itemID,rating,timestamp,split_label"]
    for u in range(n_users):
        for t, i in enumerate(g.choice(n_items, size=6, replace=False)):
            lines.append(f"{u},{int(i)},1,{t},{0 if t < 4 else t - 3}")
    path.mkdir(parents=True)
    (path / "inter.csv").write_text("\n".join(lines) + "\n")
    group = np.eye(4)[np.arange(n_items) % 4]
    np.save(path / "text_features.npy", np.hstack([group, g.standard_normal((n_items, 4))]).astype(np.float16))
    np.save(path / "image_features.npy", g.standard_normal((n_items, 8)).astype(np.float16))
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return run_folder(tmp_path_factory.mktemp("report") / "run")


def page_of(folder) -> str:
    res = run_cli("report", folder)
    assert res.code == 0, res.err
    path = folder / "report.html"
    assert res.out.splitlines() == [
        f"wrote {path}",
        f"next: open it in a browser (xdg-open {path}, or on macOS open {path}); it needs no network",
    ]
    return path.read_text(encoding="utf-8")


def test_run_page_holds_each_seeds_interval_curves_and_router(run_dir):
    html = page_of(run_dir)
    result = json.loads((run_dir / "result.json").read_text())
    assert len(result["per_seed"]) == 2
    for seed in result["per_seed"]:
        lo, hi = seed["test_ci"]["hr@10"]
        assert f"{seed['test']['hr@10']:.4f} [{lo:.4f}, {hi:.4f}]" in html
    assert f"{result['test']['hr@10']:.4f} ± {result['test_std']['hr@10']:.4f}" in html
    assert f"{result['baselines']['pop']['all']['hr@10']:.4f}" in html
    for heading in ("figures", "learning curves", "router weights", "router by round"):
        assert f"<h2>{heading}</h2>" in html
    assert html.count(FIGURE) == 3  # learning curves, router weights, router by round
    for expert, weight in zip(result["router"]["experts"], result["router"]["mean_weights"]):
        assert expert in html and f"{weight:.4f}" in html


def test_page_needs_no_other_file_or_host(run_dir):
    html = page_of(run_dir)
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", html), "the page links to something outside it"
    assert "<link" not in html and "@import" not in html and "url(" not in html
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == html.count(FIGURE) and all(len(i) > 1000 for i in images)


def test_report_out_writes_where_asked(run_dir, tmp_path):
    res = run_cli("report", run_dir, "--out", tmp_path / "elsewhere" / "page.html")
    assert res.code == 0, res.err
    assert (tmp_path / "elsewhere" / "page.html").read_text().startswith("<!DOCTYPE html>")


def test_coldstart_page_has_the_curves_and_per_bucket_gains(tmp_path):
    out = tmp_path / "cold"
    res = run_cli(
        "coldstart", feature_folder(tmp_path / "fx"), "--backbone", "fedavg", "--cold-users", "0.2", "--support",
        "1,2", "--support-epochs", "1", "--rounds", "2", "--seeds", "1", "--dim", "8", "--local-epochs", "1",
        "--no-progress", "--metrics", "hr@5,ndcg@5", "--cold-select", "ndcg@5", "--out", out,
    )  # fmt: skip
    assert res.code == 0, res.err
    html = page_of(out)
    for heading in ("cold-start curves", "per-bucket gains"):
        assert f"<h2>{heading}</h2>" in html
    assert "user_coldstart.png" in html and "sparsity.png" in html
    assert html.count(FIGURE) == len(list(out.glob("*.png")))
    assert "by support size" in html
    for row in csv.DictReader(open(out / "sparsity.csv", newline="")):
        assert f">{row['bucket']}</td>" in html


def test_bucket_gains_are_over_the_popularity_ranker_of_the_same_bucket():
    from fedvlr_plus.report.tables import bucket_gains

    coldstart = [  # sparsity.csv of coldstart: pop in its own column
        {"model": "m", "bucket": "1-10", "n_users": "4", "metric": "hr@5", "mean": "0.3", "ci_low": "0.1",
         "ci_high": "0.5", "pop": "0.25"},
        {"model": "m", "bucket": "11-20", "n_users": "2", "metric": "hr@5", "mean": "0.1", "ci_low": "",
         "ci_high": "", "pop": ""},
    ]  # fmt: skip
    table = bucket_gains("t", coldstart)
    assert table.rows == [
        ["m", "1-10", "4", "0.3000 [0.1000, 0.5000] (+0.0500 over pop)"],
        ["m", "11-20", "2", "0.1000"],
    ]
    paper = [  # sparsity.csv of paper-table: pop as one of the models
        {"model": "pop", "bucket": "1-10", "n_users": "4", "metric": "hr@5", "mean": "0.4"},
        {"model": "random", "bucket": "1-10", "n_users": "4", "metric": "hr@5", "mean": "0.0"},
        {"model": "m", "bucket": "1-10", "n_users": "4", "metric": "hr@5", "mean": "0.3"},
    ]
    assert bucket_gains("t", paper).rows == [["m", "1-10", "4", "0.3000 (-0.1000 over pop)"]]


def test_a_tuned_run_shows_the_recipes_it_tried_and_the_one_it_kept():
    from fedvlr_plus.report.tables import tuning_table

    tuning = {"metric": "hr@50", "seed": 0, "selected": "residual", "candidates": [
        {"name": "defaults", "settings": {"--fusion-residual": False}, "valid": 0.31},
        {"name": "residual", "settings": {"--fusion-residual": True, "--lr": 0.5}, "valid": 0.33},
    ]}  # fmt: skip
    table = tuning_table({"tuning": tuning})
    assert table.rows == [
        ["defaults", "the layer's defaults", "0.3100", ""],
        ["residual", "--fusion-residual, --lr 0.5", "0.3300", "kept"],
    ]
    assert tuning_table({}) is None


def test_paper_table_page_lays_out_every_row(tmp_path):
    out = tmp_path / "paper"
    out.mkdir()
    (out / "result.json").write_text(json.dumps({"dataset": "toy", "rows": [], "paired_tests": {}, "notes": ["n1"]}))
    (out / "table.csv").write_text(
        "model,kind,part,n_users,seeds,hr@10,hr@10_std,hr@10_ci_low,hr@10_ci_high\n"
        "pop,reference,all,20,1,0.135,0.0,0.035,0.351\n"
        "fedavg,federated,all,20,2,0.25,0.01,0.1,0.4\n"
    )
    html = page_of(out)
    assert "0.1350 [0.0350, 0.3510]" in html and "0.2500 ± 0.0100 [0.1000, 0.4000]" in html and "n1" in html


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: None, "holds no result.json"),
        (lambda d: (d / "result.json").write_text("{not json"), "result.json: is not valid JSON"),
        (lambda d: (d / "result.json").write_text('{"a": 1}'), "result.json: is not the result of a run"),
        (lambda d: (d / "seed-0").mkdir() or (d / "seed-0" / "checkpoint-000001.json").write_text("{}"),
         "the run has not finished"),
    ],
)  # fmt: skip
def test_a_folder_without_a_finished_run_is_one_line(tmp_path, make, needle):
    folder = tmp_path / "f"
    folder.mkdir()
    make(folder)
    assert_user_error(run_cli("report", folder), str(folder), needle)
    assert not (folder / "report.html").exists()


def test_a_missing_folder_is_one_line(tmp_path):
    assert_user_error(run_cli("report", tmp_path / "nope"), "nope: no such folder", "--out folder of fedvlr-plus run")


def browser_body(page: Path) -> dict[str, str]:
    """The attributes of ``<body>`` once headless Chromium has loaded ``page`` and its script has run."""
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:500]
    return {k: unescape(v) for k, v in re.findall(r'([a-z-]+)="([^"]*)"', body.group(1))}


@needs_chromium
def test_every_plot_renders_in_chromium_without_a_script_error(run_dir):
    page_of(run_dir)
    plots = (run_dir / "report.html").read_text().count(FIGURE)
    body = browser_body(run_dir / "report.html")
    assert "data-errors" not in body, body["data-errors"]
    assert plots == 3 and body["data-plots"] == f"{plots}/{plots}"


@needs_chromium
def test_the_browser_check_sees_a_broken_plot_and_a_script_error(tmp_path):
    from fedvlr_plus.report.html import page
    from fedvlr_plus.report.plots import router_weights
    from fedvlr_plus.report.sections import Figure, Section

    fine = router_weights({0: {"experts": ["a", "b"], "mean_weights": [0.4, 0.6]}})
    text = page("t", [], [Section("s", [Figure("fine", fine), Figure("broken", b"not a png")])])
    (tmp_path / "bad.html").write_text(text.replace("</body>", "<script>throw new Error('boom')</script></body>"))
    body = browser_body(tmp_path / "bad.html")
    assert body["data-plots"] == "1/2"
    assert "boom" in body["data-errors"] and "could not load <img>" in body["data-errors"]
