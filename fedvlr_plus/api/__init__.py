"""The Python API in a few names: ``load`` a data set, pick model recipes, run an ``Experiment``.

from fedvlr_plus import load, FedAvg, FedVLR, Experiment

data = load("ml-100k")
result = Experiment(data, [FedAvg(), FedVLR(FedAvg())], metrics=["ndcg@10", "hr@50"], seeds=3).run()
print(result.to_markdown())
"""

from .data import load
from .experiment import Experiment
from .models import FCF, AntiPop, FedAvg, FedNCF, FedRAP, FedVLR, Model, PFedRec, Pop, Random, RecBole, Reference
from .result import ExperimentResult

__all__ = [
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
]
