"""Real Flower processes on loopback for the tests: one SuperLink, N SuperNodes, runs submitted with ``flwr run``.

Every process is started in its own session (process group) so that it and its children (Flower's SuperExec, the
ServerApp and ClientApp processes) can be ended together; :meth:`Federation.close` ends every group that is still
alive, and the fixtures call it in a finalizer, so nothing outlives a test even when it fails.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedvlr_plus.flower import deploy as flower_cli

APP_DIR = Path(__file__).resolve().parents[1] / "examples" / "flower_app"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class Federation:
    """``certificates`` (a folder with ``ca.crt``, ``server.pem``, ``server.key``) turns TLS on for every process;
    ``supernode_auth`` makes the SuperLink accept registered SuperNodes only (see :meth:`register`)."""

    def __init__(self, root: Path, *, certificates: Path | None = None, supernode_auth: bool = False):
        self.root = Path(root)
        self.certificates, self.supernode_auth = certificates, supernode_auth
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ)
        # Flower starts flower-superexec / flwr-serverapp / flwr-clientapp by name: use this venv's
        self.env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + self.env.get("PATH", "")
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.env["FLWR_TELEMETRY_ENABLED"] = "0"
        # each node's SuperExec looks for a new task every second by default; a secure round has several stages
        self.env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
        self.port = None

    def _start(self, name: str, cmd: list[str], home: Path) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{name}.log", "ab")
        env = {**self.env, "FLWR_HOME": str(home)}
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(home), start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    @property
    def _tls(self) -> dict:
        """The TLS arguments of a SuperNode or a ``flwr`` call: the CA, or ``insecure``."""
        if self.certificates is None:
            return {"insecure": True}
        return {"insecure": False, "root_certificates": str(Path(self.certificates) / "ca.crt")}

    def start_superlink(self) -> None:
        self.port = free_port()
        tls = {"certificates": str(self.certificates)} if self.certificates else {"insecure": True}
        self._start(
            "superlink",
            flower_cli.superlink_command(port=self.port, supernode_auth=self.supernode_auth, **tls),
            self.root / "home-superlink",
        )
        wait_port(self.port)

    def _cli_home(self) -> Path:
        home = self.root / "home-cli"
        flower_cli.write_connection(home, f"127.0.0.1:{self.port}", **self._tls)
        return home

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``flwr ARGS`` against this federation's SuperLink (its connection is named ``fedvlr``)."""
        return subprocess.run(
            [flower_cli._exe("flwr"), *args],
            env={**self.env, "FLWR_HOME": str(self._cli_home())},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def register(self, public_key: Path) -> int:
        """Register a SuperNode's public key (node authentication); returns the node id the SuperLink gave it."""
        proc = self.flwr("supernode", "register", str(public_key), "fedvlr", "--format", "json")
        if proc.returncode != 0:
            raise RuntimeError(f"flwr supernode register failed:\n{proc.stdout}\n{proc.stderr}")
        return int(json.loads(proc.stdout[proc.stdout.index("{") :])["node-id"])

    def supernode_state(self, i: int) -> Path:
        return self.root / f"state-{i}"

    def start_supernode(
        self,
        i: int,
        n: int,
        *,
        tag: str = "",
        auth_key: Path | None = None,
        tls: dict | None = None,
        max_wait_time: float | None = None,
    ) -> subprocess.Popen:
        cmd = flower_cli.supernode_command(
            superlink=f"127.0.0.1:{self.port}",
            partition=(i, n),
            runtime_port=free_port(),
            state_dir=str(self.supernode_state(i)),
            auth_key=str(auth_key) if auth_key else None,
            max_wait_time=max_wait_time,
            **(tls or self._tls),
        )
        return self._start(f"supernode-{i}{tag}", cmd, self.root / f"home-supernode-{i}{tag}")

    def submit(self, config: dict) -> dict:
        home = self._cli_home()
        proc = subprocess.run(
            flower_cli.run_command(str(APP_DIR), config=flower_cli.absolute_paths(config)),
            env={**self.env, "FLWR_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"flwr run failed:\n{proc.stdout}\n{proc.stderr}\n{self.logs()}")
        try:
            return json.loads(proc.stdout[proc.stdout.index("{") :])
        except ValueError:
            return {"output": proc.stdout}

    def wait_result(self, path: Path, timeout: float) -> dict:
        try:
            return flower_cli.wait_for_result(path, timeout, procs=[self.procs["superlink"]])
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from exc

    def kill(self, name: str, sig=signal.SIGKILL, grace: float = 5.0) -> None:
        """End a process and its whole group: ``sig`` to the leader first (SIGTERM lets a SuperNode tell the
        SuperLink it leaves), then SIGKILL to the group."""
        p = self.procs[name]
        if p.poll() is None and sig != signal.SIGKILL:
            try:
                os.kill(p.pid, sig)
                p.wait(timeout=grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass

    def group_alive(self, name: str) -> bool:
        try:
            os.killpg(self.procs[name].pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def close(self) -> list[str]:
        """End every process group; return the names of groups still alive after 10 s (should be none)."""
        for name in list(self.procs)[::-1]:
            self.kill(name, signal.SIGTERM, grace=3.0)
        deadline = time.time() + 10.0
        while time.time() < deadline and any(self.group_alive(n) for n in self.procs):
            time.sleep(0.2)  # killed children are reaped by init a moment later
        return [n for n in self.procs if self.group_alive(n)]

    def logs(self, tail: int = 4000) -> str:
        out = []
        for f in sorted(self.root.glob("*.log")):
            text = f.read_text(errors="replace")
            out.append(f"----- {f.name}\n{text[-tail:]}")
        return "\n".join(out)
