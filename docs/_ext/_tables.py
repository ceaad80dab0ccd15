"""A docutils table from rows of text: the one table builder of the docs' extensions.

Cells may hold inline code in backticks (the claims table's commands); everything else is
plain text, so a generated table needs no second Markdown parse. Plain text is left as its
source wrote it: a help text's ``--gpus`` or ``pip install 'remat-kit[cluster]'`` copies as
shown, not with the en dash and curly quotes of Sphinx's smart quotes (the pages' prose keeps
them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from docutils import nodes


def _cell(text: str) -> nodes.entry:
    paragraph = nodes.paragraph()
    for i, part in enumerate(re.split(r"`([^`]*)`", text)):
        if part:
            paragraph += nodes.literal(part, part) if i % 2 else nodes.Text(part)
    return nodes.entry("", paragraph)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> nodes.table:
    """A table node with one header row.

    Args:
      header: the column titles.
      rows: the body, each row as long as ``header``.

    Returns:
      The docutils table.
    """
    group = nodes.tgroup(cols=len(header))
    # widths by content (the text builder draws them; HTML sizes columns itself: colwidths-auto)
    for i, title in enumerate(header):
        longest = max([len(title), *(len(str(row[i])) for row in rows)])
        group += nodes.colspec(colwidth=min(max(longest, 4), 60))
    head, body = nodes.thead(), nodes.tbody()
    head += nodes.row("", *(_cell(h) for h in header))
    for row in rows:
        body += nodes.row("", *(_cell(str(c)) for c in row))
    group += [head, body]
    node = nodes.table("", group, classes=["colwidths-auto"])
    node["support_smartquotes"] = False  # read by Sphinx's SmartQuotes for the whole table
    return node
