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

from ..errors import ConfigError
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
from .argtypes import positive_float, positive_int

#: ``--wait``'s default bound: the example app's runs take minutes; a longer run raises --timeout
DEFAULT_WAIT = 3600.0
#: ``flwr run`` only submits; it answers in seconds, or the SuperLink is not answering
SUBMIT_TIMEOUT = 300.0


def parse_partition(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--partition looks like 0/3 (partition 0 of 3), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--partition {text}: need 0 <= I < N")
    return i, n


def superlink_address(text: str) -> str:
    """``HOST:PORT`` (an IPv6 host in brackets): refused while the flags are read, not buried in Flower's output."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"looks like HOST:PORT with a port in [1, 65535], got {text!r}")
    return text



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
    sub = p.add_subparsers(dest="flower_command", metavar="{superlink,supernode,run,drill}", required=True)

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
    n.add_argument("--superlink", required=True, type=superlink_address, metavar="HOST:PORT",
                   help="the SuperLink's address")
    n.add_argument("--partition", required=True, type=parse_partition, metavar="I/N",
                   help="this node holds partition I of N (contiguous blocks of user ids; 0/1 = every user)")
    n.add_argument("--port", type=port_number, default=DEFAULT_RUNTIME_PORT,
                   help=f"local port of the node's runtime API (default {DEFAULT_RUNTIME_PORT}; one per node "
                        f"on a machine)")
    n.add_argument("--state-dir", default=None,
                   help="where the node keeps its users' private state (default $FLWR_HOME/fedvlr-state)")
    n.add_argument("--data", default=None, help="this node's copy of the data (default: the run's 'data')")
    n.add_argument("--connect-timeout", type=positive_float, default=30.0, metavar="SECONDS",
                   help="give up with one line when nothing accepts connections at --superlink after this long "
                        "(default 30)")
    n.add_argument("--auth-key", default=None, metavar="PRIVATE_KEY",
                   help="the node's private key (node authentication; register its public key first)")
    _add_tls(n, server=False)
    n.set_defaults(func=cmd_supernode)

    r = sub.add_parser("run", help="submit the Flower App as a run; optionally wait for its result")
    r.add_argument("app", metavar="APP_DIR", help="the Flower App folder (e.g. examples/flower_app)")
    r.add_argument("--superlink", required=True, type=superlink_address, metavar="HOST:PORT",
                   help="the SuperLink's address")
    r.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="override a run-config value of the app's pyproject.toml (repeatable)")
    r.add_argument("--wait", action="store_true", help="wait for the result (needs result=PATH in the config)")
    r.add_argument("--timeout", type=positive_float, default=DEFAULT_WAIT,
                   help=f"with --wait: give up after this many seconds (default {DEFAULT_WAIT:.0f}: the example "
                        "app's runs take minutes; raise it for long runs)")
    r.add_argument("--progress-every", type=positive_float, default=30.0, metavar="SECONDS",
                   help="with --wait: a progress line on stderr this often (default 30)")
    r.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    r.add_argument("--secagg", action="store_true",
                   help="secure aggregation of the training uploads with Flower's SecAgg+ (= --config secagg=1; "
                        "tune with --config secagg-num-shares=... secagg-reconstruction-threshold=...)")
    _add_tls(r, server=False)
    r.set_defaults(func=cmd_run)
    _register_drill(sub)
    return p


def _register_drill(sub) -> None:
    d = sub.add_parser("drill", help="a SuperLink and K SuperNodes on loopback, measured beside the in-process run")
    d.add_argument("source", metavar="SOURCE", help="ml-100k, synthetic:USERSxITEMS, or a dataset folder")
    d.add_argument("--nodes", type=positive_int, default=2, help="SuperNodes; the users are split among them")
    d.add_argument("--rounds", type=positive_int, default=3, help="federated rounds of both runs (default 3)")
    d.add_argument("--out", required=True, help="folder for drill.json, the result and the processes' logs")
    d.add_argument("--app", default="examples/flower_app", metavar="APP_DIR", help="the Flower App folder")
    d.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a run-config value, e.g. --config fusion=none (repeatable)")
    d.add_argument("--timeout", type=positive_float, default=DEFAULT_WAIT, help="give up after this many seconds")
    d.add_argument("--task-poll", type=positive_float, default=0.1, metavar="SECONDS",
                   help="how often each node's Flower SuperExec looks for a new task (its "
                        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL; Flower's default 1)")
    d.set_defaults(func=cmd_drill)


def cmd_drill(args) -> int:
    from pathlib import Path

    from ..flower.drill import render, run_drill

    if not (Path(args.app) / "pyproject.toml").is_file():
        raise ConfigError(f"--app {args.app}", "not a Flower App folder (no pyproject.toml)",
                          "e.g. examples/flower_app")
    overrides = {}
    for item in args.config:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"--config {item}", "expected KEY=VALUE", "e.g. --config fusion=none")
        overrides[k.strip()] = v.strip()
    source = args.source if ":" in args.source or args.source.startswith("ml-") else str(Path(args.source).resolve())
    report = run_drill(source, args.nodes, args.rounds, Path(args.out), app_dir=args.app, overrides=overrides,
                       timeout=args.timeout, task_poll=args.task_poll,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(report))
    return 0


def cmd_superlink(args) -> int:
    from ..flower.supervise import check_port_free, supervise

    cmd = superlink_command(host=args.host, port=args.port, insecure=args.insecure, certificates=args.certificates,
                            database=args.database, supernode_auth=args.enable_supernode_auth)
    check_port_free(args.host, args.port, "--port")
    print(" ".join(cmd), file=sys.stderr)
    return supervise(cmd, "flower superlink")


def cmd_supernode(args) -> int:
    from ..flower.supervise import check_port_free, check_superlink_reachable, supervise

    _check_node_paths(args)
    cmd = supernode_command(superlink=args.superlink, partition=args.partition, runtime_port=args.port,
                            insecure=args.insecure, root_certificates=args.root_certificates,
                            state_dir=args.state_dir, data=args.data, auth_key=args.auth_key)
    check_port_free("127.0.0.1", args.port, "--port")
    check_superlink_reachable(args.superlink, args.connect_timeout)
    print(" ".join(cmd), file=sys.stderr)
    return supervise(cmd, "flower supernode")


def _check_node_paths(args) -> None:
    """A node's data and state folder checked at start, not when the first run reaches the node."""
    from pathlib import Path

    if args.data is not None and not Path(args.data).exists():
        raise ConfigError(f"--data {args.data}", "no such file or folder",
                          "give this node's copy of the data, or leave --data out to use the run's")
    if args.state_dir is not None and Path(args.state_dir).exists() and not Path(args.state_dir).is_dir():
        raise ConfigError(f"--state-dir {args.state_dir}", "is a file, not a folder")
    for flag in ("root_certificates", "auth_key"):
        value = getattr(args, flag, None)
        if value is not None and not Path(value).is_file():
            raise ConfigError(f"--{flag.replace('_', '-')} {value}", "no such file")


def _run_config(args) -> dict:
    """``--config KEY=VALUE`` items (and ``--secagg``) as the run config, paths made absolute and checked."""
    from pathlib import Path

    config = {}
    for item in args.config:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"--config {item}", "expected KEY=VALUE", "e.g. --config rounds=3")
        config[k.strip()] = v.strip()
    if args.secagg:
        config["secagg"] = "1"
    config = absolute_paths(config)
    if args.wait:
        if not config.get("result"):
            raise ConfigError("--wait", "needs --config result=PATH (the file the ServerApp writes)")
        result = Path(config["result"])
        if result.exists() or result.with_suffix(".error.json").exists():
            raise ConfigError(f"--config result={config['result']}", "already exists: --wait would read an old "
                              "run's result as this one's", "remove it or choose another path")
        if not result.parent.is_dir():
            raise ConfigError(f"--config result={config['result']}", f"no folder {result.parent}",
                              "create it first, or choose another path")
    return config


def cmd_run(args) -> int:
    from pathlib import Path

    from ..flower.deploy import FlowerRunError, submitted_run

    if not (Path(args.app) / "pyproject.toml").is_file():
        raise ConfigError(f"APP_DIR {args.app}", "not a Flower App folder (no pyproject.toml)",
                          "e.g. examples/flower_app")
    config = _run_config(args)
    with tempfile.TemporaryDirectory(prefix="fedvlr-flwr-home-") as home:
        write_connection(home, args.superlink, insecure=args.insecure, root_certificates=args.root_certificates)
        env = {**os.environ, "FLWR_HOME": home}
        try:
            proc = subprocess.run(run_command(args.app, config=config), env=env, capture_output=True, text=True,
                                  timeout=SUBMIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise FlowerRunError(f"flwr run {args.app}", f"no answer from the SuperLink {args.superlink} after "
                                 f"{SUBMIT_TIMEOUT:.0f} s; the run may not have been submitted") from None
    submitted = submitted_run(proc.stdout, proc.stderr, proc.returncode, args.app)
    if not args.wait:
        print(json.dumps(submitted))
        return 0
    print(f"submitted run {submitted.get('run-id', '?')}; waiting for {config['result']} (at most "
          f"{args.timeout:.0f} s, --timeout)", file=sys.stderr, flush=True)
    result = wait_for_result(config["result"], args.timeout, every=args.progress_every,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(_result_table(result))
    if args.json:
        print(json.dumps(result))
    return 0


def _result_table(result: dict) -> str:
    """The figures as ``run`` prints them: one line naming the run, then valid, test, test warm / cold."""
    from ..evaluation.run_report import format_table, part_rows

    keys = list((result.get("test") or result.get("valid") or {}).keys())
    head = (f"{result.get('dataset')} | {result.get('backbone')} | flower, {result.get('strategy')} | "
            f"{result.get('rounds_run')} rounds, selected round {result.get('selected_round')}")
    return head + "\n" + format_table(part_rows(result), keys)
