"""What an :class:`~fedvlr_plus.api.Experiment` compares: recipes for models, not trained models.

A recipe knows its label and how to build its backbone for a given data set, so a user never passes
``n_items`` or ``dim`` by hand: ``FedAvg()``, ``FedVLR(FedAvg())``, ``RecBole("BPR")``, ``Pop()``. Training
options given to a recipe (``FedAvg(lr=0.5)``) override the experiment's for that model only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace


@dataclass
class Model:
    """A federated backbone trained by the engine. ``train`` holds FedConfig fields set for this model only;
    ``backbone_options`` the backbone's own options (its ``options_type`` fields, e.g. FedRAP's penalties)."""

    backbone: str
    label: str
    train: dict = field(default_factory=dict)
    backbone_options: dict = field(default_factory=dict)

    def build(self, data, cfg):
        """The backbone for ``data``: a registered name the engine builds, or, with options of its own, the
        adapter built with them at the data's size."""
        if not self.backbone_options:
            return self.backbone
        from ..adapters import make_backbone

        return make_backbone(self.backbone, data.n_items, cfg.dim, **self.backbone_options)


class FedAvg(Model):
    def __init__(self, **train):
        super().__init__("fedavg", "FedAvg", train)


class FedNCF(Model):
    def __init__(self, **train):
        super().__init__("fedncf", "FedNCF", train)


class FCF(Model):
    def __init__(self, **train):
        super().__init__("fcf", "FCF", train)


class PFedRec(Model):
    def __init__(self, **train):
        super().__init__("pfedrec", "PFedRec", train)


class FedRAP(Model):
    """FedRAP; ``fedrap_lambda`` / ``fedrap_mu`` are the backbone's own penalties
    (:class:`~fedvlr_plus.adapters.FedRAPOptions`; None: its defaults), any other keyword a training option."""

    def __init__(self, fedrap_lambda: float | None = None, fedrap_mu: float | None = None, **train):
        own = {k: v for k, v in (("fedrap_lambda", fedrap_lambda), ("fedrap_mu", fedrap_mu)) if v is not None}
        if own:  # refused here, not when the experiment reaches this model
            from ..adapters.fedrap import FedRAPOptions

            FedRAPOptions(**own)
        super().__init__("fedrap", "FedRAP", train, own)


class RecBole(Model):
    """Any RecBole general recommender by name (any case), e.g. ``RecBole("BPR")``."""

    def __init__(self, model: str, config_file: str | None = None, **train):
        super().__init__(f"recbole:{model}", f"RecBole {model}", train)
        self.model, self.config_file = model, config_file

    def build(self, data, cfg):
        from ..adapters.recbole.backbone import federate

        backbone, _ = federate(self.model, data=data, config_file=self.config_file, seed=int(cfg.seed))
        return backbone


class FedVLR(Model):
    """``inner`` wrapped by the FedVLR layer. ``views``: the items' content views (name -> [n_items, d]; None:
    loaded as ``options.views`` says). ``options``: a whole :class:`~fedvlr_plus.fedvlr.FedVLROptions` record to
    start from; keyword arguments named like its fields (``mode="mlp"``, ``residual=True``) replace them, and any
    other keyword is a training option of this model. ``label``: the model's name in the result."""

    def __init__(self, inner: Model, views: dict | None = None, *, label: str | None = None, options=None, **settings):
        from ..fedvlr import FedVLROptions

        names = {f.name for f in fields(FedVLROptions)}
        self.options = replace(options or FedVLROptions(), **{k: v for k, v in settings.items() if k in names})
        self.inner, self.views = inner, views
        train = {**inner.train, **{k: v for k, v in settings.items() if k not in names}}
        super().__init__(inner.backbone, label or f"{inner.label} + FedVLR", train)

    def build(self, data, cfg):
        from ..adapters import make_backbone
        from ..errors import ConfigError, UserError
        from ..fedvlr import build_fedvlr

        base = self.inner.build(data, cfg)
        if isinstance(base, str):  # a registered backbone at the experiment's size (its options: none given)
            base = make_backbone(base, data.n_items, cfg.dim)
        try:
            return build_fedvlr(data, base, self.options, views=self.views)
        except ValueError as exc:  # a backbone the layer cannot wrap, unusable views: one line naming the model
            if isinstance(exc, UserError):
                raise
            raise ConfigError(self.label, str(exc)) from None


@dataclass
class Reference:
    """A reference ranker that needs no training: ``pop``, ``random`` or ``antipop``."""

    name: str
    label: str


def Pop() -> Reference:  # noqa: N802 (reads like the other recipes)
    return Reference("pop", "pop")


def Random() -> Reference:  # noqa: N802
    return Reference("random", "random")


def AntiPop() -> Reference:  # noqa: N802
    return Reference("antipop", "antipop")


REFERENCES = (Pop, Random, AntiPop)
