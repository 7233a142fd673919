"""The federated training loop: rounds, model selection on validation, checkpoints, resume, several seeds.

One round (``FederatedRun.run_round``): sample clients (seeded) -> each client restores its private state, trains
locally and uploads its shared parts (the batched simulator does all clients at once) -> the strategy aggregates
-> the private states are stored back -> validation -> (if validation improved) test at this round -> checkpoint.

Model selection uses validation only: the selected round is the one with the best ``valid_metric``; training stops
after ``patience`` evaluations without improvement. The test figures reported are those computed at the selected
round (test is evaluated whenever validation improves, and nothing ever reads it to make a decision).

Checkpoints (``RUN_DIR/seed-<s>/checkpoint-<round>.{safetensors,json}``, written atomically after every round and
listed with their sha256 in ``manifest.json``, see :mod:`.run_folder`) hold the shared state, the strategy's
optimizer state, every client's private state (or, with the disk store, a committed folder), the history, the
selection state and RNG states. All randomness is keyed by (seed, round, client), so a resumed run ends with
exactly the numbers of an uninterrupted one, and a finished run resumed with more rounds continues as if it had
been asked for them from the start.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ..adapters import Backbone, make_backbone
from ..data_identity import split_digest
from ..errors import ResumeMismatch, RunFolderError
from ..evaluation.run_report import per_user_file_frame
from ..phases import phase
from .config import FedConfig
from .data_ranges import check_against_data
from .privacy.accountant import run_clip, run_noise, run_privacy
from .rounds import RoundLoop
from .runs.checkpoint_clock import CheckpointClock
from .runs.folder import SeedFolder
from .runs.kept_round import KeptRound
from .runs.round_log import copy_round_logs, open_round_log
from .runs.same_run import check_same_run
from .runs.seeds import SEED_PARTS, combine_seeds  # noqa: F401  (named here before)
from .simulation.batched import BatchedSimulator
from .simulation.rng import TAG_SAMPLE
from .simulation.round_timing import bench_round, format_bench  # noqa: F401  (named here before)
from .simulation.sequential import SequentialSimulator
from .simulation.upload_stream import StreamedUploads, can_stream, fit_streamed
from .state import streamed_safetensors
from .state.choice import choose_private_store, private_state_bytes, say_once
from .state.file_store import FileStore
from .state.initial import init_shared_state
from .state.store import CompactStore, make_store
from .state.streamed_safetensors import loaded
from .strategies.base import make_strategy

CHECKPOINT_FORMAT = 2


def _evaluator():
    try:
        from ..evaluation import evaluate
    except ImportError as exc:
        raise RuntimeError("fedvlr_plus.evaluation.evaluate is not available; the federated engine needs the "
                           "evaluation module to select rounds on validation") from exc
    return evaluate


def _plain(d):
    """Metrics dicts as plain floats (EvalResult values may be numpy scalars)."""
    if isinstance(d, dict):
        return {k: _plain(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_plain(v) for v in d]
    if isinstance(d, (np.floating, np.integer)):
        return d.item()
    return d


def dataset_identity(data) -> dict:
    """Name, sizes, the old count-and-sum check (which checkpoints written before the digest compare by) and the
    digest of the split (fedvlr_plus.data_identity)."""
    tr = data.train()
    keys = tr["user"].to_numpy().astype(np.int64) * data.n_items + tr["item"].to_numpy().astype(np.int64)
    return {"name": data.name, "users": int(data.n_users), "items": int(data.n_items), "train": int(len(tr)),
            "train_key_sum": int(np.sort(keys).astype(np.uint64).sum(dtype=np.uint64) % (1 << 62)),
            "digest": split_digest(data)}


class FederatedRun:
    """One seed of a federated run; ``run()`` trains to the end and returns the JSON-ready result.

    ``backbone``: a registered name, built with ``options`` (the backbone's own, e.g. FedRAP's penalties; None:
    its defaults), or a ready adapter (which carries its options)."""

    def __init__(self, data, backbone: str, cfg: FedConfig, run_dir: str | os.PathLike | None = None, *,
                 progress: bool = True, on_round=None, on_upload=None, options: dict | None = None,
                 test: bool = True, keep_selected: bool = False):
        data.require_split(need=("train", "valid", "test"))
        check_against_data(cfg, data)  # counts beyond the population or catalogue: one line, before any round
        self.data, self.cfg = data, cfg
        self.test = test  # False: validation only (a tuning candidate); the result has no test figures
        #: keep the selected round's model in every checkpoint, so that a later run can go on from this one and
        #: still test that round (a tuning candidate, which the run that keeps its recipe continues)
        self.keep_selected = keep_selected
        self.backbone_name = backbone
        m = data.matrix(["train"]).tocsr()
        m.sort_indices()
        self.indptr = m.indptr.astype(np.int64)
        self.indices = m.indices.astype(np.int64)
        self.n_users, self.n_items = int(data.n_users), int(data.n_items)
        if isinstance(backbone, Backbone):  # a ready adapter (e.g. wrapped by the FedVLR fusion layer)
            self.bb, self.backbone_name = backbone, backbone.name
        else:
            self.bb = make_backbone(backbone, self.n_items, cfg.dim, **(options or {}))
        self.specs = {s.name: s for s in self.bb.all_specs()}
        self._resolve_settings()
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.folder = SeedFolder(self.run_dir) if self.run_dir is not None else None
        self.round_log = open_round_log(cfg.log, self.run_dir, cfg.seed)  # does nothing unless cfg.log asks
        self._tmp = None
        self.progress = progress
        self.store = self._private_store()
        base = self._start_simulator()
        self.strategy = self.bb.wrap_strategy(self.strategy, cfg.seed)  # the FedVLR layer adds its server side
        self.shared = init_shared_state(self.bb, cfg.seed)
        if base is not None:  # shared parameters as the wrapped model initialises them under this seed
            self.shared.update({k: v for k, v in base.initial_values(cfg.seed).items() if k in self.shared})
        self.shared = self.strategy.prepare_shared(self.shared)
        self.on_round, self.on_upload = on_round, on_upload
        #: an upload observer whose ``state()`` goes into every checkpoint and ``load_state(state)`` comes back on
        #: resume (an attacker's counts), so that what it saw survives a kill; None: none
        self.checkpointed_observer = None
        self.round = self._checkpointed_round = 0
        self.checkpoint_clock = CheckpointClock()
        self.history: list[dict] = []
        self.best: dict | None = None
        #: the selected round's model while run() defers its test (None: test is evaluated at the round)
        self._kept: dict | None = None
        self.bad_evals = 0
        self.stopped_early = False
        #: the evaluated splits' target pairs and masked history, read from ``data`` once (it does not change)
        self._eval_cache: dict = {}

    def _resolve_settings(self) -> None:
        """The settings left to the backbone (None in the config) resolved, the clients per round, the upload
        noise and the aggregation strategy."""
        cfg = self.cfg
        self.lr = float(cfg.lr if cfg.lr is not None else self.bb.default_lr)
        self.local_epochs = int(cfg.local_epochs if cfg.local_epochs is not None else self.bb.default_local_epochs)
        self.item_lr_scale = float(cfg.item_lr_scale if cfg.item_lr_scale is not None
                                   else self.bb.default_item_lr_scale)
        self.strategy_name = cfg.strategy or self.bb.default_strategy
        self.eligible = np.flatnonzero(np.diff(self.indptr) > 0)
        if not len(self.eligible):
            raise ValueError(f"{self.data.name}: no user has a training interaction")
        self.per_round = self._clients_per_round()
        self.upload_noise = run_noise(cfg, len(self.eligible), self.per_round)
        self.upload_clip = run_clip(cfg, self.upload_noise)
        default_slr = self.bb.default_server_lr or self.lr * self.per_round
        self.server_lr = float(cfg.server_lr if cfg.server_lr is not None else default_slr)
        self.server_optimizer = cfg.server_optimizer or self.bb.default_server_optimizer
        self.strategy = make_strategy(self.strategy_name, server_lr=self.server_lr,
                                      server_optimizer=self.server_optimizer, trim_fraction=cfg.trim_fraction,
                                      chunk_floats=cfg.chunk_floats, item_lr_scale=self.item_lr_scale)

    def _private_store(self):
        """Where the clients' private states live between rounds: memory, files, or a folder (under the run
        folder); ``auto`` picks memory or files by the population's state size (:mod:`.store_choice`)."""
        kind, why = choose_private_store(self.cfg.private_store, private_state_bytes(self.bb, self.data.n_users))
        if why and self.progress:
            say_once(why)
        if kind == "disk":
            root = self.run_dir / "private" if self.run_dir else Path(self._tmpdir()) / "private"
            return make_store("disk", root)
        if kind == "file":   # working tables, not a record: the checkpoints hold the states
            return FileStore(Path(self._tmpdir()) / "tables", capacity=self.data.n_users)
        return CompactStore(capacity=self.data.n_users, pin_memory=self._device().type == "cuda")

    def _device(self):
        from .device import resolve_device

        return resolve_device(self.cfg.device)

    def _start_simulator(self):
        """``self.sim``: the batched or sequential simulator, or for a wrapped ``nn.Module`` (RecBole) its own
        module clients; returns that module's adapter base (None for the package's own backbones)."""
        from .simulation.modules.batched import BatchedModuleSimulator
        from .simulation.modules.client import ModuleSimulator, module_base

        cfg = self.cfg
        sim_cls = BatchedSimulator if cfg.simulator == "batched" else SequentialSimulator
        base = module_base(self.bb)
        if base is not None:  # a wrapped nn.Module (RecBole): its own clients, vmapped or one at a time
            sim_cls = BatchedModuleSimulator if cfg.simulator == "batched" else ModuleSimulator
        self.sim = sim_cls(self.bb, self.indptr, self.indices, self.store, seed=cfg.seed,
                           chunk_floats=cfg.chunk_floats, device=self._device())
        return base

    def _tmpdir(self) -> str:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="fedvlr-private-")
        return self._tmp.name

    # ------------------------------------------------------------------ clients and configs
    def _clients_per_round(self) -> int:
        n, c = len(self.eligible), self.cfg.clients_per_round
        if c is None:
            return n
        if isinstance(c, float) and c <= 1.0:  # a fraction (1.0 = everyone); an int is a count
            return max(1, min(n, int(round(c * n))))
        return max(1, min(n, int(c)))

    def sample_clients(self, round_index: int) -> np.ndarray:
        if self.per_round >= len(self.eligible):
            return self.eligible.copy()
        g = np.random.default_rng([int(self.cfg.seed), int(round_index), TAG_SAMPLE])
        return np.sort(g.choice(self.eligible, size=self.per_round, replace=False))

    def round_config(self, round_index: int) -> dict:
        cfg = self.cfg
        return {
            "seed": int(cfg.seed), "round": int(round_index), "epochs": self.local_epochs,
            "negatives": int(cfg.negatives), "batch_size": int(cfg.batch_size),
            "lr": self.lr * cfg.lr_decay ** (round_index - 1), "item_lr_scale": self.item_lr_scale,
            "weight_decay": float(cfg.weight_decay), "upload": self.strategy.upload,
            "local_shared": bool(cfg.local_shared),
            "upload_noise": self.upload_noise, "upload_clip": self.upload_clip,
            "pad_uploads": int(cfg.pad_uploads),
        }

    # ------------------------------------------------------------------ evaluation
    def scorer(self):
        """The run's :data:`~fedvlr_plus.evaluation.Scorer` of the current model; where the simulator scores
        chosen items faster than every item (``prefers_candidates``), the sampled protocol asks for its candidates
        only."""
        def score(users):
            return self.sim.scores(np.asarray(users, dtype=np.int64), self.shared)
        if getattr(self.sim, "prefers_candidates", False):
            score.score_items = lambda users, items: self.sim.score_items(users, items, self.shared)
        return score

    def evaluate(self, split: str, protocol: str = "full"):
        """An :class:`~fedvlr_plus.evaluation.EvalResult` of the current model on ``split``."""
        evaluate = _evaluator()
        with phase("evaluation"):
            return evaluate(self.data, self.scorer(), split=split, protocol=protocol, ks=tuple(self.cfg.ks),
                            metrics=tuple(self.cfg.metrics), mask_history=self.cfg.mask_history,
                            seed=int(self.cfg.seed), cache=self._eval_cache)

    def _test_now(self) -> dict:
        """Test of the current model: full-sort, and sampled where validation is sampled or both are asked for."""
        cfg = self.cfg
        both = cfg.valid_protocol == "sampled" or cfg.test_both_protocols
        return {"test_full": self.evaluate("test", "full"), "test_sampled": self._test_sampled() if both else None}

    def _test_selected(self, end_at_selected: bool, at_selected=None) -> None:
        """The selected round's test from its kept model; the model the run ended with is put back after, unless
        the caller wants the selected one (``end_at_selected``)."""
        selected = self._kept.pop("selected", None) if self._kept is not None else None
        if selected is None or not self.test:   # a candidate kept its selected model for its checkpoints only
            if selected is not None:
                selected.discard()
            return
        last = None if end_at_selected else KeptRound(self, Path(self._tmpdir()))
        selected.put_back(self)
        self.best.update(self._test_now())
        if at_selected is not None:
            at_selected(self)
        if last is not None:
            last.put_back(self)
            last.discard()
        selected.discard()

    def _test_sampled(self):
        """The sampled-protocol test beside the full one, or None where the catalogue is too small for it."""
        from ..evaluation import sampled_unavailable

        if sampled_unavailable(self.data) is not None:
            return None
        return self.evaluate("test", "sampled")

    # ------------------------------------------------------------------ one round
    def run_round(self) -> dict:
        """Round ``self.round + 1`` through the package's round loop (:mod:`.rounds`) with this run's hooks."""
        loop = RoundLoop(self.eligible, self._aggregate, fit=self._fit, sample=self._sample,
                         configure=lambda r, shared: (shared, self.round_config(r)), evaluate=self._evaluate_round,
                         eval_every=self.cfg.eval_every, last_round=self.cfg.rounds, store=self.store,
                         checkpoint=self._end_round,
                         on_round=None if self.on_round is None else lambda r, shared, rec: self.on_round(self, rec))
        self.shared, record = loop.step(self.round + 1, self.shared)
        return record

    def _sample(self, r: int) -> np.ndarray:
        self._round_started = time.perf_counter()
        return self.sample_clients(r)

    def _fit(self, cids, shared, config):
        with phase("training"):
            return self._fit_clients(cids, shared, config)

    def _fit_clients(self, cids, shared, config):
        if can_stream(self.sim, self.strategy):   # each chunk's uploads added to the sums, then dropped
            examples = np.diff(self.indptr)[np.asarray(cids, dtype=np.int64)]
            return fit_streamed(self.sim, self.strategy, cids, shared, self.specs, config, examples,
                                on_upload=self.on_upload)
        updates = self.sim.fit(cids, shared, config)
        if self.on_upload is not None:
            for u in updates:
                self.on_upload(config["round"], u)
        return updates

    def _aggregate(self, r: int, shared, updates, config) -> tuple[dict, dict]:
        if isinstance(updates, StreamedUploads):
            self.shared = self.strategy.from_sums(shared, updates.sums, self.specs)
            n, losses = updates.num_examples, updates.losses
        else:
            self.shared = self.strategy.aggregate(shared, updates, self.specs)   # evaluation scores with it
            n = np.array([u.num_examples for u in updates], dtype=np.float64)
            losses = [u.metrics.get("loss", 0.0) for u in updates]
        loss = float(np.dot(n, losses) / n.sum())
        if not np.isfinite(loss) or not all(bool(torch.isfinite(v).all()) for v in self.shared.values()):
            raise FloatingPointError(f"training diverged in round {r} (loss {loss}); lower the learning rates "
                                     f"(lr {self.lr}, item_lr_scale {self.item_lr_scale}"
                                     + (f", server_lr {self.server_lr}" if self.strategy.upload == "grads" else "")
                                     + ")")
        return self.shared, {"round": r, "clients": int(len(updates)), "loss": loss,
                             "train_seconds": time.perf_counter() - self._round_started}

    def _evaluate_round(self, r: int, shared) -> dict:
        """Validation; test only where validation improved (never read by a decision); early stopping."""
        cfg = self.cfg
        t1 = time.perf_counter()
        valid = _plain(self.evaluate("valid", cfg.valid_protocol).summary())
        metric = float(valid[cfg.valid_metric])
        if self.best is None or metric > self.best["metric"]:
            # test is never read by any decision; only the selected round's is reported: evaluated now, or once
            # at the end of run() from the round's model kept aside (the same figures, one test pass in all)
            self.best = {"round": r, "metric": metric, "valid": valid}
            if self._kept is not None:
                if "selected" in self._kept:
                    self._kept["selected"].discard()
                self._kept["selected"] = KeptRound(self, Path(self._tmpdir()))
                self.best.update(test_full=None, test_sampled=None)
            elif self.test:
                self.best.update(self._test_now())
            self.bad_evals = 0
        else:
            self.bad_evals += 1
        self.stopped_early = self.bad_evals >= cfg.patience
        return {"valid": valid, "eval_seconds": time.perf_counter() - t1}

    def _end_round(self, r: int, shared, record: dict) -> None:
        """The round is done: it joins the history and, when due, the checkpoint (before the store commits)."""
        self.round = r
        self.history.append(record)
        if self.run_dir is not None and self._checkpoint_due(record):
            self.save_checkpoint()
        self.round_log.write(self, record)

    def _checkpoint_due(self, record: dict) -> bool:
        """Every ``checkpoint_every`` rounds (None: as :mod:`.runs.checkpoint_clock` says) and at the end; every
        round with a disk store (it commits each round's private states, which only the latest checkpoint can
        recover). A resume repeats the rounds after the last checkpoint with the same numbers, evaluations included,
        so evaluated rounds need no checkpoint of their own."""
        r, every = record["round"], self.cfg.checkpoint_every
        if self.store.kind == "disk" or r >= self.cfg.rounds or self.stopped_early:
            return True
        return self.checkpoint_clock.due() if every is None else r % every == 0

    def done(self) -> bool:
        return self.round >= self.cfg.rounds or self.stopped_early

    def run(self, end_at_selected: bool = False, at_selected=None) -> dict:
        """Train to the end or early stop and return the result. ``end_at_selected``: leave the run in the model
        of its selected round (shared, server and private state), for studies that go on from it; it needs a run
        without a folder or one that keeps its selected round (``keep_selected``), and a store whose states can be
        kept aside. ``at_selected(run)``: called with that model
        in place, where this call selected a new round, before the last round's model is put back (a tuner that
        scores a candidate at its selected round and trains it on later). A run may be run again with more
        rounds (``cfg.rounds``) and goes on as if asked for them from the start."""
        from tqdm.auto import tqdm

        bar = tqdm(total=self.cfg.rounds, initial=self.round, unit="round", disable=not self.progress,
                   desc=f"{self.backbone_name} seed {self.cfg.seed}", leave=True, dynamic_ncols=True)
        # a run without a folder keeps its best round's model aside and evaluates test once, at the end; with a
        # folder every round's checkpoint must hold the test figures of its selected round, so test is evaluated
        # as the round happens
        keeping = (self.test and self.folder is None or self.keep_selected) and KeptRound.can_keep(self)
        self._kept = (self._kept or {}) if keeping else None   # a model kept by the checkpoint it went on from stays
        if end_at_selected and self._kept is None:
            raise ValueError("end_at_selected needs a run without a folder or with keep_selected, and a private store "
                             "other than disk")
        try:
            while not self.done():
                started = time.perf_counter()
                rec = self.run_round()
                post = {"loss": f"{rec['loss']:.4f}", "s/round": f"{time.perf_counter() - started:.2f}"}
                if "valid" in rec:
                    post[self.cfg.valid_metric] = f"{rec['valid'][self.cfg.valid_metric]:.4f}"
                if self.best is not None:
                    post["best"] = self.best["round"]
                bar.set_postfix(post, refresh=False)
                bar.update(1)
        except KeyboardInterrupt:
            bar.close()
            if self.folder is not None and self.folder.has_checkpoint():
                saved = self._checkpointed_round
                print(f"\ninterrupted after round {self.round}; round {saved} is checkpointed in {self.run_dir}; "
                      f"continue with --resume", file=sys.stderr)
            raise
        finally:
            self.round_log.close()
        bar.close()
        self._test_selected(end_at_selected, at_selected)
        self._kept = None
        result = self.result()
        if self.folder is not None:
            if self.test:  # per user, so that two run folders can be compared with a paired test over the same users
                per_user = per_user_file_frame(self.best["test_full"].per_user, self.data)
                self.folder.write_file("per_user_test.csv", per_user.to_csv(index=False).encode())
            self.folder.write_json("result.json", result)
        return result

    def result(self) -> dict:
        """The JSON-ready result at the selected round; ``notes`` says which parts had no users (their
        ``*_n_users`` are 0 and their figures null) and whether the sampled protocol was skipped."""
        from ..evaluation import sampled_unavailable

        if self.best is None:
            raise RuntimeError("no validation evaluation was run")
        out = {
            "backbone": self.backbone_name, "dataset": self.data.name, "data_digest": self.identity()["digest"],
            "seed": int(self.cfg.seed),
            "selected_round": int(self.best["round"]), "rounds_run": int(self.round),
            "stopped_early": bool(self.stopped_early), "strategy": self.strategy_name,
            "simulator": getattr(self.sim, "name", self.cfg.simulator), "valid": self.best["valid"],
        }
        if not self.test:
            return {**out, "notes": ["test: not evaluated (validation only, as a tuning candidate)"],
                    "history": self.history, "config": self.recorded_config()}
        out.update(_plain(self.best["test_full"].to_json(prefix="test")))
        notes = list(out.get("notes", []))
        if self.best.get("test_sampled") is not None:
            sampled = _plain(self.best["test_sampled"].to_json(prefix="test_sampled"))
            out.update({k: v for k, v in sampled.items() if k.startswith("test_sampled")})
            notes += sampled.get("notes", [])
        elif self.cfg.valid_protocol == "sampled" or self.cfg.test_both_protocols:   # asked for, and not possible
            notes.append(f"test sampled: not evaluated, {sampled_unavailable(self.data) or 'not computed'}")
        out["notes"] = notes
        out["history"] = self.history
        out["config"] = self.recorded_config()
        out["resolved"] = self._resolved()
        out["model"] = self.bb.describe()
        privacy = run_privacy(self.cfg, self.upload_noise, self.upload_clip, len(self.eligible), self.per_round,
                              self.round)
        if privacy is not None:
            out["privacy"] = privacy
        return out

    def _resolved(self) -> dict:
        """The values this run uses for the settings that default to the backbone's (None in the config)."""
        grads = self.strategy.upload == "grads"
        return {"lr": self.lr, "item_lr_scale": self.item_lr_scale, "strategy": self.strategy_name,
                "local_epochs": self.local_epochs, "server_lr": self.server_lr if grads else None,
                "server_optimizer": self.server_optimizer if grads else None,
                "clients_per_round": int(self.per_round), "private_store": self.store.kind}

    def identity(self) -> dict:
        """The data's identity (dataset_identity), computed once: every checkpoint and the result record it."""
        if getattr(self, "_identity", None) is None:
            self._identity = dataset_identity(self.data)
        return self._identity

    def recorded_config(self) -> dict:
        """The run's settings as results and checkpoints record them: the config's fields, then the backbone's
        own options (FedRAP's ``fedrap_lambda`` / ``fedrap_mu``), so a resume checks both."""
        return {**self.cfg.to_dict(), **self.bb.option_values()}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        state = {
            "format": CHECKPOINT_FORMAT, "backbone": self.backbone_name, "config": self.recorded_config(),
            "dataset": self.identity(), "round": self.round, "shared": self.shared,
            "strategy": self.strategy.state_dict(), "private_store": self.store.kind,
            "private": self._private_snapshot(), "history": self.history, "best": self.best,
            "bad_evals": self.bad_evals, "stopped_early": self.stopped_early, "resolved": self._resolved(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()},
        }
        if self.checkpointed_observer is not None:
            state["observer"] = self.checkpointed_observer.state()
        if self.keep_selected and self._kept and "selected" in self._kept:
            # the selected round is this one: the checkpoint's own model, not written twice
            current = self.best["round"] == self.round
            state["selected_model"] = "current" if current else self._kept["selected"].to_state()
        self.checkpoint_clock.timed(
            lambda: self.folder.write_state(f"checkpoint-{self.round:06d}", state, checkpoint=True)
        )
        self._checkpointed_round = self.round

    def _private_snapshot(self):
        """The store's snapshot for a checkpoint written at once (a compact store need not copy its tensors)."""
        if isinstance(self.store, CompactStore):
            return self.store.snapshot(copy=False)
        return self.store.snapshot()

    def resume_saved(self) -> bool:
        """Continue from the latest checkpoint of the run's folder where it has one that holds a checkpoint;
        whether it did."""
        if self.folder is None or not self.folder.has_checkpoint():
            return False
        self.load_checkpoint()
        return True

    def load_checkpoint(self, source: SeedFolder | None = None) -> None:
        """Continue from the latest checkpoint of the run's folder, or of ``source`` (another run's seed folder,
        which is only read); checksums checked, a changed setting refused."""
        source = source or self.folder
        # the clients' state tables (a block or more) stay in the checkpoint's file and are restored a block at a time
        ck = source.read_checkpoint(on_disk_from=streamed_safetensors.ROW_BLOCK_BYTES)
        where = str(source.path)
        if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT_FORMAT:
            raise RunFolderError(where, f"no checkpoint of format {CHECKPOINT_FORMAT} to resume",
                                 "start a new run in another folder")
        private = ck.pop("private", None)
        ck = loaded(ck)
        check_same_run(self, ck, where)
        if self.checkpointed_observer is not None and "observer" not in ck:   # (refused before anything is loaded)
            raise ResumeMismatch(where, "the checkpoint keeps no observer's state (the run had none)",
                                 "start a new run in another folder")
        self.round = self._checkpointed_round = int(ck["round"])
        self.shared = ck["shared"]
        self.strategy.load_state_dict(ck["strategy"])
        if isinstance(self.store, CompactStore):   # memory or file tables: the checkpoint holds the states
            self.store.restore(private)
        else:
            self.store.recover(self.round)
        self.history = ck["history"]
        self.best = ck["best"]
        self.bad_evals = int(ck["bad_evals"])
        self.stopped_early = bool(ck["stopped_early"]) and self.bad_evals >= self.cfg.patience
        torch.set_rng_state(ck["rng"]["torch"])
        np.random.set_state(ck["rng"]["numpy"])
        if self.checkpointed_observer is not None:
            self.checkpointed_observer.load_state(ck["observer"])
        kept = ck.get("selected_model")
        if kept == "current":
            kept = KeptRound(self, Path(self._tmpdir()))
        self._kept = {"selected": KeptRound.from_state(kept) if isinstance(kept, dict) else kept} if kept else None

    def continue_from(self, folder) -> bool:
        """Go on from another run's latest checkpoint (the tuning candidate of the recipe a run kept), as a resume
        would; the other folder is only read. False, with nothing loaded, where this run cannot go on from it and
        test that run's selected round: its checkpoint kept no selected model, this run's store lives in a folder,
        or its own folder holds a checkpoint already. ``on_round`` hears the selected round so far (at or before
        the checkpoint), with its model in place, and no other earlier round. A run with a folder tests that round
        now, as it would have when the round happened, checkpoints at once and copies the other run's round logs."""
        source = SeedFolder(folder)
        if not isinstance(self.store, CompactStore) or not source.has_checkpoint():
            return False
        if self.folder is not None and self.folder.has_checkpoint():
            return False
        if source.read_json(source.manifest()["checkpoint"] + ".json")["state"].get("selected_model") is None:
            return False
        self.load_checkpoint(source)
        self._at_kept_selected()
        if self.folder is not None:  # its rounds so far are the other run's: so are its logs
            copy_round_logs(source.path, self.folder.path)
        return True

    def _at_kept_selected(self) -> None:
        """With the kept selected round's model in place: its test where this run has a folder (every checkpoint
        there holds its selected round's figures), and ``on_round``; the last round's model is put back after. A
        run with a folder keeps no model aside from then on."""
        if self.folder is None and self.on_round is None:
            return
        selected = self._kept["selected"]
        last = KeptRound(self, Path(self._tmpdir()))
        selected.put_back(self)
        if self.folder is not None and self.test:
            self.best.update(self._test_now())
        if self.on_round is not None:  # the selected round came before, or at, the round it goes on from
            self.on_round(self, next(r for r in self.history if r["round"] == self.best["round"]))
        last.put_back(self)
        last.discard()
        if self.folder is not None:
            selected.discard()
            self._kept = None
            self.save_checkpoint()
