"""The report as one HTML file that needs nothing else: styles inline, plots as ``data:`` PNG images, no link to
any other file or host.

The page's one script checks, once the page has loaded, that every plot decoded: a plot that did not shows a line
saying so in its place. It leaves what it found on ``<body>`` (``data-plots="shown/total"``, ``data-errors`` with
any script or loading error), which is what the headless-browser test reads."""

from __future__ import annotations

import base64
from html import escape

from .sections import Figure, Section
from .tables import Table

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1.5em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1em; margin: 1.2em 0 .4em; }
dl.summary { display: grid; grid-template-columns: max-content 1fr; gap: .15em 1em; }
dl.summary dt { color: #666; } dl.summary dd { margin: 0; word-break: break-all; }
table { border-collapse: collapse; margin: .3em 0; font-variant-numeric: tabular-nums; }
th, td { padding: .25em .7em; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th:first-child, td:first-child, th.text, td.text { text-align: left; }
thead th { border-bottom: 2px solid #ccc; }
.scroll { overflow-x: auto; }
p.note { color: #555; font-size: .9em; margin: .2em 0; }
figure.plot { margin: 1em 0; } figure.plot img { max-width: 100%; height: auto; border: 1px solid #eee; }
figure.plot figcaption { color: #555; font-size: .9em; }
figure.broken img { display: none; }
figure.broken::before { content: "this plot could not be shown"; color: #b00; }
"""

_CHECK = """
(function () {
  var errors = [];
  function note(text) { errors.push(text); document.body.setAttribute("data-errors", errors.join(" | ")); }
  window.addEventListener("error", function (e) {
    var what = e.target && e.target.tagName ? "<" + e.target.tagName.toLowerCase() + ">" : "a resource";
    note(e.message ? String(e.message) : "could not load " + what);
  }, true);
  window.addEventListener("load", function () {
    var images = document.querySelectorAll("figure.plot img"), shown = 0;
    for (var i = 0; i < images.length; i++) {
      if (images[i].complete && images[i].naturalWidth > 0) { shown++; }
      else { images[i].parentNode.className += " broken"; }
    }
    document.body.setAttribute("data-plots", shown + "/" + images.length);
  });
})();
"""


def page(title: str, summary: list[tuple[str, str]], sections: list[Section]) -> str:
    """The whole page."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<script>{_CHECK}</script>",
        f"<h1>{escape(title)}</h1>",
        '<dl class="summary">' + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in summary) + "</dl>",
    ]
    for section in sections:
        parts.append(f"<h2>{escape(section.heading)}</h2>")
        parts.extend(_block(b) for b in section.blocks)
    parts.append("</body></html>")
    return "\n".join(parts)


def _block(block) -> str:
    if isinstance(block, Figure):
        return figure(block)
    if isinstance(block, Table):
        return table(block)
    raise TypeError(f"a report section holds tables and figures, not {type(block).__name__}")


def figure(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    caption = escape(f.title) + (f": {escape(f.caption)}" if f.caption else "")
    return (
        f'<figure class="plot"><img alt="{escape(f.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def table(t: Table) -> str:
    """A table whose text columns (labels) align left and whose figures align right."""
    text_cols = {i for i, _ in enumerate(t.columns) if not any(_numeric(row[i]) for row in t.rows if i < len(row))}
    head = "".join(f'<th{_cls(i, text_cols)}>{escape(c)}</th>' for i, c in enumerate(t.columns))
    body = "".join(
        "<tr>" + "".join(f"<td{_cls(i, text_cols)}>{escape(str(v))}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in t.rows
    )
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in t.notes)
    return (
        f"<h3>{escape(t.title)}</h3><div class=\"scroll\"><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>{notes}"
    )


def _numeric(v) -> bool:
    text = str(v).split(" ", 1)[0].replace(",", "")
    try:
        float(text)
    except ValueError:
        return False
    return True


def _cls(i: int, text_cols: set[int]) -> str:
    return ' class="text"' if i in text_cols else ""
