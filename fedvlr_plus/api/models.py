"""What an :class:`~fedvlr_plus.api.Experiment` compares: recipes for models, not trained models.

A recipe knows its label and how to build its backbone for a given data set, so a user never passes
``n_items`` or ``dim`` by hand: ``FedAvg()``, ``FedVLR(FedAvg())``, ``RecBole("BPR")``, ``Pop()``. Training
options given to a recipe (``FedAvg(lr=0.5)``) override the experiment's for that model only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from .checks import ArgumentTypeError, check_label, check_training, check_types


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
    def __init__(self, *, label: str | None = None, **train):
        super().__init__("fedavg", check_label(label, "FedAvg") or "FedAvg", _checked("FedAvg", train))


class FedNCF(Model):
    def __init__(self, *, label: str | None = None, **train):
        super().__init__("fedncf", check_label(label, "FedNCF") or "FedNCF", _checked("FedNCF", train))


class FCF(Model):
    def __init__(self, *, label: str | None = None, **train):
        super().__init__("fcf", check_label(label, "FCF") or "FCF", _checked("FCF", train))


class PFedRec(Model):
    def __init__(self, *, label: str | None = None, **train):
        super().__init__("pfedrec", check_label(label, "PFedRec") or "PFedRec", _checked("PFedRec", train))


class FedRAP(Model):
    """FedRAP; ``fedrap_lambda`` / ``fedrap_mu`` are the backbone's own penalties
    (:class:`~fedvlr_plus.adapters.FedRAPOptions`; None: its defaults), any other keyword a training option."""

    def __init__(
        self, fedrap_lambda: float | None = None, fedrap_mu: float | None = None, *, label: str | None = None, **train
    ):
        own = {k: v for k, v in (("fedrap_lambda", fedrap_lambda), ("fedrap_mu", fedrap_mu)) if v is not None}
        if own:  # refused here, not when the experiment reaches this model
            from ..adapters.fedrap import FedRAPOptions
            from ..errors import ConfigError

            try:
                FedRAPOptions(**own)
            except (TypeError, ValueError) as exc:
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(f"FedRAP({', '.join(f'{k}={v!r}' for k, v in own.items())})", str(exc)) from None
        super().__init__("fedrap", check_label(label, "FedRAP") or "FedRAP", _checked("FedRAP", train), own)


class RecBole(Model):
    """Any RecBole general recommender by name (any case), e.g. ``RecBole("BPR")``."""

    def __init__(self, model: str, config_file: str | None = None, *, label: str | None = None, **train):
        if not isinstance(model, str) or not model.strip():
            raise ArgumentTypeError(f"RecBole({model!r})", "the model is a RecBole model's name, e.g. RecBole('BPR')")
        label = check_label(label, "RecBole") or f"RecBole {model}"
        super().__init__(f"recbole:{model}", label, _checked("RecBole", train))
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

        _check_inner(inner)
        names = {f.name for f in fields(FedVLROptions)}
        self.options = _fedvlr_options(options, {k: v for k, v in settings.items() if k in names})
        self.inner, self.views = inner, views
        own = _checked("FedVLR", {k: v for k, v in settings.items() if k not in names})
        label = check_label(label, "FedVLR") or f"{inner.label} + FedVLR"
        super().__init__(inner.backbone, label, {**inner.train, **own})

    def build(self, data, cfg):
        from ..adapters import make_backbone
        from ..errors import ConfigError, UserError
        from ..fedvlr import build_fedvlr

        base = self.inner.build(data, cfg)
        if isinstance(base, str):  # a registered backbone at the experiment's size (its options: none given)
            base = make_backbone(base, data.n_items, cfg.dim)
        try:
            return build_fedvlr(data, base, self.options, views=self.views, purpose=self.label)
        except ValueError as exc:  # a backbone the layer cannot wrap, unusable views: one line naming the model
            if isinstance(exc, UserError):  # already names the model (purpose): not twice
                message = _in_python_terms(str(exc)).removeprefix(f"{self.label}: ")
                raise ConfigError(self.label, message) from None
            raise ConfigError(self.label, str(exc)) from None


#: the command line's remedies in a views message, as a Python caller would do the same
_PYTHON_TERMS = {
    "pass --views DIR": "pass views={name: [n_items, d] array}",
    "use --fusion none": "drop the FedVLR layer",
    ", --fusion-residual": "",
}


def _in_python_terms(text: str) -> str:
    for flag, python in _PYTHON_TERMS.items():
        text = text.replace(flag, python)
    return text


def _checked(owner: str, train: dict) -> dict:
    """A recipe's training options, refused when it is made (not when the experiment reaches the model)."""
    check_training(owner, train)
    return train


def _check_inner(inner) -> None:
    """The layer wraps a trained recipe; a reference ranker, a string or another FedVLR layer it cannot."""
    if isinstance(inner, Reference):
        raise ArgumentTypeError(
            f"FedVLR({inner.label}())",
            "a reference ranker has no embeddings for the layer to wrap",
            "wrap a trained recipe, e.g. FedVLR(FedAvg())",
        )
    if isinstance(inner, FedVLR):
        raise ArgumentTypeError(f"FedVLR({inner.label!r})", "the layer is already there", "wrap the inner recipe once")
    if not isinstance(inner, Model):
        raise ArgumentTypeError(
            f"FedVLR({inner!r})"[:80], "the first argument is a recipe", "e.g. FedVLR(FedAvg()) or FedVLR(FCF(lr=0.5))"
        )


def _fedvlr_options(options, settings: dict):
    """``options`` (a FedVLROptions or None) with ``settings`` replacing its fields; a bad value names itself."""
    from ..errors import ConfigError
    from ..fedvlr import FedVLROptions

    if options is not None and not isinstance(options, FedVLROptions):
        raise ArgumentTypeError("FedVLR(options=...)", f"expected a FedVLROptions, got {type(options).__name__}")
    check_types("FedVLR", settings, FedVLROptions)
    try:
        return replace(options or FedVLROptions(), **settings)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        given = ", ".join(f"{k}={v!r}" for k, v in settings.items()) or "options=..."
        raise ConfigError(f"FedVLR({given})", _in_python_terms(str(exc))) from None


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
