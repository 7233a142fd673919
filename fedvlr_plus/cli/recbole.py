"""``run SOURCE --backbone recbole:<Model> [--fusion ...] [--recbole-config FILE]``: the RecBole model, federated,
and wrapped by the FedVLR layer when ``--fusion`` asks; a refusal names the flag that caused it."""

from __future__ import annotations


def cli_backbone(args, data):
    """The backbone ``args`` ask for, built on ``data``."""
    from ..adapters.recbole.backbone import RefusedModel, federate
    from ..errors import ConfigError
    from ..fedvlr.recbole_layer import fedvlr

    name = args.backbone.split(":", 1)[1].strip()
    if not name:
        raise ConfigError("--backbone recbole:", "needs a model name", "e.g. recbole:BPR or recbole:NeuMF")
    try:
        bb, _ = federate(
            name, data=data, config_file=getattr(args, "recbole_config", None), seed=int(getattr(args, "seed", 0))
        )
    except RefusedModel as exc:
        raise RefusedModel("--backbone", str(exc)) from None
    except ValueError as exc:  # RecBole's own checks of the model's configuration
        raise ConfigError(f"--backbone {args.backbone}", str(exc)) from None
    if getattr(args, "fusion", "none") == "none":
        return bb
    from .fusion import options_from_args

    try:
        return fedvlr(bb, data=data, options=options_from_args(args))
    except RefusedModel as exc:
        raise RefusedModel(f"--fusion {args.fusion}", str(exc)) from None
