"""Make text from Slurm and users inert in each output: job names, user, account and
partition names, node names, and notes made from them.

Each function takes text as it came and returns what a format may print as is:
control characters (terminal escapes, newlines, bidi overrides) become U+FFFD,
rich markup is escaped for the terminal, Markdown and raw HTML are escaped for
Markdown, and a CSV cell that a spreadsheet would run as a formula gets a leading
quote (OWASP's advice). HTML escaping is ``html.escape`` in html.py and svg.py.
"""

from __future__ import annotations

import re

from rich.markup import escape as _rich_escape

from slurm_gpu_exporter.report.inert_text import plain

__all__ = ["csv_cell", "markdown", "terminal"]

# What Markdown (CommonMark, GFM tables) gives a meaning to inside a line; the
# values never start one, so list and heading marks need no escape.
_MARKDOWN = re.compile(r"([\\`*_\[\]|~])")
_FORMULA_START = ("=", "+", "-", "@")


def terminal(text: object) -> str:
    """For a rich table or line: no escape sequence reaches the terminal, no markup
    (``[/oops]``, ``[link=…]``) is interpreted."""
    return _rich_escape(plain(text))


def markdown(text: object) -> str:
    """For a Markdown line or table cell: no HTML, no link, no emphasis, no column."""
    escaped = plain(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN.sub(r"\\\1", escaped)


def csv_cell(text: str) -> str:
    """For a CSV cell: text a spreadsheet would take for a formula is quoted."""
    text = plain(text)
    return "'" + text if text.startswith(_FORMULA_START) else text
