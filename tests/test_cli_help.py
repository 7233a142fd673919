"""The command line explains itself: --version, each command's help shows its own options with their
defaults and the backbone list, and building the parser imports no torch (so --help is fast)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from _bad_input import run_cli


def help_of(*command: str) -> str:
    res = run_cli(*command, "--help")
    assert res.code == 0, res.err
    return res.out


def option_names(text: str) -> set[str]:
    return set(re.findall(r"^\s+(--[a-z][a-z0-9-]*)", text, flags=re.M))


def test_version():
    import fedvlr_plus

    res = run_cli("--version")
    assert res.code == 0 and res.out.strip() == f"fedvlr-plus {fedvlr_plus.__version__}"


def test_run_help_lists_every_backbone_and_shows_defaults():
    from fedvlr_plus.federation.config import FEDERATED_BACKBONES

    text = " ".join(help_of("run").split())  # argparse wraps lines; compare word by word
    for name in FEDERATED_BACKBONES + ("recbole:<Model>", "pop", "random", "antipop"):
        assert name in text, name
    for shown in (
        "--rounds ROUNDS maximum number of rounds (default: 100)",
        "(default: 20)",
        "number of seeds (seed, seed+1, ...) (default: 1)",
        "(default: hr@10,ndcg@10,hr@50,ndcg@50)",
    ):
        assert shown in text, shown


@pytest.mark.parametrize(
    "command,absent",
    [
        (("bench", "round"), {"--resume", "--recbole-config", "--evaluator", "--rounds", "--patience", "--seeds"}),
        (("coldstart",), {"--recbole-config", "--evaluator"}),
        (("experiment", "paper-table"), {"--recbole-config", "--evaluator"}),
        (("data", "stats"), {"--backbone", "--rounds", "--fusion"}),
        (("views", "build"), {"--rounds", "--backbone", "--fusion"}),
    ],
)
def test_each_command_shows_only_its_own_options(command, absent):
    names = option_names(help_of(*command))
    assert names, "no options found in the help"
    assert not names & absent, names & absent


def test_run_keeps_the_options_that_apply_to_it():
    names = option_names(help_of("run"))
    assert {"--resume", "--recbole-config", "--evaluator", "--rounds", "--fusion", "--seeds"} <= names


def test_coldstart_and_paper_table_show_their_three_seeds():
    for command in (("coldstart",), ("experiment", "paper-table")):
        text = " ".join(help_of(*command).split())
        assert "number of seeds (seed, seed+1, ...) (default: 3)" in text, command


def test_building_the_parser_imports_no_heavy_library():
    code = (
        "import sys; from fedvlr_plus.cli import build_parser; build_parser(); "
        "print(','.join(m for m in ('torch', 'pandas', 'recbole', 'open_clip', 'faiss') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "", f"imported while building the parser: {out.stdout.strip()}"


def test_a_run_does_not_import_scipy_stats():
    # scipy.stats costs about half a second of start-up; a run needs only its resampling, drawn with numpy
    code = (
        "import sys; from fedvlr_plus.cli.main import main; main(['run', 'ml-100k', '--backbone', 'pop', '--json']); "
        "print('scipy.stats' in sys.modules)"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False", "a pop run imported scipy.stats"


def test_torch_free_names_match_the_modules_that_define_them():
    from fedvlr_plus.cli.coldstart import COLD_RULES, NEW_USER_STARTS
    from fedvlr_plus.cli.fusion_args import FUSION_MODES, ROUTER_OVER
    from fedvlr_plus.coldstart.population import STARTS
    from fedvlr_plus.coldstart.rules import FUSED_RULES, RULES
    from fedvlr_plus.fedvlr import MODES
    from fedvlr_plus.fedvlr.view_experts import ROUTER_OVER as LAYER_ROUTER_OVER

    assert FUSION_MODES == MODES and COLD_RULES == RULES + FUSED_RULES and NEW_USER_STARTS == STARTS
    assert ROUTER_OVER == LAYER_ROUTER_OVER
    from fedvlr_plus.cli.experiment.view_routing import ROW_GROUPS
    from fedvlr_plus.experiments.view_routing import ROW_GROUPS as LIBRARY_ROW_GROUPS

    assert ROW_GROUPS == LIBRARY_ROW_GROUPS


def test_run_says_what_it_does_and_what_to_try_next(tmp_path):
    res = run_cli("run", "ml-100k", "--backbone", "pop", "--out", str(tmp_path / "r"), "--json")
    assert res.code == 0, res.err
    assert f"ranking ml-100k with the reference ranker pop (no training); writing to {tmp_path / 'r'}" in res.err
    assert "next: train a federated backbone" in res.err
    assert res.out.strip().splitlines()[-1].startswith("{")


def test_federated_run_plan_names_seeds_rounds_patience_and_folder():
    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.cli.run.command import _next_step, _run_plan

    args = build_parser().parse_args(["run", "ml-100k", "--backbone", "fedavg", "--seeds", "3", "--out", "D"])
    assert _run_plan(args, "ml-100k") == (
        "training fedavg on ml-100k: 3 seeds (0, 1, 2), up to 100 rounds, patience 20; writing to D"
    )
    assert "--fusion fedvlr" in _next_step(args) and "fedvlr-plus coldstart ml-100k" in _next_step(args)
    untuned = build_parser().parse_args(["run", "ml-100k", "--backbone", "fedavg", "--fusion", "fedvlr", "--no-tune"])
    assert "recipe (the best differs between data sets) with --tune" in _next_step(untuned)
    assert "choosing" not in _run_plan(untuned, "ml-100k")
    tuned = build_parser().parse_args(["run", "ml-100k", "--backbone", "fedavg", "--fusion", "fedvlr", "--tune"])
    assert "choosing its recipe on valid" in _run_plan(tuned, "ml-100k") and "--no-tune" not in _next_step(tuned)


def test_the_run_plan_names_the_gpu_a_run_trains_on(monkeypatch):
    import torch

    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.cli.run.command import _run_plan

    args = build_parser().parse_args(["run", "ml-100k", "--backbone", "fedavg", "--device", "auto"])
    assert "GPU" not in _run_plan(args, "ml-100k") or torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU 80GB")
    assert _run_plan(args, "ml-100k").startswith("training fedavg on ml-100k on the GPU (Test GPU 80GB): 1 seed (0)")


def test_run_tunes_the_fusion_layer_by_default_and_only_where_there_is_a_choice(tmp_path):
    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.cli.run.tune import resolve_tune

    def tunes(*flags):
        return resolve_tune(build_parser().parse_args(["run", "ml-100k", "--backbone", "fedavg", *flags]))

    assert tunes("--fusion", "fedvlr") and not tunes("--fusion", "fedvlr", "--no-tune") and not tunes()
    # every value of the grid fixed by the user: one recipe left, nothing to choose
    assert not tunes(
        "--fusion", "fedvlr", "--lr", "0.1", "--server-lr", "1", "--fusion-residual", "--content-preference"
    )
    assert tunes("--fusion", "fedvlr", "--lr", "0.1")
    # a resumed folder tunes only if it was tuned when it was made
    made_plain = tmp_path / "plain"
    made_plain.mkdir()
    made_tuned = tmp_path / "tuned"
    (made_tuned / "tuning").mkdir(parents=True)
    assert not tunes("--fusion", "fedvlr", "--resume", str(made_plain))
    assert tunes("--fusion", "fedvlr", "--resume", str(made_tuned))


def test_suggested_commands_quote_paths_with_spaces(tmp_path):
    import shlex

    from fedvlr_plus.cli import build_parser
    from fedvlr_plus.cli.run.command import _next_step
    from fedvlr_plus.errors import RunFolderError
    from fedvlr_plus.federation.run_seeds import _check_folder

    source = tmp_path / "my data" / "ratings.csv"
    args = build_parser().parse_args(["run", str(source), "--backbone", "fedavg"])
    line = _next_step(args)
    command = line[line.index("fedvlr-plus") :]
    assert shlex.split(command)[:3] == ["fedvlr-plus", "coldstart", str(source)]
    folder = tmp_path / "run folder"
    (folder / "seed-0").mkdir(parents=True)
    (folder / "seed-0" / "manifest.json").write_text("{}")
    with pytest.raises(RunFolderError) as err:
        _check_folder(folder, [0], resume=False)
    assert f"--resume {shlex.quote(str(folder))}" in str(err.value)
