"""The ServerApp's side of a deployment: a Flower strategy that aggregates with our strategies, selects the round on
validation as the simulator does, and optionally runs the training rounds under SecAgg+."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy as FlowerStrategyBase

from ..jsonio import write_json_atomic
from .progress import ProgressFile
from .reply_poll import QuickPollGrid
from .settings import Settings, build_backbone, load_data
from .wire import content_to_updates, shared_to_record  # (first: it checks for flwr)


class FedVLRStrategy(FlowerStrategyBase):
    """A Flower strategy whose aggregation is one of ours (``run.strategy``); selection on validation.

    ``run`` is a :class:`~fedvlr_plus.federation.engine.FederatedRun` used for what the simulator would use: the
    backbone, resolved learning rates, the (wrapped) strategy, the shared state and the round configuration. Its
    in-process simulator is never called.
    """

    def __init__(self, run, s: Settings):
        self.run, self.s = run, s
        self.history: list[dict] = []
        self.best: dict | None = None
        self.audit = Path(s.audit_dir) if s.audit_dir else None
        self._rng = random.Random(int(s.cfg.seed))
        self._pending: dict | None = None
        self.progress = ProgressFile(s.result, s.cfg.rounds)
        self._asked = 0  # nodes the current stage's messages went to

    # ---- node selection
    def _nodes(self, grid: Grid, minimum: int, fraction: float) -> list[int]:
        need = max(int(minimum), int(self.s.min_available_nodes))
        deadline = time.time() + float(self.s.round_timeout)
        while len(ids := sorted(grid.get_node_ids())) < need:
            if time.time() > deadline:
                raise RuntimeError(
                    f"only {len(ids)} SuperNodes connected after {self.s.round_timeout:.0f} s; "
                    f"the run needs {need} (min-available-nodes / min-train-nodes)"
                )
            time.sleep(0.5)
        k = max(int(minimum), int(np.ceil(fraction * len(ids))))
        return sorted(self._rng.sample(ids, min(k, len(ids))))

    def configure_train(self, server_round, arrays, config, grid):
        nodes = self._nodes(grid, self.s.min_train_nodes, self.s.fraction_train)
        conf = ConfigRecord(self.run.round_config(server_round))
        rec = shared_to_record(self.run.shared)
        self._sent(server_round, "train", nodes, rec)
        return [
            Message(RecordDict({"arrays": rec, "config": conf}), dst_node_id=n, message_type="train") for n in nodes
        ]

    def _sent(self, server_round: int, stage: str, nodes: list, rec=None) -> None:
        self._asked = len(nodes)
        self._bytes_down = _record_bytes(rec) if rec is not None else 0
        self.progress.sent(server_round, stage, len(nodes))

    def _ok(self, replies, server_round: int, what: str, minimum: int) -> list[Message]:
        replies = list(replies)
        ok = [m for m in replies if not m.has_error()]
        if len(ok) < minimum:
            errors = "; ".join(f"node {m.metadata.src_node_id}: {m.error.reason}" for m in replies if m.has_error())
            raise RuntimeError(
                f"round {server_round}: {len(ok)} {what} replies, fewer than the minimum {minimum}"
                + (f" ({errors})" if errors else "")
            )
        return ok

    def _audit(self, server_round: int, what: str, msg: Message) -> None:
        if self.audit is None:
            return
        folder = self.audit / f"round{server_round:03d}-{what}"
        folder.mkdir(parents=True, exist_ok=True)
        stem = folder / f"node{msg.metadata.src_node_id}"
        arrays, scalars = {}, {}
        for rname, rec in msg.content.items():
            if isinstance(rec, ArrayRecord):
                for k, v in rec.items():
                    arrays[f"{rname}::{k}"] = v.numpy()
            else:
                scalars[rname] = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in rec.items()}
        np.savez(f"{stem}.npz", **arrays)
        write_json_atomic(
            f"{stem}.json", {"records": sorted(msg.content.keys()), "scalars": scalars, "arrays": sorted(arrays)}
        )

    def aggregate_train(self, server_round, replies):
        from .node_sums import is_sums_reply

        ok = self._ok(replies, server_round, "training", self.s.min_train_nodes)
        for m in ok:
            self._audit(server_round, "train", m)
        self._bytes_up = {int(m.metadata.src_node_id): _content_bytes(m.content) for m in ok}
        kinds = {is_sums_reply(m.content) for m in ok}
        if len(kinds) > 1:
            raise RuntimeError(f"round {server_round}: some nodes sent sums and some uploads (mixed app versions)")
        if kinds == {True}:
            return self._aggregate_sums(server_round, [m.content for m in ok])
        updates = []
        for m in ok:
            updates += content_to_updates(m.content, self.run.strategy.upload)
        updates.sort(key=lambda u: u.cid)  # the simulator's order: aggregation is then bit-for-bit the same
        self._check_users(server_round, [u.cid for u in updates])
        n = np.array([u.num_examples for u in updates], dtype=np.float64)
        loss = float(np.dot(n, [u.metrics.get("loss", 0.0) for u in updates]) / n.sum())
        run = self.run
        shared = run.strategy.aggregate(run.shared, updates, run.specs)
        return self._apply(server_round, shared, loss=loss, nodes=len(ok), clients=len(updates))

    def _aggregate_sums(self, server_round: int, contents: list):
        """Each node sent its users' weighted sums (:mod:`.node_sums`): the round's sums, then the strategy."""
        from .node_sums import merged_sums

        run = self.run
        tables = {k for k in run.shared if run.specs[k].item_table}
        sums, loss, _, cids = merged_sums(contents, run.shared, tables)
        self._check_users(server_round, cids)
        shared = run.strategy.from_sums(run.shared, sums, run.specs)
        return self._apply(server_round, shared, loss=loss, nodes=len(contents), clients=len(cids))

    @staticmethod
    def _check_users(server_round: int, cids: list) -> None:
        if len(set(cids)) != len(cids):
            raise RuntimeError(f"round {server_round}: a user was uploaded by two nodes (overlapping partitions)")
        if not cids:
            raise RuntimeError(f"round {server_round}: the replying nodes hold no user with training data")

    def _apply(self, server_round: int, shared: dict, *, loss: float, nodes: int, clients: int):
        """The round's new shared state (aggregated by our strategy) checked and recorded."""
        run = self.run
        run.shared = shared
        run.round = server_round
        if not np.isfinite(loss) or not all(bool(torch.isfinite(v).all()) for v in run.shared.values()):
            raise FloatingPointError(f"training diverged in round {server_round} (loss {loss})")
        seconds = self.progress.replied(server_round, "train", self._asked, nodes, loss=loss)
        self._pending = {
            "round": server_round,
            "nodes": nodes,
            "clients": clients,
            "loss": loss,
            "train_seconds": seconds,
        }
        if getattr(self, "_bytes_up", None):  # what each node sent and received (the arrays' bytes)
            self._pending.update(bytes_up=self._bytes_up, bytes_down=self._bytes_down)
            self._bytes_up = None
        self.history.append(self._pending)
        return shared_to_record(run.shared), MetricRecord({"loss": loss, "nodes": nodes, "clients": clients})

    def _evaluating(self, server_round: int) -> bool:
        cfg = self.run.cfg
        return server_round % cfg.eval_every == 0 or server_round == cfg.rounds

    def eval_config(self) -> dict:
        cfg = self.run.cfg
        return {
            "splits": "valid,test",
            "ks": [int(k) for k in cfg.ks],
            "metrics": list(cfg.metrics),
            "mask_history": cfg.mask_history,
            "seed": int(cfg.seed),
        }

    def configure_evaluate(self, server_round, arrays, config, grid):
        if self.s.evaluation != "federated" or not self._evaluating(server_round):
            return []
        nodes = self._nodes(grid, self.s.min_evaluate_nodes, 1.0)
        conf = ConfigRecord(self.eval_config())
        rec = shared_to_record(self.run.shared)
        self._sent(server_round, "evaluate", nodes, rec)
        return [
            Message(RecordDict({"arrays": rec, "config": conf}), dst_node_id=n, message_type="evaluate") for n in nodes
        ]

    def aggregate_evaluate(self, server_round, replies):
        if self.s.evaluation != "federated" or not self._evaluating(server_round):
            return None
        ok = self._ok(replies, server_round, "evaluation", self.s.min_evaluate_nodes)
        for m in ok:
            self._audit(server_round, "evaluate", m)
        sums: dict[str, float] = {}
        for m in ok:
            for k, v in m.content["metrics"].items():
                sums[k] = sums.get(k, 0.0) + float(v)
        res = {}
        for split in ("valid", "test"):
            for group in ("all", "warm", "cold"):
                n = sums.get(f"{split}/{group}/n", 0.0)
                names = sorted({k.split("/")[2] for k in sums if k.startswith(f"{split}/{group}/")} - {"n"})
                res[(split, group)] = (
                    {name: (sums[f"{split}/{group}/{name}"] / n if n else None) for name in names},
                    int(n),
                )
        self._select(server_round, res, nodes=len(ok))
        valid = res[("valid", "all")][0]
        metric = self.run.cfg.valid_metric
        seconds = self.progress.replied(
            server_round, "evaluate", self._asked, len(ok), valid={metric: valid.get(metric)}
        )
        if self.history and self.history[-1]["round"] == server_round:
            self.history[-1]["eval_seconds"] = seconds
        return MetricRecord({f"valid/{k}": float(v) for k, v in valid.items() if v is not None})

    def _select(self, server_round: int, res: dict, nodes: int) -> None:
        """The engine's rule: the best validation metric selects the round; its test figures are kept."""
        valid = res[("valid", "all")][0]
        rec = (
            self.history[-1] if self.history and self.history[-1]["round"] == server_round else {"round": server_round}
        )
        rec["valid"] = valid
        rec["eval_nodes"] = nodes
        metric = valid.get(self.run.cfg.valid_metric)
        if metric is not None and (self.best is None or metric > self.best["metric"]):
            self.best = {
                "round": server_round,
                "metric": float(metric),
                "valid": valid,
                "test": res[("test", "all")][0],
                "test_warm": res[("test", "warm")][0],
                "test_cold": res[("test", "cold")][0],
                "n_users": res[("test", "all")][1],
                "test_warm_n_users": res[("test", "warm")][1],
                "test_cold_n_users": res[("test", "cold")][1],
            }

    def server_evaluate(self, server_round: int, arrays) -> MetricRecord | None:
        """Server-side evaluation: the global model for users with an untrained (initial) private state."""
        if server_round == 0 or not self._evaluating(server_round):
            return None
        run = self.run
        groups = {}
        for split in ("valid", "test"):
            r = run.evaluate(split, "full")
            for group in ("all", "warm", "cold"):
                groups[(split, group)] = (
                    {k: (None if v != v else float(v)) for k, v in r.summary(group).items()},
                    r.n_users(group),
                )
        self._select(server_round, groups, nodes=0)
        return MetricRecord({f"valid/{k}": float(v) for k, v in groups[("valid", "all")][0].items() if v is not None})

    def summary(self) -> None:
        from logging import INFO

        from flwr.common.logger import log

        log(
            INFO,
            "\t├── fedvlr-plus strategy %s (upload %s), backbone %s, evaluation %s",
            self.run.strategy_name,
            self.run.strategy.upload,
            self.run.backbone_name,
            self.s.evaluation,
        )
        log(
            INFO,
            "\t└── min train nodes %d, min evaluate nodes %d, min available nodes %d, fraction-train %.2f",
            self.s.min_train_nodes,
            self.s.min_evaluate_nodes,
            self.s.min_available_nodes,
            self.s.fraction_train,
        )

    def result(self) -> dict:
        if self.best is None:
            raise RuntimeError("no validation evaluation was run")
        run = self.run
        out = {
            "backbone": run.backbone_name,
            "dataset": run.data.name,
            "seed": int(run.cfg.seed),
            "selected_round": int(self.best["round"]),
            "rounds_run": int(run.round),
            "strategy": run.strategy_name,
            "engine": "flower",
            "evaluation": self.s.evaluation,
            "valid": self.best["valid"],
            "test": self.best["test"],
            "test_warm": self.best["test_warm"],
            "test_cold": self.best["test_cold"],
            "n_users": self.best["n_users"],
            "test_warm_n_users": self.best["test_warm_n_users"],
            "test_cold_n_users": self.best["test_cold_n_users"],
            "history": self.history,
            "config": run.recorded_config(),
            "model": run.bb.describe(),
        }
        return out


class SecureFedVLRStrategy(FedVLRStrategy):
    """:class:`FedVLRStrategy` whose training rounds run under Flower's SecAgg+: the server receives masked
    vectors only, and our strategy aggregates one upload that stands for the round's secure sum
    (:func:`~fedvlr_plus.federation.privacy.secure_sum.aggregate_as_update`). Evaluation is unchanged (metric sums)."""

    def __init__(self, run, s: Settings):
        from ..federation.privacy.secure_sum import SUMMABLE

        super().__init__(run, s)
        self.rule = "fedgrad" if run.strategy.upload == "grads" else run.strategy_name
        if self.rule not in SUMMABLE:
            raise ValueError(
                f"secagg: strategy {run.strategy_name!r} needs every upload and cannot run on a "
                f"secure sum; choose one of {', '.join(SUMMABLE)}"
            )
        self._secure = None
        # SecAgg+ weights a node by N_i / max_weight: no node holds more training examples than the dataset
        self.max_weight = float(s.secagg_max_weight or int(np.diff(run.indptr).sum()))

    def configure_train(self, server_round, arrays, config, grid):
        from .secagg import run_secure_round

        nodes = self._nodes(grid, self.s.min_train_nodes, self.s.fraction_train)
        self._sent(server_round, "train", nodes)
        tables = {n for n in self.run.shared if self.run.specs[n].item_table}
        if self.audit is not None:
            self.audit.mkdir(parents=True, exist_ok=True)
        self._secure = run_secure_round(
            grid,
            nodes,
            self.run.shared,
            self.run.round_config(server_round),
            tables,
            self.s,
            server_round,
            self.max_weight,
            self.audit,
        )
        return []  # the round's messages were exchanged by the SecAgg+ workflow

    def aggregate_train(self, server_round, replies):
        from ..federation.privacy.secure_sum import aggregate_as_update

        sec, self._secure = self._secure, None
        if sec.nodes < self.s.min_train_nodes:
            raise RuntimeError(
                f"round {server_round}: {sec.nodes} nodes in the secure sum, fewer than the minimum "
                f"{self.s.min_train_nodes} ({'; '.join(sec.failures)})"
            )
        update = aggregate_as_update(
            self.rule, self.run.shared, sec.means, sec.weights, sec.n_total, self.run.strategy.upload
        )
        shared = self.run.strategy.aggregate(self.run.shared, [update], self.run.specs)
        out = self._apply(server_round, shared, loss=sec.loss, nodes=sec.nodes, clients=sec.users)
        if self.audit is not None:  # what the server holds after the round (the aggregate, nothing per node)
            np.savez(
                self.audit / f"round{server_round:03d}-shared.npz", **{k: v.numpy() for k, v in self.run.shared.items()}
            )
        return out

    def result(self) -> dict:
        s = self.s
        return {
            **super().result(),
            "secure_aggregation": {
                "protocol": "SecAgg+ (flwr secaggplus_mod / SecAggPlusWorkflow)",
                "rule": self.rule,
                "num_shares": float(s.secagg_num_shares),
                "reconstruction_threshold": float(s.secagg_reconstruction_threshold),
                "max_weight": self.max_weight,
                "clipping_range": float(s.secagg_clipping_range) or "auto",
                "quantization_range": int(s.secagg_quantization_range) or "auto",
            },
        }


def _record_bytes(rec: ArrayRecord) -> int:
    return int(sum(len(a.data) for a in rec.values()))


def _content_bytes(content: RecordDict) -> int:
    """The bytes of a reply's arrays (what dominates its size on the wire)."""
    return sum(_record_bytes(r) for r in content.values() if isinstance(r, ArrayRecord))


def server_main(grid: Grid, context: Context) -> dict:
    """The ServerApp's body: build the run as the simulator would, drive Flower's round loop, write the result."""
    from ..federation.engine import FederatedRun

    s = Settings.from_run_config(context.run_config)
    try:
        data = load_data(s.data, s.max_users)
        bb = build_backbone(data, s)
        run = FederatedRun(data, bb, s.cfg, progress=False)
        strategy = (SecureFedVLRStrategy if s.secagg else FedVLRStrategy)(run, s)
        if s.reply_poll_interval > 0:  # Flower's own grid asks for replies every 3 s
            grid = QuickPollGrid(grid, s.reply_poll_interval, strategy.progress.arrived)
        strategy.start(
            grid=grid,
            initial_arrays=shared_to_record(run.shared),
            num_rounds=s.cfg.rounds,
            timeout=s.round_timeout,
            evaluate_fn=strategy.server_evaluate if s.evaluation == "server" else None,
        )
        result = strategy.result()
    except BaseException as exc:
        if s.result:
            write_json_atomic(Path(s.result).with_suffix(".error.json"), {"error": f"{type(exc).__name__}: {exc}"})
        raise
    if s.result:
        write_json_atomic(s.result, result)
    return result


def make_server_app() -> ServerApp:
    """The ``ServerApp`` (see :func:`server_main`)."""
    app = ServerApp()
    app.main()(server_main)
    return app
