"""``{api-reference}``: an autodoc entry for every name of ``remat_kit.__all__``.

The list is read from the package as the page is built, so a name added to the public API
is documented without editing the page.
"""

from __future__ import annotations

import inspect
import types

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def _directive(name: str, value: object) -> list[str]:
    """The autodoc directive for one name, in reStructuredText (autodoc writes rST, so the
    Markdown page hands it over in one ``eval-rst`` block)."""
    if isinstance(value, types.ModuleType):
        head, options = "automodule", [":no-members:"]
    elif inspect.isclass(value):
        head, options = "autoclass", [":members:"]
    elif callable(value):
        head, options = "autofunction", []
    else:
        head, options = "autodata", []
    return [f".. {head}:: remat_kit.{name}", *(f"   {o}" for o in options), ""]


class ApiReference(SphinxDirective):
    """Every public name, in ``__all__``'s order (grouped by concept there)."""

    def run(self) -> list[nodes.Node]:
        import remat_kit

        lines = ["```{eval-rst}"]
        for name in remat_kit.__all__:
            lines += _directive(name, getattr(remat_kit, name))
        lines.append("```")
        container = nodes.section()
        container.document = self.state.document
        self.state.nested_parse(StringList(lines, source="remat_kit.__all__"), 0, container)
        return container.children


def setup(app):  # Sphinx calls it to load the extension
    app.add_directive("api-reference", ApiReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
