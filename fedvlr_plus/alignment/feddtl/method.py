"""FedDTL: decoupled training with local reinforcement fine-tuning, mapped onto next-item recommendation.

Ma, Cheng, Xu, "Decoupled Training with Local Reinforcement Fine-Tuning in Federated Learning", ICML 2026,
arXiv 2605.27900 (see docs/alignment.md, "FedDTL"). In the paper a CLIP text encoder (server) is the
semantic anchor and the image encoder (clients) is LoRA-tuned; classes split into base and novel. Here:

- **item tower (server, the anchor)**: ``v_i = normalise(e_i + B_s A_s e_i)``, ``e_i`` the frozen offline text
  embedding of item i's content (MiniLM over "title. genres. year"), ``A_s, B_s`` a low-rank adapter;
- **user tower (clients)**: ``u = normalise(h + B_c A_c h)``, ``h`` the mean content embedding of the user's
  private history (other than the target), ``A_c, B_c`` a low-rank adapter;
- policy ``pi(i | u) = softmax_i(cos(u, v_i) / tau)`` over the warm items; base / novel classes = warm / cold items
  (cold items have content but no training interactions);
- **SFT stage**: cross-entropy of the held-out-of-history target, on the user adapter only;
- **GRPO stage**: G candidates per example from Gaussian noise in the user embedding (``argmax_i cos(normalise(u +
  sigma eps_j), v_i)``), reward ``1[candidate = target]``, group-normalised advantages, clipped ratio and a k3 KL to
  a hybrid reference ``0.5 pi_SFT + 0.5 pi_global`` (the mixture of the client's final SFT model and the latest
  global model), all through :func:`fedvlr_plus.alignment.grpo.grpo_loss`;
- **uplink**: the user adapter and, per item the client trained on, the normalised mean of its users' context
  embeddings for that item (a class prototype: no user id, no history, no rating); **server**: FedAvg of the user
  adapters (:func:`~fedvlr_plus.federation.strategies.base.make_strategy`), then cross-entropy training of its item
  adapter so the uploaded prototypes pick their item (modality alignment);
- **baseline "FedAvg of both towers"**: clients train both adapters with the SFT loss and FedAvg averages both.

Prototypes travel with their example counts and the server draws them in that proportion;
``DTLConfig.prototypes="example"`` uploads every example's user embedding instead (the paper's per-sample
uploads). Evaluation follows the base-to-novel protocol (warm targets among warm items, cold among cold) and is
reported twice: with the global model and with each client's own tower(s) after its last local training; the
headline is the client towers for the decoupled methods and the global model for FedAvg of both.

Clients are groups of users: a Dirichlet(alpha) split over each user's dominant genre (label skew), the genre
with the largest share of the history (``dominant="count"``) or the one most over-represented against the global
genre shares (``"lift"``). Where the catalogue's genres give no class skew (ml-100k), ``run_feddtl(classes=K,
novel=N)`` makes the classes a k-means of the item vectors (:mod:`.dtl_classes`) and N of them novel (every item
cold); the report carries each client's class-mix TV distance and the paired tests of :mod:`.dtl_table`.
``split="examples"`` deals each class's examples to clients instead of whole users (the paper's protocol,
:mod:`.dtl_examples`); every method is then judged by its global model.
``DTLConfig.user_tower="private"`` keeps each client's user adapter in its store and
restores it every round (the paper's scheme, the default, starts every round from the FedAvg of the adapters).

Where the parts live: :mod:`.dtl_task` (items, histories, label-skewed split of users), :mod:`.dtl_examples`
(the split of examples), :mod:`.dtl_towers` (the towers, and scores against the item tower that stay cheap on
sparse content), :mod:`.dtl_model` (settings, noisy candidates, warm / cold evaluation),
:mod:`.dtl_client` (SFT and GRPO on a client); this module holds the server alignment, the training loop and the
runner and re-exports every public name.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import ConfigError
from ...federation.messages import ClientUpdate
from ...federation.rounds import RoundLoop
from ...federation.strategies.base import make_strategy
from ..pairs import content_flag_hint, shipped_features
from .client import DTLClient
from .model import (
    ITEM_PARAMS,
    METHODS,
    USER_PARAMS,
    DTLConfig,
    evaluate_users,
    init_params,
    item_vectors,
    lora,
    noisy_candidates,
    param_specs,
    user_vectors,
)
from .task import (
    RecTask,
    build_task,
    dirichlet_split,
    dominant_labels,
    few_shot_targets,
    item_label_weights,
    item_texts,
    label_skew,
    minilm_content,
)
from .towers import ItemContent

__all__ = ["DTLClient", "DTLConfig", "DTLResult", "ITEM_PARAMS", "METHODS", "RecTask", "SPLITS", "USER_PARAMS",
           "anchor_penalty", "build_task", "dirichlet_split", "dominant_labels", "evaluate_users", "few_shot_targets",
           "init_params", "item_label_weights", "item_texts", "item_vectors", "label_skew", "lora", "make_clients",
           "minilm_content", "noisy_candidates", "param_specs", "run_feddtl", "server_align", "train", "user_vectors"]


def server_align(p: dict, protos: list[tuple], task: RecTask, cfg: DTLConfig, seed: int = 0,
                 warm_content: ItemContent | None = None) -> tuple[dict, list[float]]:
    """Train the item adapter so each uploaded prototype classifies to its item (CE over warm items).

    ``protos``: ``(embeddings [n, d], item ids [n])`` or ``(embeddings, item ids, example counts [n])`` per client.
    With counts and ``cfg.proto_weighting == "count"`` a batch draws prototypes in proportion to their counts
    (the sample-weighted CE of the paper's per-sample uploads); otherwise uniformly. ``warm_content``: the task's
    warm items' content when the caller holds it already (built here when None).
    """
    col = torch.full((task.n_items,), -1, dtype=torch.long)
    col[torch.from_numpy(task.warm_items)] = torch.arange(len(task.warm_items))
    x = torch.cat([t[0] for t in protos])
    y = col[torch.cat([t[1] for t in protos]).long()]
    counted = cfg.proto_weighting == "count" and all(len(t) > 2 for t in protos)
    n = torch.cat([t[2].float() for t in protos]) if counted else torch.ones(len(y))
    keep = y >= 0
    x, y, n = x[keep], y[keep], n[keep]
    q = {k: v.clone().requires_grad_(k in ITEM_PARAMS) for k, v in p.items()}
    opt = torch.optim.Adam([q[k] for k in ITEM_PARAMS], lr=cfg.server_lr)
    if warm_content is None:
        warm_content = _warm_content(task)
    all_content = torch.from_numpy(task.content)
    losses = []
    gen = torch.Generator().manual_seed(int(seed))
    for _ in range(cfg.server_steps):
        b = torch.multinomial(n, cfg.server_batch, replacement=True, generator=gen) if counted \
            else torch.randperm(len(y), generator=gen)[:cfg.server_batch]
        loss = F.cross_entropy(warm_content.tower(q).scores(x[b]) / cfg.tau, y[b])
        if cfg.anchor_weight:
            loss = loss + cfg.anchor_weight * anchor_penalty(q, all_content)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return {k: v.detach() for k, v in q.items()}, losses


def anchor_penalty(p: dict, content: torch.Tensor) -> torch.Tensor:
    """mean_i (1 - cos(v_i, e_i)): how far the item adapter moved the items from their frozen (unit) content."""
    return (1.0 - (item_vectors(p, content) * F.normalize(content, dim=-1)).sum(-1)).mean()


@dataclass
class DTLResult:
    method: str
    test: dict                   #: headline figures, plus "global_model" and "client_models" evaluations
    history: list[dict] = field(default_factory=list)
    params: dict = field(default_factory=dict)               #: the final global model
    client_params: list[dict] = field(default_factory=list)  #: each client's own tower(s) after its last round
    client_examples: list[int] = field(default_factory=list)
    assign: np.ndarray | None = None                         #: client id per user


SPLITS = ("users", "examples")


def _warm_content(task: RecTask) -> ItemContent:
    """The task's warm items' frozen content, to score against (one copy, shared by the clients and the server)."""
    return ItemContent(torch.from_numpy(task.content[task.warm_items]))


def make_clients(task: RecTask, cfg: DTLConfig, *, split: str, n_clients: int, alpha: float, seed: int,
                 warm_content: ItemContent | None = None) -> tuple[list[DTLClient], np.ndarray]:
    """The clients of a ``split`` and each user's client for the "own tower" evaluation: ``"users"`` deals whole
    users by a Dirichlet over their dominant class; ``"examples"`` deals each class's examples by a Dirichlet over
    the clients (:mod:`.dtl_examples`), and a user's client is the one holding most of its examples.
    ``warm_content``: the warm items' content all the clients share (built here when None)."""
    warm = warm_content if warm_content is not None else _warm_content(task)
    if split == "users":
        assign = dirichlet_split(task.user_genre, n_clients, alpha, seed)
        return [DTLClient(c, task, np.flatnonzero(assign == c), cfg, seed=seed, warm_content=warm)
                for c in range(n_clients)], assign
    if split != "examples":
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    from .examples import deal_examples, home_clients

    if task.item_class is None:
        raise ValueError("the split over examples needs the task's item classes (RecTask.item_class)")
    held = deal_examples(task, task.item_class, n_clients, alpha, seed)
    order = [sorted(users) for users in held]
    clients = [DTLClient(c, task, order[c], cfg, seed=seed, targets=[users[u] for u in order[c]], warm_content=warm)
               for c, users in enumerate(held)]
    return clients, home_clients(held, len(task.histories))


def train(task: RecTask, method: str, cfg: DTLConfig, *, n_clients: int = 5, alpha: float = 0.1, rounds: int = 20,
          sft_rounds: int = 10, seed: int = 0, split: str = "users", log=None) -> DTLResult:
    """One method end to end on the clients of ``split`` (:func:`make_clients`); returns the global model's and
    each client's towers' warm / cold figures over all users."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    torch.manual_seed(seed)
    warm = _warm_content(task)   # built once: the clients share it, and the server's alignment reads it every round
    clients, assign = make_clients(task, cfg, split=split, n_clients=n_clients, alpha=alpha, seed=seed,
                                   warm_content=warm)
    shared = init_params(task.dim, cfg.rank, seed)
    specs = param_specs(task.dim, cfg.rank)
    strategy = make_strategy("fedavg")
    both = method == "fedavg_both"
    agg_names = list(USER_PARAMS) + (list(ITEM_PARAMS) if both else [])
    last_uploads: list[ClientUpdate] = []   # the final round's: each client's own tower(s)

    def configure(r, shared):
        stage = "rl" if method == "feddtl" and r >= sft_rounds else "sft"
        return shared, {"round": r, "stage": stage, "train_item_tower": both}

    def aggregate(r, shared, ups, config):
        plain = [ClientUpdate(u.cid, "params", {k: u.arrays[k] for k in agg_names}, num_examples=u.num_examples)
                 for u in ups]
        new = strategy.aggregate({k: shared[k] for k in agg_names}, plain, {k: specs[k] for k in agg_names})
        shared = {**shared, **{k: v.float() for k, v in new.items()}}
        row = {"round": r, "stage": config["stage"], "loss": _round_mean(ups, "loss")}
        if not both:
            shared, sl = server_align(shared, [(u.arrays["proto"], u.rows["proto"], u.arrays["proto_n"])
                                               for u in ups if "proto" in u.arrays],
                                      task, cfg, seed, warm_content=warm)
            if sl:       # --server-steps 0 leaves the item tower as it started
                row["server_loss_first"], row["server_loss_last"] = sl[0], sl[-1]
        if config["stage"] == "rl":
            row["reward"] = _round_mean(ups, "reward")
            row["groups_with_signal"] = _round_mean(ups, "groups_with_signal")
        last_uploads[:] = ups
        return shared, row

    def report(r, shared, row):
        if log:
            log(f"[{method}] round {r + 1}/{rounds} {row['stage']} loss {row['loss']:.4f}")

    shared, history = RoundLoop(clients, aggregate, configure=configure, on_round=report).run(shared, range(rounds))
    ups = last_uploads
    glob = evaluate_users(shared, task, np.arange(len(task.histories)), cfg)   # every user, by the global model
    # each client's own tower(s) as left by its last local training (the user adapter, plus the item adapter for
    # FedAvg of both towers), with the server's latest global parts for the rest
    own = [USER_PARAMS + (ITEM_PARAMS if both else ()) for _ in clients]
    personal = _pooled([evaluate_users({**shared, **{k: u.arrays[k] for k in names}}, task,
                                       np.flatnonzero(assign == c.cid), cfg)
                        for c, u, names in zip(clients, ups, own)])
    # headline: FedAvg of both towers is one global model (both towers averaged); the decoupled methods keep the
    # client-side tower local, so each client's users are ranked with that client's own adapted user tower. Split
    # over examples, no client owns a user: every method serves its users with the global model
    test = glob if both or split == "examples" else personal
    return DTLResult(method, {**test, "global_model": glob, "client_models": personal}, history,
                     params={k: v.detach().clone() for k, v in shared.items()},
                     client_params=[{k: u.arrays[k] for k in names} for u, names in zip(ups, own)],
                     client_examples=[u.num_examples for u in ups], assign=assign)


def _round_mean(ups: list[ClientUpdate], key: str) -> float:
    """A round's mean of a client metric over the clients that took a step: a client whose users have no
    example (every history shorter than two items, as a tiny client of a many-client split can have) trains
    nothing and reports neither a loss nor a reward. 0.0 when no client stepped."""
    values = [u.metrics[key] for u in ups if u.metrics.get("steps", 0) and key in u.metrics]
    return float(np.mean(values)) if values else 0.0


def _pooled(parts: list[dict]) -> dict:
    """Per-kind figures of several disjoint user groups pooled into one (weighted by each group's ``n``)."""
    out = {}
    for kind in ("warm", "cold"):
        n = np.array([p[kind]["n"] for p in parts], dtype=np.float64)
        out[kind] = {"n": int(n.sum())}
        for k in parts[0][kind]:
            if k != "n":
                out[kind][k] = float((n * [p[kind][k] for p in parts]).sum() / max(n.sum(), 1.0))
    return out


def _content(data, content: str, device: str, cache_dir, log=print) -> np.ndarray:
    """The frozen item vectors: MiniLM of the item texts (``"text"``) or one of the dataset's own features.

    A data set without item texts that ships a feature array named ``text`` (KU: CLIP text features) gets that
    array for ``"text"``: it is the text content the user asked for, and the encoder would have nothing to read."""
    if content == "text":
        if len(set(item_texts(data))) >= 2:
            return minilm_content(data, device, cache_dir or None)
        arrays = sorted(getattr(data, "features", None) or {})
        if "text" in arrays:
            log(f"{data.name}: no item texts to encode; --content text uses the data set's own 'text' feature array")
            return np.asarray(shipped_features(data, "text"), np.float32)
        raise ConfigError("--content text", f"the items of {data.name} have no text (no title, category or "
                          "year), so every item would get the same content vector", content_flag_hint(data))
    return np.asarray(shipped_features(data, content, other="; 'text' encodes the item texts"), np.float32)


#: the number of k-means classes ``classes="auto"`` makes where the catalogue's categories cannot serve
AUTO_CLASSES = 10


def _resolve_classes(data, classes, novel: int, log=print) -> int:
    """``classes="auto"``: the catalogue's categories (0) where it has two or more and no class is to be novel;
    otherwise a k-means into :data:`AUTO_CLASSES` (novel classes need classes every item belongs to, and a
    catalogue without categories, such as KU's or an Amazon file's, has none). An integer is kept as given."""
    if classes != "auto":
        return int(classes)
    if not novel and (item_label_weights(data).sum(0) > 0).sum() >= 2:
        return 0
    why = "--novel-classes needs them" if novel else f"the items of {data.name} have fewer than two categories"
    log(f"--classes auto: item classes are a k-means ({AUTO_CLASSES}) of the item vectors ({why})")
    return AUTO_CLASSES


def _classes(data, vectors: np.ndarray, classes: int, content: str, seed: int):
    """(item class per item or None, label weights [n_items, n_labels], description of the classes)."""
    from .classes import class_weights, kmeans_classes

    if not classes:
        weights = item_label_weights(data)
        if (weights.sum(0) > 0).sum() < 2:
            raise ConfigError("--classes 0", f"the catalogue's categories are the classes, and the items of "
                              f"{data.name} have fewer than two", "pass --classes K: a k-means of the content vectors")
        return None, weights, "the catalogue's categories"
    item_class = kmeans_classes(vectors, classes, seed)
    return item_class, class_weights(item_class), f"k-means ({classes}) of the '{content}' vectors"


def run_feddtl(source: str, cfg: DTLConfig, *, seeds, clients: int, alpha: float, rounds: int, sft_rounds: int,
               cold_share: float, dominant: str, device: str = "cpu", cache_dir: str | None = None,
               content: str = "text", classes: int | str = "auto", novel: int = 0, valid: bool = False, shots: int = 0,
               split: str = "users", log=print) -> dict:
    """``align feddtl``: every method for every seed on ``source``; mean and per-seed figures, paired tests.

    ``classes`` > 0: item classes are a k-means of the content vectors (seeded per seed) instead of the
    catalogue's categories; ``"auto"``: as :func:`_resolve_classes` decides from the data. ``novel`` > 0: that
    many classes are novel (all their items cold) instead of a random ``cold_share`` of the items. ``valid``:
    held-out targets one step earlier, the test targets unused. ``shots`` > 0: the few-shot regime, at most that
    many training examples per item (:func:`few_shot_targets`). ``split``: what the Dirichlet deals to clients,
    whole users or each class's examples (:func:`make_clients`)."""
    import time

    from ... import datasets
    from .table import paired_tests, tv_summary

    if novel and not classes:
        raise ConfigError("--novel-classes: needs k-means item classes (--classes K, or auto); with the "
                          "catalogue's categories (--classes 0) the cold items are a random --cold-share of the items")
    t0, c0 = time.time(), time.process_time()
    data = datasets.load(source)
    vectors = _content(data, content, device, cache_dir, log)
    classes = _resolve_classes(data, classes, novel, log)
    per_seed = []
    for seed in seeds:
        task, weights, described, novel_ids = _seed_task(data, vectors, seed, classes=classes, content=content,
                                                         novel=novel, cold_share=cold_share, dominant=dominant,
                                                         valid=valid, shots=shots)
        row = _split_row(task, weights, novel_ids, split=split, clients=clients, alpha=alpha, seed=seed)
        log(f"seed {seed}: users per client {row['client_users']}, class-mix TV to the global mix "
            f"{row['client_genre_tv']}")
        for m in METHODS:
            row[m] = _one_method(task, m, cfg, clients, alpha, rounds, sft_rounds, seed, log, split)
        per_seed.append(row)
    report = {"source": source, "seeds": list(seeds), "clients": clients, "alpha": alpha, "split": split,
              "dominant": dominant, "user_tower": cfg.user_tower, "prototypes": cfg.prototypes,
              "rounds": rounds, "sft_rounds": sft_rounds, "cold_share": cold_share,
              "rank_among": cfg.rank_among, "epochs": cfg.epochs, "per_user": cfg.per_user,
              "server_steps": cfg.server_steps, "anchor_weight": cfg.anchor_weight,
              "n_warm_items": int(len(task.warm_items)), "n_cold_items": int(len(task.cold_items)),
              "content": content, "classes": described, "novel_classes": novel, "shots": shots,
              "evaluated_on": "valid" if valid else "test"}
    mean = lambda rows: {kind: {k: float(np.mean([r[kind][k] for r in rows])) for k in ("hr@10", "ndcg@10")}  # noqa: E731
                         for kind in ("warm", "cold")}
    for m in METHODS:
        report[m] = mean([s[m] for s in per_seed])
        report[m]["global_model"] = mean([s[m]["global_model"] for s in per_seed])
        report[m]["client_models"] = mean([s[m]["client_models"] for s in per_seed])
    report["client_class_tv"] = tv_summary([x for s in per_seed for x in s["client_genre_tv"]])
    report["paired"] = paired_tests(per_seed)
    report["per_seed"] = per_seed
    report["seconds"] = round(time.time() - t0, 1)
    report["cpu_seconds"] = round(time.process_time() - c0, 1)
    return report


def _split_row(task, weights, novel_ids, *, split: str, clients: int, alpha: float, seed: int) -> dict:
    """A seed's row of the report before its methods run: the split's client sizes (users; with the split over
    examples also examples) and class skew, the warm and cold item counts, the novel classes and, in the few-shot
    regime, the number of labelled examples."""
    from .table import tv_summary

    row = {}
    if split == "examples":
        from .examples import deal_examples, example_skew

        held = deal_examples(task, task.item_class, clients, alpha, seed)
        tv = example_skew(weights, held)
        row["client_users"] = [len(users) for users in held]
        row["client_examples"] = [int(sum(map(len, users.values()))) for users in held]
    else:
        assign = dirichlet_split(task.user_genre, clients, alpha, seed)
        tv = label_skew(weights, task, assign)
        row["client_users"] = np.bincount(assign, minlength=clients).tolist()
    row.update({"client_genre_tv": [round(x, 4) for x in tv], "client_class_tv": tv_summary(tv),
                "n_warm_items": int(len(task.warm_items)), "n_cold_items": int(len(task.cold_items))})
    if novel_ids is not None:
        row["novel_classes"] = novel_ids.tolist()
    if task.labelled is not None:
        row["labelled_examples"] = sum(map(len, task.labelled))
    return row


def _seed_task(data, vectors, seed: int, *, classes: int, content: str, novel: int, cold_share: float,
               dominant: str, valid: bool, shots: int):
    """One seed's task (its classes, novel classes, split and, with ``shots``, its labelled examples), the class
    weights for the skew report, the classes' description and the novel class ids (or None)."""
    from .classes import novel_classes

    item_class, weights, described = _classes(data, vectors, classes, content, seed)
    novel_ids = novel_classes(item_class, novel, seed) if novel and item_class is not None else None
    task = build_task(data, vectors, cold_share=cold_share, seed=seed, dominant=dominant, item_class=item_class,
                      novel=novel_ids, valid=valid)
    # one class per item for the split over examples: its k-means class, or its first catalogue category
    task.item_class = item_class if item_class is not None else np.argmax(weights, 1)
    if shots:
        task.labelled = few_shot_targets(task.histories, shots, seed)
    return task, weights, described, novel_ids


def _one_method(task, m, cfg, clients, alpha, rounds, sft_rounds, seed, log, split: str = "users") -> dict:
    """One method on one seed's task: its test figures plus, for FedDTL, the last GRPO round's signal."""
    import time

    t = time.time()
    res = train(task, m, cfg, n_clients=clients, alpha=alpha, rounds=rounds, sft_rounds=sft_rounds, seed=seed,
                split=split)
    out = res.test
    rl = [h for h in res.history if h["stage"] == "rl"]
    if rl:
        out["rl_reward_last"] = rl[-1]["reward"]
        out["rl_groups_with_signal"] = rl[-1]["groups_with_signal"]
    g, c = out["global_model"], out["client_models"]
    log(f"seed {seed} {m:>13}: warm HR@10 {out['warm']['hr@10']:.4f} NDCG@10 "
        f"{out['warm']['ndcg@10']:.4f} | cold HR@10 {out['cold']['hr@10']:.4f} NDCG@10 "
        f"{out['cold']['ndcg@10']:.4f} | global model warm/cold {g['warm']['hr@10']:.4f}/"
        f"{g['cold']['hr@10']:.4f}, client models {c['warm']['hr@10']:.4f}/{c['cold']['hr@10']:.4f} "
        f"({time.time() - t:.1f}s)")
    return out
