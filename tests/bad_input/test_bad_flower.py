"""Bad input and failures of ``fedvlr-plus flower ...``: a run that Flower did not submit, a wait that ends, a
node whose files are missing. One line naming the culprit, a non-zero exit, never exit 0 on a failure."""

from __future__ import annotations

import json
import shutil
import socket
import time

import pytest
from _bad_input import assert_user_error, run_cli

from fedvlr_plus.errors import UserError
from fedvlr_plus.flower.deploy import FlowerRunError, submitted_run, wait_for_result

APP = "examples/flower_app"
NODE = ("flower", "supernode", "--partition", "0/1", "--insecure")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(
    shutil.which("flwr") is None and not __import__("importlib").util.find_spec("flwr"),
    reason="Flower is not installed",
)
def test_a_superlink_that_is_not_there_is_a_failure_with_flowers_reason():
    """Real ``flwr run`` against a closed loopback port: Flower exits 0 and says ``success: false``."""
    res = run_cli("flower", "run", APP, "--superlink", f"127.0.0.1:{_closed_port()}", "--insecure")
    line = assert_user_error(res, "flwr run", "not submitted", "Connection to the SuperLink is unavailable")
    assert "Using SuperLink" not in line and res.out.strip() == ""


@pytest.mark.parametrize(
    "stdout, rc, needles",
    [
        ('{\n  "success": false,\n  "error-message": "Using SuperLink: x\\n\\nApp refused"\n}', 0, ("App refused",)),
        ('{"success": false}', 0, ("no reason given",)),
        ("Traceback: boom", 1, ("exit code 1", "boom")),
        ("", 0, ("no JSON answer",)),
        ('{"success": true, "run-id": "7"}', 3, ("not submitted",)),
        ("[1, 2]", 0, ("not submitted",)),
    ],
    ids=["refused", "no-reason", "crash", "silent", "nonzero-exit", "not-an-object"],
)
def test_flowers_answer_decides_whether_the_run_was_submitted(stdout, rc, needles):
    with pytest.raises(FlowerRunError) as exc:
        submitted_run(stdout, "", rc, APP)
    for needle in needles:
        assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_submitted_run_is_flowers_answer():
    answer = 'Using SuperLink...\n{\n  "success": true,\n  "run-id": "42"\n}'
    assert submitted_run(answer, "", 0, APP) == {"success": True, "run-id": "42"}


def test_a_wait_that_times_out_is_one_line_after_progress_lines(tmp_path):
    lines = []
    started = time.time()
    with pytest.raises(FlowerRunError) as exc:
        wait_for_result(tmp_path / "r.json", 0.7, progress=lines.append, every=0.2)
    assert time.time() - started < 5
    assert "no result after 1 s" in str(exc.value) and "--timeout" in str(exc.value)
    assert len(lines) >= 2 and all(str(tmp_path / "r.json") in line for line in lines)


def test_a_failed_serverapp_is_named(tmp_path):
    (tmp_path / "r.error.json").write_text(json.dumps({"error": "the data folder is empty"}))
    with pytest.raises(UserError, match="the ServerApp failed: the data folder is empty"):
        wait_for_result(tmp_path / "r.json", 5)


def test_a_half_written_result_is_named(tmp_path):
    (tmp_path / "r.json").write_text('{"test": ')
    with pytest.raises(UserError, match="cannot be read as the run's result"):
        wait_for_result(tmp_path / "r.json", 5)


def test_wait_has_a_bounded_default():
    from fedvlr_plus.cli import build_parser

    args = build_parser().parse_args(["flower", "run", APP, "--superlink", "127.0.0.1:9093", "--wait"])
    assert 0 < args.timeout <= 4 * 3600


RUN = ("flower", "run", APP, "--insecure")


@pytest.mark.parametrize(
    "args, needles",
    [
        (RUN + ("--superlink", "localhost"), ("--superlink", "HOST:PORT", "'localhost'")),
        (RUN + ("--superlink", "127.0.0.1:99999"), ("--superlink", "[1, 65535]")),
        (RUN + ("--superlink", ":9093"), ("--superlink", "HOST:PORT")),
        (("flower", "run", "no/such/app", "--superlink", "127.0.0.1:1", "--insecure"), ("no/such/app", "pyproject")),
        (RUN + ("--superlink", "127.0.0.1:1", "--config", "=3"), ("--config =3", "KEY=VALUE")),
        (RUN + ("--superlink", "127.0.0.1:1", "--wait"), ("--wait", "result=PATH")),
        (RUN + ("--superlink", "127.0.0.1:1", "--wait", "--timeout", "0"), ("--timeout",)),
        (RUN + ("--superlink", "127.0.0.1:1", "--wait", "--config", "result=/no/such/dir/r.json"), ("/no/such/dir",)),
        (NODE + ("--superlink", "127.0.0.1"), ("--superlink", "HOST:PORT")),
        (NODE + ("--superlink", "127.0.0.1:9092", "--partition", "3/2"), ("--partition",)),
    ],
)
def test_bad_flower_flags_are_refused_before_flower_starts(args, needles):
    assert_user_error(run_cli(*args), *needles)


def test_wait_refuses_an_old_result_it_would_read_as_this_runs(tmp_path):
    (tmp_path / "r.json").write_text("{}")
    res = run_cli(*RUN, "--superlink", "127.0.0.1:1", "--wait", "--config", f"result={tmp_path / 'r.json'}")
    assert_user_error(res, str(tmp_path / "r.json"), "already exists")
    assert (tmp_path / "r.json").read_text() == "{}"


@pytest.mark.parametrize(
    "flag, make, needles",
    [
        ("--data", lambda tmp: tmp / "missing-data", ("--data", "missing-data", "no such file or folder")),
        ("--state-dir", lambda tmp: (tmp / "f").write_text("") or tmp / "f", ("--state-dir", "is a file")),
        ("--auth-key", lambda tmp: tmp / "key.pem", ("--auth-key", "key.pem", "no such file")),
    ],
    ids=["data", "state-dir", "auth-key"],
)
def test_a_supernodes_missing_files_are_refused_at_start(tmp_path, monkeypatch, flag, make, needles):
    from fedvlr_plus.flower import supervise

    def never(*args):  # the node must not start
        raise AssertionError("the SuperNode was started")

    monkeypatch.setattr(supervise, "supervise", never)
    res = run_cli(*NODE, "--superlink", "127.0.0.1:9092", flag, make(tmp_path))
    assert_user_error(res, *needles)
