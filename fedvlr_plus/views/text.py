"""Item texts for the text encoders, built from an ``InteractionData.items`` frame.

Two documented templates:

* **Combined text** (one string per item, used by OpenCLIP's text tower)::

      "{title}. {categories}. {description}"

  Title first, because CLIP's tokenizer keeps only 77 tokens and the title is the most specific part;
  categories are de-duplicated and joined with ", "; the description is cut at ``max_chars``. Missing
  parts are left out (never the string "None"). An item with none of the three has no text.

* **Fields** (several strings per item, used by the text-only sentence encoder, one embedding each):

  - ``title``: the title;
  - ``description``: the description (cut at ``max_chars``);
  - ``metadata``: ``"Categories: a, b. Year: 1995. Brand: X."`` from ``categories`` plus the optional
    ``year`` / ``release_year`` and ``brand`` columns when the loader provides them.

A part is missing when the value is None, NaN, an empty string or an empty list.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

COMBINED_TEMPLATE = "{title}. {categories}. {description}"
TEXT_FIELDS = ("title", "description", "metadata")
DEFAULT_MAX_CHARS = 1000


def clean(value: Any) -> str | None:
    """One display string from a str / list-of-str / None / NaN value; None when there is nothing."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, (list, tuple)):
        parts = [p for p in (clean(v) for v in value) if p]
        return " ".join(parts) if parts else None
    text = " ".join(str(value).split())  # collapse newlines and runs of spaces
    return text or None


def join_categories(value: Any) -> str | None:
    """Categories as "a, b, c", duplicates removed in first-seen order (Amazon repeats them)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        value = [value]
    seen: list[str] = []
    for v in value:
        c = clean(v)
        if c and c not in seen:
            seen.append(c)
    return ", ".join(seen) if seen else None


def _cut(text: str | None, max_chars: int) -> str | None:
    if text is None or len(text) <= max_chars:
        return text
    return text[:max_chars].rsplit(" ", 1)[0] or text[:max_chars]


def _get(items: pd.DataFrame, column: str, row: int) -> Any:
    return items[column].iat[row] if column in items.columns else None


def combined_texts(items: pd.DataFrame, max_chars: int = DEFAULT_MAX_CHARS) -> list[str | None]:
    """The combined template for every row of ``items`` (None where the item has no text at all)."""
    out: list[str | None] = []
    for r in range(len(items)):
        parts = [
            clean(_get(items, "title", r)),
            join_categories(_get(items, "categories", r)),
            _cut(clean(_get(items, "description", r)), max_chars),
        ]
        parts = [p.rstrip(".") for p in parts if p]
        out.append(". ".join(parts) + "." if parts else None)
    return out


def metadata_text(items: pd.DataFrame, row: int) -> str | None:
    parts = []
    cats = join_categories(_get(items, "categories", row))
    if cats:
        parts.append(f"Categories: {cats}.")
    for col, label in (("year", "Year"), ("release_year", "Year"), ("brand", "Brand")):
        v = clean(_get(items, col, row))
        if v and not (label == "Year" and any(p.startswith("Year:") for p in parts)):
            parts.append(f"{label}: {v}.")
    return " ".join(parts) if parts else None


def field_texts(
    items: pd.DataFrame, max_chars: int = DEFAULT_MAX_CHARS, *, keep_empty: bool = False
) -> dict[str, list[str | None]]:
    """Per-field texts (title, description, metadata); a field absent from every item is left out
    unless ``keep_empty``."""
    fields = {
        "title": [clean(_get(items, "title", r)) for r in range(len(items))],
        "description": [_cut(clean(_get(items, "description", r)), max_chars) for r in range(len(items))],
        "metadata": [metadata_text(items, r) for r in range(len(items))],
    }
    if keep_empty:
        return fields
    return {k: v for k, v in fields.items() if any(t is not None for t in v)}
