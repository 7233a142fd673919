"""The layer's training recipe chosen on validation: a small fixed grid, one training run per recipe on the first
seed, the recipe with the best validation score kept for every seed.

Why a grid and not one default: the layer's best recipe differs between data sets. On data whose content views are
weak the ID embedding needs its own path past the fusion (``residual``); on data where they are strong the plain
mixture is better; and the learning rates that suit a few hundred users overshoot on more. No single setting was
best on every data set measured (docs/results.md), so the choice is made where it can be made honestly: on the
validation split, before any test figure is read.

The grid is deliberately small (five recipes), so tuning costs five single-seed runs. A flag the user passes is
never overridden: recipes that differ only in a value the user fixed collapse into one. The content-preference
recipe (a private VBPR-style preference over projected content) is left out for backbones that score through
their own module (RecBole models), which the layer cannot give that term.

``fast`` is relative: three times the model's own server step (SGD at 1.0 for the package's backbones, so
``--server-lr 3``; Adam at 0.05 for a RecBole model, so ``--server-lr 0.15``), the client step left at the model's
default. An absolute value cannot be fast for both: ``--server-lr 3`` fed to a RecBole model's Adam diverges.

A RecBole model also gets the two ``unit`` recipes: the fused views as unit vectors instead of the size of the
model's own initial item rows (``--fusion-view-scale``). Neither size was best for every model: NeuMF's towers,
made for rows of norm 0.11, learn far better behind views of that size, while BPR on lfm2k did better behind unit
vectors. For the package's own backbones the two sizes are the same, and those recipes are left out.

Where the data has cold items (no training interaction) among at least 1% of its validation targets, every recipe
also gets an ID-dropout twin (``--id-dropout``): ranking a cold item from a content estimate of its ID row is what
the fusion must then do, and whether training it for that costs the warm items more than it gives the cold ones
differs between data sets.

A RecBole model also gets ``residual+gate``: the residual path with its fused part behind a server-learnt scale per
expert and item table that starts at zero (``--fusion-residual-gate``). NeuMF behind the ungated residual path
lagged NeuMF alone on validation while its towers learned (docs/method.md, "Residual gate"); measured on NeuMF
only, so the package's own backbones do not get it. ``residual+gate+wd`` adds L2 weight decay (``--weight-decay``,
:data:`GATE_WEIGHT_DECAY`): NeuMF's ID rows grow under the server's Adam while the gated fused part keeps its initial
size, so the gate barely opens; decay keeps the rows small enough for the content to count (docs/recbole.md). A
weight decay the user passes replaces the grid's, so that recipe then collapses into ``residual+gate``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class Recipe:
    """One point of the grid; ``None`` leaves the layer's own default."""

    name: str
    lr: float | None = None
    server_lr: float | None = None
    residual: bool = False
    content_preference: bool = False
    #: the server step as a multiple of the model's default one (resolved by :func:`candidate_recipes`)
    server_lr_scale: float | None = None
    #: fused views as unit vectors (``--fusion-view-scale unit``) instead of the model's own row size
    unit_scale: bool = False
    #: share of warm items the server reads through a content estimate of their ID row (``--id-dropout``)
    id_dropout: float = 0.0
    #: the residual path's fused part behind a learnt per-table scale that starts at zero (``--fusion-residual-gate``)
    residual_gate: bool = False
    #: L2 weight decay of the run (``--weight-decay``); None keeps the run's own
    weight_decay: float | None = None

    @property
    def view_scale(self) -> str:
        """The ``FedVLROptions.view_scale`` this recipe trains with."""
        return "unit" if self.unit_scale else "model"

    def layer_options(self, options):
        """``options`` (:class:`~fedvlr_plus.fedvlr.FedVLROptions`) with this recipe's layer settings."""
        return replace(
            options,
            residual=self.residual,
            content_preference=self.content_preference,
            view_scale=self.view_scale,
            id_dropout=self.id_dropout,
            residual_gate=self.residual_gate,
        )

    def settings(self) -> dict:
        """The values this recipe sets, under the flag names a user would type."""
        out = {"--fusion-residual": self.residual, "--content-preference": self.content_preference}
        if self.unit_scale:
            out["--fusion-view-scale"] = "unit"
        if self.id_dropout:
            out["--id-dropout"] = self.id_dropout
        if self.residual_gate:
            out["--fusion-residual-gate"] = True
        if self.weight_decay is not None:
            out["--weight-decay"] = self.weight_decay
        if self.lr is not None:
            out["--lr"] = self.lr
        if self.server_lr is not None:
            out["--server-lr"] = self.server_lr
        return out


#: the weight decay of the ``residual+gate+wd`` recipe (NeuMF's choice on lfm2k's validation among 1e-4 and 1e-3)
GATE_WEIGHT_DECAY = 1e-4

#: the grid: the layer's defaults, the residual ID path, a larger server step, both, and a private preference over
#: content
RECIPES: tuple[Recipe, ...] = (
    Recipe("default"),
    Recipe("residual", residual=True),
    Recipe("fast", server_lr_scale=3.0),
    Recipe("fast+residual", server_lr_scale=3.0, residual=True),
    Recipe("content", content_preference=True),
    Recipe("unit", unit_scale=True),
    Recipe("unit+residual", residual=True, unit_scale=True),
    Recipe("residual+gate", residual=True, residual_gate=True),
    Recipe("residual+gate+wd", residual=True, residual_gate=True, weight_decay=GATE_WEIGHT_DECAY),
)


#: the ID dropout of the grid's twins where the data has cold items (``candidate_recipes(cold_items=True)``)
COLD_ITEM_DROPOUT = 0.5
#: the share of validation targets on cold items from which the grid holds the twins: below it validation can
#: hardly judge what they are for, and they would double the cost of tuning (ml-100k's split: 1 of 943)
COLD_VALID_SHARE = 0.01


def tries_id_dropout(data) -> bool:
    """Whether the grid for ``data`` holds the ID-dropout twins: at least :data:`COLD_VALID_SHARE` of its
    validation targets are cold items (no training interaction)."""
    cold = data.cold_items()
    items = data.valid()["item"].to_numpy()
    return bool(len(items)) and float(cold[items].mean()) >= COLD_VALID_SHARE


def fixed_by(options) -> dict:
    """The grid's layer values that ``options`` (:class:`~fedvlr_plus.fedvlr.FedVLROptions`) already fixes, as
    :func:`candidate_recipes` takes them (None: left to the grid); the inverse of :meth:`Recipe.layer_options`."""
    return {
        "residual": True if options.residual else None,
        "content_preference": True if options.content_preference else None,
        "view_scale": "unit" if options.view_scale == "unit" else None,
        "residual_gate": True if options.residual_gate else None,
        "id_dropout": options.id_dropout or None,
    }


def layer_server_lr(backbone: str) -> float:
    """The server step the FedVLR layer takes by default around ``backbone`` (a RecBole model keeps its own)."""
    from .layer import FusionLayer

    if backbone.startswith("recbole:"):
        from ..adapters.recbole.backbone import RecBoleBackbone

        return float(RecBoleBackbone.default_server_lr)
    return float(FusionLayer.default_server_lr)


def candidate_recipes(
    *,
    lr: float | None = None,
    server_lr: float | None = None,
    residual: bool | None = None,
    content_preference: bool | None = None,
    view_scale: str | None = None,
    residual_gate: bool | None = None,
    id_dropout: float | None = None,
    weight_decay: float | None = None,
    cold_items: bool = False,
    backbone: str = "fedavg",
) -> list[Recipe]:
    """The grid for the layer around ``backbone`` with the values the user fixed put in place of the grid's;
    duplicates dropped, order kept. A backbone that scores through its own module (``recbole:``) gets no content
    preference; only such a backbone gets the ``unit`` recipes (for the others both view sizes are one).

    ``cold_items``: the training data has items nobody trained on, which the layer must rank from a content
    estimate of their ID row, so each recipe also gets an ID-dropout twin (``+dropout``, :data:`COLD_ITEM_DROPOUT`),
    after all the others so that a tie keeps the recipe without it."""
    module = backbone.startswith("recbole:")
    grid = [
        r
        for r in RECIPES
        if not ((r.content_preference and module) or ((r.unit_scale or r.residual_gate) and not module))
    ]
    if cold_items:
        grid += [replace(r, name=f"{r.name}+dropout", id_dropout=COLD_ITEM_DROPOUT) for r in grid]
    seen, out = set(), []
    for r in grid:
        grid_slr = (
            r.server_lr if r.server_lr_scale is None else round(r.server_lr_scale * layer_server_lr(backbone), 12)
        )
        gate = r.residual_gate if residual_gate is None else residual_gate
        fixed = Recipe(
            r.name,
            lr=r.lr if lr is None else lr,
            server_lr=grid_slr if server_lr is None else server_lr,
            residual=(r.residual if residual is None else residual) or gate,
            residual_gate=gate,
            content_preference=r.content_preference if content_preference is None else content_preference,
            unit_scale=r.unit_scale if view_scale is None else view_scale == "unit",
            id_dropout=r.id_dropout if id_dropout is None else id_dropout,
            weight_decay=r.weight_decay if weight_decay is None else weight_decay,
        )
        key = (
            fixed.lr,
            fixed.server_lr,
            fixed.residual,
            fixed.content_preference,
            fixed.unit_scale,
            fixed.residual_gate,
            fixed.id_dropout,
            fixed.weight_decay,
        )
        if key not in seen:
            seen.add(key)
            out.append(fixed)
    return out


@dataclass
class TuningReport:
    """What was tried, what each scored on validation, and what was kept."""

    metric: str
    seed: int
    scores: dict[str, float] = field(default_factory=dict)
    recipes: list[Recipe] = field(default_factory=list)
    selected: str | None = None
    #: recipes that successive halving stopped, and the round budget at which (:mod:`.halving`)
    stopped: dict[str, int] = field(default_factory=dict)

    @property
    def chosen(self) -> Recipe:
        return next(r for r in self.recipes if r.name == self.selected)

    def scores_line(self) -> str:
        """Each recipe's validation score, and the budget that stopped it, for a one-line summary."""
        parts = (
            f"{n} {s:.4f}" + (f" at round {self.stopped[n]}" if n in self.stopped else "")
            for n, s in self.scores.items()
        )
        return ", ".join(parts)

    def to_json(self) -> dict:
        return {
            "metric": self.metric,
            "split": "valid",
            "seed": self.seed,
            "selected": self.selected,
            "selected_settings": self.chosen.settings() if self.selected else None,
            "candidates": [
                {
                    **asdict(r),
                    "settings": r.settings(),
                    "valid": self.scores.get(r.name),
                    "stopped_at_round": self.stopped.get(r.name),
                }
                for r in self.recipes
            ],
        }


def select_recipe(
    recipes: list[Recipe],
    valid_score: Callable[[Recipe], float],
    *,
    metric: str,
    seed: int,
    on_candidate: Callable[[int, Recipe], None] | None = None,
) -> TuningReport:
    """Score every recipe with ``valid_score`` (its best validation ``metric``) and keep the best; a tie keeps the
    earlier recipe, so the layer's defaults win unless another recipe is strictly better on validation."""
    if not recipes:
        raise ValueError("no recipe to choose from")
    report = TuningReport(metric=metric, seed=seed, recipes=list(recipes))
    for i, recipe in enumerate(recipes):
        if on_candidate is not None:
            on_candidate(i, recipe)
        report.scores[recipe.name] = float(valid_score(recipe))
        if report.selected is None or report.scores[recipe.name] > report.scores[report.selected]:
            report.selected = recipe.name
    return report
