"""Every report path finishes on data whose test has no cold (or no warm) targets and says which part is empty.

Data: tiny folders in real formats written to tmp_path (ml-latest-small's CSVs, a RecBole atomic folder, KU's
feature-folder layout for the commands that need content views) where every valid/test item also occurs in
training, a one-user folder (every target is cold), and KU when present.
"""

import json

import pytest
from _shared import shared_data, write

from fedvlr_plus.cli import main
from fedvlr_plus.federation.engine import combine_seeds

FAST = ["--rounds", "2", "--dim", "8", "--local-epochs", "1", "--no-progress"]
COLD_NOTE = "test cold: no cold targets in test"


def _history(n_users=12, n_items=10, per_user=8):
    """User u rates items u, u+1, ... (mod n_items) in time order: the last two (valid, test) are trained by
    other users, so no target is cold; every user and item has at least 5 interactions (5-core as it is)."""
    return [(u, (u + j) % n_items, j) for u in range(n_users) for j in range(per_user)]


def _ml_latest(folder, rows):
    write(
        folder / "ratings.csv",
        "userId,movieId,rating,timestamp\n"
        + "".join(f"{u + 1},{i + 1},4.0,{1_000_000 + 100 * u + t}\n" for u, i, t in rows),
    )
    items = sorted({i for _, i, _ in rows})
    write(folder / "movies.csv", "movieId,title,genres\n" + "".join(f"{i + 1},Film {i} (2000),Drama\n" for i in items))
    return folder


def _atomic(folder, rows, name="shop"):
    write(
        folder / name / f"{name}.inter",
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
        + "".join(f"u{u}\ti{i}\t4\t{100 * u + t}\n" for u, i, t in rows),
    )
    return folder / name


def _feature_folder(folder, rows, n_items=10):
    """KU's layout (inter.csv with split labels, CLIP-like feature files): content views without an encoder."""
    import numpy as np

    last = {}
    for u, _, t in rows:
        last[u] = max(last.get(u, t), t)
    label = lambda u, t: 2 if t == last[u] else 1 if t == last[u] - 1 else 0  # noqa: E731
    write(
        folder / "inter.csv",
        "userID,itemID,rating,timestamp,split_label\n"
        + "".join(f"{u},{i},1,{100 * u + t},{label(u, t)}\n" for u, i, t in rows),
    )
    g = np.random.default_rng(0)
    for name in ("image_features.npy", "text_features.npy"):
        np.save(folder / name, g.standard_normal((n_items, 6)).astype(np.float16))
    return folder


@pytest.fixture(autouse=True)
def _own_view_cache(tmp_path, monkeypatch):
    # view stores are cached by data set name; these tests' folders must not meet another run's store
    monkeypatch.setenv("FEDVLR_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    return {
        "ml-latest": (_ml_latest(root / "mll", _history()), ["--k-core", "5"]),
        "atomic": (_atomic(root / "atomic", _history()), []),
        "features": (_feature_folder(root / "fx", _history()), []),
        "one-user": (_ml_latest(root / "one", [(0, i, i) for i in range(6)]), []),
    }


def _run(capsys, argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.strip().splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


@pytest.mark.parametrize("backbone", ["pop", "random", "antipop", "fedavg"])
@pytest.mark.parametrize("fmt", ["ml-latest", "atomic"])
def test_run_without_cold_targets_prints_table_and_json(sources, capsys, fmt, backbone):
    folder, flags = sources[fmt]
    res, table = _run(capsys, ["run", folder, "--backbone", backbone, "--json", *flags, *FAST])
    assert res["test_cold_n_users"] == 0 and res["test_warm_n_users"] == res["n_users"] == 12
    assert all(v is None for v in res["test_cold"].values())
    assert res["test"] == res["test_warm"]
    assert any(n.startswith(COLD_NOTE) for n in res["notes"])
    assert "test cold        (no cold targets in test" in table
    assert all("cold" not in parts for parts in res["baselines"].values())


@pytest.mark.parametrize("backbone", ["pop", "fedavg"])
def test_run_with_one_user_says_there_are_no_warm_targets(sources, capsys, backbone):
    folder, flags = sources["one-user"]
    res, table = _run(capsys, ["run", folder, "--backbone", backbone, "--json", *FAST])
    assert res["n_users"] == 1 and res["test_warm_n_users"] == 0 and res["test_cold_n_users"] == 1
    assert any(n.startswith("test warm: no warm targets in test") for n in res["notes"])
    assert "test warm        (no warm targets in test" in table
    lo, hi = res["test_ci"]["ndcg@10"]
    assert lo == hi == res["test"]["ndcg@10"]  # one user: every resample is that user


@pytest.mark.parametrize("backbone", ["pop", "random", "antipop", "fedavg"])
def test_run_on_ku_reports_its_cold_targets(capsys, backbone):
    res, table = _run(capsys, ["run", shared_data("ku"), "--backbone", backbone, "--json", *FAST])
    assert res["test_cold_n_users"] == 88 and res["test_warm_n_users"] == 116
    assert res["test_cold"]["hr@50"] is not None and not any(n.startswith("test cold") for n in res["notes"])
    assert "test cold" in table and "no cold targets" not in table


def test_several_seeds_write_the_summary_and_say_the_cold_part_is_empty(sources, capsys, tmp_path):
    folder, flags = sources["ml-latest"]
    out = tmp_path / "run"
    res, table = _run(
        capsys,
        ["run", folder, "--backbone", "fedavg", "--seeds", "2", "--out", out, "--json", "--test-both-protocols"]
        + [*flags, *FAST],
    )
    saved = json.loads((out / "result.json").read_text())
    assert saved["test_cold"] is None and saved["test_cold_n_users"] == 0
    assert len(saved["per_seed"]) == 2
    per_seed = [s["test"]["hr@10"] for s in saved["per_seed"]]
    assert saved["test"]["hr@10"] == pytest.approx(sum(per_seed) / 2)
    assert any(n.startswith(COLD_NOTE) for n in saved["notes"])
    # sampled test asked for, and the catalogue (10 items) is too small for 99 sampled negatives: said, not raised
    assert any(n.startswith("test sampled: not evaluated") for n in saved["notes"])
    assert "test cold        (no cold targets in test" in table and res["test"] == saved["test"]


def _seed(seed, cold):
    return {
        "backbone": "b",
        "dataset": "d",
        "seed": seed,
        "selected_round": 1,
        "strategy": "s",
        "simulator": "x",
        "config": {},
        "valid": {"hr@10": 0.5},
        "test": {"hr@10": 0.2 + seed},
        "test_n_users": 3,
        "test_cold": {"hr@10": cold},
        "test_cold_n_users": 0 if cold is None else 1,
        "notes": [] if cold is not None else ["test cold: no cold targets in test"],
    }


def test_combine_seeds_combines_only_parts_every_seed_has():
    out = combine_seeds([_seed(0, 0.5), _seed(1, None)])
    assert out["test"]["hr@10"] == pytest.approx(0.7) and out["test_n_users"] == 3
    assert out["test_cold"] is None and out["test_cold_std"] is None and out["test_cold_n_users"] == [1, 0]
    assert "test cold: absent in seeds 1; not combined over seeds" in out["notes"]
    both = combine_seeds([_seed(0, 0.5), _seed(1, 0.25)])
    assert both["test_cold"]["hr@10"] == pytest.approx(0.375) and both["notes"] == []


def test_paper_table_without_cold_targets(sources, capsys, tmp_path):
    folder, flags = sources["features"]
    out = tmp_path / "table"
    res, table = _run(
        capsys,
        [
            "experiment",
            "paper-table",
            folder,
            "--backbones",
            "fedavg",
            "--variants",
            "none",
            "--seeds",
            "2",
            "--out",
            out,
            "--json",
            *flags,
            *FAST,
        ],
    )
    assert {r["part"] for r in res["rows"]} == {"all", "warm"}
    assert any(n.startswith("cold: no cold targets in test") for n in res["notes"])
    assert any(n.startswith("cold among cold: no cold items") for n in res["notes"])
    assert "Not reported: cold: no cold targets in test" in (out / "table.md").read_text()
    for name in ("table.csv", "table.png", "result.json"):
        assert (out / name).exists(), name


def test_coldstart_without_cold_targets(sources, capsys, tmp_path):
    folder, flags = sources["features"]
    out = tmp_path / "report"
    res, table = _run(
        capsys,
        [
            "coldstart",
            folder,
            "--backbone",
            "fedavg",
            "--seeds",
            "1",
            "--metrics",
            "hr@5,ndcg@5",
            "--cold-select",
            "ndcg@5",
            "--out",
            out,
            "--json",
            *FAST,
        ],
    )
    assert res["n_cold_items"] == 0 and res["cold_among_all"]["hr@5"]["n_users"] == 0
    assert res["cold_rule"] == "trained" and res["warm"]["hr@5"]["mean"] is not None
    assert any(n.startswith("cold among all: no cold targets in test") for n in res["notes"])
    report = (out / "report.md").read_text()
    assert "Not reported: no cold targets in test" in report and "fedavg, as trained *" in report
    for name in ("cold_items.csv", "cold_items.png", "result.json"):
        assert (out / name).exists(), name


def test_run_accepts_a_synthetic_source(capsys):
    res, table = _run(capsys, ["run", "synthetic:60x300", "--backbone", "pop", "--json"])
    assert res["dataset"] == "synthetic-60x300" and res["split"] == "loo" and res["n_users"] > 50
