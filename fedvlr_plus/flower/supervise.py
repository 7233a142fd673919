"""Flower's long-running processes (``flower-superlink``, ``flower-supernode``) started as children that end with
their parent, after checks that turn Flower's usual failures into one line before anything starts.

- Before the start: the port the process will listen on must be free on this machine, and a SuperNode's
  ``--superlink`` host must resolve and, within ``wait_s`` seconds, accept a connection (a SuperNode started
  against nothing would retry for ever).
- While it runs: its output goes to this process's stderr unchanged; SIGINT/SIGTERM are passed on, so a SuperNode
  still tells the SuperLink it leaves.
- If the command itself is killed (SIGKILL), Flower's process gets SIGTERM from the kernel (Linux) and ends.
- When it ends, for whatever reason: its whole process group and every process seen below it (Flower's
  ``flower-superexec``, which a SuperLink starts in a session of its own, and the ClientApp or ServerApp processes)
  are ended at once, not left to Flower's own parent check; a non-zero exit is one line naming the command and
  Flower's last error line.

Nothing here imports flwr or torch.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from ..errors import ConfigError, UserError


def check_port_free(host: str, port: int, flag: str) -> None:
    """ConfigError naming ``flag`` where something on this machine already listens on ``host:port``."""
    bind_host = "" if host in ("0.0.0.0", "::", "") else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((bind_host, int(port)))
        except OSError as exc:
            raise ConfigError(
                f"{flag} {port}",
                f"cannot listen there ({exc.strerror or exc}): another process (a SuperLink or SuperNode?) holds it",
                f"stop that process, or give {flag} another port",
            ) from None


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def check_superlink_reachable(address: str, wait_s: float) -> None:
    """The SuperLink's host resolves, and something accepts connections there within ``wait_s`` seconds."""
    host, port = split_address(address)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(
            f"--superlink {address}", f"the host {host!r} does not resolve ({exc.strerror or exc})", "check the address"
        ) from None
    deadline = time.time() + max(0.0, wait_s)
    while True:
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return
        except OSError as exc:
            why = exc.strerror or str(exc)
        if time.time() >= deadline:
            raise ConfigError(
                f"--superlink {address}",
                f"nothing accepts connections there after {wait_s:.0f} s ({why})",
                "start the SuperLink first, check HOST:PORT, or wait longer with --connect-timeout SECONDS",
            )
        time.sleep(0.5)


def _signal_all(pgid: int, pids: set[int], sig) -> bool:
    """``sig`` to the group and to ``pids``; whether any of them was still there."""
    alive = False
    for send, target in [(os.killpg, pgid)] + [(os.kill, p) for p in pids]:
        try:
            send(target, sig)
            alive = True
        except (ProcessLookupError, PermissionError):
            pass
    return alive


def _end_all(pgid: int, seen: dict[int, int], grace: float = 3.0) -> None:
    """SIGTERM to the group and to the processes seen below the child (Flower starts some in sessions of their
    own), SIGKILL to what is left after ``grace`` seconds; a pid is signalled only while it names the process
    that was seen (its start time), never a later one that reuses the number."""
    if not _signal_all(pgid, _still_ours(seen), signal.SIGTERM):
        return
    deadline = time.time() + grace
    while time.time() < deadline and _signal_all(pgid, _still_ours(seen), 0):
        time.sleep(0.1)
    _signal_all(pgid, _still_ours(seen), signal.SIGKILL)


def _watch_descendants(root: int, seen: dict[int, int], stop) -> None:
    """Keep ``seen`` (pid: start time) up to date with the processes below ``root`` until ``stop`` is set."""
    from .process_sampler import descendants

    while not stop.wait(0.5):
        seen.update(descendants(root, seen))


def _still_ours(seen: dict[int, int]) -> set[int]:
    """The pids of ``seen`` that still name the process seen (same start time: not a reused pid)."""
    from .process_sampler import start_time

    return {pid for pid, started in seen.items() if pid != os.getpid() and start_time(pid) == started}


def _last_error(lines: list[str]) -> str:
    """Flower's last ``ERROR`` line (its own reason), else the last line it printed."""
    for line in reversed(lines):
        if "ERROR" in line:
            return line.split("ERROR", 1)[1].lstrip(" :\x1b[0m").strip()
    return lines[-1].strip() if lines else "no output"


def _copy_output(stream, tail: list[str]) -> None:
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        tail.append(line)
        del tail[:-50]


def _term_with_parent() -> None:
    """In the child before it runs Flower (Linux): SIGTERM when the command dies, even by SIGKILL, which no handler
    of ours sees. Flower then ends its own children (they watch their parent)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(cmd: list[str], name: str) -> int:
    """Run ``cmd`` in its own process group until it ends; end the group; one line if it failed."""
    linux = sys.platform.startswith("linux")
    child = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
        preexec_fn=_term_with_parent if linux else None,
    )
    stopping = []

    def pass_on(signum, frame):
        stopping.append(signum)
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, pass_on) for s in (signal.SIGINT, signal.SIGTERM)}
    tail: list[str] = []
    # the output is copied by a thread: Flower's own children hold the pipe open after the child itself ends, so
    # the end of the output is not the end of the child
    copier = threading.Thread(target=_copy_output, args=(child.stdout, tail), daemon=True)
    copier.start()
    below, stop = {}, threading.Event()
    threading.Thread(target=_watch_descendants, args=(child.pid, below, stop), daemon=True).start()
    try:
        rc = child.wait()
    finally:
        stop.set()
        _end_all(child.pid, below)
        copier.join(timeout=5.0)
        for s, handler in old.items():
            signal.signal(s, handler)
    if stopping or rc == 0:
        return 0
    raise UserError(name, f"exited with code {rc}: {_last_error(tail)}")
