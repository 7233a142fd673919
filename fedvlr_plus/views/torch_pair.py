"""torch and torchvision must come from the same release pair. A torchvision built for another torch fails deep
inside an import (``operator torchvision::nms does not exist``, often wrapped by transformers as "Failed to import
transformers.modeling_utils"), which names neither package. The encoders call :func:`check_torch_pair` first, so
such an environment gets one line that says which versions clash and what to install."""

from __future__ import annotations

from importlib import metadata

from .errors import EncoderUnavailable

#: torchvision's minor version is torch's plus this, for torch 2.x (torch 2.14 pairs with torchvision 0.29)
MINOR_OFFSET = 15


def matching_torchvision(torch_version: str) -> str | None:
    """The torchvision release built with ``torch_version`` (``2.14.1+cpu`` -> ``0.29.1``), or None if unknown."""
    parts = torch_version.split("+")[0].split(".")
    if len(parts) < 2 or parts[0] != "2" or not parts[1].isdigit():
        return None
    patch = parts[2] if len(parts) > 2 and parts[2].isdigit() else "0"
    return f"0.{int(parts[1]) + MINOR_OFFSET}.{patch}"


def check_torch_pair() -> None:
    """Import torchvision; where it does not load beside this torch, raise one line naming both versions."""
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        return  # not installed: the text encoders do not need it, open_clip says so itself
    except (RuntimeError, ImportError, OSError) as exc:
        raise mismatch_error(exc) from None


def mismatch_error(exc: BaseException) -> EncoderUnavailable:
    """The one line for a torchvision that fails to load beside the installed torch."""
    torch_version = _version("torch")
    vision = _version("torchvision")
    pair = matching_torchvision(torch_version)
    fix = (
        f"pip install 'torch=={torch_version.split('+')[0]}' 'torchvision=={pair}'"
        if pair
        else "install the torchvision release built for this torch"
    )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return EncoderUnavailable(
        f"torchvision {vision} does not load beside torch {torch_version} ({first})",
        None,
        f"the two must come from one release pair: {fix}",
    )


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "(not installed)"
