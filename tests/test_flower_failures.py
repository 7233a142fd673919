"""``fedvlr-plus flower superlink|supernode`` as real processes on loopback, when things go wrong: a missing data
folder, a SuperLink address that does not resolve or where nothing listens, a port already taken each end at once
with one line and exit code 2; Flower's ``flower-superexec`` child ends with its parent, whether the command is
stopped or Flower's own process dies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedvlr-plus[flower]')")

from _bad_input import run_cli_process  # noqa: E402
from _flower_harness import free_port, wait_port  # noqa: E402

NODE = ("flower", "supernode", "--partition", "0/1", "--insecure")


def _one_line_exit_2(res, *needles: str) -> str:
    assert res.code == 2, (res.code, res.err[-2000:])
    lines = [x for x in res.err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in res.err, res.err[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_missing_data_folder_stops_the_node_at_once(tmp_path):
    started = time.time()
    res = run_cli_process(*NODE, "--superlink", "127.0.0.1:9", "--data", tmp_path / "nothing", timeout=60)
    _one_line_exit_2(res, "--data", "nothing", "no such file or folder")
    assert time.time() - started < 30


def test_a_superlink_host_that_does_not_resolve_is_one_line():
    res = run_cli_process(*NODE, "--superlink", "no-such-host.invalid:9092", "--port", free_port(), timeout=60)
    _one_line_exit_2(res, "--superlink no-such-host.invalid:9092", "does not resolve")


def test_a_superlink_where_nothing_listens_is_one_line_after_the_connect_timeout():
    port = free_port()
    res = run_cli_process(
        *NODE, "--superlink", f"127.0.0.1:{port}", "--port", free_port(), "--connect-timeout", "1", timeout=60
    )
    _one_line_exit_2(res, f"--superlink 127.0.0.1:{port}", "nothing accepts connections there after 1 s")


@pytest.mark.parametrize("which", ["supernode", "superlink"])
def test_a_port_in_use_is_one_line(which):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if which == "supernode":
            res = run_cli_process(*NODE, "--superlink", "127.0.0.1:9", "--port", port, timeout=60)
        else:
            res = run_cli_process("flower", "superlink", "--insecure", "--host", "127.0.0.1", "--port", port)
    _one_line_exit_2(res, f"--port {port}", "cannot listen there")


def _superexecs(marker: str) -> list[int]:
    """Pids of live ``flower-superexec`` processes whose command line holds ``marker``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "flower-superexec" in cmd and marker in cmd and state != "Z":
            out.append(int(entry.name))
    return out


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} after {timeout} s")


def _start(args, home: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "PYTHONSAFEPATH": "1",
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "out.log", "wb")
    p = subprocess.Popen(
        [sys.executable, "-m", "fedvlr_plus.cli", *map(str, args)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    log.close()
    return p


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc to find Flower's child processes")
@pytest.mark.parametrize("ending", ["command-stopped", "flower-died"])
def test_flowers_superexec_ends_with_its_supernode(tmp_path, ending):
    link_port, node_port = free_port(), free_port()
    procs = [_start(("flower", "superlink", "--insecure", "--host", "127.0.0.1", "--port", link_port), tmp_path / "l")]
    try:
        wait_port(link_port, 60)
        node = _start((*NODE, "--superlink", f"127.0.0.1:{link_port}", "--port", node_port), tmp_path / "n")
        procs.append(node)
        marker = f"127.0.0.1:{node_port}"
        superexec = _wait_for(lambda: _superexecs(marker), 60, "no flower-superexec started by the SuperNode")
        if ending == "command-stopped":
            node.send_signal(signal.SIGTERM)
            assert node.wait(timeout=30) == 0
        else:  # Flower's SuperNode dies without a word: its superexec must not linger
            flower = [p for p in _children(node.pid) if "flower-supernode" in _cmdline(p)]
            assert flower, "no flower-supernode under the command"
            os.kill(flower[0], signal.SIGKILL)
            node.wait(timeout=30)
        _wait_for(lambda: not any(_alive(p) for p in superexec), 8, f"flower-superexec {superexec} still alive")
    finally:
        _end(procs)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc to find Flower's child processes")
def test_the_superlinks_detached_superexec_ends_with_the_command(tmp_path):
    """flower-superlink starts its SuperExec in a session of its own (not in the command's process group)."""
    from fedvlr_plus.flower.process_sampler import descendants

    port = free_port()
    link = _start(("flower", "superlink", "--insecure", "--host", "127.0.0.1", "--port", port), tmp_path / "l")
    try:
        wait_port(port, 60)
        below = _wait_for(
            lambda: [p for p in descendants(link.pid) if "flower-superexec" in _cmdline(p)], 60, "no superexec"
        )
        assert os.getpgid(below[0]) != os.getpgid(link.pid)  # what a killpg of the command's group would miss
        link.send_signal(signal.SIGTERM)
        assert link.wait(timeout=30) == 0
        _wait_for(lambda: not any(_alive(p) for p in below), 8, f"the SuperLink's superexec {below} still alive")
    finally:
        _end([link])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
def test_a_command_killed_outright_takes_flower_with_it(tmp_path):
    """SIGKILL to ``fedvlr-plus flower superlink`` (no handler runs): the kernel sends Flower's SuperLink SIGTERM,
    and it and its SuperExec end instead of staying behind as orphans."""
    from fedvlr_plus.flower.process_sampler import descendants

    port = free_port()
    link = _start(("flower", "superlink", "--insecure", "--host", "127.0.0.1", "--port", port), tmp_path / "l")
    try:
        wait_port(port, 60)
        _wait_for(lambda: any("flower-superexec" in _cmdline(p) for p in descendants(link.pid)), 60, "no superexec")
        below = [p for p in descendants(link.pid) if "flower-super" in _cmdline(p)]
        link.kill()
        link.wait(timeout=30)
        _wait_for(lambda: not any(_alive(p) for p in below), 15, f"Flower's processes {below} outlived the command")
    finally:
        _end([link])


def _end(procs) -> None:
    """SIGTERM to the commands this test started, so that they end Flower's processes, then SIGKILL to their groups
    (a no-op where they ended as they should)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
