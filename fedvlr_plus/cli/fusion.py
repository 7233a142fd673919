"""``fedvlr-plus run ... --fusion``: the command line's fusion flags turned into :class:`FedVLROptions` and handed
to the one builder, :func:`fedvlr_plus.fedvlr.build_fedvlr` (FedVLR, Li et al., AAAI-26, arXiv 2410.08478;
see docs/method.md). Nothing here decides anything about the model."""

from __future__ import annotations

from ..errors import ConfigError, UserError
from ..fedvlr import FedVLROptions, FusionLayer, build_fedvlr, router_report  # noqa: F401  (router_report: CLI use)
from ..fedvlr.views import load_views  # noqa: F401  (the commands load the views for their reference rankers)


def options_from_args(args, mode: str | None = None) -> FedVLROptions:
    """The layer's options from parsed ``--fusion ...`` flags (see
    :func:`~fedvlr_plus.cli.fusion_args.add_fusion_arguments`);
    ``mode`` replaces ``--fusion`` (a command that trains several fusion variants)."""
    over = {"router_over": args.router_over} if getattr(args, "router_over", None) else {}
    return FedVLROptions(
        mode=mode or args.fusion,
        **over,
        temperature=args.router_temperature,
        balance=args.router_balance,
        residual=bool(getattr(args, "fusion_residual", False) or getattr(args, "fusion_residual_gate", False)),
        residual_gate=getattr(args, "fusion_residual_gate", False),
        view_scale=getattr(args, "fusion_view_scale", None) or "model",
        personal_offset=getattr(args, "personal_offset", False),
        content_preference=getattr(args, "content_preference", False),
        cold_neighbours=args.cold_neighbours,
        id_dropout=getattr(args, "id_dropout", 0.0),
        views=args.views,
        fusion_views=tuple(args.fusion_views.split(",")) if args.fusion_views else None,
        drop_modality=tuple(args.drop_modality),
        progress=not getattr(args, "no_progress", False),
    )


def base_backbone(args, n_items: int, backbone: str, dim: int):
    """The backbone the layer wraps, with the command line's backbone options."""
    from ..adapters import backbone_options, make_backbone

    opts = backbone_options(backbone, args)
    return make_backbone(backbone, n_items, dim, **opts)


def build_for_command(data, base, options: FedVLROptions, views=None, backbone: str | None = None) -> FusionLayer:
    """:func:`build_fedvlr`, with a layer that cannot be built reported as one line naming the flags."""
    try:
        return build_fedvlr(data, base, options, views)
    except ValueError as exc:  # a backbone the layer cannot wrap, bad views: a message, not a traceback
        if isinstance(exc, UserError):  # already one line naming its flag
            raise
        raise ConfigError(f"--fusion {options.mode} with --backbone {backbone or base.name}", str(exc)) from None


def fusion_backbone(args, data, backbone: str, dim: int) -> FusionLayer:
    """The layer ``run --fusion`` trains: ``args`` -> options -> :func:`build_fedvlr`."""
    return build_for_command(
        data, base_backbone(args, data.n_items, backbone, dim), options_from_args(args), backbone=backbone
    )
