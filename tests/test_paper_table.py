"""``fedvlr-plus experiment paper-table``: references, cold-among-cold ranking, paired tests, report, resume."""

import csv
import json
import re

import numpy as np
import pytest

from fedvlr_plus.cli import build_parser
from fedvlr_plus.cli.experiment.command import paper_table_options
from fedvlr_plus.coldstart.content import ContentRanker, RestrictedScorer
from fedvlr_plus.datasets import InteractionData
from fedvlr_plus.errors import ConfigError, RunFolderError
from fedvlr_plus.evaluation import evaluate
from fedvlr_plus.experiments.paper.table import run_paper_table
from fedvlr_plus.federation.synthetic import synthetic_data

#: a small table's training flags: two seeds of two rounds
SMALL = "--seeds 2 --rounds 2 --local-epochs 1 --dim 8 --no-progress".split()


def _run(args, data, metrics):
    """The table for parsed flags, with ``metrics`` in place of --metrics."""
    from dataclasses import replace

    return run_paper_table(data, replace(paper_table_options(args), metrics=metrics))


def _tiny_split():
    # users 0, 1; items 0..3; user 0 trains on 0, 1; user 1 on 2; test: user 0 -> 3 (cold), user 1 -> 0 (warm)
    inter = {"user": [0, 0, 1, 0, 1, 0, 1], "item": [0, 1, 2, 2, 1, 3, 0], "split": [0, 0, 0, 1, 1, 2, 2]}

    data = InteractionData.from_raw("tiny", np.array(inter["user"]), np.array(inter["item"]), timestamp=np.arange(7))
    data.inter["split"] = np.array(inter["split"])
    return data


def test_content_scorer_is_the_cosine_to_the_mean_training_item():
    data = _tiny_split()
    uid = {str(u): i for i, u in enumerate(data.user_ids)}
    iid = {str(x): i for i, x in enumerate(data.item_ids)}
    v = np.zeros((data.n_items, 2))
    v[iid["0"]], v[iid["1"]], v[iid["2"]], v[iid["3"]] = [1, 0], [0, 2], [1, 1], [3, 3]
    s = ContentRanker(data, {"text": v})(np.array([uid["0"]]))[0]
    # user 0's profile: mean of (1, 0) and (0, 1) -> direction (1, 1): cosine 1 with items 2 and 3
    assert s[iid["3"]] == pytest.approx(1.0)
    assert s[iid["2"]] == pytest.approx(1.0)
    assert s[iid["0"]] == pytest.approx(1 / np.sqrt(2))


def test_among_cold_ranks_cold_targets_among_cold_items_only():
    data = _tiny_split()
    cold = data.cold_items()
    assert cold.sum() == 1 and cold[int(np.flatnonzero(data.item_ids.astype(str) == "3")[0])]
    worst_for_cold = lambda users: np.tile(-np.asarray(cold, float), (len(users), 1))  # cold item scored lowest
    plain = evaluate(data, worst_for_cold, split="test", ks=(1,), metrics=("hr",))
    only = evaluate(data, RestrictedScorer(worst_for_cold, cold), split="test", ks=(1,), metrics=("hr",))
    assert plain.summary("cold")["hr@1"] == 0.0
    assert only.summary("cold")["hr@1"] == 1.0  # the only cold item is first among cold items


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    data = synthetic_data(30, 120, 10.0, groups=4, seed=3)
    g = np.random.default_rng(0)
    grp = np.arange(data.n_items) % 4
    data.features = {"text": np.hstack([np.eye(4)[grp], 0.3 * g.standard_normal((data.n_items, 6))]).astype(np.float32)}
    out = tmp_path_factory.mktemp("table")
    argv = [
        "experiment",
        "paper-table",
        "unused",
        "--backbones",
        "fedavg",
        "--variants",
        "none,fedgrad,fedvlr",
        *SMALL,
        "--out",
        str(out),
        "--override",
        "fedvlr:server_lr=0.5",
    ]
    args = build_parser().parse_args(argv)
    res = _run(args, data, ["hr@10", "ndcg@10"])
    return data, args, res, out


def test_table_has_every_model_and_reference_with_cis_and_paired_tests(table):
    data, _, res, _ = table
    models = {r["model"] for r in res["rows"] if r["part"] == "all"}
    assert models == {
        "pop",
        "random",
        "antipop",
        "content",
        "fedavg",
        "fedavg (fedgrad)",
        "fedavg+fedvlr",
        "fedavg + cold rule",
        "fedavg (fedgrad) + cold rule",
    }
    for r in res["rows"]:
        lo, hi = r["ndcg@10_ci"]
        assert lo <= r["ndcg@10"] + 1e-12 and r["ndcg@10"] <= hi + 1e-12
        assert r["seeds"] == (2 if r["kind"] == "federated" else 1)
    t = res["paired_tests"]["fedavg+fedvlr vs fedavg"]["all"]["ndcg@10"]
    n_test = int(data.test()["user"].nunique())
    assert t["n"] == n_test
    row = {(r["model"], r["part"]): r for r in res["rows"]}
    assert t["mean_a"] == pytest.approx(row[("fedavg+fedvlr", "all")]["ndcg@10"])
    assert t["mean_b"] == pytest.approx(row[("fedavg", "all")]["ndcg@10"])
    assert len(res["selected_round"]["fedavg"]) == 2
    assert res["router"]["fedavg+fedvlr"] and res["overrides"] == [["fedvlr", "server_lr", "0.5"]]
    # the like-for-like baseline: the backbone alone, aggregated as FedVLR is (the layer's default server lr)
    cfgs = res["row_configs"]
    assert cfgs["fedavg (fedgrad)"]["strategy"] == "fedgrad" and cfgs["fedavg (fedgrad)"]["server_lr"] == 1.0
    assert cfgs["fedavg"]["strategy"] is None and cfgs["fedavg+fedvlr"]["server_lr"] == 0.5
    vs = res["paired_tests"]["fedavg+fedvlr vs fedavg (fedgrad)"]["all"]["ndcg@10"]
    assert vs["mean_b"] == pytest.approx(row[("fedavg (fedgrad)", "all")]["ndcg@10"])
    assert row[("fedavg (fedgrad)", "all")]["ndcg@10"] != row[("fedavg", "all")]["ndcg@10"]
    # the layer against the content-only ranker on every part, and among cold items against the cold-rule rows too
    c = res["paired_tests"]["fedavg+fedvlr vs content"]["all"]["ndcg@10"]
    assert c["mean_b"] == pytest.approx(row[("content", "all")]["ndcg@10"]) and c["n"] == n_test
    among = res["paired_tests"]["fedavg+fedvlr vs fedavg (fedgrad) + cold rule (cold among cold)"]["cold"]["ndcg@10"]
    assert among["mean_b"] == pytest.approx(row[("fedavg (fedgrad) + cold rule", "cold_among_cold")]["ndcg@10"])


@pytest.mark.parametrize("backbone", ["fedavg", "pfedrec", "fedrap"])
def test_cold_rule_rows_score_cold_items_as_their_content_neighbours(table, backbone):
    from fedvlr_plus.api import Experiment
    from fedvlr_plus.coldstart.rules import make_rule
    from fedvlr_plus.experiments.paper.table import _with_rule
    from fedvlr_plus.federation import FedConfig, FederatedRun

    data, _, res, _ = table
    cold = data.cold_items()
    assert cold.any()
    run = FederatedRun(
        data, backbone, FedConfig(rounds=2, local_epochs=1, dim=8, ks=(10,), metrics=("hr", "ndcg")), progress=False
    )
    run.run()
    rule = make_rule("neighbours", data.features, cold, k=3)
    common = dict(protocol="full", ks=(10,), metrics=("hr", "ndcg"), mask_history="train")
    got, among_cold = _with_rule(run, rule, Experiment(data, [], ["hr@10", "ndcg@10"], references=False), cold)
    raw = run.scorer()

    # scores are linear in the item rows (shared, PFedRec's private copy, FedRAP's C + A_u): a cold item gets the
    # mean score of its neighbours for the same user
    def by_hand(users):
        s = raw(users).double().numpy().copy()
        s[:, np.flatnonzero(cold)] = s[:, rule.neighbours].mean(-1)
        return s

    want = evaluate(data, by_hand, split="test", **common)
    for part in ("all", "warm", "cold"):
        assert got.summary(part) == pytest.approx(want.summary(part), abs=1e-9)
    assert got.summary("all") != pytest.approx(run.evaluate("test").summary("all"), abs=1e-9)  # the rule matters
    row = {(r["model"], r["part"]): r for r in res["rows"]}
    assert ("fedavg + cold rule", "cold_among_cold") in row
    assert "fedavg+fedvlr vs fedavg + cold rule" in res["paired_tests"]


def test_report_files_are_written(table):
    _, _, res, out = table
    rows = list(csv.DictReader(open(out / "table.csv")))
    assert len(rows) == len(res["rows"]) and {"model", "part", "ndcg@10_ci_low"} <= set(rows[0])
    md = (out / "table.md").read_text()
    assert "| fedavg+fedvlr |" in md and "Paired tests" in md
    assert (out / "table.png").stat().st_size > 1000
    assert json.loads((out / "result.json").read_text())["rows"] == json.loads(json.dumps(res["rows"]))


def test_history_length_section_buckets_every_tested_user_and_pairs_fedvlr_with_its_backbones(table):
    from fedvlr_plus.coldstart.experiment import bucket_labels, history_bucket

    data, _, res, out = table
    train = np.bincount(data.train()["user"].to_numpy(), minlength=data.n_users)
    assert res["sparsity"]["targets"] == "warm"  # the fixture's split has cold test targets
    tested = np.unique(data.test()["user"].to_numpy()[~data.cold_items()[data.test()["item"].to_numpy()]])
    sections = res["sparsity"]["buckets"]
    assert sum(s["n_users"] for s in sections) == len(tested)
    labels = bucket_labels()
    for s in sections:
        users = tested[history_bucket(train, tested) == labels.index(s["bucket"])]
        assert s["n_users"] == len(users)
        low, _, high = s["bucket"].lstrip(">").partition("-")  # "a+1-b": a < count <= b; ">b": count > b
        assert (train[users] >= int(low) + (s["bucket"][0] == ">")).all()
        assert not high or (train[users] <= int(high)).all()
        for cmp in ("fedavg+fedvlr vs fedavg (fedgrad)", "fedavg+fedvlr vs fedavg"):
            t = s["paired"][cmp]["ndcg@10"]
            assert t["n"] == len(users)
            assert t["mean_a"] == pytest.approx(s["means"]["fedavg+fedvlr"]["ndcg@10"])
    # the buckets' means, weighted by their users, are the table's figure over all users
    row = {(r["model"], r["part"]): r for r in res["rows"]}
    for model in ("fedavg", "fedavg+fedvlr", "pop"):
        pooled = sum(s["n_users"] * s["means"][model]["ndcg@10"] for s in sections) / len(tested)
        assert pooled == pytest.approx(row[(model, "warm")]["ndcg@10"])
    md = (out / "table.md").read_text()
    assert "## By history length (warm test targets" in md
    assert "fedavg+fedvlr vs fedavg (fedgrad): diff (t-test p)" in md
    lines = list(csv.DictReader(open(out / "sparsity.csv")))
    assert {ln["bucket"] for ln in lines} == {s["bucket"] for s in sections}


def test_resume_reads_finished_runs_back_and_refuses_to_overwrite(table):
    data, args, res, out = table
    args.out = None
    with pytest.raises(RunFolderError, match="--resume"):
        _run(
            build_parser().parse_args(
                [
                    "experiment",
                    "paper-table",
                    "unused",
                    "--backbones",
                    "fedavg",
                    "--variants",
                    "none,fedgrad,fedvlr",
                    "--seeds",
                    "2",
                    "--rounds",
                    "2",
                    "--local-epochs",
                    "1",
                    "--dim",
                    "8",
                    "--no-progress",
                    "--out",
                    str(out),
                    "--override",
                    "fedvlr:server_lr=0.5",
                ]
            ),
            data,
            ["hr@10", "ndcg@10"],
        )
    args.resume = str(out)
    again = _run(args, data, ["hr@10", "ndcg@10"])
    assert [(r["model"], r["part"], r["ndcg@10"]) for r in again["rows"]] == [
        (r["model"], r["part"], r["ndcg@10"]) for r in res["rows"]
    ]


def _resume_copy(table, tmp_path):
    import shutil
    from copy import copy

    data, args, res, out = table
    dst = tmp_path / "copy"
    shutil.copytree(out, dst)
    again = copy(args)
    again.out, again.resume = None, str(dst)
    return data, again, res, dst


def test_resume_recomputes_an_extra_that_a_kill_left_unsaved(table, tmp_path):
    """Killed after the selected round's checkpoint but before its extra results were saved: the resumed table
    recomputes them from that checkpoint and gets the same rows."""
    data, args, res, dst = _resume_copy(table, tmp_path)
    seed = dst / "runs" / "fedavg" / "seed-0"
    m = json.loads((seed / "manifest.json").read_text())
    for name in ("selected_extra.json", "selected_extra.safetensors"):
        m["files"].pop(name, None)
        (seed / name).unlink(missing_ok=True)
    (seed / "manifest.json").write_text(json.dumps(m))
    again = _run(args, data, ["hr@10", "ndcg@10"])
    assert [(r["model"], r["part"], r["ndcg@10"]) for r in again["rows"]] == [
        (r["model"], r["part"], r["ndcg@10"]) for r in res["rows"]
    ]
    assert "selected_extra.json" in json.loads((seed / "manifest.json").read_text())["files"]


def test_resume_refuses_a_changed_extra_naming_it(table, tmp_path):
    data, args, _, dst = _resume_copy(table, tmp_path)
    path = dst / "runs" / "fedavg+fedvlr" / "seed-1" / "selected_extra.json"
    path.write_text(path.read_text().replace("0.", "1.", 1))
    with pytest.raises(RunFolderError, match=re.escape(f"{path}: does not match its sha256")):
        _run(args, data, ["hr@10", "ndcg@10"])


def test_unknown_variant_and_bad_override_are_errors(table):
    data, args, _, _ = table
    bad = build_parser().parse_args(["experiment", "paper-table", "x"])
    bad.variants = "none,magic"  # past the parser's own check: the library refuses it too
    with pytest.raises(ConfigError, match="magic"):
        _run(bad, data, ["hr@10"])
    bad = build_parser().parse_args(["experiment", "paper-table", "x", "--override", "fedvlr-server_lr"])
    with pytest.raises(ConfigError, match="SELECTOR"):
        _run(bad, data, ["hr@10"])


def test_backbones_the_layer_cannot_wrap_are_skipped_with_the_reason(tmp_path, monkeypatch):
    import fedvlr_plus.fedvlr as fedvlr

    data = synthetic_data(20, 200, 8.0, groups=4, seed=5)
    data.features = {"text": np.random.default_rng(0).standard_normal((data.n_items, 6)).astype(np.float32)}
    argv = [
        "experiment",
        "paper-table",
        "x",
        "--backbones",
        "pfedrec",
        "--variants",
        "none,fedvlr",
        "--seeds",
        "1",
        "--rounds",
        "1",
        "--local-epochs",
        "1",
        "--dim",
        "8",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    # PFedRec is wrapped (its personal item embedding becomes a private offset on the fused vector)
    res = _run(build_parser().parse_args(argv), data, ["hr@10"])
    assert not res["skipped"] and "pfedrec+fedvlr" in {r["model"] for r in res["rows"]}
    # a backbone the layer refuses is skipped with the layer's reason, in the result and in the table
    monkeypatch.setattr(fedvlr, "wrap_refusal", lambda base: "no way to wrap it")
    res = _run(build_parser().parse_args(argv[:-1] + [str(tmp_path / "b")]), data, ["hr@10"])
    assert res["skipped"]["pfedrec+fedvlr"] == "no way to wrap it"
    assert {r["model"] for r in res["rows"]} == {
        "pop",
        "random",
        "antipop",
        "content",
        "pfedrec",
        "pfedrec + cold rule",
    }
    assert "Not run: pfedrec+fedvlr" in (tmp_path / "b" / "table.md").read_text()


def test_data_without_content_runs_the_backbones_alone_and_says_what_it_left_out(tmp_path, capsys):
    data = synthetic_data(20, 200, 8.0, groups=4, seed=5)
    from fedvlr_plus.fedvlr.views import has_content

    assert not has_content(data)  # no feature array, no item text
    argv = [
        "experiment",
        "paper-table",
        "x",
        "--backbones",
        "fedavg",
        "--seeds",
        "1",
        "--rounds",
        "1",
        "--local-epochs",
        "1",
        "--dim",
        "8",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    res = _run(build_parser().parse_args(argv), data, ["hr@10"])
    assert {r["model"] for r in res["rows"]} == {"pop", "random", "antipop", "fedavg", "fedavg (fedgrad)"}
    assert set(res["skipped"]) == {"fedavg+mlp", "fedavg+fedvlr"}
    assert "has no item content" in res["skipped"]["fedavg+fedvlr"]
    assert "the fusion rows and the content-only ranker are left out" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"--variants: every variant asked for \(mlp, fedvlr\) fuses item content"):
        _run(build_parser().parse_args(argv[:-2] + ["--variants", "mlp,fedvlr"]), data, ["hr@10"])


def test_router_ablation_rows_are_trained_and_tested_against_fedvlr(tmp_path):
    data = synthetic_data(20, 60, 8.0, groups=4, seed=4)
    data.features = {"text": np.random.default_rng(1).standard_normal((data.n_items, 6)).astype(np.float32)}
    argv = [
        "experiment",
        "paper-table",
        "x",
        "--backbones",
        "fedavg",
        "--variants",
        "sum,gate,uniform,fedvlr",
        "--seeds",
        "1",
        "--rounds",
        "1",
        "--local-epochs",
        "1",
        "--dim",
        "8",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    res = _run(build_parser().parse_args(argv), data, ["ndcg@10"])
    rows = {(r["model"], r["part"]): r for r in res["rows"]}
    for v in ("sum", "gate", "uniform"):
        t = res["paired_tests"][f"fedavg+fedvlr vs fedavg+{v}"]["all"]["ndcg@10"]
        assert t["mean_b"] == pytest.approx(rows[(f"fedavg+{v}", "all")]["ndcg@10"])
        assert t["mean_a"] == pytest.approx(rows[("fedavg+fedvlr", "all")]["ndcg@10"])
    # each row is its own model: the single experts and the fixed mixture do not score alike
    scores = {v: rows[(f"fedavg+{v}", "all")]["ndcg@10"] for v in ("sum", "gate", "uniform", "fedvlr")}
    assert len(set(scores.values())) > 1
    assert res["row_configs"]["fedavg+uniform"]["strategy"] is None


def test_default_variants_leave_the_router_ablation_out():
    args = build_parser().parse_args(["experiment", "paper-table", "x"])
    assert args.variants == "none,fedgrad,mlp,fedvlr"


@pytest.mark.slow
def test_rows_and_seeds_side_by_side_give_the_table_of_runs_one_after_another(table, tmp_path, capsys):
    """``--jobs 2`` trains the table's runs in two worker processes; with one torch thread in both tables (each
    worker has one) every figure is the same as ``--jobs 1``'s."""
    import torch

    data = table[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tables = []
        for jobs in (1, 2):
            argv = ["experiment", "paper-table", "unused", "--backbones", "fedavg", "--variants", "none,fedvlr"]
            argv += [*SMALL, "--jobs", str(jobs), "--out", str(tmp_path / f"jobs-{jobs}")]
            parsed = build_parser().parse_args(argv)
            tables.append(_run(parsed, data, ["hr@10", "ndcg@10"]))
    finally:
        torch.set_num_threads(threads)
    assert "side by side in 2 worker processes" in capsys.readouterr().err
    one, two = (json.loads(json.dumps(t, default=str)) for t in tables)
    for t in (one, two):
        t.pop("config", None)
        for row in t.get("row_configs", {}).values():
            row.pop("jobs", None)
    assert one["rows"] and one == two
