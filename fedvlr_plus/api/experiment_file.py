"""An :class:`~fedvlr_plus.api.Experiment` from the experiment file ``fedvlr-plus run --config`` reads (and a run
folder's ``config.toml``): the same keys, turned into ``load(...)``, one recipe and its training options.

The file names one model (``backbone``, with ``fusion`` the FedVLR layer around it), as ``run`` trains one; the
experiment also ranks the reference rankers on the same test, as ``run`` reports them.
"""

from __future__ import annotations

from dataclasses import fields

from ..errors import ConfigError, UserError
from ..experiment_file import bad_value, read_experiment_file, unknown_key

#: the keys that say how the data is read and split: ``load``'s arguments
DATA_KEYS = ("source", "split", "k_core", "implicit_threshold")
#: the fusion flags and the FedVLROptions fields they set
FUSION_KEYS = {
    "router_over": "router_over",
    "router_temperature": "temperature",
    "router_balance": "balance",
    "fusion_residual": "residual",
    "fusion_residual_gate": "residual_gate",
    "fusion_view_scale": "view_scale",
    "personal_offset": "personal_offset",
    "content_preference": "content_preference",
    "cold_neighbours": "cold_neighbours",
    "id_dropout": "id_dropout",
    "views": "views",
    "fusion_views": "fusion_views",
    "drop_modality": "drop_modality",
}
#: keys of the command line that change nothing the experiment computes (where it writes, what it prints; how
#: ``--tune`` cuts its grid, and the API trains no grid)
IGNORED_KEYS = ("out", "json", "json_history", "no_progress", "evaluator", "halving")
EXPERIMENT_KEYS = (
    "backbone",
    "fusion",
    "metrics",
    "seeds",
    "seed",
    "protocol",
    "tune",
    "fedrap_lambda",
    "fedrap_mu",
    "recbole_config",
)


def experiment_arguments(path) -> dict:
    """The keyword arguments of :class:`Experiment` that the file at ``path`` describes."""
    from ..federation.config import FedConfig

    settings = read_experiment_file(path)
    settings["source"] = settings.pop("data", settings.get("source"))
    training_keys = {f.name for f in fields(FedConfig)}
    known = set(DATA_KEYS) | set(FUSION_KEYS) | set(IGNORED_KEYS) | set(EXPERIMENT_KEYS) | training_keys
    for key in settings:
        if key not in known:
            raise unknown_key(path, key, known | {"data"})
    if settings["source"] is None:
        raise ConfigError(str(path), "no source", 'name the data, e.g. source = "ml-100k"')
    if settings.get("tune"):
        raise bad_value(
            path,
            "tune",
            "the Python API trains the recipe the file gives; choosing it on validation "
            "is fedvlr-plus run's (set tune = false, with the chosen recipe's keys)",
        )
    if settings.get("evaluator", "ours") != "ours":
        raise bad_value(path, "evaluator", "RecBole's evaluator is fedvlr-plus run's; the API scores with its own")
    try:
        return _arguments(settings, training_keys)
    except UserError as exc:
        raise ConfigError(str(path), str(exc)) from None


def _arguments(settings: dict, training_keys: set) -> dict:
    from .data import load

    data_options = {k: settings[k] for k in DATA_KEYS[1:] if k in settings}
    seed = settings.get("seed", 0)
    data = load(settings["source"], seed=seed, **data_options)
    protocol = settings.get("protocol", "full")
    return {
        "data": data,
        "models": [_model(settings)],
        "metrics": settings.get("metrics"),
        "seeds": settings.get("seeds", 1),
        "seed": seed,
        "protocol": "sampled" if protocol == "sampled99" else protocol,
        "progress": not settings.get("no_progress", False),
        **{k: v for k, v in settings.items() if k in training_keys and k not in ("seed", "seeds", "metrics")},
    }


def _model(settings: dict):
    """The recipe the file names: its backbone, wrapped by the FedVLR layer when ``fusion`` is not none."""
    from . import models

    backbone = settings.get("backbone", "pop")
    references = {"pop": models.Pop, "random": models.Random, "antipop": models.AntiPop}
    if backbone in references:
        return references[backbone]()
    if backbone.startswith("recbole:"):
        inner = models.RecBole(backbone.split(":", 1)[1], settings.get("recbole_config"))
    elif backbone == "fedrap":
        inner = models.FedRAP(settings.get("fedrap_lambda"), settings.get("fedrap_mu"))
    else:
        named = {"fedavg": models.FedAvg, "fedncf": models.FedNCF, "fcf": models.FCF, "pfedrec": models.PFedRec}
        if backbone not in named:
            raise ConfigError(
                f"backbone {backbone!r}",
                f"unknown backbone; one of {', '.join(named)}, fedrap, recbole:<Model>, pop, random, antipop",
            )
        inner = named[backbone]()
    fusion = settings.get("fusion", "none")
    if fusion == "none":
        return inner
    options = {FUSION_KEYS[k]: v for k, v in settings.items() if k in FUSION_KEYS}
    if isinstance(options.get("fusion_views"), str):
        options["fusion_views"] = tuple(options["fusion_views"].split(","))
    if options.get("residual_gate"):
        options["residual"] = True  # the gate is on the residual path, as --fusion-residual-gate implies
    if "drop_modality" in options:
        options["drop_modality"] = tuple(options["drop_modality"])
    return models.FedVLR(inner, mode=fusion, **options)
