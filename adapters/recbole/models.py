"""Which RecBole models the adapter takes: a model named (any case) or given as a class is looked up in RecBole's
model families, and one that cannot be federated (sequential, context-aware, knowledge-graph, non-trainable) is
refused with the reason; and the temporary folder RecBole's own code runs in."""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from fedvlr_plus.errors import UserError


class RefusedModel(UserError, ValueError):
    """This RecBole model cannot be federated by the adapter; the message says why."""


@contextlib.contextmanager
def recbole_workdir(path: str | os.PathLike | None = None):
    """Run RecBole inside ``path`` (a fresh temporary folder by default) so that its ``log/`` and
    ``log_tensorboard/`` never land in the caller's current directory; ``sys.argv`` is hidden from RecBole's
    ``Config`` (it parses ``--key=value`` words of the command line as configuration)."""
    tmp = None
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="fedvlr-recbole-")
        path = tmp.name
    old_cwd, old_argv = os.getcwd(), sys.argv
    Path(path).mkdir(parents=True, exist_ok=True)
    os.chdir(path)
    sys.argv = old_argv[:1]
    try:
        yield Path(path)
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
        if tmp is not None:
            tmp.cleanup()


def _refusal_for_type(cls) -> str | None:
    from recbole.utils import ModelType

    t = getattr(cls, "type", None)
    reasons = {
        ModelType.SEQUENTIAL: "it is a sequential model (it reads ordered item sequences, not a user's set of "
        "positives); federating sequential models is not supported",
        ModelType.KNOWLEDGE: "it is a knowledge-graph model (it needs the global knowledge graph and entity "
        "tables); federating knowledge-graph models is not supported",
        ModelType.CONTEXT: "it is a context-aware (feature) model; the adapter federates general "
        "(user, item) recommenders only",
        ModelType.TRADITIONAL: "it is not trained by gradient descent (a 'traditional' model such as Pop, "
        "ItemKNN or EASE computes its scores from the global interaction matrix); "
        "there is nothing to federate",
    }
    if t in reasons:
        return reasons[t]
    if t != ModelType.GENERAL:
        return f"its model type is {t!r}; only ModelType.GENERAL recommenders can be federated"
    return None


#: RecBole's model families, searched in this order; a model found outside the first is refused with the
#: reason its type gives (sequential, context-aware, knowledge-graph)
MODEL_FAMILIES = (
    "general_recommender",
    "sequential_recommender",
    "context_aware_recommender",
    "knowledge_aware_recommender",
)


def _family_models(family: str) -> tuple[dict[str, type], str | None]:
    """The model classes of one RecBole family by lower-cased name, and why the family could not be imported."""
    import importlib

    try:
        with _process_modes_kept():
            module = importlib.import_module(f"recbole.model.{family}")
    except ImportError as exc:  # a family whose optional dependency is missing here
        return {}, f"{family}: {exc}"
    return {
        name.lower(): obj
        for name, obj in vars(module).items()
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module)
    }, None


@contextlib.contextmanager
def _process_modes_kept():
    """Put back the process-wide modes an import of RecBole's models changes: its SINE module turns on autograd's
    anomaly detection when imported (recbole 1.2.1, ``sequential_recommender/sine.py``), which made every later
    backward pass of the process several times slower, and some families add warning filters."""
    anomaly, check_nan = torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()
    try:
        with warnings.catch_warnings():
            yield
    finally:
        torch.set_anomaly_enabled(anomaly, check_nan)


def _model_by_name(name: str):
    """A RecBole model class by name, matched without regard to case (``bpr`` is ``BPR``)."""
    general, broken = {}, []
    for family in MODEL_FAMILIES:
        models, why = _family_models(family)
        if why:
            broken.append(why)
        if name.lower() in models:
            return models[name.lower()]
        if family == MODEL_FAMILIES[0]:
            general = models
    close = difflib.get_close_matches(name.lower(), list(general), n=3, cutoff=0.6)
    hint = (
        ("did you mean " + " or ".join(f"recbole:{general[k].__name__}" for k in close) + "?")
        if close
        else "general recommenders: " + ", ".join(sorted(c.__name__ for c in general.values()))
    )
    why = "not a RecBole general recommender" + (f" (could not import {'; '.join(broken)})" if broken else "")
    raise RefusedModel(f"recbole:{name}", why, hint)


def resolve_model(model):
    """A RecBole model class from a name (``"BPR"``, any case) or a class; refuse what cannot be federated."""
    from fedvlr_plus._compat import patch_recbole

    patch_recbole()
    cls = _model_by_name(model.strip()) if isinstance(model, str) else model
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise TypeError(f"expected a RecBole model class or name, got {model!r}")
    from recbole.model.abstract_recommender import GeneralRecommender

    reason = _refusal_for_type(cls)
    if reason is None and not issubclass(cls, GeneralRecommender):
        reason = "it does not subclass recbole.model.abstract_recommender.GeneralRecommender"
    if reason:
        raise RefusedModel(f"cannot federate RecBole model {cls.__name__}: {reason}")
    return cls
