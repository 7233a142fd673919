"""``fedvlr-plus flower ...``: start what a Flower deployment of fedvlr-plus needs.

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

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .argtypes import port as port_number
from .argtypes import positive_float
from .errors import ConfigError, UserError

DEFAULT_SUPERLINK_PORT = 9093
DEFAULT_RUNTIME_PORT = 9094


def _exe(name: str) -> str:
    """Flower's executable beside the running Python (a venv), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise UserError(f"{name} not found", "Flower is not installed",
                        "pip install 'fedvlr-plus[flower]'")
    return found


def tls_args(*, insecure: bool, certificates: str | None = None, root_certificates: str | None = None,
             server: bool) -> list[str]:
    if insecure:
        if certificates or root_certificates:
            raise ConfigError("--insecure", "choose either --insecure or TLS certificates, not both")
        return ["--insecure"]
    if server:
        if not certificates:
            raise ConfigError("--certificates", "the SuperLink needs TLS files or --insecure",
                              "give --certificates DIR with ca.crt, server.pem and server.key, or --insecure")
        d = Path(certificates)
        files = {"--ssl-ca-certfile": d / "ca.crt", "--ssl-certfile": d / "server.pem", "--ssl-keyfile": d / "server.key"}
        missing = [str(p) for p in files.values() if not p.exists()]
        if missing:
            raise ConfigError(f"--certificates {certificates}", f"TLS files missing: {', '.join(missing)}")
        return [x for flag, p in files.items() for x in (flag, str(p))]
    if not root_certificates:
        raise ConfigError("--root-certificates", "a SuperNode needs the SuperLink's CA certificate or --insecure",
                          "give --root-certificates CA.crt, or --insecure")
    return ["--root-certificates", str(root_certificates)]


def superlink_command(*, host: str = "127.0.0.1", port: int = DEFAULT_SUPERLINK_PORT, insecure: bool = False,
                      certificates: str | None = None, database: str | None = None,
                      supernode_auth: bool = False) -> list[str]:
    cmd = [_exe("flower-superlink"), *tls_args(insecure=insecure, certificates=certificates, server=True),
           "--host", host, "--port", str(port), "--disable-runtime-dependency-installation"]
    if database:
        cmd += ["--database", str(database)]
    if supernode_auth:
        cmd += ["--enable-supernode-auth"]
    return cmd


def parse_partition(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--partition looks like 0/3 (partition 0 of 3), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--partition {text}: need 0 <= I < N")
    return i, n


def supernode_command(*, superlink: str, partition: tuple[int, int], runtime_port: int = DEFAULT_RUNTIME_PORT,
                      insecure: bool = False, root_certificates: str | None = None, state_dir: str | None = None,
                      data: str | None = None, auth_key: str | None = None,
                      max_wait_time: float | None = None) -> list[str]:
    i, n = partition
    node_config = f"partition-id={i} num-partitions={n}"
    if state_dir:
        node_config += f" state-dir={json.dumps(str(Path(state_dir).resolve()))}"
    if data:
        node_config += f" data={json.dumps(str(Path(data).resolve()))}"
    cmd = [_exe("flower-supernode"),
           *tls_args(insecure=insecure, root_certificates=root_certificates, server=False),
           "--superlink", superlink, "--node-config", node_config, "--port", str(runtime_port)]
    if auth_key:
        cmd += ["--auth-supernode-private-key", str(auth_key)]
    if max_wait_time is not None:
        cmd += ["--max-wait-time", str(max_wait_time)]
    return cmd


def write_connection(flwr_home: str | os.PathLike, superlink: str, *, insecure: bool,
                     root_certificates: str | None = None, name: str = "fedvlr") -> Path:
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


def wait_for_result(result: str | os.PathLike, timeout: float, procs: list | None = None) -> dict:
    """Block until the ServerApp writes ``result`` (or its ``.error.json``); return the parsed result."""
    path = Path(result)
    err = path.with_suffix(".error.json")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if err.exists():
            raise RuntimeError(f"the ServerApp failed: {json.loads(err.read_text())['error']}")
        for p in procs or []:
            if p.poll() is not None:
                raise RuntimeError(f"process {p.args[0]} exited with {p.returncode} before the run finished")
        time.sleep(0.2)
    raise TimeoutError(f"no result at {path} after {timeout:.0f} s")


# ---------------------------------------------------------------------------------------------- CLI
def _add_tls(p: argparse.ArgumentParser, server: bool) -> None:
    p.add_argument("--insecure", action="store_true", help="no TLS (loopback tests and trusted networks only)")
    if server:
        p.add_argument("--certificates", metavar="DIR", default=None,
                       help="folder with ca.crt, server.pem and server.key (TLS for Fleet, Control and Runtime APIs)")
    else:
        p.add_argument("--root-certificates", metavar="CA", default=None,
                       help="the CA certificate that signed the SuperLink's certificate")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("flower", help="run fedvlr-plus clients under Flower's deployment engine",
                              description="Start a SuperLink, SuperNodes (one per device or silo) and runs of the "
                                          "Flower App in examples/flower_app. See docs/flower.md.")
    sub = p.add_subparsers(dest="flower_command", metavar="{superlink,supernode,run}", required=True)

    s = sub.add_parser("superlink", help="start the SuperLink (foreground)")
    s.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0: every interface)")
    s.add_argument("--port", type=port_number, default=DEFAULT_SUPERLINK_PORT,
                   help=f"port of the Fleet, Control and Runtime APIs (default {DEFAULT_SUPERLINK_PORT})")
    s.add_argument("--database", default=None, help="SQLite file for the SuperLink's state (default: in memory)")
    s.add_argument("--enable-supernode-auth", action="store_true",
                   help="accept only SuperNodes whose public key was registered (flwr supernode register)")
    _add_tls(s, server=True)
    s.set_defaults(func=cmd_superlink)

    n = sub.add_parser("supernode", help="start a SuperNode holding one partition of the users (foreground)")
    n.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the SuperLink's address")
    n.add_argument("--partition", required=True, type=parse_partition, metavar="I/N",
                   help="this node holds partition I of N (contiguous blocks of user ids; 0/1 = every user)")
    n.add_argument("--port", type=port_number, default=DEFAULT_RUNTIME_PORT,
                   help=f"local port of the node's runtime API (default {DEFAULT_RUNTIME_PORT}; one per node "
                        f"on a machine)")
    n.add_argument("--state-dir", default=None,
                   help="where the node keeps its users' private state (default $FLWR_HOME/fedvlr-state)")
    n.add_argument("--data", default=None, help="this node's copy of the data (default: the run's 'data')")
    n.add_argument("--auth-key", default=None, metavar="PRIVATE_KEY",
                   help="the node's private key (node authentication; register its public key first)")
    _add_tls(n, server=False)
    n.set_defaults(func=cmd_supernode)

    r = sub.add_parser("run", help="submit the Flower App as a run; optionally wait for its result")
    r.add_argument("app", metavar="APP_DIR", help="the Flower App folder (e.g. examples/flower_app)")
    r.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the SuperLink's address")
    r.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="override a run-config value of the app's pyproject.toml (repeatable)")
    r.add_argument("--wait", action="store_true", help="wait for the result (needs result=PATH in the config)")
    r.add_argument("--timeout", type=positive_float, default=24 * 3600.0,
                   help="with --wait: give up after this many seconds")
    r.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    _add_tls(r, server=False)
    r.set_defaults(func=cmd_run)
    return p


def cmd_superlink(args) -> int:
    cmd = superlink_command(host=args.host, port=args.port, insecure=args.insecure, certificates=args.certificates,
                            database=args.database, supernode_auth=args.enable_supernode_auth)
    print(" ".join(cmd), file=sys.stderr)
    os.execv(cmd[0], cmd)
    return 0  # pragma: no cover


def cmd_supernode(args) -> int:
    cmd = supernode_command(superlink=args.superlink, partition=args.partition, runtime_port=args.port,
                            insecure=args.insecure, root_certificates=args.root_certificates,
                            state_dir=args.state_dir, data=args.data, auth_key=args.auth_key)
    print(" ".join(cmd), file=sys.stderr)
    os.execv(cmd[0], cmd)
    return 0  # pragma: no cover


def cmd_run(args) -> int:
    config = {}
    for item in args.config:
        if "=" not in item:
            raise ConfigError(f"--config {item}", "expected KEY=VALUE", "e.g. --config rounds=3")
        k, v = item.split("=", 1)
        config[k.strip()] = v.strip()
    config = absolute_paths(config)
    if args.wait and not config.get("result"):
        raise ConfigError("--wait", "needs --config result=PATH (the file the ServerApp writes)")
    with tempfile.TemporaryDirectory(prefix="fedvlr-flwr-home-") as home:
        write_connection(home, args.superlink, insecure=args.insecure, root_certificates=args.root_certificates)
        env = {**os.environ, "FLWR_HOME": home}
        proc = subprocess.run(run_command(args.app, config=config), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise UserError(f"flwr run {args.app}", f"failed with exit code {proc.returncode}: {last}")
    submitted = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    if not args.wait:
        print(submitted)
        return 0
    result = wait_for_result(config["result"], args.timeout)
    summary = {k: result.get(k) for k in ("selected_round", "valid", "test", "test_warm", "test_cold")}
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(summary, indent=2))
    return 0
