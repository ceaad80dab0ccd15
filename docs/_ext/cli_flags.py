"""``{remat-kit-flags} COMMAND``: the command's flags, read from the live argparse parser.

The tables are built from ``remat_kit.cli``'s own parser at build time, grouped as its
``--help`` groups them, so a renamed flag or a changed default cannot drift from the page.
"""

from __future__ import annotations

import argparse

from _tables import table
from docutils import nodes
from sphinx.util.docutils import SphinxDirective


def _subparser(command: str) -> argparse.ArgumentParser:
    from remat_kit.cli import _parser

    parser, _ = _parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    if isinstance(action.default, list | tuple):
        return ",".join(map(str, action.default))
    return str(action.default)


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    try:  # argparse's own expansion (%(default)s, %(choices)s, %%)
        params = dict(vars(action), prog=prog)
        params["choices"] = ", ".join(map(str, action.choices or ()))
        return text % params
    except (KeyError, TypeError, ValueError):
        return text


def _flag(action: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
    if action.nargs != 0 and action.option_strings:
        names += f" `{action.metavar or action.dest.upper()}`"
    return names


def flag_rows(command: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Each argument group of ``remat-kit COMMAND`` with its rows (flag, default, help).

    Args:
      command: a name of ``remat-kit --help``'s command list.

    Returns:
      ``(group title, rows)`` per group that holds a flag, ``-h`` left out.
    """
    parser = _subparser(command)
    groups = []
    for group in parser._action_groups:
        rows = [
            (_flag(a), _default(a), _help(a, parser.prog))
            for a in group._group_actions
            if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS
        ]
        if rows:
            groups.append((group.title or "flags", rows))
    return groups


class FlagsDirective(SphinxDirective):
    """The flag tables of one command."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for title, rows in flag_rows(self.arguments[0]):
            out.append(nodes.rubric(text=title[:1].upper() + title[1:]))
            out.append(table(("flag", "default", "what it sets"), rows))
        return out


def setup(app):  # Sphinx calls it to load the extension
    app.add_directive("remat-kit-flags", FlagsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
