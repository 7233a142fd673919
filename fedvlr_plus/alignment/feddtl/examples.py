"""FedDTL's label skew over examples (``--split examples``): the paper's protocol, where a client holds the
samples of a few classes, rather than whole users.

A training example is one (user, train item) pair: the item is the label, the mean of the user's other train items
the input. For every class a Dirichlet(alpha) draw gives the share of its examples each client holds, and each
example goes to a client drawn from its item's class shares (Hsu, Qi & Brown, arXiv 1909.06335, over examples);
alpha 0, the Dirichlet's limit, deals each class wholly to one client (the pathological split). A user's examples
therefore spread over several clients, each of which sees the user's history as the input of the
examples it holds, as every image of the paper's clients is whole and only the labels are skewed. No client owns a
user, so evaluation serves every user with the global model, and the report's "each client's own tower" evaluation
scores a user with the tower of the client holding most of its examples (its home client).
"""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from .task import RecTask, client_skew, label_shares


def deal_examples(
    task: RecTask, item_class: np.ndarray, n_clients: int, alpha: float, seed: int = 0
) -> list[dict[int, np.ndarray]]:
    """Per client, ``{user: the train items it holds as that user's examples}``. Only a user's labelled items
    (every train item outside the few-shot regime) are examples; a user with fewer than two train items has none
    (an example needs another item as its input). Redraws until every client holds an example."""
    rng = np.random.default_rng([int(seed), 17])
    item_class = np.asarray(item_class, np.int64)
    examples = _example_items(task)
    present = np.unique(item_class[np.concatenate(examples)]) if examples else np.zeros(0, np.int64)
    for _ in range(100):
        shares = label_shares(rng, int(item_class.max()) + 1, n_clients, alpha, present)
        held: list[dict[int, np.ndarray]] = [{} for _ in range(n_clients)]
        for u, items in enumerate(examples):
            if not len(items):
                continue
            # one uniform draw per example against its class's cumulative shares: a client per example
            cum = np.cumsum(shares[item_class[items]], axis=1)
            client = np.minimum((rng.random(len(items))[:, None] > cum).sum(1), n_clients - 1)
            for c in np.unique(client):
                held[c][u] = items[client == c]
        if all(held):
            return held
    raise ConfigError(
        f"--clients {n_clients} --alpha {alpha}",
        "no draw of 100 gave every client a training example",
        "use fewer clients or a larger --alpha",
    )


def _example_items(task: RecTask) -> list:
    """Per user, the train items that are its examples (none for a history shorter than two items)."""
    return [
        np.asarray(h if task.labelled is None else task.labelled[u], np.int64) if len(h) >= 2 else np.zeros(0, np.int64)
        for u, h in enumerate(task.histories)
    ]


def home_clients(held: list[dict[int, np.ndarray]], n_users: int) -> np.ndarray:
    """Client id per user: the client holding most of its examples (the lowest id on a tie; 0 without any)."""
    counts = np.zeros((n_users, len(held)), np.int64)
    for c, users in enumerate(held):
        for u, items in users.items():
            counts[u, c] = len(items)
    return np.argmax(counts, 1)


def example_skew(weights: np.ndarray, held: list[dict[int, np.ndarray]]) -> list[float]:
    """Per client, the total-variation distance between the class mix of the examples it holds and the mix of all
    clients' examples (``weights``: [n_items, n_classes] class weights of the items)."""
    return client_skew([list(users.values()) for users in held], weights)
