"""``fedvlr-plus flower superlink|supernode|run``: the flags of a Flower deployment, turned into the command
lines of :mod:`fedvlr_plus.flower.deploy` (which starts Flower's own executables). Nothing here imports flwr or
torch."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from ..errors import ConfigError, UserError
from ..flower.deploy import (
    DEFAULT_RUNTIME_PORT,
    DEFAULT_SUPERLINK_PORT,
    absolute_paths,
    run_command,
    superlink_command,
    supernode_command,
    wait_for_result,
    write_connection,
)
from .argtypes import port as port_number
from .argtypes import positive_float


def parse_partition(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--partition looks like 0/3 (partition 0 of 3), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--partition {text}: need 0 <= I < N")
    return i, n



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
    r.add_argument("--secagg", action="store_true",
                   help="secure aggregation of the training uploads with Flower's SecAgg+ (= --config secagg=1; "
                        "tune with --config secagg-num-shares=... secagg-reconstruction-threshold=...)")
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
    if args.secagg:
        config["secagg"] = "1"
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
