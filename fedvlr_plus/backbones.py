"""The names ``run --backbone`` takes: federated backbones, ``recbole:<Model>`` and the reference rankers.

Names only, importing nothing: the command line lists them in its help, and the federated engine and the
evaluation both name them without depending on each other.
"""

from __future__ import annotations

#: federated backbones (fedvlr_plus.adapters.BACKBONES), named here so that building the CLI does not import torch
FEDERATED_BACKBONES = ("fcf", "fedavg", "fedncf", "fedrap", "pfedrec")
#: reference rankers reported beside every model, in the order their rows are printed
REFERENCE_BACKBONES = ("pop", "random", "antipop")


def backbone_names() -> str:
    """Every name ``--backbone`` takes, for its help and for the unknown-backbone error."""
    return (
        f"federated: {', '.join(FEDERATED_BACKBONES)}, recbole:<Model> (any RecBole general recommender, "
        f"e.g. recbole:BPR); reference rankers: {', '.join(REFERENCE_BACKBONES)}"
    )


def normalise_backbone(text: str) -> str:
    """``text`` as the name of a backbone (lower-cased, ``recbole:`` kept with its model name), or ValueError."""
    name = text.strip()
    if name.lower() in FEDERATED_BACKBONES + REFERENCE_BACKBONES:
        return name.lower()
    if name.lower().startswith("recbole:"):
        if not name.split(":", 1)[1].strip():
            raise ValueError("recbole:<Model> needs a model name, e.g. recbole:BPR")
        return "recbole:" + name.split(":", 1)[1].strip()
    raise ValueError(f"unknown backbone {text!r}; choose from {backbone_names()}")
