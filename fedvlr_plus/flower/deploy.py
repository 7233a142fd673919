"""What a Flower deployment of fedvlr-plus needs started (``fedvlr-plus flower ...`` calls these):

- ``flower superlink``  one per federation (the coordinator; runs the ServerApp when a run starts);
- ``flower supernode --superlink HOST:PORT --partition I/N``  one per device or silo;
- ``flower run APP_DIR --superlink HOST:PORT``  submit the Flower App (``examples/flower_app``) as a run, and with
  ``--wait`` block until the ServerApp has written its result.

The helpers call Flower's own executables (``flower-superlink``, ``flower-supernode``, ``flwr``) with the flags
this project needs: the SuperLink never installs app dependencies at run time (it would build a fresh environment
and download torch), TLS certificates or ``--insecure`` are explicit, and ``flwr run`` gets a private Flower
configuration (``FLWR_HOME``) holding one SuperLink connection. The ``*_command`` functions return the argument
lists, which the tests use to start real processes. Nothing here imports flwr or torch.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..errors import ConfigError, UserError

DEFAULT_SUPERLINK_PORT = 9093
DEFAULT_RUNTIME_PORT = 9094


def _exe(name: str) -> str:
    """Flower's executable beside the running Python (a venv), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise UserError(f"{name} not found", "Flower is not installed", "pip install 'fedvlr-plus[flower]'")
    return found


def tls_args(
    *, insecure: bool, certificates: str | None = None, root_certificates: str | None = None, server: bool
) -> list[str]:
    if insecure:
        if certificates or root_certificates:
            raise ConfigError("--insecure", "choose either --insecure or TLS certificates, not both")
        return ["--insecure"]
    if server:
        if not certificates:
            raise ConfigError(
                "--certificates",
                "the SuperLink needs TLS files or --insecure",
                "give --certificates DIR with ca.crt, server.pem and server.key, or --insecure",
            )
        d = Path(certificates)
        files = {
            "--ssl-ca-certfile": d / "ca.crt",
            "--ssl-certfile": d / "server.pem",
            "--ssl-keyfile": d / "server.key",
        }
        missing = [str(p) for p in files.values() if not p.exists()]
        if missing:
            raise ConfigError(f"--certificates {certificates}", f"TLS files missing: {', '.join(missing)}")
        return [x for flag, p in files.items() for x in (flag, str(p))]
    if not root_certificates:
        raise ConfigError(
            "--root-certificates",
            "a SuperNode needs the SuperLink's CA certificate or --insecure",
            "give --root-certificates CA.crt, or --insecure",
        )
    return ["--root-certificates", str(root_certificates)]


def superlink_command(
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_SUPERLINK_PORT,
    insecure: bool = False,
    certificates: str | None = None,
    database: str | None = None,
    supernode_auth: bool = False,
) -> list[str]:
    cmd = [
        _exe("flower-superlink"),
        *tls_args(insecure=insecure, certificates=certificates, server=True),
        "--host",
        host,
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
    ]
    if database:
        cmd += ["--database", str(database)]
    if supernode_auth:
        cmd += ["--enable-supernode-auth"]
    return cmd


def supernode_command(
    *,
    superlink: str,
    partition: tuple[int, int],
    runtime_port: int = DEFAULT_RUNTIME_PORT,
    insecure: bool = False,
    root_certificates: str | None = None,
    state_dir: str | None = None,
    data: str | None = None,
    auth_key: str | None = None,
    max_wait_time: float | None = None,
) -> list[str]:
    i, n = partition
    node_config = f"partition-id={i} num-partitions={n}"
    if state_dir:
        node_config += f" state-dir={json.dumps(str(Path(state_dir).resolve()))}"
    if data:
        node_config += f" data={json.dumps(str(Path(data).resolve()))}"
    cmd = [
        _exe("flower-supernode"),
        *tls_args(insecure=insecure, root_certificates=root_certificates, server=False),
        "--superlink",
        superlink,
        "--node-config",
        node_config,
        "--port",
        str(runtime_port),
    ]
    if auth_key:
        cmd += ["--auth-supernode-private-key", str(auth_key)]
    if max_wait_time is not None:
        cmd += ["--max-wait-time", str(max_wait_time)]
    return cmd


def write_connection(
    flwr_home: str | os.PathLike,
    superlink: str,
    *,
    insecure: bool,
    root_certificates: str | None = None,
    name: str = "fedvlr",
) -> Path:
    """A Flower configuration (``FLWR_HOME/config.toml``) whose default SuperLink connection is ``superlink``."""
    home = Path(flwr_home)
    home.mkdir(parents=True, exist_ok=True)
    lines = ["[superlink]", f'default = "{name}"', "", f"[superlink.{name}]", f'address = "{superlink}"']
    if insecure:
        lines.append("insecure = true")
    elif root_certificates:
        lines.append(f"root-certificates = {json.dumps(str(Path(root_certificates).resolve()))}")
    path = home / "config.toml"
    tmp = path.with_name(".config.toml.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def _toml_value(v: str) -> str:
    """``k=v`` from the command line as a TOML value: numbers and booleans as they are, the rest quoted."""
    low = v.strip().lower()
    if low in ("true", "false"):
        return low
    try:
        float(v)
        return v
    except ValueError:
        return json.dumps(v)


def run_command(app_dir: str, *, config: dict[str, str] | None = None, name: str = "fedvlr") -> list[str]:
    cmd = [_exe("flwr"), "run", str(Path(app_dir).resolve()), name, "--format", "json"]
    if config:
        cmd += ["--run-config", " ".join(f"{k}={_toml_value(str(v))}" for k, v in config.items())]
    return cmd


def absolute_paths(config: dict[str, str]) -> dict[str, str]:
    """Paths in the run config are read by other processes (other working directories): make them absolute."""
    out = dict(config)
    for key in ("data", "result", "audit-dir"):
        if out.get(key) and not str(out[key]).startswith("ml-"):
            out[key] = str(Path(out[key]).expanduser().resolve())
    return out


class FlowerRunError(UserError, RuntimeError):
    """``flwr run`` did not submit the run (SuperLink unreachable, app refused), or the run failed or timed out.
    A RuntimeError too, as the failures of ``wait_for_result`` were before."""


def submitted_run(stdout: str, stderr: str, returncode: int, app: str) -> dict:
    """Flower's JSON answer to ``flwr run --format json`` when it says the run was submitted; else one line with
    Flower's own message. Flower exits 0 even when its JSON says ``success: false`` (SuperLink unreachable), so
    the JSON decides, not the exit code."""
    answer = _last_json_object(stdout)
    if answer is None:
        last = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1]
        why = f"exit code {returncode}: {last}" if returncode else f"Flower printed no JSON answer ({last[:200]})"
        raise FlowerRunError(f"flwr run {app}", f"the run was not submitted; {why}")
    if answer.get("success") is not True or returncode:
        message = " ".join(
            line.strip()
            for line in str(answer.get("error-message") or answer.get("error") or "no reason given").splitlines()
            if line.strip() and not line.startswith("Using SuperLink")  # Flower's own preamble: not the reason
        )
        raise FlowerRunError(f"flwr run {app}", f"the run was not submitted: {message or 'no reason given'}")
    return answer


def _last_json_object(text: str) -> dict | None:
    """The JSON object Flower printed (the whole output, else its last ``{`` ... ``}`` block), or None."""
    text = text.strip()
    for start in [0] + [i for i, ch in enumerate(text) if ch == "{" and (i == 0 or text[i - 1] == "\n")][::-1]:
        try:
            value = json.loads(text[start:])
        except ValueError:
            continue
        return value if isinstance(value, dict) else None
    return None


def wait_for_result(
    result: str | os.PathLike, timeout: float, procs: list | None = None, *, progress=None, every: float = 30.0
) -> dict:
    """Block until the ServerApp writes ``result`` (or its ``.error.json``); return the parsed result.
    ``progress(line)`` gets a line whenever the run moves on (its round, stage and the nodes that replied, from
    the ServerApp's progress file) and every ``every`` seconds while nothing changes, so a wait is never silent."""
    from .progress import describe, read_progress

    path = Path(result)
    err = path.with_suffix(".error.json")
    start = time.time()
    deadline, next_note, last = start + timeout, start + every, None
    while time.time() < deadline:
        if path.exists():
            return _read_result(path)
        if err.exists():
            reason = _read_result(err).get("error", "no reason given")
            raise FlowerRunError(str(err), f"the ServerApp failed: {reason}")
        for p in procs or []:
            if p.poll() is not None:
                raise FlowerRunError(f"{p.args[0]}", f"exited with {p.returncode} before the run finished")
        if progress is not None:
            state = read_progress(path)
            line = describe(state) if state else f"waiting for {path}: the ServerApp has not started a round yet"
            elapsed = time.time() - start
            if line != last or time.time() >= next_note:
                progress(f"{line} [{elapsed:.0f} s of at most {timeout:.0f} s]")
                last, next_note = line, time.time() + every
        time.sleep(min(0.2, max(0.0, deadline - time.time())))
    raise FlowerRunError(
        f"--wait {path}",
        f"no result after {timeout:.0f} s (the run may still be going on the SuperLink)",
        "wait longer with --timeout SECONDS, or list runs with flwr ls",
    )


def _read_result(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FlowerRunError(str(path), f"cannot be read as the run's result ({exc})") from None
    if not isinstance(value, dict):
        raise FlowerRunError(str(path), "is not a JSON object")
    return value
