"""fedvlr-plus: personalised multimodal fusion for federated recommenders.

The library's face is :mod:`fedvlr_plus.api`, re-exported here lazily (so that ``import fedvlr_plus``, and
with it the command line's ``--help``, does not load torch)::

    from fedvlr_plus import load, FedAvg, FedVLR, Experiment
"""

__version__ = "0.1.0"

_API = (
    "load",
    "Experiment",
    "ExperimentResult",
    "Model",
    "Reference",
    "FedAvg",
    "FedNCF",
    "FCF",
    "PFedRec",
    "FedRAP",
    "RecBole",
    "FedVLR",
    "Pop",
    "Random",
    "AntiPop",
)
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedvlr_plus' has no attribute {name!r}")
