"""A server-side attack on item-set privacy: guess each client's training items from what it uploads.

An honest-but-curious server sees, for every upload, the item-table rows it carries (their ids and values) and
the example count, which is the client's number of training positives. Two guesses, both scored against the
client's true training items:

- **row ids**: every uploaded row is a guess (the client's positives and its sampled negatives, plus any decoys);
  recall is 1 whenever every positive is trained in the round, precision is the positives' share of the rows;
- **magnitude**: rank the uploaded rows by the L2 norm of their change (the gradient row, or the new row minus the
  broadcast one), summed over the item tables, and guess the top ``n`` rows, ``n`` the upload's example count.
  A positive is pushed towards its user in every step, a negative only in the steps that draw it, so positives
  tend to move most.

Scores are pooled over uploads (true guesses / guesses, true guesses / true items), per round and overall.
Reference for the threat: Chai, Wang, Chen, Yang, "Secure Federated Matrix Factorization", IEEE Intelligent
Systems 2021 (the server reads a user's items off the uploaded gradients).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from ..messages import ClientUpdate

ATTACKS = ("row_ids", "magnitude")


def row_change_norms(update: ClientUpdate, shared: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """The uploaded item-row ids (sorted, unique) and the L2 norm of each one's change over every item table."""
    ids, sq = [], []
    for name, rows in update.rows.items():
        a = update.arrays[name].double().reshape(len(rows), -1)
        if update.kind == "params":
            a = a - shared[name].double().index_select(0, rows).reshape(len(rows), -1)
        ids.append(rows.numpy().astype(np.int64))
        sq.append((a**2).sum(1).numpy())
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0)
    uniq, inv = np.unique(np.concatenate(ids), return_inverse=True)
    return uniq, np.sqrt(np.bincount(inv, weights=np.concatenate(sq), minlength=len(uniq)))


def guesses(update: ClientUpdate, shared: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Each attack's guessed item set for one upload."""
    ids, norms = row_change_norms(update, shared)
    n = min(int(update.num_examples), len(ids))
    top = ids[np.argsort(-norms, kind="stable")[:n]]
    return {"row_ids": ids, "magnitude": np.sort(top)}


def score(guess: np.ndarray, truth: np.ndarray) -> tuple[int, int, int]:
    """(true guesses, guesses, true items)."""
    return int(len(np.intersect1d(guess, truth))), int(len(guess)), int(len(truth))


def precision_recall(hits: int, guessed: int, actual: int) -> dict:
    return {"precision": hits / guessed if guessed else 0.0, "recall": hits / actual if actual else 0.0}


def upload_bytes(update: ClientUpdate) -> int:
    """Bytes of an upload's arrays and row ids as sent (numpy buffers; scalars not counted)."""
    return int(
        sum(a.numel() * a.element_size() for a in update.arrays.values())
        + sum(r.numel() * 8 for r in update.rows.values())
    )


class ItemSetAttack:
    """Observes every upload of a run (``FederatedRun(on_upload=attack.observe)``); ``shared_of()`` returns the
    round's broadcast (the server holds it). ``truth(cid)``: the client's training items."""

    def __init__(self, truth, shared_of):
        self.truth, self.shared_of = truth, shared_of
        self.counts = defaultdict(lambda: np.zeros(3, dtype=np.int64))  # (round, attack) -> hits, guessed, actual
        self.bytes = defaultdict(int)
        self.uploads = defaultdict(int)

    def observe(self, round_index: int, update: ClientUpdate) -> None:
        shared = self.shared_of()
        truth = np.asarray(self.truth(int(update.cid)), dtype=np.int64)
        for name, guess in guesses(update, shared).items():
            self.counts[(int(round_index), name)] += score(guess, truth)
        self.bytes[int(round_index)] += upload_bytes(update)
        self.uploads[int(round_index)] += 1

    def state(self) -> dict:
        """What the attack has seen so far, as plain JSON (a run keeps it in every checkpoint)."""
        return {
            "counts": [[r, a, *map(int, c)] for (r, a), c in sorted(self.counts.items())],
            "bytes": [[r, int(b)] for r, b in sorted(self.bytes.items())],
            "uploads": [[r, int(n)] for r, n in sorted(self.uploads.items())],
        }

    def load_state(self, state: dict) -> None:
        """Go on from :meth:`state` (a resumed run): what was seen up to its checkpoint, and nothing after."""
        self.counts.clear(), self.bytes.clear(), self.uploads.clear()
        for r, a, *c in state["counts"]:
            self.counts[(int(r), a)] = np.asarray(c, dtype=np.int64)
        self.bytes.update({int(r): int(b) for r, b in state["bytes"]})
        self.uploads.update({int(r): int(n) for r, n in state["uploads"]})

    def summary(self) -> dict:
        """Per round and overall precision/recall of each attack, and the bytes uploaded per round."""
        rounds = sorted(self.bytes)
        per_round = [
            {
                "round": r,
                "bytes": self.bytes[r],
                "uploads": self.uploads[r],
                **{a: precision_recall(*self.counts[(r, a)]) for a in ATTACKS},
            }
            for r in rounds
        ]
        overall = {
            a: precision_recall(*sum((self.counts[(r, a)] for r in rounds), np.zeros(3, np.int64))) for a in ATTACKS
        }
        return {
            "overall": overall,
            "bytes_per_round": float(np.mean([self.bytes[r] for r in rounds])) if rounds else 0.0,
            "per_round": per_round,
        }
