"""Every item's NeuMF score for a batch of users without running its tower on every (user, item) concatenation.

RecBole's NeuMF has no ``full_sort_predict``: RecBole's trainer, and the adapter's reference path, run ``predict``
on every (user, item) pair, whose first tower layer multiplies the concatenation ``[user vector, item vector]``
(``2d x h1`` multiply-adds a pair). That layer is linear, so it splits into a user half and an item half, each
computed once; only the rest of the tower (the activation, the later layers) runs per pair, and the GMF path
through the prediction layer is one matrix product per batch of users. The scores are ``predict``'s up to the
order of float summation (``tests/test_recbole_neumf.py`` compares them).

Taken only for RecBole's own ``NeuMF`` class (a subclass may change ``forward``), in eval mode, with a tower of
``Linear`` layers and parameter-free element-wise activations (no batch norm); otherwise :func:`plan` returns None
and the caller runs ``predict`` on every pair.
"""

from __future__ import annotations

import torch
from torch import nn

#: activations the tower may apply after a Linear layer: element-wise and parameter-free (Dropout and Identity,
#: no-ops in eval mode, are skipped wherever they are)
ELEMENTWISE = (nn.ReLU, nn.Sigmoid, nn.Tanh, nn.LeakyReLU)
#: users and items per block of the per-pair part: ``[users, items, h1]`` floats stay in cache
USERS_PER_BLOCK, ITEMS_PER_BLOCK = 32, 256


def plan(module) -> list[tuple[str, object]] | None:
    """The tower's steps after the first Linear layer, ``[("linear", name) | ("apply", layer)]``, with the first
    Linear layer's name first; None where the decomposition does not apply to ``module``."""
    from recbole.model.general_recommender import NeuMF

    if type(module) is not NeuMF or module.training:
        return None
    steps, first = [], None
    for index, layer in module.mlp_layers.mlp_layers.named_children():
        name = f"mlp_layers.mlp_layers.{index}"
        if isinstance(layer, nn.Linear):
            if first is None:
                first = name
            else:
                steps.append(("linear", name))
        elif isinstance(layer, (nn.Dropout, nn.Identity)):
            continue
        elif isinstance(layer, ELEMENTWISE) and first is not None:
            steps.append(("apply", layer))
        else:  # batch norm, a layer with parameters, or an activation on the concatenation itself
            return None
    return None if first is None else [("first", first)] + steps


def neumf_scores(module, params: dict, rb_users: torch.Tensor, rb_items: torch.Tensor) -> torch.Tensor | None:
    """``sigmoid(forward(user, item))`` ``[B, I]`` for RecBole users ``rb_users [B]`` and items ``rb_items [I]``
    from full module ``params``; None where :func:`plan` does not apply."""
    steps = plan(module)
    if steps is None:
        return None
    w_out, bias = params["predict_layer.weight"][0], params["predict_layer.bias"][0]
    d_mf = module.mf_embedding_size if module.mf_train else 0
    out = torch.full((len(rb_users), len(rb_items)), float(bias), dtype=w_out.dtype)
    if module.mf_train:  # predict_layer over [u * i, ...]: (u * w) . i
        u = params["user_mf_embedding.weight"][rb_users] * w_out[:d_mf]
        out += u @ params["item_mf_embedding.weight"][rb_items].T
    if module.mlp_train:
        _add_tower(out, steps, params, rb_users, rb_items, w_out[d_mf:])
    return torch.sigmoid(out)


def _add_tower(out: torch.Tensor, steps, params: dict, rb_users, rb_items, w_tower: torch.Tensor) -> None:
    """Adds ``tower([u, i]) . w_tower`` to ``out [B, I]``, the first layer split into its user and item halves."""
    first = steps[0][1]
    weight, b1 = params[f"{first}.weight"], params.get(f"{first}.bias")
    d = params["user_mlp_embedding.weight"].shape[1]
    user_half = params["user_mlp_embedding.weight"][rb_users] @ weight[:, :d].T
    if b1 is not None:
        user_half = user_half + b1
    item_half = params["item_mlp_embedding.weight"][rb_items] @ weight[:, d:].T
    for u0 in range(0, len(rb_users), USERS_PER_BLOCK):
        uh = user_half[u0 : u0 + USERS_PER_BLOCK, None, :]
        for i0 in range(0, len(rb_items), ITEMS_PER_BLOCK):
            h = uh + item_half[None, i0 : i0 + ITEMS_PER_BLOCK, :]
            for kind, what in steps[1:]:
                h = (
                    what(h)
                    if kind == "apply"
                    else torch.nn.functional.linear(h, params[f"{what}.weight"], params.get(f"{what}.bias"))
                )
            out[u0 : u0 + USERS_PER_BLOCK, i0 : i0 + ITEMS_PER_BLOCK] += h @ w_tower
