"""``{captured} NAME``: the line under an example's output saying how its times were taken.

``docs/capture.py`` records the conditions of each capture (date, cores, the machine's load)
in ``docs/_output/captured.json``; this directive words them with the same function README's
blocks use, so a page cannot state a time without the load it was measured at.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

DOCS = Path(__file__).resolve().parents[1]


class CapturedDirective(SphinxDirective):
    """The conditions line of one captured example."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        sys.path.insert(0, str(DOCS))
        try:
            from capture import CONDITIONS, conditions_line
        finally:
            sys.path.remove(str(DOCS))
        name = self.arguments[0]
        conditions = json.loads(CONDITIONS.read_text()) if CONDITIONS.exists() else {}
        if name not in conditions:
            raise self.error(f"{name!r} has no recorded capture; run docs/capture.py {name}")
        self.env.note_dependency(str(CONDITIONS))
        return [nodes.paragraph(text=conditions_line(conditions[name]))]


def setup(app):  # Sphinx calls it to load the extension
    app.add_directive("captured", CapturedDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
